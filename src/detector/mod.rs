//! Adversarial-example detectors — the contract they implement ([`Detector`]), the calibration of their threshold
//! on clean data ([`calibrate_threshold`]), and a detector in front of a classifier as one [`Classifier`]
//! ([`Guarded`]) so that any attack can run against the pair.
//!
//! A detector flags inputs instead of classifying them: MagNet (Meng & Chen 2017), feature squeezing (Xu et al.
//! 2018), local intrinsic dimensionality (Ma et al. 2018), Mahalanobis distance (Lee et al. 2018), stateful query
//! detection (Chen et al. 2020). Evaluating one fairly means attacking the classifier and the detector together,
//! with the attacker knowing both (the adaptive setting of Carlini & Wagner 2017, "Adversarial examples are not
//! easily detected: bypassing ten detection methods", and Tramèr et al. 2020, "On adaptive attacks to adversarial
//! example defenses"): [`Guarded`] is that pair.

pub mod roc;

use std::sync::Arc;

use crate::classifier::{Classifier, Counters};
use crate::tensor::{grad_enabled, Tensor};
use crate::{Error, Result};

pub use roc::{roc_auc, roc_curve, tpr_at_fpr};

/// An adversarial-example detector: a score per input, higher meaning more suspicious, and a threshold above
/// which an input is flagged.
///
/// Implementors provide [`Detector::score`] and the threshold's storage; [`Detector::fit`] (calibration on clean
/// data at a target false-positive rate with [`calibrate_threshold`]) and [`Detector::detect`] are provided.
/// Detectors that learn something from clean data (MagNet's autoencoder, Mahalanobis class means) override
/// `fit` to learn it, then calibrate. The score of a sample must depend on that sample alone, as a
/// [`Classifier`]'s logits do, so that batches may be split.
pub trait Detector: Send + Sync {
    /// A short name for reports (`"magnet"`, `"lid"`, …).
    fn name(&self) -> &str;

    /// One score per sample of a batch [N, C, H, W]; higher is more suspicious. No graph is needed.
    fn score(&self, x: &Tensor) -> Result<Vec<f32>>;

    /// The threshold: an input is flagged when its score is strictly above it. `None` until set or fitted.
    fn threshold(&self) -> Option<f32>;

    /// Sets the threshold.
    fn set_threshold(&mut self, threshold: f32);

    /// Calibrates the threshold on clean inputs so that at most a fraction `target_fpr` of them is flagged
    /// ([`calibrate_threshold`] of their scores), sets it and returns it.
    fn fit(&mut self, clean: &Tensor, target_fpr: f32) -> Result<f32> {
        check_fpr(target_fpr)?;
        let scores = self.score(clean)?;
        let threshold = calibrate_threshold(&scores, target_fpr)?;
        self.set_threshold(threshold);
        Ok(threshold)
    }

    /// Whether each sample is flagged (score > threshold). An error if no threshold is set or a score is NaN.
    fn detect(&self, x: &Tensor) -> Result<Vec<bool>> {
        let threshold = usable_threshold(self)?;
        let scores = self.score(x)?;
        if scores.iter().any(|s| s.is_nan()) {
            return Err(Error::NonFinite { op: "Detector::detect" });
        }
        Ok(scores.into_iter().map(|s| s > threshold).collect())
    }

    /// A purifying transform applied to the input before the classifier sees it (MagNet's reformer), when the
    /// detector has one: a batch of the input's shape and bounds. Differentiable if built from tensor ops on
    /// `x`; [`Guarded`] passes the gradient straight through (BPDA, Athalye et al. 2018) otherwise.
    fn purify(&self, _x: &Tensor) -> Option<Result<Tensor>> {
        None
    }

    /// The score as an autodiff-tracked tensor `[N]`, for adaptive attacks that differentiate through the
    /// detector, when the detector has one. Its values must equal [`Detector::score`]'s (e.g. `score` is this
    /// under [`crate::no_grad`]): [`Guarded`] decides rejections from whichever of the two it computed.
    fn score_tensor(&self, _x: &Tensor) -> Option<Result<Tensor>> {
        None
    }
}

fn check_fpr(target_fpr: f32) -> Result<()> {
    if !(0.0..=1.0).contains(&target_fpr) {
        return Err(Error::invalid(
            "calibrate_threshold",
            format!("target false-positive rate {target_fpr} is not in [0, 1]"),
        ));
    }
    Ok(())
}

fn usable_threshold(d: &(impl Detector + ?Sized)) -> Result<f32> {
    match d.threshold() {
        Some(t) if !t.is_nan() => Ok(t),
        Some(_) => Err(Error::invalid("Detector::detect", format!("detector '{}' has a NaN threshold", d.name()))),
        None => Err(Error::invalid(
            "Detector::detect",
            format!("detector '{}' has no threshold: set one or fit it on clean data", d.name()),
        )),
    }
}

/// The threshold that flags at most a fraction `target_fpr` of the clean `scores` (flagged: strictly above),
/// as close to it as the scores allow.
///
/// It is an order statistic of the scores: with the scores sorted ascending s₍₁₎ ≤ … ≤ s₍N₎ and
/// m = ⌊target_fpr · N⌋ false positives allowed, the threshold is s₍N−m₎ (s₍₁₎ if m = N). At most m scores lie
/// strictly above it, and no smaller score would do (all of s₍N−m₎ … s₍N₎, m + 1 of them, would lie above it);
/// tied scores above it count together, so fewer than m may be flagged. When N · target_fpr < 1 it is the
/// largest score, flagging none of them; at `target_fpr` = 1 it is the smallest, flagging all but the ties at the
/// minimum. `target_fpr` is read up to f32 rounding (0.7 of 10 scores allows 7, although 0.7f32 < 0.7).
///
/// Errors: no scores, a NaN score, or `target_fpr` outside [0, 1].
pub fn calibrate_threshold(scores: &[f32], target_fpr: f32) -> Result<f32> {
    check_fpr(target_fpr)?;
    if scores.is_empty() {
        return Err(Error::invalid("calibrate_threshold", "no scores to calibrate on"));
    }
    if scores.iter().any(|s| s.is_nan()) {
        return Err(Error::NonFinite { op: "calibrate_threshold" });
    }
    let n = scores.len();
    // f32 holds a decimal rate within a relative 2⁻²⁴: allow for it, so 0.7 · 10 is 7, not 6.
    let allowed = (f64::from(target_fpr) * n as f64 * (1.0 + f64::from(f32::EPSILON))).floor() as usize;
    let mut sorted = scores.to_vec();
    sorted.sort_by(f32::total_cmp);
    Ok(sorted[n - 1 - allowed.min(n - 1)])
}

/// A detector in front of a classifier, as one [`Classifier`] with K + 1 classes: the classifier's K, and class
/// K, "rejected", which is the prediction exactly when the detector flags the input. Attacks then run against
/// the pair, the adaptive setting of Carlini & Wagner (2017) and Tramèr et al. (2020);
/// [`Classifier::rejection_class`] is `Some(K)` so that attacks neither count it as a success nor aim at it.
///
/// The rejection logit is `z_K = max_j z_j + scale · (s(x) − τ)` with z the classifier's logits, s the detector's
/// score and τ its threshold: above every z_j exactly when s(x) > τ, whatever the sign of the logits (Carlini &
/// Wagner's `(Z_D(x) + 1) · max_j Z(x)_j` needs positive ones). Where f32 rounding would make the sum equal
/// `max_j z_j` although s > τ, its value is raised by one ulp (a constant: the gradient is unchanged), so the
/// argmax property is exact; ties go to the classifier's class (the first maximum).
///
/// Gradients: ∂z_K/∂x = ∂(max_j z_j)/∂x + scale · ∂s/∂x through [`Detector::score_tensor`] when the detector has
/// one; otherwise s is a constant and a non-differentiable detector contributes only the classifier's gradient
/// (a BPDA-style attack, Athalye et al. 2018, is then the attacker's job). When the detector has a
/// [`Detector::purify`] transform the classifier sees the purified input; the detector always scores the input
/// itself.
///
/// Shape, bounds, [`Classifier::check_input`] and [`Classifier::chunk_size`] are the classifier's; the detector's
/// scores must be per sample, and a non-finite score is an [`Error::NonFinite`]. Layer taps ([`Classifier::activations`]) are the classifier's, on the purified
/// input. The pair counts its own passes; the classifier's counters do not see them.
pub struct Guarded {
    classifier: Arc<dyn Classifier>,
    detector: Arc<dyn Detector>,
    scale: f32,
    counters: Counters,
}

impl Guarded {
    /// The detector in front of the classifier, with `scale` 1. The detector must have a threshold (fit it
    /// first); the classifier must not itself have a rejection class (combine detectors into one instead).
    pub fn new(classifier: Arc<dyn Classifier>, detector: Arc<dyn Detector>) -> Result<Guarded> {
        usable_threshold(detector.as_ref()).map_err(|e| match e {
            Error::InvalidArgument { msg, .. } => Error::invalid("Guarded::new", msg),
            e => e,
        })?;
        if let Some(k) = classifier.rejection_class() {
            return Err(Error::invalid(
                "Guarded::new",
                format!("the classifier already rejects (class {k}): combine the detectors into one instead"),
            ));
        }
        Ok(Guarded { classifier, detector, scale: 1.0, counters: Counters::default() })
    }

    /// Sets the factor of `s(x) − τ` in the rejection logit (finite, > 0): the exchange rate between score units
    /// and logit units that an attack's loss sees.
    pub fn with_scale(mut self, scale: f32) -> Result<Guarded> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::invalid("Guarded::with_scale", format!("scale {scale} must be finite and > 0")));
        }
        self.scale = scale;
        Ok(self)
    }

    /// The classifier behind the detector.
    pub fn classifier(&self) -> &dyn Classifier {
        self.classifier.as_ref()
    }

    /// The detector.
    pub fn detector(&self) -> &dyn Detector {
        self.detector.as_ref()
    }

    /// The factor of `s(x) − τ` in the rejection logit.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// What the classifier sees: the purified input when the detector purifies (passed straight through on the
    /// graph when the purification is not differentiable), else `x`.
    fn classifier_input(&self, x: &Tensor) -> Result<Tensor> {
        let Some(purified) = self.detector.purify(x) else {
            return Ok(x.clone());
        };
        let p = purified?;
        if p.shape() != x.shape() {
            return Err(Error::ShapeMismatch {
                op: "Detector::purify",
                expected: x.shape().to_vec(),
                got: p.shape().to_vec(),
            });
        }
        if grad_enabled() && x.is_tracked() && !p.is_tracked() {
            // BPDA: the value of p, the gradient of the identity.
            return x.sub(&x.detach())?.add(&p);
        }
        Ok(p)
    }

    /// Appends the rejection logit to the classifier's logits `z` of `x`.
    fn with_rejection(&self, x: &Tensor, z: Tensor) -> Result<Tensor> {
        let n = x.shape().first().copied().unwrap_or(0);
        let k = self.classifier.num_classes();
        if z.shape() != [n, k] {
            return Err(Error::ShapeMismatch { op: "Guarded", expected: vec![n, k], got: z.shape().to_vec() });
        }
        let tau = usable_threshold(self.detector.as_ref())?;
        let tracked = grad_enabled() && x.is_tracked();
        let (scores, score_t) = match tracked.then(|| self.detector.score_tensor(x)).flatten() {
            Some(st) => {
                let st = st?;
                (st.to_vec(), Some(st))
            }
            None => (self.detector.score(x)?, None),
        };
        if scores.len() != n {
            return Err(Error::ShapeMismatch { op: "Detector::score", expected: vec![n], got: vec![scores.len()] });
        }
        if scores.iter().any(|s| !s.is_finite()) {
            return Err(Error::NonFinite { op: "Detector::score" });
        }
        // The value of each rejection logit, exactly on the right side of the classifier's maximum.
        let target: Vec<f32> = z
            .value()
            .outer_iter()
            .zip(&scores)
            .map(|(row, &s)| {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let v = m + self.scale * (s - tau);
                match (s > tau, v > m) {
                    (true, false) => m.next_up(),
                    (false, true) => m,
                    _ => v,
                }
            })
            .collect();
        let mut rejection = Tensor::from_vec(target, &[n, 1])?;
        if tracked {
            // The gradient of max_j z_j + scale·(s − τ) on the exact value: v + (r − r) is v.
            let mut r = z.max(1, true)?;
            if let Some(st) = score_t {
                r = r.add(&st.reshape(&[n, 1])?.add_scalar(-tau).mul_scalar(self.scale))?;
            }
            rejection = rejection.add(&r.sub(&r.detach())?)?;
        }
        Tensor::concat(&[z, rejection], 1)
    }
}

impl Classifier for Guarded {
    fn input_shape(&self) -> &[usize] {
        self.classifier.input_shape()
    }
    /// The classifier's classes and the rejection class.
    fn num_classes(&self) -> usize {
        self.classifier.num_classes() + 1
    }
    fn bounds(&self) -> (f32, f32) {
        self.classifier.bounds()
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let z = self.classifier.forward(&self.classifier_input(x)?)?;
        self.with_rejection(x, z)
    }
    fn counters(&self) -> &Counters {
        &self.counters
    }
    fn check_input(&self, x: &Tensor) -> Result<usize> {
        self.classifier.check_input(x)
    }
    fn chunk_size(&self) -> Option<usize> {
        self.classifier.chunk_size()
    }
    fn layer_names(&self) -> Vec<String> {
        self.classifier.layer_names()
    }
    /// The classifier's activations of the (purified) input, and the K + 1 logits.
    fn forward_activations(&self, x: &Tensor, layers: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        let (z, acts) = self.classifier.forward_activations(&self.classifier_input(x)?, layers)?;
        Ok((self.with_rejection(x, z)?, acts))
    }
    /// Class K, after the classifier's.
    fn rejection_class(&self) -> Option<usize> {
        Some(self.classifier.num_classes())
    }
}
