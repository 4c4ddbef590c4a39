//! Clean and robust accuracy of a (defended) model, with the checks that catch gradient masking: a defense that
//! resists PGD but not APGD, or does not break under an unbounded budget, is flagged, not celebrated.

use std::sync::Arc;

use armoury::data::Dataset;
use armoury::{Attack, Classifier, Goal, Result};
use armoury_attacks::Pgd;

/// What to evaluate on.
#[derive(Clone)]
pub struct RobustnessConfig {
    /// Held-out data (clean accuracy on all of it).
    pub data: Dataset,
    /// Robust accuracy on the first `robust_samples` images.
    pub robust_samples: usize,
    /// The attacks for robust accuracy, by name (e.g. PGD-40 and APGD-CE).
    pub attacks: Vec<(String, Arc<dyn Attack>)>,
    /// Run PGD with a box-sized budget (ε = max − min) as a sanity check: accuracy must fall to ≈ 0.
    pub unbounded_check: bool,
    /// Samples attacked per call.
    pub batch_size: usize,
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

fn accuracy_under(model: &dyn Classifier, attack: &dyn Attack, data: &Dataset, n: usize, batch: usize) -> Result<f32> {
    let mut correct = 0;
    for s in (0..n).step_by(batch.max(1)) {
        let e = (s + batch).min(n);
        let (x, y) = data.batch(s..e)?;
        let r = attack.run(model, &x, &y, &Goal::Untargeted, 0)?;
        correct += r.predictions.iter().zip(&y).filter(|(p, l)| p == l).count();
    }
    Ok(correct as f32 / n.max(1) as f32)
}

/// Evaluates `model` as configured.
pub fn robust_evaluation(model: &dyn Classifier, cfg: &RobustnessConfig) -> Result<RobustEvaluation> {
    let mut correct = 0;
    for (x, y) in cfg.data.batches(1000)? {
        correct += model.predict(&x)?.iter().zip(&y).filter(|(p, l)| p == l).count();
    }
    let clean_accuracy = correct as f32 / cfg.data.len() as f32;
    let n = cfg.robust_samples.min(cfg.data.len());
    let mut robust_accuracy = Vec::new();
    for (name, attack) in &cfg.attacks {
        robust_accuracy.push((name.clone(), accuracy_under(model, attack.as_ref(), &cfg.data, n, cfg.batch_size)?));
    }
    let (lo, hi) = model.bounds();
    let unbounded_accuracy = if cfg.unbounded_check {
        let box_eps = hi - lo;
        let attack = Pgd { steps: 20, step_size: box_eps / 10.0, ..Pgd::linf(box_eps) };
        Some(accuracy_under(model, &attack, &cfg.data, n.min(500), cfg.batch_size)?)
    } else {
        None
    };
    let mut warnings = Vec::new();
    if let Some(u) = unbounded_accuracy {
        if u > 0.05 {
            warnings.push(format!(
                "accuracy {u:.3} under a box-sized budget: the attack's gradients are not working (gradient masking?)"
            ));
        }
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
