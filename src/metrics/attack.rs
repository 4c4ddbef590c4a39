//! MindArmour's attack metrics (`AttackEvaluate`): how often an attack succeeds, how confidently, how far and
//! how visibly it moved the inputs.

use ndarray::Array2;

use super::{ssim_slices, AttackMetrics, SSIM_WINDOW};
use crate::attack::{AttackResult, Resolved};
use crate::classifier::Classifier;
use crate::{Error, Result, Tensor};

const OP: &str = "attack_metrics";

/// Denominators of the relative distances below this are replaced by 1 (an all-zero image has no scale).
const ZERO_NORM: f64 = 1e-12;

/// MindArmour's attack metrics of adversarial inputs `x_adv` made from `x` (both `[N, C, H, W]`), with the
/// true `labels`, the model's class probabilities on `x_adv` (`[N, classes]`), the targets of a targeted attack
/// (`None`: untargeted) and the data range of the inputs for the SSIM (the classifier's max − min bound).
///
/// A sample is a success when its predicted class (the first maximum of its probabilities) differs from its
/// label, or equals its target when `targets` is given — MindArmour's criterion, computed from the probabilities
/// alone. Over the successes: ACAC is the mean probability of the predicted class, ACTC that of the true class,
/// the relative distances are ‖δ‖_p / ‖x‖_p for p = 0, 2, ∞ (δ = x_adv − x; ‖·‖₀ counts nonzero values; a zero
/// ‖x‖_p counts as 1), ASS is the mean SSIM of `(x, x_adv)` ([`super::ssim`]; `None` when the images are smaller
/// than its 11×11 window) and NTE (Luo et al. 2018, "Towards imperceptible and robust adversarial example
/// attacks against neural networks") is the mean gap between the largest and the second-largest probability.
/// With no success every average is 0.
///
/// Errors: shapes that disagree, an empty batch, labels or targets out of range, NaN or infinite values, a
/// non-positive data range.
pub fn attack_metrics(
    x: &Tensor,
    x_adv: &Tensor,
    labels: &[usize],
    adv_probabilities: &Array2<f32>,
    targets: Option<&[usize]>,
    data_range: f64,
) -> Result<AttackMetrics> {
    let (n, c, h, w) = check(x, x_adv, labels, adv_probabilities, targets, data_range)?;
    let predictions = crate::classifier::argmax_rows(adv_probabilities);
    let success: Vec<usize> = (0..n)
        .filter(|&i| match targets {
            Some(t) => predictions[i] == t[i],
            None => predictions[i] != labels[i],
        })
        .collect();
    let s = success.len();
    let mut m = AttackMetrics {
        samples: n,
        successes: s,
        misclassification_rate: s as f64 / n as f64,
        avg_confidence_adversarial: 0.0,
        avg_confidence_true: 0.0,
        avg_relative_l0: 0.0,
        avg_relative_l2: 0.0,
        avg_relative_linf: 0.0,
        avg_ssim: if h >= SSIM_WINDOW && w >= SSIM_WINDOW { Some(0.0) } else { None },
        data_range,
        nte: 0.0,
    };
    if s == 0 {
        return Ok(m);
    }
    let size = c * h * w;
    let (xs, advs) = (x.to_vec(), x_adv.to_vec());
    let (mut acac, mut actc, mut nte, mut ssim_sum) = (0.0, 0.0, 0.0, 0.0);
    let mut dist = [0.0f64; 3];
    for &i in &success {
        let p = adv_probabilities.row(i);
        acac += p[predictions[i]] as f64;
        actc += p[labels[i]] as f64;
        nte += top_two_gap(p.iter().copied());
        let (xi, ai) = (&xs[i * size..(i + 1) * size], &advs[i * size..(i + 1) * size]);
        for (d, r) in dist.iter_mut().zip(relative_distances(xi, ai)) {
            *d += r;
        }
        if m.avg_ssim.is_some() {
            ssim_sum += ssim_slices(xi, ai, [c, h, w], data_range)?;
        }
    }
    let sf = s as f64;
    m.avg_confidence_adversarial = acac / sf;
    m.avg_confidence_true = actc / sf;
    [m.avg_relative_l0, m.avg_relative_l2, m.avg_relative_linf] = dist.map(|d| d / sf);
    m.avg_ssim = m.avg_ssim.map(|_| ssim_sum / sf);
    m.nte = nte / sf;
    Ok(m)
}

/// [`attack_metrics`] of an attack's result: the model's probabilities on `result.adversarial` (one counted
/// query), the targets of `result.goal`, and the data range of the model's bounds.
pub fn attack_metrics_of(
    model: &dyn Classifier,
    x: &Tensor,
    labels: &[usize],
    result: &AttackResult,
) -> Result<AttackMetrics> {
    let probabilities = model.probabilities(&result.adversarial)?;
    let targets = match &result.goal {
        Resolved::Untargeted => None,
        Resolved::Targeted(t) => Some(t.as_slice()),
    };
    let (lo, hi) = model.bounds();
    attack_metrics(x, &result.adversarial, labels, &probabilities, targets, hi as f64 - lo as f64)
}

/// Validates the inputs of [`attack_metrics`]; returns (N, C, H, W).
fn check(
    x: &Tensor,
    x_adv: &Tensor,
    labels: &[usize],
    probabilities: &Array2<f32>,
    targets: Option<&[usize]>,
    data_range: f64,
) -> Result<(usize, usize, usize, usize)> {
    if x.shape() != x_adv.shape() {
        return Err(Error::ShapeMismatch { op: OP, expected: x.shape().to_vec(), got: x_adv.shape().to_vec() });
    }
    let (n, c, h, w) = x.dims4(OP)?;
    if n == 0 {
        return Err(Error::invalid(OP, "empty batch"));
    }
    let classes = probabilities.ncols();
    if probabilities.nrows() != n || labels.len() != n || targets.is_some_and(|t| t.len() != n) {
        return Err(Error::invalid(
            OP,
            format!(
                "{n} images need {n} labels, probability rows and targets; got {}, {} and {:?}",
                labels.len(),
                probabilities.nrows(),
                targets.map(|t| t.len())
            ),
        ));
    }
    if let Some(&label) = labels.iter().chain(targets.unwrap_or(&[])).find(|&&l| l >= classes) {
        return Err(Error::LabelOutOfRange { op: OP, label, num_classes: classes });
    }
    if !x.all_finite() || !x_adv.all_finite() || probabilities.iter().any(|p| !p.is_finite()) {
        return Err(Error::NonFinite { op: OP });
    }
    if !(data_range.is_finite() && data_range > 0.0) {
        return Err(Error::invalid(OP, format!("data_range must be positive and finite, got {data_range}")));
    }
    Ok((n, c, h, w))
}

/// ‖δ‖_p / ‖x‖_p for p = 0, 2, ∞, in f64.
fn relative_distances(x: &[f32], adv: &[f32]) -> [f64; 3] {
    let (mut d0, mut d2, mut dinf, mut x0, mut x2, mut xinf) = (0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in x.iter().zip(adv) {
        let d = b as f64 - a as f64;
        let a = a as f64;
        d0 += (d != 0.0) as u8 as f64;
        d2 += d * d;
        dinf = dinf.max(d.abs());
        x0 += (a != 0.0) as u8 as f64;
        x2 += a * a;
        xinf = xinf.max(a.abs());
    }
    let rel = |num: f64, den: f64| num / if den > ZERO_NORM { den } else { 1.0 };
    [rel(d0, x0), rel(d2.sqrt(), x2.sqrt()), rel(dinf, xinf)]
}

/// The largest value minus the second largest (0 for a single value).
fn top_two_gap(values: impl Iterator<Item = f32>) -> f64 {
    let (mut first, mut second) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for v in values.map(f64::from) {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    if second == f64::NEG_INFINITY {
        0.0
    } else {
        first - second
    }
}
