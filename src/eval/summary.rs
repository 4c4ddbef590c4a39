//! The figures of a ledger: clean and robust accuracy with 95% Wilson intervals at every ε, robust accuracy
//! after each attack of the cascade, the class-flip matrix and the minimal-perturbation norms. Computed from the
//! per-sample records alone, so a merged sharded ledger gives the unsharded run's figures exactly.

use serde::{Deserialize, Serialize};

use super::cascade::Ledger;
use super::threat::ThreatModel;
use crate::data::Dataset;
use crate::metrics::Interval;
use crate::{Error, Result, Tensor};

/// `k` of `n` with its 95% Wilson interval ([`crate::metrics::wilson`]); no samples give 0 in [0, 1].
pub fn proportion(k: usize, n: usize) -> Interval {
    crate::metrics::wilson(k, n, crate::metrics::Z95).unwrap_or(Interval { value: 0.0, lo: 0.0, hi: 1.0 })
}

/// One attack's line of the summary.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttackLine {
    /// The attack's label (registry name and settings).
    pub attack: String,
    /// Robust accuracy after this attack (cumulative, cascade order), at each ε.
    pub robust_after: Vec<Interval>,
    /// Samples this attack broke first, at the headline ε.
    pub broken: usize,
    /// Gradient evaluations per attacked sample.
    pub mean_gradients: f64,
    /// Queries per attacked sample.
    pub mean_queries: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// The figures of a complete ledger.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// The threat model's hash.
    pub threat_model_hash: String,
    /// The model.
    pub model: String,
    /// Samples evaluated.
    pub samples: usize,
    /// The ε grid.
    pub eps: Vec<f64>,
    /// Clean accuracy.
    pub clean_accuracy: Interval,
    /// Robust accuracy after the whole cascade, per ε.
    pub robust_accuracy: Vec<Interval>,
    /// Per attack, in cascade order.
    pub per_attack: Vec<AttackLine>,
    /// At the headline ε: counts[true class][prediction on the adversarial input] over the broken samples.
    pub class_flips: Vec<Vec<u64>>,
    /// Per minimum-norm attack: its label and each correctly classified sample's minimal norm (`None`: none
    /// found).
    pub minimal_norms: Vec<(String, Vec<Option<f64>>)>,
    /// Samples that stayed robust although some of their gradients were all zero or not finite.
    pub robust_with_faults: usize,
}

impl Summary {
    /// The headline robust accuracy (at the largest ε).
    pub fn headline(&self) -> Interval {
        *self.robust_accuracy.last().expect("at least one ε")
    }
}

/// The summary of `ledger` under `tm` (with `classes` classes).
pub fn summarise(tm: &ThreatModel, ledger: &Ledger, classes: usize) -> Summary {
    let r = &ledger.records;
    let n = r.len();
    let count = |f: &dyn Fn(&super::cascade::SampleRecord) -> bool| r.iter().filter(|s| f(s)).count();
    let clean = count(&|s| s.clean_correct());
    let ks = tm.eps.len();
    let robust_accuracy = (0..ks).map(|k| proportion(count(&|s| s.robust_at(k, None)), n)).collect();
    let last = ks - 1;
    let per_attack = tm
        .attacks
        .iter()
        .enumerate()
        .map(|(j, spec)| {
            let w = &ledger.work[j];
            let per = |v: u64| if w.attacked == 0 { 0.0 } else { v as f64 / w.attacked as f64 };
            AttackLine {
                attack: spec.label(),
                robust_after: (0..ks).map(|k| proportion(count(&|s| s.robust_at(k, Some(j))), n)).collect(),
                broken: count(&|s| s.broken.as_ref().is_some_and(|b| b.eps_index == last && b.attack_index == j)),
                mean_gradients: per(w.gradients),
                mean_queries: per(w.queries),
                seconds: w.seconds,
            }
        })
        .collect();
    let mut class_flips = vec![vec![0u64; classes]; classes];
    for s in r {
        if let Some(b) = &s.broken {
            if s.label < classes && b.prediction < classes {
                class_flips[s.label][b.prediction] += 1;
            }
        }
    }
    let minimal_norms = tm
        .minimal
        .iter()
        .enumerate()
        .map(|(m, spec)| (spec.label(), r.iter().filter(|s| s.clean_correct()).map(|s| s.minimal_norms[m]).collect()))
        .collect();
    Summary {
        threat_model_hash: ledger.threat_model_hash.clone(),
        model: ledger.model.clone(),
        samples: n,
        eps: tm.eps.clone(),
        clean_accuracy: proportion(clean, n),
        robust_accuracy,
        per_attack,
        class_flips,
        minimal_norms,
        robust_with_faults: count(&|s| s.robust_at(last, None) && s.gradient_faults > 0),
    }
}

/// The cascade's worst-case input per sample of a ledger, in ledger order: its adversarial example when the
/// cascade broke it (at any ε), else the clean image; with the labels and which samples were broken. What a
/// defense or detector is evaluated on non-adaptively.
///
/// Errors: a record whose index is not in `data`, an adversarial example of another size.
pub fn worst_case_inputs(ledger: &Ledger, data: &Dataset) -> Result<(Tensor, Vec<usize>, Vec<bool>)> {
    let [c, h, w] = data.image_shape();
    let mut values = Vec::with_capacity(ledger.records.len() * c * h * w);
    let (mut labels, mut broken) = (Vec::new(), Vec::new());
    for r in &ledger.records {
        let clean = data
            .image(r.index)
            .ok_or_else(|| Error::invalid("worst_case_inputs", format!("sample {} is not in the data", r.index)))?;
        let adv = r.broken.as_ref().and(r.adversarial.as_deref());
        values.extend_from_slice(adv.unwrap_or(clean));
        labels.push(r.label);
        broken.push(adv.is_some());
    }
    Ok((Tensor::from_vec(values, &[labels.len(), c, h, w])?, labels, broken))
}
