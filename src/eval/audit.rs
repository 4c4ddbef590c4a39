//! The gradient-masking audit (Athalye, Carlini & Wagner 2018; Carlini et al. 2019, "On Evaluating Adversarial
//! Robustness", §5): robustness that comes from broken gradients rather than from the model shows up as attacks
//! that disagree with how attacks must relate. Each check gives a pass/fail verdict and says why:
//!
//! | check | fails when |
//! |---|---|
//! | `iterative-vs-single-step` | PGD leaves more samples robust than FGSM (+ tolerance) |
//! | `monotone-in-eps` | PGD's robust accuracy at ε/4, ε/2, ε, 2ε (separate runs, nothing carried over) rises |
//! | `unbounded-eps` | PGD with ε = the input box leaves more than 5% of the samples correct |
//! | `noise-weaker` | uniform noise in the ε-ball breaks more samples than PGD (− tolerance) |
//! | `black-box-weaker` | Square (score-based) breaks more samples than PGD (− tolerance) |
//! | `gradients-finite` | more than 1% of the samples PGD attacked had all-zero or non-finite gradients |
//! | `deterministic-output` | the same input gives different logits twice (randomness: an attack needs EOT) |
//! | `logits-not-probabilities` | every output row is in [0, 1] and sums to 1 (a softmax before the loss) |
//!
//! Accuracies are the fraction of the audit samples still classified correctly, the clean misclassified ones
//! counting as broken. The attacks are built by the caller's [`Builder`] from registry names (`fgsm`/`fgm`,
//! `pgd`, `noise`, `square`), so the core needs no attack implementation.

use super::cascade::Builder;
use super::threat::AttackSpec;
use crate::attack::{Attack, AttackResult, Goal, Norm};
use crate::classifier::Classifier;
pub use crate::report::Verdict;
use crate::tensor::Tensor;
use crate::Result;

/// What the audit attacks with.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    /// The norm.
    pub norm: Norm,
    /// The budget.
    pub eps: f32,
    /// PGD iterations (20).
    pub steps: usize,
    /// Square's queries per sample (1,000).
    pub square_queries: u64,
    /// Slack in accuracy between attacks that must be ordered (0.02).
    pub tolerance: f64,
    /// The seed.
    pub seed: u64,
}

impl AuditConfig {
    /// PGD-20, Square 1,000 queries, tolerance 0.02, seed 0.
    pub fn new(norm: Norm, eps: f32) -> AuditConfig {
        AuditConfig { norm, eps, steps: 20, square_queries: 1_000, tolerance: 0.02, seed: 0 }
    }
}

fn verdict(check: &str, pass: bool, explanation: String) -> Verdict {
    Verdict { check: check.into(), pass, explanation }
}

fn accuracy(r: &AttackResult, y: &[usize]) -> f64 {
    r.predictions.iter().zip(y).filter(|(p, l)| p == l).count() as f64 / y.len().max(1) as f64
}

/// Runs the audit on the batch `x` (true labels `y`).
pub fn audit(
    model: &dyn Classifier,
    x: &Tensor,
    y: &[usize],
    build: &Builder<'_>,
    cfg: &AuditConfig,
) -> Result<Vec<Verdict>> {
    let (norm, eps, tol) = (cfg.norm, cfg.eps, cfg.tolerance);
    let pgd_spec = AttackSpec { steps: Some(cfg.steps), ..AttackSpec::named("pgd") };
    let run = |a: &dyn Attack| a.run(model, x, y, &Goal::Untargeted, cfg.seed);
    let single = if norm == Norm::Linf { "fgsm" } else { "fgm" };
    let fgsm = accuracy(&run(build(&AttackSpec::named(single), norm, eps)?.as_ref())?, y);
    let pgd_result = run(build(&pgd_spec, norm, eps)?.as_ref())?;
    let pgd = accuracy(&pgd_result, y);
    let mut out = vec![verdict(
        "iterative-vs-single-step",
        pgd <= fgsm + tol,
        format!(
            "PGD-{} leaves {pgd:.3} correct, {single} {fgsm:.3}: an iterative attack must be at least as strong as \
             one step{}",
            cfg.steps,
            if pgd <= fgsm + tol { "" } else { " — its gradients do not lead anywhere (masking)" }
        ),
    )];
    let mut curve = Vec::new();
    for f in [0.25f32, 0.5, 1.0, 2.0] {
        let a = if f == 1.0 { pgd } else { accuracy(&run(build(&pgd_spec, norm, eps * f)?.as_ref())?, y) };
        curve.push((eps * f, a));
    }
    let rises = curve.windows(2).find(|w| w[1].1 > w[0].1 + tol);
    let shown: Vec<String> = curve.iter().map(|(e, a)| format!("{e}: {a:.3}")).collect();
    out.push(verdict(
        "monotone-in-eps",
        rises.is_none(),
        format!(
            "PGD robust accuracy by ε (separate runs) {}{}",
            shown.join(", "),
            match rises {
                None => " does not rise".to_string(),
                Some(w) => format!(" rises from ε = {} to {}: a larger budget cannot help the model", w[0].0, w[1].0),
            }
        ),
    ));
    let (lo, hi) = model.bounds();
    let boxed = AttackSpec { steps: Some(cfg.steps.max(20)), ..AttackSpec::named("pgd") };
    let unbounded = accuracy(&run(build(&boxed, Norm::Linf, hi - lo)?.as_ref())?, y);
    out.push(verdict(
        "unbounded-eps",
        unbounded <= 0.05,
        format!(
            "PGD with ε = {} (the whole input box) leaves {unbounded:.3} correct; it must reach about 0{}",
            hi - lo,
            if unbounded <= 0.05 { "" } else { " — the attack cannot follow the gradients (masking)" }
        ),
    ));
    let noise = accuracy(&run(build(&AttackSpec::named("noise"), norm, eps)?.as_ref())?, y);
    out.push(verdict(
        "noise-weaker",
        noise >= pgd - tol,
        format!("uniform noise in the ε-ball leaves {noise:.3} correct, PGD {pgd:.3}: noise must be the weaker"),
    ));
    let sq_spec = AttackSpec { queries: Some(cfg.square_queries), ..AttackSpec::named("square") };
    let square = accuracy(&run(build(&sq_spec, norm, eps)?.as_ref())?, y);
    out.push(verdict(
        "black-box-weaker",
        square >= pgd - tol,
        format!(
            "Square ({} queries) leaves {square:.3} correct, PGD {pgd:.3}: a score-based attack beating the gradient \
             attack means the gradients mislead it",
            cfg.square_queries
        ),
    ));
    out.extend(output_checks(model, x, &pgd_result, y)?);
    Ok(out)
}

/// The checks on gradients and outputs.
fn output_checks(model: &dyn Classifier, x: &Tensor, pgd: &AttackResult, y: &[usize]) -> Result<Vec<Verdict>> {
    let faulty = pgd.gradient_faults.iter().zip(&pgd.gradients).filter(|(f, &g)| g > 0 && f.any()).count();
    let attacked = pgd.gradients.iter().filter(|&&g| g > 0).count();
    let share = faulty as f64 / attacked.max(1) as f64;
    let robust_faulty = (0..y.len()).filter(|&i| pgd.predictions[i] == y[i] && pgd.gradient_faults[i].any()).count();
    let mut out = vec![verdict(
        "gradients-finite",
        share <= 0.01,
        format!(
            "{faulty} of {attacked} samples PGD attacked had all-zero or non-finite gradients ({robust_faulty} of \
             them stayed correct){}",
            if share <= 0.01 { "" } else { ": their robustness is not measured (saturated or masked gradients)" }
        ),
    )];
    let (z1, z2) = (model.logits(x)?, model.logits(x)?);
    let same = z1.iter().zip(z2.iter()).all(|(a, b)| a.to_bits() == b.to_bits());
    out.push(verdict(
        "deterministic-output",
        same,
        if same {
            "the same inputs gave bit-identical logits twice".into()
        } else {
            "the same inputs gave different logits twice: the model is randomised, so gradient attacks need an \
             expectation over its randomness (EOT) and a single draw overstates robustness"
                .into()
        },
    ));
    let probs = z1.rows().into_iter().all(|r| {
        r.iter().all(|v| (0.0..=1.0).contains(v)) && (r.iter().map(|&v| v as f64).sum::<f64>() - 1.0).abs() < 1e-3
    });
    out.push(verdict(
        "logits-not-probabilities",
        !probs,
        if probs {
            "every output row lies in [0, 1] and sums to 1: the model returns probabilities where logits are \
             expected, so the cross-entropy of a softmax of them has flat gradients"
                .into()
        } else {
            "the outputs are not probability vectors (logits, as the losses expect)".into()
        },
    ));
    Ok(out)
}
