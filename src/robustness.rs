//! Clean and robust accuracy of a (defended) model under a list of attacks, with the checks that catch gradient
//! masking (Athalye, Carlini & Wagner 2018; Carlini et al. 2019, "On Evaluating Adversarial Robustness"): a
//! defense that resists one attack but not another, that does not break under a budget as large as the input
//! box, or whose robust samples had degenerate gradients, is flagged, not celebrated. The trainer runs it after
//! every epoch when configured.

use crate::attack::{Attack, Goal};
use crate::classifier::Classifier;
use crate::data::Dataset;
use crate::{Error, Result};

/// What to evaluate on and with.
pub struct RobustnessConfig {
    /// Held-out data (clean accuracy on all of it).
    pub data: Dataset,
    /// Robust accuracy on the first `robust_samples` images.
    pub robust_samples: usize,
    /// The attacks for robust accuracy, by name (e.g. PGD-40 and APGD-CE).
    pub attacks: Vec<(String, Box<dyn Attack>)>,
    /// An attack whose budget is as large as the input box (e.g. PGD-L∞ with ε = max − min, 20 steps of ε/10
    /// from a random start), run on up to 500 of the robust samples: accuracy must fall to ≈ 0, or the gradients
    /// are not working. `None` skips the check.
    pub unbounded_check: Option<Box<dyn Attack>>,
    /// Samples attacked per call.
    pub batch_size: usize,
    /// The seed of the attacks' random choices (the same at every epoch, so epochs are comparable).
    pub seed: u64,
}

/// Clean and robust accuracy, with masking warnings.
#[derive(Clone, Debug)]
pub struct RobustEvaluation {
    /// Clean accuracy on the whole held-out set.
    pub clean_accuracy: f32,
    /// Robust accuracy per attack name.
    pub robust_accuracy: Vec<(String, f32)>,
    /// Accuracy under a box-sized budget, when checked.
    pub unbounded_accuracy: Option<f32>,
    /// Signs of gradient masking, in words.
    pub warnings: Vec<String>,
}

impl RobustEvaluation {
    /// The robust accuracy under the attack named `name`.
    pub fn robust(&self, name: &str) -> Option<f32> {
        self.robust_accuracy.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }
}

/// Robust accuracy of `model` under `attack` on the first `n` samples of `data`, and how many samples stayed
/// correct although some of their gradients were all zero or not finite.
fn accuracy_under(
    model: &dyn Classifier,
    attack: &dyn Attack,
    data: &Dataset,
    n: usize,
    batch: usize,
    seed: u64,
) -> Result<(f32, usize)> {
    let (mut correct, mut faulty) = (0, 0);
    for s in (0..n).step_by(batch.max(1)) {
        let e = (s + batch).min(n);
        let (x, y) = data.batch(s..e)?;
        let r = attack.run(model, &x, &y, &Goal::Untargeted, seed)?;
        for (i, (p, l)) in r.predictions.iter().zip(&y).enumerate() {
            if p == l {
                correct += 1;
                faulty += usize::from(r.gradient_faults.get(i).is_some_and(|f| f.any()));
            }
        }
    }
    Ok((correct as f32 / n.max(1) as f32, faulty))
}

/// Evaluates `model` as configured.
pub fn robust_evaluation(model: &dyn Classifier, cfg: &RobustnessConfig) -> Result<RobustEvaluation> {
    if cfg.batch_size == 0 {
        return Err(Error::invalid("robust evaluation", "batch size must be positive"));
    }
    let mut correct = 0;
    for (x, y) in cfg.data.batches(1000)? {
        correct += model.predict(&x)?.iter().zip(&y).filter(|(p, l)| p == l).count();
    }
    let clean_accuracy = correct as f32 / cfg.data.len() as f32;
    let n = cfg.robust_samples.min(cfg.data.len());
    let (mut robust_accuracy, mut warnings) = (Vec::new(), Vec::new());
    for (name, attack) in &cfg.attacks {
        let (acc, faulty) = accuracy_under(model, attack.as_ref(), &cfg.data, n, cfg.batch_size, cfg.seed)?;
        robust_accuracy.push((name.clone(), acc));
        if faulty > 0 {
            warnings.push(format!(
                "{name}: {faulty} samples stayed correct with zero or non-finite gradients (gradient masking?)"
            ));
        }
    }
    let unbounded_accuracy = match &cfg.unbounded_check {
        Some(attack) => {
            Some(accuracy_under(model, attack.as_ref(), &cfg.data, n.min(500), cfg.batch_size, cfg.seed)?.0)
        }
        None => None,
    };
    if let Some(u) = unbounded_accuracy.filter(|&u| u > 0.05) {
        warnings.push(format!(
            "accuracy {u:.3} under a box-sized budget: the attack's gradients are not working (gradient masking?)"
        ));
    }
    if let Some(&(_, best)) = robust_accuracy.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        for (name, acc) in &robust_accuracy {
            if acc - best > 0.05 {
                warnings.push(format!(
                    "{name} reports {acc:.3} but another attack reaches {best:.3}: {name} overestimates robustness"
                ));
            }
        }
    }
    Ok(RobustEvaluation { clean_accuracy, robust_accuracy, unbounded_accuracy, warnings })
}
