//! The evaluation report: a plain serde data model that an evaluation fills in, and [`write`]'s three files —
//! `report.json` (every figure), `report.md` (summary tables) and one self-contained `report.html` with SVG
//! plots (radar chart, robust accuracy against ε with confidence bands, the distribution of minimal
//! perturbation norms, the class-flip matrix, per-attack bars, the audit verdicts, example images).
//!
//! The figures in a report are described in `docs/report.md`.

use serde::{Deserialize, Serialize};

use crate::metrics::AttackMetrics;

/// A proportion (or any estimate) with its confidence interval, e.g. a robust accuracy with its 95% Wilson
/// interval ([`crate::metrics::wilson`]).
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

/// One attack of a cascade: robust accuracy after it (cumulative, in cascade order) and its cost.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttackSummary {
    /// The attack's name.
    pub attack: String,
    /// Robust accuracy after this attack and every one before it in the cascade.
    pub robust_accuracy_after: Interval,
    /// Samples this attack broke (that the earlier ones had not).
    pub broken: usize,
    /// Mean gradient evaluations per attacked sample.
    pub mean_gradients: f64,
    /// Mean model queries per attacked sample.
    pub mean_queries: f64,
    /// Wall-clock time of this attack, in seconds.
    pub seconds: f64,
}

/// A security curve: accuracy against ε for one attack and norm.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EpsCurve {
    /// The attack's name.
    pub attack: String,
    /// The norm ε is measured in (`"linf"`, `"l2"`, …).
    pub norm: String,
    /// The budgets, ascending.
    pub eps: Vec<f64>,
    /// Accuracy at each budget, with its interval.
    pub accuracy: Vec<Interval>,
}

/// Minimal perturbation norms found by a minimum-norm attack, one per sample (`None`: not found).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NormDistribution {
    /// The attack's name.
    pub attack: String,
    /// The norm (`"linf"`, `"l2"`, …).
    pub norm: String,
    /// Per sample: the smallest adversarial perturbation's norm, or `None` when the attack found none.
    pub norms: Vec<Option<f64>>,
}

/// How often each true class was turned into each adversarial prediction.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ClassFlips {
    /// Class names, in class order.
    pub classes: Vec<String>,
    /// `counts[true][adversarial prediction]`.
    pub counts: Vec<Vec<u64>>,
}

/// One polygon of a radar chart.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RadarSeries {
    /// The legend entry.
    pub name: String,
    /// One value in [0, 1] per axis.
    pub values: Vec<f64>,
}

/// A radar chart of normalised metrics (MindArmour's `RadarMetric`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Radar {
    /// The axes' names, clockwise from the top.
    pub axes: Vec<String>,
    /// The polygons.
    pub series: Vec<RadarSeries>,
}

/// An example adversarial image with its clean original.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExampleImage {
    /// `[C, H, W]`.
    pub shape: [usize; 3],
    /// The clean image, C·H·W values, channel-major.
    pub original: Vec<f32>,
    /// The adversarial image, same layout.
    pub adversarial: Vec<f32>,
    /// The true label.
    pub label: usize,
    /// The model's prediction on the adversarial image.
    pub adversarial_prediction: usize,
    /// The attack that produced it.
    pub attack: String,
}

/// Everything an evaluation found, as plain data: what [`write`] renders.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// The report's title.
    pub title: String,
    /// The model's name or file.
    pub model: String,
    /// Hash of the threat model the figures were computed under.
    pub threat_model_hash: String,
    /// The evaluation's seed.
    pub seed: u64,
    /// Samples evaluated.
    pub samples: usize,
    /// Clean accuracy.
    pub clean_accuracy: Interval,
    /// Robust accuracy under the whole cascade.
    pub robust_accuracy: Interval,
    /// Each attack of the cascade, in order.
    pub per_attack: Vec<AttackSummary>,
    /// Security curves (accuracy against ε).
    pub curves: Vec<EpsCurve>,
    /// Minimal perturbation norms of the minimum-norm attacks.
    pub minimal_norms: Vec<NormDistribution>,
    /// The class-flip matrix, when recorded.
    pub class_flips: Option<ClassFlips>,
    /// MindArmour's attack metrics per attack.
    pub attack_metrics: Vec<(String, AttackMetrics)>,
    /// The radar chart's data, when given.
    pub radar: Option<Radar>,
    /// The gradient-masking audit.
    pub audit: Vec<Verdict>,
    /// Example adversarial images.
    pub examples: Vec<ExampleImage>,
}
