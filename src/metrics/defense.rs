//! MindArmour's defense metrics: `DefenseEvaluate` (a defended model against the raw one on the same inputs)
//! and `BlackDefenseEvaluate` (a defense against query-based black-box attacks: queries, success, false alarms
//! and latency).

use ndarray::{Array2, ArrayView1};
use serde::{Deserialize, Serialize};

use crate::classifier::argmax_rows;
use crate::{Error, Result};

/// MindArmour's `DefenseEvaluate` metrics of a defended model against the raw one on the same samples.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DefenseMetrics {
    /// Classification accuracy variance (CAV): defended accuracy − raw accuracy. Higher is better.
    pub cav: f64,
    /// Classification rectify ratio (CRR): share of samples the raw model gets wrong and the defended one right.
    pub crr: f64,
    /// Classification sacrifice ratio (CSR): share the raw model gets right and the defended one wrong.
    pub csr: f64,
    /// Classification confidence variance (CCV): mean |max p_defended − max p_raw| over the samples both get
    /// right; `None` when there is none. Lower is better.
    pub ccv: Option<f64>,
    /// Classification output stability (COS): mean Jensen–Shannon divergence (natural log) between the two
    /// models' probabilities over the samples both get right; `None` when there is none. Lower is better.
    pub cos: Option<f64>,
}

/// [`DefenseMetrics`] of the raw and defended models' probabilities (`[N, classes]` each, rows normalised to
/// sum 1 for the divergence) on the same samples with true `labels`. Predictions are the first maximum of each
/// row.
///
/// Errors: shapes that disagree, no samples, labels out of range, negative or non-finite probabilities, a row
/// that sums to 0.
pub fn defense_metrics(raw: &Array2<f32>, defended: &Array2<f32>, labels: &[usize]) -> Result<DefenseMetrics> {
    const OP: &str = "defense_metrics";
    if raw.dim() != defended.dim() {
        return Err(Error::ShapeMismatch {
            op: OP,
            expected: vec![raw.nrows(), raw.ncols()],
            got: vec![defended.nrows(), defended.ncols()],
        });
    }
    let (n, classes) = raw.dim();
    if n == 0 || labels.len() != n {
        return Err(Error::invalid(OP, format!("{n} probability rows need as many labels, got {}", labels.len())));
    }
    if let Some(&label) = labels.iter().find(|&&l| l >= classes) {
        return Err(Error::LabelOutOfRange { op: OP, label, num_classes: classes });
    }
    if raw.iter().chain(defended.iter()).any(|p| !p.is_finite() || *p < 0.0) {
        return Err(Error::invalid(OP, "probabilities must be finite and non-negative"));
    }
    if raw.rows().into_iter().chain(defended.rows()).any(|r| r.sum() <= 0.0) {
        return Err(Error::invalid(OP, "a probability row sums to 0"));
    }
    let (rp, dp) = (argmax_rows(raw), argmax_rows(defended));
    let (mut raw_ok, mut def_ok, mut rectified, mut sacrificed) = (0usize, 0usize, 0usize, 0usize);
    let (mut both, mut conf, mut js) = (0usize, 0.0f64, 0.0f64);
    for i in 0..n {
        let (r, d) = (rp[i] == labels[i], dp[i] == labels[i]);
        raw_ok += r as usize;
        def_ok += d as usize;
        rectified += (d && !r) as usize;
        sacrificed += (r && !d) as usize;
        if r && d {
            both += 1;
            let (pr, pd) = (raw.row(i), defended.row(i));
            conf += (pd[dp[i]] as f64 - pr[rp[i]] as f64).abs();
            js += jensen_shannon(pr, pd);
        }
    }
    let nf = n as f64;
    let over_both = |v: f64| (both > 0).then(|| v / both as f64);
    Ok(DefenseMetrics {
        cav: (def_ok as f64 - raw_ok as f64) / nf,
        crr: rectified as f64 / nf,
        csr: sacrificed as f64 / nf,
        ccv: over_both(conf),
        cos: over_both(js),
    })
}

/// Jensen–Shannon divergence (natural log) of two non-negative vectors, each normalised to sum 1:
/// ½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q)/2, with 0·log 0 = 0.
fn jensen_shannon(p: ArrayView1<f32>, q: ArrayView1<f32>) -> f64 {
    let (sp, sq) = (p.iter().map(|&v| v as f64).sum::<f64>(), q.iter().map(|&v| v as f64).sum::<f64>());
    let mut total = 0.0;
    for (&a, &b) in p.iter().zip(q) {
        let (a, b) = (a as f64 / sp, b as f64 / sq);
        let m = 0.5 * (a + b);
        if a > 0.0 {
            total += 0.5 * a * (a / m).ln();
        }
        if b > 0.0 {
            total += 0.5 * b * (b / m).ln();
        }
    }
    total
}

/// What a black-box defense evaluation recorded per sample, for [`black_defense_metrics`]. Samples whose raw
/// query count is 0 are benign (not attacked; their defended count must be 0 too), the others adversarial.
#[derive(Clone, Debug, Default)]
pub struct BlackDefenseRecord {
    /// Predictions of the raw model (on the adversarial input for an attacked sample).
    pub raw_predictions: Vec<usize>,
    /// Predictions of the defended model.
    pub defended_predictions: Vec<usize>,
    /// Queries the attack spent on the raw model (0 for a benign sample).
    pub raw_queries: Vec<u64>,
    /// Queries it spent on the defended model (0 for a benign sample).
    pub defended_queries: Vec<u64>,
    /// Time to answer on the raw model, in seconds (the attack's total for an attacked sample).
    pub raw_seconds: Vec<f64>,
    /// Time on the defended model.
    pub defended_seconds: Vec<f64>,
    /// Queries the defense's detector flagged (for a benign sample: 1 if its query was flagged, else 0).
    pub detections: Vec<u64>,
    /// True labels.
    pub labels: Vec<usize>,
    /// The attack's query budget.
    pub max_queries: u64,
}

/// MindArmour's `BlackDefenseEvaluate` metrics.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BlackDefenseMetrics {
    /// Query count variance (QCV): (mean defended − mean raw queries per attacked sample) / budget, capped at 1;
    /// 1 when the defended mean reaches the budget and the raw one does not. Higher is better.
    pub qcv: f64,
    /// Attack success rate variance (ASV): raw − defended attack success rate over the attacked samples.
    pub asv: f64,
    /// False-positive rate (FPR) of the detector on the benign samples; `None` without benign samples.
    pub fpr: Option<f64>,
    /// Benign query response time variance (QRV): (mean defended − mean raw time) / mean raw time over the
    /// benign samples; `None` without benign samples or with a zero raw time.
    pub qrv: Option<f64>,
}

/// [`BlackDefenseMetrics`] of a record (see [`BlackDefenseRecord`] for which samples count as attacked).
///
/// Errors: fields of different lengths, no attacked sample, a zero budget, a sample benign for one model and
/// attacked on the other, non-finite or negative times.
pub fn black_defense_metrics(r: &BlackDefenseRecord) -> Result<BlackDefenseMetrics> {
    const OP: &str = "black_defense_metrics";
    let n = r.labels.len();
    let lengths = [
        r.raw_predictions.len(),
        r.defended_predictions.len(),
        r.raw_queries.len(),
        r.defended_queries.len(),
        r.raw_seconds.len(),
        r.defended_seconds.len(),
        r.detections.len(),
    ];
    if lengths.iter().any(|&l| l != n) {
        return Err(Error::invalid(OP, format!("every field needs one entry per label ({n}), got {lengths:?}")));
    }
    if r.max_queries == 0 {
        return Err(Error::invalid(OP, "max_queries must be positive"));
    }
    if let Some(i) = (0..n).find(|&i| (r.raw_queries[i] == 0) != (r.defended_queries[i] == 0)) {
        return Err(Error::invalid(OP, format!("sample {i} is benign on one model and attacked on the other")));
    }
    if r.raw_seconds.iter().chain(&r.defended_seconds).any(|t| !t.is_finite() || *t < 0.0) {
        return Err(Error::invalid(OP, "times must be finite and non-negative"));
    }
    let attacked: Vec<usize> = (0..n).filter(|&i| r.raw_queries[i] > 0).collect();
    let benign: Vec<usize> = (0..n).filter(|&i| r.raw_queries[i] == 0).collect();
    if attacked.is_empty() {
        return Err(Error::invalid(OP, "no attacked sample (every raw query count is 0)"));
    }
    let na = attacked.len() as f64;
    let budget = r.max_queries as f64;
    let mean_def = r.defended_queries.iter().map(|&q| q as f64).sum::<f64>() / na;
    let mean_raw = r.raw_queries.iter().map(|&q| q as f64).sum::<f64>() / na;
    let qcv = if mean_def == budget && mean_raw < budget { 1.0 } else { (mean_def - mean_raw).min(budget) / budget };
    let successes = |p: &[usize]| attacked.iter().filter(|&&i| p[i] != r.labels[i]).count() as f64;
    let asv = (successes(&r.raw_predictions) - successes(&r.defended_predictions)) / na;
    let (fpr, qrv) = if benign.is_empty() {
        (None, None)
    } else {
        let nb = benign.len() as f64;
        let flagged = benign.iter().filter(|&&i| r.detections[i] > 0).count() as f64;
        let mean_time = |t: &[f64]| benign.iter().map(|&i| t[i]).sum::<f64>() / nb;
        let (raw_t, def_t) = (mean_time(&r.raw_seconds), mean_time(&r.defended_seconds));
        (Some(flagged / nb), (raw_t > 0.0).then(|| (def_t - raw_t) / raw_t))
    };
    Ok(BlackDefenseMetrics { qcv, asv, fpr, qrv })
}
