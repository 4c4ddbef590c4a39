//! Metrics of robustness evaluations: confidence intervals of accuracies, image similarity, and MindArmour's
//! evaluation metrics of attacks (`AttackEvaluate`), defenses (`DefenseEvaluate`, `BlackDefenseEvaluate`) and
//! neurons (`NeuronMetric`), with the radar chart's data (`RadarMetric`).
//!
//! Every metric is a plain function of per-sample figures, checked against hand-computed values and an
//! independent numpy script (`tests/fixtures/scripts/metrics_reference.py`); the formulas, and where they
//! differ from MindArmour's, are in `docs/metrics.md`.
//!
//! ```
//! use armoury::metrics::wilson;
//! // 80 of 100 samples robust: 0.8 with its 95% Wilson interval.
//! let ci = wilson(80, 100, 1.959964)?;
//! assert!(ci.lo < 0.8 && 0.8 < ci.hi);
//! # Ok::<(), armoury::Error>(())
//! ```

mod attack;
mod defense;
mod neuron;
mod radar;
mod ssim;

pub use self::attack::{attack_metrics, attack_metrics_of};
pub use self::defense::{
    black_defense_metrics, defense_metrics, BlackDefenseMetrics, BlackDefenseRecord, DefenseMetrics,
};
pub use self::neuron::{activation_sensitivity, neuron_sensitivity, LayerSensitivity};
pub use self::radar::{attack_radar, defense_radar, radar, Radar, RadarSeries};
pub use self::ssim::{ssim, ssim_batch, ssim_slices, SSIM_K1, SSIM_K2, SSIM_SIGMA, SSIM_WINDOW};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// z of a two-sided 95% normal interval (the 97.5% quantile of the standard normal).
pub const Z95: f64 = 1.959_963_984_540_054;

/// The proportion `successes / n` with its Wilson score interval (Wilson 1927) at normal quantile `z` (e.g.
/// [`Z95`]): centre (p̂ + z²/2n) / (1 + z²/n), half-width z·√(p̂(1 − p̂)/n + z²/4n²) / (1 + z²/n), clipped to
/// [0, 1]. Unlike the normal (Wald) interval it never collapses to a point at 0 or 1 and stays inside [0, 1],
/// which matters for robust accuracies near 0.
///
/// Errors: `n = 0`, `successes > n`, `z` not positive and finite.
pub fn wilson(successes: usize, n: usize, z: f64) -> Result<Interval> {
    if n == 0 {
        return Err(Error::invalid("wilson", "a proportion of zero samples has no interval"));
    }
    if successes > n {
        return Err(Error::invalid("wilson", format!("{successes} successes out of {n} samples")));
    }
    if !(z.is_finite() && z > 0.0) {
        return Err(Error::invalid("wilson", format!("z must be positive and finite, got {z}")));
    }
    let nf = n as f64;
    let p = successes as f64 / nf;
    let z2 = z * z;
    let denom = 1.0 + z2 / nf;
    let centre = (p + z2 / (2.0 * nf)) / denom;
    let half = z / denom * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt();
    Ok(Interval { value: p, lo: (centre - half).max(0.0), hi: (centre + half).min(1.0) })
}

/// MindArmour's attack metrics (`AttackEvaluate`) of one attack on one batch. Averages are over the samples
/// the attack succeeded on; when it succeeded on none, every average is 0 (never NaN) and `successes` is 0.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttackMetrics {
    /// Samples evaluated.
    pub samples: usize,
    /// Samples the attack succeeded on (prediction ≠ true label; = target for a targeted attack).
    pub successes: usize,
    /// Misclassification rate (MR): successes / samples.
    pub misclassification_rate: f64,
    /// Average confidence (probability) of the adversarial class (ACAC): the predicted class, or the target.
    pub avg_confidence_adversarial: f64,
    /// Average confidence of the true class (ACTC).
    pub avg_confidence_true: f64,
    /// Average relative L0 distance ‖x_adv − x‖₀ / ‖x‖₀ (can exceed 1 when x has many zeros).
    pub avg_relative_l0: f64,
    /// Average relative L2 distance ‖x_adv − x‖₂ / ‖x‖₂.
    pub avg_relative_l2: f64,
    /// Average relative L∞ distance ‖x_adv − x‖∞ / ‖x‖∞.
    pub avg_relative_linf: f64,
    /// Average SSIM between x and x_adv (ASS; Gaussian window 11, σ = 1.5, data range `data_range`); `None` when
    /// the images are smaller than the 11×11 window, where SSIM is not defined.
    pub avg_ssim: Option<f64>,
    /// The data range the SSIM used (max − min of the input bounds).
    pub data_range: f64,
    /// Noise-tolerance estimation (NTE, Luo et al. 2018): average gap between the adversarial class's
    /// probability and the largest other one.
    pub nte: f64,
}

/// A proportion (or any estimate) with its confidence interval, e.g. a robust accuracy with its 95% Wilson
/// interval ([`wilson`]).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Interval {
    /// The estimate.
    pub value: f64,
    /// Lower end of the interval.
    pub lo: f64,
    /// Upper end of the interval.
    pub hi: f64,
}

impl Interval {
    /// An estimate without uncertainty: `lo = hi = value`.
    pub fn exact(value: f64) -> Interval {
        Interval { value, lo: value, hi: value }
    }
}
