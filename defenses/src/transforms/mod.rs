//! Input-transformation defenses and randomized smoothing.
//!
//! A [`Transform`] maps a batch `[N, C, H, W]` to a batch of the same shape, image by image. [`Defended`] puts a
//! transform in front of any [`Classifier`] and is itself a `Classifier`, so every attack can be run through it
//! — honestly:
//!
//! - transforms expressible with tracked tensor ops (mean and Gaussian smoothing, Gaussian noise) are
//!   differentiated exactly;
//! - the others (bit-depth reduction, median filter, JPEG, total-variation minimisation) use **BPDA**
//!   (Athalye, Carlini & Wagner 2018, "Obfuscated gradients give a false sense of security"): the forward value
//!   is `T(x)` and the backward pass is the identity, built on the graph as `(x − x.detach()) + T(x)` — the value
//!   is exactly `T(x)` (`x − x` is exactly zero) and ∂/∂x is the identity;
//! - random transforms (Gaussian noise, pixel-dropout TV minimisation) use **EOT** (Athalye et al. 2018,
//!   "Synthesizing robust adversarial examples"): the defended logits are the mean over `eot_samples` draws, so
//!   an attack's loss is taken of the averaged logits (the gradient of the loss of the average, not the average
//!   of per-draw loss gradients); robust accuracy of a randomised defense is reported on fresh single draws
//!   ([`Defended::fresh_draw_accuracy`]), as a deployed defense answers.
//!
//! Draws are seeded per sample from the seed, the draw number and the sample's own values
//! ([`armoury::seed::sample_seed`]), so results do not depend on batch size, sample order or thread count.
//!
//! [`RandomizedSmoothing`] is Cohen, Rosenfeld & Kolter (2019): Monte-Carlo prediction with abstention and a
//! certified L2 radius from a Clopper–Pearson bound.
//!
//! ```
//! use armoury::{nn, Classifier, ModuleClassifier, Tensor};
//! use armoury_defenses::transforms::{BitDepth, Defended};
//! let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
//! let defended = Defended::new(model, BitDepth { bits: 3 })?;
//! let x = Tensor::uniform(&[2, 1, 28, 28], 0.0, 1.0, 0);
//! assert_eq!(defended.logits(&x)?.shape(), &[2, 10]);
//! # Ok::<(), armoury::Error>(())
//! ```

mod filters;
mod jpeg;
mod noise;
mod randomized;
mod squeeze;
pub mod stats;
mod tv;

use std::sync::Arc;

use armoury::classifier::{Classifier, Counters};
use armoury::{grad_enabled, no_grad, Error, Result, Tensor};
use rayon::prelude::*;

pub use filters::{gaussian_weights, GaussianFilter, MeanFilter, MedianFilter};
pub use jpeg::Jpeg;
pub use noise::GaussianNoise;
pub use randomized::{certified_accuracy, Certification, RandomizedSmoothing};
pub use squeeze::BitDepth;
pub use tv::{total_variation, TotalVariation};

/// An input transformation applied image by image to a batch `[N, C, H, W]`.
pub trait Transform: Send + Sync {
    /// A short name with the settings, e.g. `BitDepth(bits=3)`.
    fn name(&self) -> String;

    /// Whether the output depends on the draw (then [`Defended`] averages over draws: EOT).
    fn is_random(&self) -> bool {
        false
    }

    /// Checks the settings; every other method calls it first.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// The transformed batch (no graph recorded), same shape as `x`. `bounds` are the classifier's input bounds;
    /// `draw` seeds random transforms (each sample's randomness is derived from `draw` and its own values).
    fn apply(&self, x: &Tensor, bounds: (f32, f32), draw: u64) -> Result<Tensor>;

    /// The transform built from tracked tensor ops (true gradient), for the transforms that can be; `None` for
    /// the others, which [`Defended`] differentiates with BPDA. Must have the value of [`Transform::apply`].
    fn differentiable(&self, _x: &Tensor, _bounds: (f32, f32), _draw: u64) -> Option<Result<Tensor>> {
        None
    }
}

/// How [`Defended`] combines the draws of a random transform.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EotAverage {
    /// The mean of the logits.
    #[default]
    Logits,
    /// The log of the mean of the softmax probabilities (the "soft" smoothed classifier of Salman et al. 2019);
    /// the returned logits are these log-probabilities.
    Probabilities,
}

/// A classifier behind an input transformation: `forward(x) = inner.forward(T(x))`, with exact gradients for
/// differentiable transforms, BPDA (identity backward) for the others and EOT (mean over draws) for random ones.
/// Same input shape, classes, bounds and chunk size as the inner classifier.
pub struct Defended {
    inner: Arc<dyn Classifier>,
    transform: Arc<dyn Transform>,
    eot_samples: usize,
    seed: u64,
    average: EotAverage,
    counters: Counters,
}

impl Defended {
    /// `inner` behind `transform`; random transforms use one draw (seed 0) until [`Defended::with_eot`].
    pub fn new(inner: impl Classifier + 'static, transform: impl Transform + 'static) -> Result<Defended> {
        Defended::shared(Arc::new(inner), Arc::new(transform))
    }

    /// As [`Defended::new`] with shared parts.
    pub fn shared(inner: Arc<dyn Classifier>, transform: Arc<dyn Transform>) -> Result<Defended> {
        transform.validate()?;
        Ok(Defended {
            inner,
            transform,
            eot_samples: 1,
            seed: 0,
            average: EotAverage::Logits,
            counters: Counters::default(),
        })
    }

    /// Averages random transforms over `samples` draws seeded by `seed` (EOT). What is averaged is the logits
    /// (or, with [`EotAverage::Probabilities`], the probabilities) *before* any loss: an attack through this
    /// classifier follows the gradient of the loss of the average, not the average of the per-draw loss
    /// gradients of Athalye et al. — the same direction for a linear loss, a smoother one otherwise. A deployed
    /// randomised defense answers each query with one fresh draw, so report its robust accuracy on fresh single
    /// draws ([`Defended::fresh_draw_accuracy`]), not on this average.
    pub fn with_eot(mut self, samples: usize, seed: u64) -> Result<Defended> {
        if samples == 0 {
            return Err(Error::invalid("Defended::with_eot", "at least one EOT sample is needed"));
        }
        self.eot_samples = samples;
        self.seed = seed;
        Ok(self)
    }

    /// How the draws are combined (logits by default).
    pub fn with_average(mut self, average: EotAverage) -> Defended {
        self.average = average;
        self
    }

    /// The same defense answering with one draw per forward pass, seeded by `seed`: how a deployed randomised
    /// defense answers a query.
    pub fn single_draw(&self, seed: u64) -> Defended {
        Defended {
            inner: self.inner.clone(),
            transform: self.transform.clone(),
            eot_samples: 1,
            seed,
            average: self.average,
            counters: Counters::default(),
        }
    }

    /// Accuracy on `x` of `draws` independent single-draw answers (seeds derived from `seed`), averaged: the
    /// robust accuracy of a randomised defense on adversarial inputs `x`, as a user of it would see it. For a
    /// deterministic transform every draw is the same and this is the plain accuracy.
    pub fn fresh_draw_accuracy(&self, x: &Tensor, labels: &[usize], draws: usize, seed: u64) -> Result<f32> {
        if draws == 0 {
            return Err(Error::invalid("Defended::fresh_draw_accuracy", "at least one draw is needed"));
        }
        if labels.len() != x.shape().first().copied().unwrap_or(0) {
            return Err(Error::ShapeMismatch {
                op: "Defended::fresh_draw_accuracy",
                expected: vec![x.shape().first().copied().unwrap_or(0)],
                got: vec![labels.len()],
            });
        }
        let draws = if self.transform.is_random() { draws } else { 1 };
        let mut correct = 0usize;
        for k in 0..draws {
            let one = self.single_draw(armoury::seed::derive(seed, k as u64));
            correct += one.predict(x)?.iter().zip(labels).filter(|(p, l)| p == l).count();
        }
        Ok(correct as f32 / (draws * labels.len().max(1)) as f32)
    }

    /// The undefended classifier.
    pub fn inner(&self) -> &dyn Classifier {
        self.inner.as_ref()
    }

    /// The transform.
    pub fn transform(&self) -> &dyn Transform {
        self.transform.as_ref()
    }

    /// Draws per forward pass: `eot_samples` for random transforms, else 1.
    pub fn draws(&self) -> usize {
        if self.transform.is_random() {
            self.eot_samples
        } else {
            1
        }
    }

    /// The `draw` argument [`Defended`] passes to the transform for draw number `k`.
    pub fn draw_seed(&self, k: usize) -> u64 {
        armoury::seed::mix(self.seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// `T(x)` for draw `k` as the classifier sees it (no graph).
    pub fn transform_input(&self, x: &Tensor, k: usize) -> Result<Tensor> {
        no_grad(|| self.transform.apply(&x.detach(), self.inner.bounds(), self.draw_seed(k)))
    }

    /// `T(x)` for draw `k` on the graph: the transform's own ops when it is differentiable, else BPDA.
    pub fn through(&self, x: &Tensor, k: usize) -> Result<Tensor> {
        let (bounds, draw) = (self.inner.bounds(), self.draw_seed(k));
        if let Some(t) = self.transform.differentiable(x, bounds, draw) {
            return t;
        }
        let tx = no_grad(|| self.transform.apply(&x.detach(), bounds, draw))?;
        if !x.is_tracked() || !grad_enabled() {
            return Ok(tx);
        }
        bpda(x, &tx)
    }
}

/// BPDA on the graph: a tensor whose value is exactly `tx` and whose gradient with respect to `x` is the
/// identity — `(x − x.detach()) + tx`.
pub fn bpda(x: &Tensor, tx: &Tensor) -> Result<Tensor> {
    if x.shape() != tx.shape() {
        return Err(Error::ShapeMismatch { op: "bpda", expected: x.shape().to_vec(), got: tx.shape().to_vec() });
    }
    x.sub(&x.detach())?.add(&tx.detach())
}

impl Classifier for Defended {
    armoury::delegate_classifier!(inner, counters);
    fn chunk_size(&self) -> Option<usize> {
        self.inner.chunk_size()
    }

    /// The inner classifier's: a defense wrapped around a detector-guarded classifier keeps its rejection class.
    fn rejection_class(&self) -> Option<usize> {
        self.inner.rejection_class()
    }

    /// The inner classifier's layers, for a deterministic transform (one draw); none for a randomised one.
    fn layer_names(&self) -> Vec<String> {
        if self.draws() == 1 {
            self.inner.layer_names()
        } else {
            Vec::new()
        }
    }

    /// The inner classifier's activations on the transformed input. A randomised transform (several EOT draws)
    /// has no single activation per input: asking for a layer is then an error.
    fn forward_activations(&self, x: &Tensor, layers: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        if layers.is_empty() {
            return Ok((self.forward(x)?, Vec::new()));
        }
        if self.draws() != 1 {
            return Err(Error::invalid(
                "Defended::activations",
                "a randomised defense averages several draws, so an input has no single activation; tap the inner \
                 classifier on one transformed draw instead",
            ));
        }
        let (z, acts) = self.inner.forward_activations(&self.through(x, 0)?, layers)?;
        let z = match self.average {
            EotAverage::Logits => z,
            EotAverage::Probabilities => z.log_softmax(1)?,
        };
        Ok((z, acts))
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let k = self.draws();
        let mut outs = Vec::with_capacity(k);
        for j in 0..k {
            let z = self.inner.forward(&self.through(x, j)?)?;
            outs.push(match self.average {
                EotAverage::Logits => z,
                EotAverage::Probabilities => z.log_softmax(1)?,
            });
        }
        if k == 1 {
            return Ok(outs.pop().expect("one draw"));
        }
        match self.average {
            EotAverage::Logits => {
                let mut sum = outs[0].clone();
                for z in &outs[1..] {
                    sum = sum.add(z)?;
                }
                Ok(sum.mul_scalar(1.0 / k as f32))
            }
            EotAverage::Probabilities => {
                // log mean_k exp(l_k), shifted by the (constant) elementwise maximum for stability.
                let mut m = outs[0].to_array();
                for z in &outs[1..] {
                    m.zip_mut_with(z.value(), |a, &b| *a = a.max(b));
                }
                let m = Tensor::new(m);
                let mut sum = outs[0].sub(&m)?.exp();
                for z in &outs[1..] {
                    sum = sum.add(&z.sub(&m)?.exp())?;
                }
                Ok(sum.log().add(&m)?.add_scalar(-(k as f32).ln()))
            }
        }
    }
}

/// Checks that bounds are finite with min < max.
pub(crate) fn check_bounds(op: &'static str, bounds: (f32, f32)) -> Result<()> {
    if !(bounds.0.is_finite() && bounds.1.is_finite() && bounds.0 < bounds.1) {
        return Err(Error::invalid(op, format!("bounds {bounds:?} must be finite with min < max")));
    }
    Ok(())
}

/// The batch as contiguous row-major values with its dimensions, after checking it is a finite 4-D batch.
pub(crate) fn batch_values(op: &'static str, x: &Tensor) -> Result<(Vec<f32>, [usize; 4])> {
    let (n, c, h, w) = x.dims4(op)?;
    if !x.all_finite() {
        return Err(Error::NonFinite { op });
    }
    let v = x.value().as_standard_layout().iter().copied().collect();
    Ok((v, [n, c, h, w]))
}

/// Applies `f(image index, image values [C·H·W], output)` to every image in parallel; the output has x's shape.
pub(crate) fn map_images(
    op: &'static str,
    x: &Tensor,
    f: impl Fn(usize, &[f32], &mut [f32]) -> Result<()> + Sync,
) -> Result<Tensor> {
    let (v, [n, c, h, w]) = batch_values(op, x)?;
    let d = c * h * w;
    let mut out = vec![0.0f32; v.len()];
    if d > 0 {
        out.par_chunks_mut(d).zip(v.par_chunks(d)).enumerate().try_for_each(|(i, (o, img))| f(i, img, o))?;
    }
    Tensor::from_vec(out, &[n, c, h, w])
}

/// Applies `f(plane [H·W], h, w, output)` to every channel of every image in parallel.
pub(crate) fn map_planes(
    op: &'static str,
    x: &Tensor,
    f: impl Fn(&[f32], usize, usize, &mut [f32]) + Sync,
) -> Result<Tensor> {
    let (v, [n, c, h, w]) = batch_values(op, x)?;
    let hw = h * w;
    let mut out = vec![0.0f32; v.len()];
    if hw > 0 {
        out.par_chunks_mut(hw).zip(v.par_chunks(hw)).for_each(|(o, p)| f(p, h, w, o));
    }
    Tensor::from_vec(out, &[n, c, h, w])
}

/// scipy.ndimage's default `reflect` boundary (half-sample symmetric, `d c b a | a b c d | d c b a`): the index
/// inside `0..n` that position `i` reads. Any offset is valid (the extension has period 2n).
pub(crate) fn reflect(i: isize, n: usize) -> usize {
    let p = 2 * n as isize;
    let m = i.rem_euclid(p) as usize;
    if m < n {
        m
    } else {
        2 * n - 1 - m
    }
}
