//! Detectors: threshold calibration on hand-computed cases, the provided `fit`/`detect`, and `Guarded` (a
//! detector in front of the fixture cnn): rejections exactly where the detector flags, for negative logits and
//! at the threshold too; gradients of the rejection logit; purification; counters; metadata and taps.

use std::ops::Range;
use std::sync::Arc;

use armoury::io::{load_module, SafetensorsFile};
use armoury::{
    calibrate_threshold, no_grad, Classifier, Counters, Detector, Error, Guarded, Module, ModuleClassifier, Tensor,
};

use crate::common::fixture;

fn images() -> Tensor {
    let file = SafetensorsFile::open(fixture("reference.safetensors")).expect("reference fixture reads");
    Tensor::new(file.f32("x").expect("x"))
}

fn cnn() -> Arc<ModuleClassifier> {
    let m = armoury::nn::cnn(0);
    load_module(&m, fixture("cnn.safetensors")).expect("fixture weights load");
    let m: Arc<dyn Module> = Arc::new(m);
    Arc::new(ModuleClassifier::new(m, &[1, 28, 28], 10, (0.0, 1.0)).expect("classifier"))
}

#[test]
fn detector_calibration_hand_computed() {
    let t = |s: &[f32], fpr: f32| calibrate_threshold(s, fpr).expect("calibrates");
    // N = 1: nothing can be flagged below fpr 1; at 1 the one score is the threshold, still flagging none.
    for fpr in [0.0, 0.05, 0.5, 1.0] {
        assert_eq!(t(&[0.3], fpr), 0.3, "N = 1, fpr {fpr}");
    }
    // N = 3: m = ⌊3·fpr⌋ = 0, 0, 1, 3.
    let three = [2.0, 0.5, 1.0];
    assert_eq!(t(&three, 0.0), 2.0);
    assert_eq!(t(&three, 0.05), 2.0, "3·0.05 < 1: the maximum, not the minimum");
    assert_eq!(t(&three, 0.5), 1.0, "one of three above");
    assert_eq!(t(&three, 1.0), 0.5, "the minimum: all but it above");
    // N = 10 (scores 0..9 shuffled): m = 0, 0, 5, 10; and 0.7 allows 7 although 0.7f32 < 0.7.
    let ten = [3.0, 7.0, 0.0, 9.0, 1.0, 5.0, 8.0, 2.0, 6.0, 4.0];
    assert_eq!(t(&ten, 0.0), 9.0);
    assert_eq!(t(&ten, 0.05), 9.0);
    assert_eq!(t(&ten, 0.5), 4.0, "5 above 4");
    assert_eq!(t(&ten, 1.0), 0.0);
    assert_eq!(t(&ten, 0.7), 2.0, "7 above 2");
    assert_eq!(t(&ten, 0.1), 8.0, "1 above 8");
    // N = 1000 (scores 0..999 reversed): m = 0, 50, 500, 1000.
    let thousand: Vec<f32> = (0..1000).rev().map(|i| i as f32).collect();
    assert_eq!(t(&thousand, 0.0), 999.0);
    assert_eq!(t(&thousand, 0.05), 949.0, "50 above 949");
    assert_eq!(t(&thousand, 0.5), 499.0, "500 above 499");
    assert_eq!(t(&thousand, 1.0), 0.0);
    for fpr in [0.0, 0.01, 0.05, 0.123, 0.5, 0.9, 1.0] {
        let th = t(&thousand, fpr);
        let above = thousand.iter().filter(|&&s| s > th).count();
        assert!(above as f32 / 1000.0 <= fpr + 1e-6, "fpr {fpr}: {above} above");
    }
    // Ties: the tied scores above a threshold count together, so fewer may be flagged than allowed.
    let ties = [1.0, 2.0, 2.0, 2.0, 3.0];
    assert_eq!(t(&ties, 0.2), 2.0, "one allowed: the 3");
    assert_eq!(t(&ties, 0.4), 2.0, "two allowed, but only the 3 is above any tie of 2");
    assert_eq!(t(&ties, 0.8), 1.0, "four allowed: everything above 1");
    assert_eq!(t(&[5.0; 4], 0.5), 5.0, "all tied: none can be flagged");
    assert_eq!(t(&[5.0; 4], 1.0), 5.0);
    // Errors.
    assert!(matches!(calibrate_threshold(&[1.0, f32::NAN], 0.1), Err(Error::NonFinite { .. })));
    for fpr in [-0.01, 1.01, f32::NAN] {
        assert!(matches!(calibrate_threshold(&three, fpr), Err(Error::InvalidArgument { .. })), "fpr {fpr}");
    }
    assert!(calibrate_threshold(&[], 0.1).is_err());
    // Infinite scores are scores.
    assert_eq!(t(&[f32::NEG_INFINITY, 1.0, f32::INFINITY], 0.0), f32::INFINITY);
}

/// A tiny detector: the mean pixel value (bright images are "suspicious"), differentiable or not, optionally
/// purifying by scaling the image.
struct MeanPixel {
    threshold: Option<f32>,
    differentiable: bool,
    /// `Some((factor, on_graph))`: purify to factor·x, on the graph or as a constant.
    purify: Option<(f32, bool)>,
}

impl MeanPixel {
    fn new(differentiable: bool) -> MeanPixel {
        MeanPixel { threshold: None, differentiable, purify: None }
    }
    fn tensor(x: &Tensor) -> armoury::Result<Tensor> {
        x.mean(&[1, 2, 3], false)
    }
}

impl Detector for MeanPixel {
    fn name(&self) -> &str {
        "mean-pixel"
    }
    fn score(&self, x: &Tensor) -> armoury::Result<Vec<f32>> {
        Ok(no_grad(|| MeanPixel::tensor(x))?.to_vec())
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.threshold = Some(threshold);
    }
    fn purify(&self, x: &Tensor) -> Option<armoury::Result<Tensor>> {
        let (factor, on_graph) = self.purify?;
        Some(Ok(if on_graph { x.mul_scalar(factor) } else { Tensor::new(x.to_array()).mul_scalar(factor) }))
    }
    fn score_tensor(&self, x: &Tensor) -> Option<armoury::Result<Tensor>> {
        self.differentiable.then(|| MeanPixel::tensor(x))
    }
}

fn fitted(differentiable: bool, clean: &Tensor, fpr: f32) -> MeanPixel {
    let mut d = MeanPixel::new(differentiable);
    d.fit(clean, fpr).expect("fits");
    d
}

/// Predictions of the pair: the rejection class exactly where `detect` flags, the classifier's elsewhere.
fn assert_rejects_exactly_where_flagged(guarded: &Guarded, x: &Tensor) -> usize {
    let k = guarded.classifier().num_classes();
    let flagged = guarded.detector().detect(x).expect("detect");
    let pred = guarded.predict(x).expect("predict");
    let inner = guarded.classifier().predict(x).expect("inner predict");
    for (i, ((&f, &p), &c)) in flagged.iter().zip(&pred).zip(&inner).enumerate() {
        if f {
            assert_eq!(p, k, "sample {i} is flagged");
        } else {
            assert_eq!(p, c, "sample {i} is not flagged");
        }
    }
    flagged.iter().filter(|&&f| f).count()
}

#[test]
fn detector_fit_and_detect() {
    let x = images();
    let mut d = MeanPixel::new(true);
    let err = d.detect(&x).expect_err("no threshold yet");
    assert!(err.to_string().contains("no threshold"), "{err}");
    let t = d.fit(&x, 0.25).expect("fits");
    assert_eq!(d.threshold(), Some(t));
    let flagged = d.detect(&x).expect("detect");
    assert_eq!(flagged.iter().filter(|&&f| f).count(), 4, "a quarter of 16 distinct scores");
    assert!(d.fit(&x, 1.5).is_err());
    assert_eq!(d.threshold(), Some(t), "a failed fit keeps the threshold");
}

#[test]
fn detector_guarded_rejects_exactly_where_flagged() {
    let x = images();
    let guarded = Guarded::new(cnn(), Arc::new(fitted(true, &x, 0.5))).expect("guarded");
    let rejected = assert_rejects_exactly_where_flagged(&guarded, &x);
    assert_eq!(rejected, 8, "half of 16 distinct scores");
    // Negative logits: the classifier's minus 1000.
    let negative =
        Guarded::new(Arc::new(Shifted(cnn(), -1000.0, Counters::default())), Arc::new(fitted(true, &x, 0.5)))
            .expect("guarded");
    assert!(negative.classifier().logits(&x).expect("logits").iter().all(|&v| v < 0.0));
    assert_eq!(assert_rejects_exactly_where_flagged(&negative, &x), 8);
    // A non-differentiable detector flags the same.
    let plain = Guarded::new(cnn(), Arc::new(fitted(false, &x, 0.5))).expect("guarded");
    assert_eq!(plain.predict(&x).expect("predict"), guarded.predict(&x).expect("predict"));
    // A chunked batch (70 > 32 samples).
    let big = Tensor::uniform(&[70, 1, 28, 28], 0.0, 1.0, 3);
    let guarded = Guarded::new(cnn(), Arc::new(fitted(true, &big, 0.3))).expect("guarded");
    assert_eq!(assert_rejects_exactly_where_flagged(&guarded, &big), 21);
}

/// At the threshold itself a sample is not flagged and keeps its class; one ulp above it is flagged and
/// rejected, even when scale · (s − τ) is far below the logits' rounding.
#[test]
fn detector_guarded_rejects_at_one_ulp_above_the_threshold() {
    let x = images();
    let s0 = MeanPixel::new(true).score(&x).expect("scores")[0];
    for differentiable in [true, false] {
        for (threshold, flagged) in [(s0, false), (s0.next_down(), true)] {
            let mut d = MeanPixel::new(differentiable);
            d.set_threshold(threshold);
            assert_eq!(d.detect(&x).expect("detect")[0], flagged);
            let guarded = Guarded::new(cnn(), Arc::new(d)).expect("guarded").with_scale(1e-20).expect("scale");
            assert_rejects_exactly_where_flagged(&guarded, &x);
            // The same decision from the logits of a gradient pass.
            let f = |z: &Tensor, _: Range<usize>| z.narrow(1, 10, 1)?.reshape(&[z.shape()[0]]);
            let (_, _, logits) = guarded.gradient(&x, &f).expect("gradient");
            assert_eq!(armoury::classifier::argmax_rows(&logits)[0] == 10, flagged);
            assert_eq!(logits, guarded.logits(&x).expect("logits"), "the same logits either way");
        }
    }
}

/// z_K − max_j z_j for each sample: the detector's part of the rejection logit.
fn margin(z: &Tensor, _: Range<usize>) -> armoury::Result<Tensor> {
    let n = z.shape()[0];
    let rejection = z.narrow(1, 10, 1)?.reshape(&[n])?;
    rejection.sub(&z.narrow(1, 0, 10)?.max(1, false)?)
}

#[test]
fn detector_guarded_gradient_of_the_rejection_logit() {
    let x = images();
    let scale = 3.0;
    let guarded =
        Guarded::new(cnn(), Arc::new(fitted(true, &x, 0.5))).expect("guarded").with_scale(scale).expect("scale");
    // ∂(z_K − max_j z_j)/∂x = scale · ∂s/∂x = scale / 784 for the mean pixel.
    let (values, grad, _) = guarded.gradient(&x, &margin).expect("gradient");
    let s = guarded.detector().score(&x).expect("scores");
    let tau = guarded.detector().threshold().expect("threshold");
    for (v, s) in values.iter().zip(&s) {
        assert!((v - scale * (s - tau)).abs() <= 1e-5, "margin {v} vs {}", scale * (s - tau));
    }
    let want = scale / 784.0;
    assert!(grad.value().iter().all(|g| (g - want).abs() <= 1e-6), "∂ margin/∂x is scale·∂s/∂x");
    // ∂z_K/∂x against central finite differences of the rejection logit itself.
    let x2 = Tensor::uniform(&[2, 1, 28, 28], 0.05, 0.95, 5);
    let rejection = |z: &Tensor, _: Range<usize>| z.narrow(1, 10, 1)?.reshape(&[z.shape()[0]]);
    let (_, g, _) = guarded.gradient(&x2, &rejection).expect("gradient");
    let g = g.to_vec();
    let base = x2.to_vec();
    let z_at = |i: usize, d: f32| {
        let mut v = base.clone();
        v[i] += d;
        let z = guarded.logits(&Tensor::from_vec(v, x2.shape()).expect("shape")).expect("logits");
        f64::from(z[[i / 784, 10]])
    };
    let h = 1e-3;
    for i in (0..base.len()).step_by(131) {
        let fd = (z_at(i, h) - z_at(i, -h)) / (2.0 * f64::from(h));
        assert!((fd - f64::from(g[i])).abs() <= 2e-2 + 1e-2 * fd.abs(), "pixel {i}: {} vs {fd}", g[i]);
    }
    // A detector without score_tensor contributes nothing: the margin has no gradient, and z_K's is the
    // classifier's maximum logit's.
    let plain = Guarded::new(cnn(), Arc::new(fitted(false, &x, 0.5))).expect("guarded");
    let (_, grad, _) = plain.gradient(&x, &margin).expect("gradient");
    assert!(grad.value().iter().all(|&g| g == 0.0));
    let (_, g_rej, _) = plain.gradient(&x, &rejection).expect("gradient");
    let top = cnn().predict(&x).expect("predict");
    let top_logit = move |z: &Tensor, r: Range<usize>| z.pick(&top[r]);
    let (_, g_top, _) = cnn().gradient(&x, &top_logit).expect("inner gradient");
    assert_eq!(g_rej.to_vec(), g_top.to_vec(), "BPDA-style: only the classifier's gradient");
}

#[test]
fn detector_guarded_purifies_before_the_classifier() {
    let x = images();
    for on_graph in [true, false] {
        let mut d = fitted(true, &x, 0.5);
        d.purify = Some((0.5, on_graph));
        let guarded = Guarded::new(cnn(), Arc::new(d)).expect("guarded");
        let flagged = guarded.detector().detect(&x).expect("detect");
        let pred = guarded.predict(&x).expect("predict");
        let purified = cnn().predict(&x.mul_scalar(0.5)).expect("predict");
        for i in 0..16 {
            assert_eq!(pred[i], if flagged[i] { 10 } else { purified[i] }, "sample {i}");
        }
        // The gradient of a class logit goes through the purification: 0.5 × the classifier's gradient at 0.5·x,
        // or (not on the graph) straight through, BPDA: 1 ×.
        let class = |z: &Tensor, _: Range<usize>| z.narrow(1, 3, 1)?.reshape(&[z.shape()[0]]);
        let (_, g, _) = guarded.gradient(&x, &class).expect("gradient");
        let (_, g_inner, _) = cnn().gradient(&x.mul_scalar(0.5), &class).expect("inner gradient");
        let factor = if on_graph { 0.5 } else { 1.0 };
        for (a, b) in g.value().iter().zip(g_inner.value().iter()) {
            assert!((a - factor * b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {factor}·{b}");
        }
    }
}

#[test]
fn detector_guarded_counts_and_reports_its_shape() {
    let x = images();
    let inner = cnn();
    let guarded = Guarded::new(inner.clone(), Arc::new(fitted(true, &x, 0.5))).expect("guarded");
    assert_eq!(guarded.num_classes(), 11);
    assert_eq!(guarded.rejection_class(), Some(10));
    assert_eq!(inner.rejection_class(), None);
    assert_eq!(guarded.input_shape(), inner.input_shape());
    assert_eq!(guarded.bounds(), inner.bounds());
    assert_eq!(guarded.chunk_size(), inner.chunk_size());
    assert_eq!(guarded.scale(), 1.0);
    assert_eq!(guarded.detector().name(), "mean-pixel");
    guarded.predict(&x).expect("predict");
    guarded.loss_gradient(&x, &[0; 16]).expect("gradient");
    let c = guarded.counters().snapshot();
    assert_eq!((c.forward_calls, c.forward_samples, c.backward_calls, c.backward_samples), (2, 32, 1, 16));
    assert_eq!(inner.counters().snapshot().forward_calls, 0, "the pair counts its own passes");
    assert!(matches!(guarded.predict(&Tensor::zeros(&[1, 1, 28, 27])), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(guarded.predict(&Tensor::full(&[1, 1, 28, 28], f32::NAN)), Err(Error::NonFinite { .. })));
    // Taps are the classifier's, with the pair's K + 1 logits.
    assert_eq!(guarded.layer_names(), inner.layer_names());
    let acts = guarded.activations(&x, &["pool2"]).expect("taps");
    assert_eq!(acts.logits.shape(), &[16, 11]);
    assert_eq!(acts.layers[0].1.to_vec(), inner.activations(&x, &["pool2"]).expect("inner taps").layers[0].1.to_vec());
    assert_eq!(acts.logits.to_vec(), guarded.logits(&x).expect("logits").iter().copied().collect::<Vec<_>>());
}

#[test]
fn detector_guarded_errors() {
    let x = images();
    let err = Guarded::new(cnn(), Arc::new(MeanPixel::new(true))).err().expect("no threshold");
    assert!(err.to_string().contains("no threshold"), "{err}");
    let guarded = Arc::new(Guarded::new(cnn(), Arc::new(fitted(true, &x, 0.5))).expect("guarded"));
    assert!(Guarded::new(guarded, Arc::new(fitted(true, &x, 0.5))).is_err(), "no detector in front of a detector");
    for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(Guarded::new(cnn(), Arc::new(fitted(true, &x, 0.5))).expect("guarded").with_scale(scale).is_err());
    }
    let mut d = MeanPixel::new(true);
    d.set_threshold(f32::NAN);
    assert!(d.detect(&x).is_err());
}

/// The classifier's logits shifted by a constant (all negative with a large negative shift).
struct Shifted(Arc<ModuleClassifier>, f32, Counters);

impl Classifier for Shifted {
    fn input_shape(&self) -> &[usize] {
        self.0.input_shape()
    }
    fn num_classes(&self) -> usize {
        self.0.num_classes()
    }
    fn bounds(&self) -> (f32, f32) {
        self.0.bounds()
    }
    fn forward(&self, x: &Tensor) -> armoury::Result<Tensor> {
        Ok(self.0.forward(x)?.add_scalar(self.1))
    }
    fn counters(&self) -> &Counters {
        &self.2
    }
}
