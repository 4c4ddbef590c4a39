//! The figures of a ledger: clean and robust accuracy with 95% Wilson intervals at every ε, robust accuracy
//! after each attack of the cascade, the class-flip matrix and the minimal-perturbation norms. Computed from the
//! per-sample records alone, so a merged sharded ledger gives the unsharded run's figures exactly.

use serde::{Deserialize, Serialize};

use super::cascade::Ledger;
use super::threat::ThreatModel;

/// A proportion with its 95% Wilson score interval.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Proportion {
    /// successes / n.
    pub value: f64,
    /// Lower end of the interval.
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
}

impl Proportion {
    /// `k` of `n` with the Wilson score interval at z (1.96 for 95%); n = 0 gives 0 in [0, 1].
    pub fn wilson(k: usize, n: usize, z: f64) -> Proportion {
        if n == 0 {
            return Proportion { value: 0.0, lo: 0.0, hi: 1.0 };
        }
        let (p, n) = (k as f64 / n as f64, n as f64);
        let z2 = z * z;
        let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
        let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
        Proportion { value: p, lo: (centre - half).max(0.0), hi: (centre + half).min(1.0) }
    }
}

/// One attack's line of the summary.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttackLine {
    /// The attack's label (registry name and settings).
    pub attack: String,
    /// Robust accuracy after this attack (cumulative, cascade order), at each ε.
    pub robust_after: Vec<Proportion>,
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
    pub clean_accuracy: Proportion,
    /// Robust accuracy after the whole cascade, per ε.
    pub robust_accuracy: Vec<Proportion>,
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
    pub fn headline(&self) -> Proportion {
        *self.robust_accuracy.last().expect("at least one ε")
    }
}

/// The summary of `ledger` under `tm` (with `classes` classes).
pub fn summarise(tm: &ThreatModel, ledger: &Ledger, classes: usize) -> Summary {
    let r = &ledger.records;
    let n = r.len();
    let z = 1.959_963_984_540_054;
    let count = |f: &dyn Fn(&super::cascade::SampleRecord) -> bool| r.iter().filter(|s| f(s)).count();
    let clean = count(&|s| s.clean_correct());
    let ks = tm.eps.len();
    let robust_accuracy = (0..ks).map(|k| Proportion::wilson(count(&|s| s.robust_at(k, None)), n, z)).collect();
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
                robust_after: (0..ks).map(|k| Proportion::wilson(count(&|s| s.robust_at(k, Some(j))), n, z)).collect(),
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
        clean_accuracy: Proportion::wilson(clean, n, z),
        robust_accuracy,
        per_attack,
        class_flips,
        minimal_norms,
        robust_with_faults: count(&|s| s.robust_at(last, None) && s.gradient_faults > 0),
    }
}

#[cfg(test)]
mod tests {
    use super::Proportion;

    /// Hand-computed: 8 of 10 at z = 1.96 → centre (0.8 + 0.19208)/1.38416 = 0.71674, half-width
    /// 1.96/1.38416·√(0.016 + 0.009604) = 0.22664, so [0.4901, 0.9433]; 0 of 10 → [0, 0.2775].
    #[test]
    fn wilson_matches_hand_computed_values() {
        let p = Proportion::wilson(8, 10, 1.96);
        assert!((p.lo - 0.4901).abs() < 1e-4 && (p.hi - 0.9433).abs() < 1e-4, "{p:?}");
        let p = Proportion::wilson(0, 10, 1.96);
        assert!(p.lo == 0.0 && (p.hi - 0.2775).abs() < 1e-4, "{p:?}");
    }
}
