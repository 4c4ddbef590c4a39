//! The gradient-masking audit (Athalye, Carlini & Wagner 2018; Carlini et al. 2019, "On Evaluating Adversarial
//! Robustness", §5): robustness that comes from broken gradients rather than from the model shows up as attacks
//! that disagree with how attacks must relate. Each check gives a pass/fail verdict whose explanation states the
//! measured values, the threshold and a conclusion that agrees with the verdict:
//!
//! | check | fails when |
//! |---|---|
//! | `iterative-vs-single-step` | PGD leaves more samples robust than FGSM (FGM outside L∞) + tolerance |
//! | `monotone-in-eps` | PGD's robust accuracy at ε/4, ε/2, ε, 2ε (separate runs, nothing carried over) rises by more than the tolerance |
//! | `unbounded-eps` | PGD with ε = the input box's diameter in the threat norm leaves more than 5% of the samples correct |
//! | `noise-weaker` | uniform noise in the ε-ball, best of [`NOISE_DRAWS`] independent draws, leaves fewer samples robust than PGD − tolerance |
//! | `black-box-weaker` | Square (score-based) leaves fewer samples robust than PGD − tolerance |
//! | `gradients-finite` | more than 1% of the samples PGD attacked had all-zero or non-finite gradients |
//! | `deterministic-output` | the same input gives different logits twice, or the logits jump under a move of 10⁻⁶ of the input range (randomness keyed on the input's values): an attack needs EOT |
//! | `logits-not-probabilities` | every output row is in [0, 1] and sums to 1 within 10⁻³ (a softmax before the loss) |
//!
//! Accuracies are the fraction of the audit samples still classified correctly, the clean misclassified ones
//! counting as broken. The attacks are built by the caller's [`Builder`] from registry names (`fgsm` for L∞,
//! `fgm` otherwise, `pgd`, `noise`, `square`), every one in the threat norm — a builder that cannot build an
//! attack in that norm must fail, and one that silently builds another norm is caught: every result must lie in
//! the threat model's ε-ball, else the audit is an error. The core needs no attack implementation.
//!
//! The `deterministic-output` check catches randomised defenses that seed their noise from the input's own values
//! (Armoury's do, [`crate::seed::sample_seed`]): asked the same input twice they answer the same, but moving the
//! input by 10⁻⁶ of its range redraws the noise. For a deterministic model the logits' change scales with the
//! move — about 10⁻⁴ of the change from a 10⁻² move along the same direction, plus rounding — while a model that
//! redraws its noise changes about as much for either move.

use serde::{Deserialize, Serialize};

use super::cascade::Builder;
use super::threat::AttackSpec;
use crate::attack::{Attack, AttackResult, Goal, Norm};
use crate::classifier::Classifier;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// One check of the gradient-masking audit, with its verdict and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Verdict {
    /// The check's name, e.g. `"iterative ≥ single-step"`.
    pub check: String,
    /// Whether the model passed it.
    pub pass: bool,
    /// The figures behind the verdict, in words.
    pub explanation: String,
}

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

/// `build`, telling `notify` the name of each attack it builds (`pgd(steps=20) at ε = 0.1`), once for a run of
/// the same attack: the audit's progress, as it builds every attack it runs through its builder.
pub fn announcing<'a>(
    build: &'a Builder<'a>,
    notify: &'a (dyn Fn(&str) + Sync),
) -> impl Fn(&AttackSpec, Norm, f32) -> Result<Box<dyn Attack>> + Sync + 'a {
    let last = std::sync::Mutex::new(String::new());
    move |spec, norm, eps| {
        let step = format!("{} at ε = {eps}", spec.label());
        if let Ok(mut last) = last.lock() {
            if *last != step {
                notify(&step);
                *last = step;
            }
        }
        build(spec, norm, eps)
    }
}

/// `unbounded-eps` fails when PGD over the whole input box leaves more than this share correct.
pub const UNBOUNDED_MAX_ACCURACY: f64 = 0.05;
/// `gradients-finite` fails when more than this share of the attacked samples had degenerate gradients.
pub const MAX_GRADIENT_FAULT_SHARE: f64 = 0.01;
/// `noise-weaker` draws uniform noise this many times (independent seeds, none of them PGD's random start); a
/// sample counts as broken when any draw breaks it.
pub const NOISE_DRAWS: usize = 10;
/// `logits-not-probabilities`: how far from 1 a row's sum may be to count as a probability vector.
pub const PROBABILITY_SUM_TOLERANCE: f64 = 1e-3;
/// `deterministic-output`: the small move, as a fraction of the input range.
pub const SMALL_MOVE: f32 = 1e-6;
/// `deterministic-output`: the reference move, as a fraction of the input range.
pub const REFERENCE_MOVE: f32 = 1e-2;
/// `deterministic-output` fails when the small move changes the logits (beyond rounding) by more than this
/// fraction of what the reference move changes them — 500 times what a deterministic model's change,
/// [`SMALL_MOVE`] / [`REFERENCE_MOVE`], should be.
pub const MAX_SMALL_MOVE_RATIO: f64 = 0.05;
/// `deterministic-output`: the samples moved (the first ones of the batch).
pub const MOVED_SAMPLES: usize = 16;
/// `deterministic-output`: a small move's change up to this many ulps of the row's largest logit is rounding.
pub const ROUNDING_ULPS: f32 = 64.0;

fn verdict(check: &str, pass: bool, explanation: String) -> Verdict {
    Verdict { check: check.into(), pass, explanation }
}

fn accuracy(r: &AttackResult, y: &[usize]) -> f64 {
    correct(r, y).iter().filter(|&&c| c).count() as f64 / y.len().max(1) as f64
}

fn correct(r: &AttackResult, y: &[usize]) -> Vec<bool> {
    r.predictions.iter().zip(y).map(|(p, l)| p == l).collect()
}

/// Runs `attack` and checks that every perturbation lies in the `norm` ball of radius `eps`: a builder that
/// ignored the threat norm (an L∞ attack for an L1 threat) would otherwise be audited in the wrong threat model.
fn run_in_ball(
    attack: &dyn Attack,
    model: &dyn Classifier,
    (x, y): (&Tensor, &[usize]),
    (norm, eps): (Norm, f32),
    seed: u64,
) -> Result<AttackResult> {
    let r = attack.run(model, x, y, &Goal::Untargeted, seed)?;
    if let Some(worst) = r.norms.iter().map(|n| n.get(norm)).find(|&s| s > eps * (1.0 + 1e-3) + 1e-5) {
        return Err(Error::invalid(
            "audit",
            format!(
                "{} returned a perturbation of {} norm {worst} > ε = {eps}: it was not built for the threat norm",
                attack.name(),
                norm.name()
            ),
        ));
    }
    Ok(r)
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
    let run = |spec: &AttackSpec, e: f32, seed: u64| {
        run_in_ball(build(spec, norm, e)?.as_ref(), model, (x, y), (norm, e), seed)
    };
    let single = if norm == Norm::Linf { "fgsm" } else { "fgm" };
    let fgsm = accuracy(&run(&AttackSpec::named(single), eps, cfg.seed)?, y);
    let single = single.to_uppercase();
    let pgd_result = run(&pgd_spec, eps, cfg.seed)?;
    let pgd = accuracy(&pgd_result, y);
    let pgd_name = format!("PGD-{} ({}, ε = {eps})", cfg.steps, norm.name());
    let pass = pgd <= fgsm + tol;
    let mut out = vec![verdict(
        "iterative-vs-single-step",
        pass,
        format!(
            "{pgd_name} leaves {pgd:.3} correct, {single} {fgsm:.3}; fails when PGD leaves more than {single} + \
             tolerance {tol} = {:.3}: {}",
            fgsm + tol,
            if pass {
                "the iterative attack is at least as strong as one step, as it must be"
            } else {
                "the iterative attack is weaker than one step — its gradients do not lead anywhere (masking)"
            }
        ),
    )];

    let mut curve = Vec::new();
    for f in [0.25f32, 0.5, 1.0, 2.0] {
        let a = if f == 1.0 { pgd } else { accuracy(&run(&pgd_spec, eps * f, cfg.seed)?, y) };
        curve.push((eps * f, a));
    }
    let rises = curve.windows(2).find(|w| w[1].1 > w[0].1 + tol);
    let largest = curve.windows(2).map(|w| w[1].1 - w[0].1).fold(f64::NEG_INFINITY, f64::max);
    let shown: Vec<String> = curve.iter().map(|(e, a)| format!("ε = {e}: {a:.3}")).collect();
    out.push(verdict(
        "monotone-in-eps",
        rises.is_none(),
        format!(
            "PGD-{} robust accuracy by ε (separate runs) {}; fails when it rises by more than the tolerance {tol} \
             from one ε to the next: {}",
            cfg.steps,
            shown.join(", "),
            match rises {
                None =>
                    format!("it never does (largest change {largest:+.3}), as a larger budget cannot help the model"),
                Some(w) => format!(
                    "it rises from {:.3} at ε = {} to {:.3} at ε = {} — a larger budget helped the model, so the \
                     attack does not follow the gradients (masking)",
                    w[0].1, w[0].0, w[1].1, w[1].0
                ),
            }
        ),
    ));

    let (lo, hi) = model.bounds();
    let d = x.numel() / x.shape().first().copied().unwrap_or(1).max(1);
    let diameter = crate::attack::budget::box_diameter(norm, (lo, hi), d) as f32;
    let boxed = AttackSpec { steps: Some(cfg.steps.max(20)), ..AttackSpec::named("pgd") };
    let unbounded = accuracy(&run(&boxed, diameter, cfg.seed)?, y);
    let pass = unbounded <= UNBOUNDED_MAX_ACCURACY;
    out.push(verdict(
        "unbounded-eps",
        pass,
        format!(
            "PGD-{} with ε = {diameter} (the input box's {} diameter: every input reachable) leaves {unbounded:.3} \
             correct; fails above {UNBOUNDED_MAX_ACCURACY}: {}",
            cfg.steps.max(20),
            norm.name(),
            if pass {
                "it reaches about 0, as an attack that can follow the gradients must"
            } else {
                "it does not reach about 0, so the attack cannot follow the gradients (masking)"
            }
        ),
    ));

    // Independent draws: the noise attack with the audit's own seed would be PGD's random start.
    let noise_spec = AttackSpec::named("noise");
    let mut noise_correct = vec![true; y.len()];
    for k in 0..NOISE_DRAWS {
        let r = run(&noise_spec, eps, crate::seed::derive(cfg.seed, 0x0015_e000 + k as u64))?;
        noise_correct.iter_mut().zip(correct(&r, y)).for_each(|(c, now)| *c &= now);
    }
    let noise = noise_correct.iter().filter(|&&c| c).count() as f64 / y.len().max(1) as f64;
    let pass = noise >= pgd - tol;
    out.push(verdict(
        "noise-weaker",
        pass,
        format!(
            "uniform noise in the ε-ball (best of {NOISE_DRAWS} draws) leaves {noise:.3} correct, {pgd_name} \
             {pgd:.3}; fails when noise leaves fewer than PGD − tolerance {tol} = {:.3}: {}",
            pgd - tol,
            if pass {
                "noise is the weaker attack, as it must be"
            } else {
                "random noise beats the gradient attack — the gradients mislead PGD (masking)"
            }
        ),
    ));

    let sq_spec = AttackSpec { queries: Some(cfg.square_queries), ..AttackSpec::named("square") };
    let square = accuracy(&run(&sq_spec, eps, cfg.seed)?, y);
    let pass = square >= pgd - tol;
    out.push(verdict(
        "black-box-weaker",
        pass,
        format!(
            "Square ({} queries, {}) leaves {square:.3} correct, {pgd_name} {pgd:.3}; fails when Square leaves \
             fewer than PGD − tolerance {tol} = {:.3}: {}",
            cfg.square_queries,
            norm.name(),
            pgd - tol,
            if pass {
                "the score-based attack is no stronger than the gradient attack beyond the tolerance, as it must be"
            } else {
                "the score-based attack beats the gradient attack — the gradients mislead PGD (masking)"
            }
        ),
    ));
    out.extend(output_checks(model, x, &pgd_result, y, cfg.seed)?);
    Ok(out)
}

/// The checks on gradients and outputs.
fn output_checks(
    model: &dyn Classifier,
    x: &Tensor,
    pgd: &AttackResult,
    y: &[usize],
    seed: u64,
) -> Result<Vec<Verdict>> {
    let faulty = pgd.gradient_faults.iter().zip(&pgd.gradients).filter(|(f, &g)| g > 0 && f.any()).count();
    let attacked = pgd.gradients.iter().filter(|&&g| g > 0).count();
    let share = faulty as f64 / attacked.max(1) as f64;
    let robust_faulty = (0..y.len()).filter(|&i| pgd.predictions[i] == y[i] && pgd.gradient_faults[i].any()).count();
    let pass = share <= MAX_GRADIENT_FAULT_SHARE;
    let mut out = vec![verdict(
        "gradients-finite",
        pass,
        format!(
            "{faulty} of {attacked} samples PGD attacked ({:.1}%) had all-zero or non-finite gradients \
             ({robust_faulty} of them stayed correct); fails above {}%: {}",
            100.0 * share,
            100.0 * MAX_GRADIENT_FAULT_SHARE,
            if pass {
                "the gradients the attack followed were usable"
            } else {
                "their robustness is not measured (saturated or masked gradients)"
            }
        ),
    )];
    out.push(deterministic_output(model, x, seed)?);
    let z1 = model.logits(x)?;
    let rows = z1.nrows();
    let probability_rows = z1
        .rows()
        .into_iter()
        .filter(|r| {
            r.iter().all(|v| (0.0..=1.0).contains(v))
                && (r.iter().map(|&v| v as f64).sum::<f64>() - 1.0).abs() < PROBABILITY_SUM_TOLERANCE
        })
        .count();
    let probs = rows > 0 && probability_rows == rows;
    out.push(verdict(
        "logits-not-probabilities",
        !probs,
        format!(
            "{probability_rows} of {rows} output rows lie in [0, 1] and sum to 1 within {PROBABILITY_SUM_TOLERANCE}; \
             fails when every row does: {}",
            if probs {
                "the model returns probabilities where logits are expected, so the cross-entropy of a softmax of \
                 them has flat gradients"
            } else {
                "the outputs are logits, as the losses expect"
            }
        ),
    ));
    Ok(out)
}

/// The `deterministic-output` check alone: `x` twice, then its first [`MOVED_SAMPLES`] samples moved by
/// [`SMALL_MOVE`] and [`REFERENCE_MOVE`] of the input range (directions drawn from `seed`).
pub fn deterministic_output(model: &dyn Classifier, x: &Tensor, seed: u64) -> Result<Verdict> {
    let (z1, z2) = (model.logits(x)?, model.logits(x)?);
    let same = z1.iter().zip(z2.iter()).all(|(a, b)| a.to_bits() == b.to_bits());
    let moved = small_move_ratio(model, x, seed)?;
    let keyed = moved.ratio > MAX_SMALL_MOVE_RATIO;
    let measured = format!(
        "the same {} inputs gave {} logits twice; moving {} inputs by {SMALL_MOVE:e} of the input range along a \
         random ±1 direction changed their logits by {:.3e} beyond rounding ({ROUNDING_ULPS} ulps of each row's \
         largest logit), {:.2e} times the {:.3e} a {REFERENCE_MOVE:e} move changed them; fails when the same inputs \
         give different logits or that ratio exceeds {MAX_SMALL_MOVE_RATIO} (a deterministic model's change \
         scales with the move: about {:.0e})",
        x.shape().first().copied().unwrap_or(0),
        if same { "bit-identical" } else { "different" },
        moved.samples,
        moved.small,
        moved.ratio,
        moved.reference,
        f64::from(SMALL_MOVE / REFERENCE_MOVE),
    );
    let conclusion = match (same, keyed) {
        (true, false) => "the model is deterministic, gradient attacks need no expectation over randomness",
        (false, _) => {
            "the model is randomised, so gradient attacks need an expectation over its randomness (EOT) and a \
             single draw overstates robustness"
        }
        (true, true) => {
            "the model redraws randomness keyed on its input's values (a seed from the input), so it is randomised \
             although the same input repeats its answer: gradient attacks need EOT and a single draw overstates \
             robustness"
        }
    };
    Ok(verdict("deterministic-output", same && !keyed, format!("{measured}: {conclusion}")))
}

/// What the `deterministic-output` check's moves changed.
struct Moved {
    samples: usize,
    /// Σ over samples of the largest logit change under the small move, less rounding.
    small: f64,
    /// Σ over samples of the largest logit change under the reference move.
    reference: f64,
    /// small / reference (0 when nothing changed, ∞ when only the small move changed anything).
    ratio: f64,
}

/// Moves the first [`MOVED_SAMPLES`] inputs by [`SMALL_MOVE`] and by [`REFERENCE_MOVE`] of the input range along
/// one random ±1 direction per sample (pointing into the box), and compares the logits' changes. All in one
/// batch, so the rows' logits are as the classifier gives them whatever the batch.
fn small_move_ratio(model: &dyn Classifier, x: &Tensor, seed: u64) -> Result<Moved> {
    use rand::Rng;
    let n = x.shape().first().copied().unwrap_or(0);
    let m = n.min(MOVED_SAMPLES);
    if m == 0 {
        return Ok(Moved { samples: 0, small: 0.0, reference: 0.0, ratio: 0.0 });
    }
    let base = x.narrow(0, 0, m)?;
    let values = base.to_vec();
    let (lo, hi) = model.bounds();
    let (small, big) = (SMALL_MOVE * (hi - lo), REFERENCE_MOVE * (hi - lo));
    let mut rng = crate::seed::rng(crate::seed::derive(seed, 0xde7e_0000));
    let (mut near, mut far) = (values.clone(), values.clone());
    for ((v, a), b) in values.iter().zip(&mut near).zip(&mut far) {
        let mut s: f32 = if rng.random::<bool>() { 1.0 } else { -1.0 };
        if !(lo..=hi).contains(&(v + s * big)) {
            s = -s;
        }
        *b = (v + s * big).clamp(lo, hi);
        let mut t = (v + s * small).clamp(lo, hi);
        if t == *v {
            // Below the resolution of f32 at this value: the next representable one in that direction.
            t = if s > 0.0 { v.next_up() } else { v.next_down() }.clamp(lo, hi);
        }
        *a = t;
    }
    let mut shape = base.shape().to_vec();
    shape[0] = 3 * m;
    let mut all = values;
    all.extend(near);
    all.extend(far);
    let z = model.logits(&Tensor::from_vec(all, &shape)?)?;
    let ulp = |v: f32| (v.abs().max(f32::MIN_POSITIVE) * f32::EPSILON) as f64;
    let (mut sum_small, mut sum_big) = (0.0f64, 0.0f64);
    for i in 0..m {
        let (z0, zs, zb) = (z.row(i), z.row(m + i), z.row(2 * m + i));
        let largest = z0.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let change = |other: ndarray::ArrayView1<'_, f32>| {
            z0.iter().zip(other.iter()).map(|(a, b)| (f64::from(*a) - f64::from(*b)).abs()).fold(0.0, f64::max)
        };
        sum_small += (change(zs) - f64::from(ROUNDING_ULPS) * ulp(largest)).max(0.0);
        sum_big += change(zb);
    }
    let ratio = if sum_small == 0.0 {
        0.0
    } else if sum_big == 0.0 {
        f64::INFINITY
    } else {
        sum_small / sum_big
    };
    Ok(Moved { samples: m, small: sum_small, reference: sum_big, ratio })
}
