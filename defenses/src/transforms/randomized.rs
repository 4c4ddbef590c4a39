//! Randomized smoothing (Cohen, Rosenfeld & Kolter 2019, "Certified adversarial robustness via randomized
//! smoothing"): the smoothed classifier g(x) = argmax_c P(f(x + ε) = c), ε ~ N(0, σ²I), its Monte-Carlo
//! PREDICT (with abstention) and CERTIFY (certified L2 radius σ·Φ⁻¹(p̲_A)) algorithms, and the "soft" smoothed
//! classifier as a [`Classifier`] for attacking it with EOT.

use std::sync::Arc;

use armoury::attack::sample;
use armoury::classifier::Classifier;
use armoury::seed::normal_vec;
use armoury::seed::sample_seed;
use armoury::{Error, Result, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::stats::{binomial_test_half, clopper_pearson_lower, normal_ppf};
use super::{Defended, EotAverage, GaussianNoise};

/// Settings of randomized smoothing. Noise is never clipped to the bounds (as in the paper).
///
/// Each sample's noise is drawn from its own ChaCha8 generators, one per draw, seeded from `seed`, a stream
/// (selection, estimation or prediction), the draw number and the sample's values
/// ([`armoury::seed::sample_seed`]) — so results do not depend on `batch`, the batch composition or the thread
/// count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandomizedSmoothing {
    /// Noise standard deviation σ in input units, > 0.
    pub sigma: f32,
    /// Draws to select the top class in CERTIFY.
    pub n0: usize,
    /// Draws to estimate (CERTIFY) or to test (PREDICT).
    pub n: usize,
    /// Failure probability α of the certificate or of the prediction test, in (0, 1).
    pub alpha: f64,
    /// Noisy copies per forward pass.
    pub batch: usize,
    /// Seed of the noise.
    pub seed: u64,
}

impl Default for RandomizedSmoothing {
    fn default() -> Self {
        RandomizedSmoothing { sigma: 0.25, n0: 100, n: 10_000, alpha: 0.001, batch: 1000, seed: 0 }
    }
}

/// The outcome of CERTIFY for one sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Certification {
    /// The certified class, `None` when the procedure abstains (p̲_A < ½).
    pub class: Option<usize>,
    /// The certified L2 radius σ·Φ⁻¹(p̲_A) (0 when abstaining).
    pub radius: f32,
    /// How many of the `n` estimation draws gave the selected class.
    pub count: u64,
    /// The Clopper–Pearson lower bound p̲_A on that class's probability under noise.
    pub p_lower: f64,
}

const STREAM_SELECT: u64 = 0;
const STREAM_ESTIMATE: u64 = 1;
const STREAM_PREDICT: u64 = 2;

impl RandomizedSmoothing {
    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        let op = "RandomizedSmoothing";
        if !(self.sigma.is_finite() && self.sigma > 0.0) {
            return Err(Error::invalid(op, format!("sigma {} must be positive and finite", self.sigma)));
        }
        if self.n0 == 0 || self.n == 0 || self.batch == 0 {
            return Err(Error::invalid(
                op,
                format!("n0 {}, n {} and batch {} must be ≥ 1", self.n0, self.n, self.batch),
            ));
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(Error::invalid(op, format!("alpha {} must be in (0, 1)", self.alpha)));
        }
        Ok(())
    }

    /// Class counts of `model`'s predictions on `num` noisy copies of each sample of `x`, from noise stream
    /// `stream`: one row of `num_classes` counts per sample.
    pub fn counts(&self, model: &dyn Classifier, x: &Tensor, num: usize, stream: u64) -> Result<Vec<Vec<u64>>> {
        self.validate()?;
        let n = model.check_input(x)?;
        let shape = x.shape()[1..].to_vec();
        let d: usize = shape.iter().product();
        let mut all = Vec::with_capacity(n);
        for i in 0..n {
            let v = sample(x, i)?;
            let base = sample_seed(self.seed, stream, &v);
            let mut counts = vec![0u64; model.num_classes()];
            let mut start = 0;
            while start < num {
                let b = self.batch.min(num - start);
                let mut buf = vec![0.0f32; b * d];
                buf.par_chunks_mut(d).enumerate().for_each(|(j, out)| {
                    let mut rng = ChaCha8Rng::seed_from_u64(armoury::seed::mix(base ^ (start + j) as u64));
                    let z = normal_vec(&mut rng, d);
                    for ((o, &xv), zv) in out.iter_mut().zip(&v).zip(z) {
                        *o = xv + self.sigma * zv;
                    }
                });
                let mut s = vec![b];
                s.extend_from_slice(&shape);
                for c in model.predict(&Tensor::from_vec(buf, &s)?)? {
                    counts[c] += 1;
                }
                start += b;
            }
            all.push(counts);
        }
        Ok(all)
    }

    /// PREDICT: the top class under `n` noisy draws if a two-sided binomial test of its count against the
    /// runner-up's rejects equality at level α, else `None` (abstain). The probability of returning a class other
    /// than g(x) is at most α.
    pub fn predict(&self, model: &dyn Classifier, x: &Tensor) -> Result<Vec<Option<usize>>> {
        let counts = self.counts(model, x, self.n, STREAM_PREDICT)?;
        Ok(counts
            .iter()
            .map(|c| {
                let (a, b) = top_two(c);
                (binomial_test_half(c[a], c[a] + c[b]) <= self.alpha).then_some(a)
            })
            .collect())
    }

    /// CERTIFY: select the top class with `n0` draws, estimate its probability with `n` fresh draws, bound it
    /// below by the one-sided Clopper–Pearson bound at level α, and certify radius σ·Φ⁻¹(p̲_A) — or abstain when
    /// p̲_A < ½. With probability at least 1 − α, g is constant within that L2 radius.
    pub fn certify(&self, model: &dyn Classifier, x: &Tensor) -> Result<Vec<Certification>> {
        let select = self.counts(model, x, self.n0, STREAM_SELECT)?;
        let estimate = self.counts(model, x, self.n, STREAM_ESTIMATE)?;
        Ok(select
            .iter()
            .zip(&estimate)
            .map(|(s, e)| {
                let (a, _) = top_two(s);
                let p_lower = clopper_pearson_lower(e[a], self.n as u64, self.alpha);
                if p_lower < 0.5 {
                    Certification { class: None, radius: 0.0, count: e[a], p_lower }
                } else {
                    let radius = (self.sigma as f64 * normal_ppf(p_lower)) as f32;
                    Certification { class: Some(a), radius, count: e[a], p_lower }
                }
            })
            .collect())
    }

    /// The soft smoothed classifier (the mean of the softmax over `eot_samples` Gaussian draws, as
    /// log-probabilities; Salman et al. 2019) as a [`Classifier`] whose gradients are EOT averages — what
    /// white-box attacks on a smoothed model run against.
    pub fn classifier(&self, model: Arc<dyn Classifier>, eot_samples: usize) -> Result<Defended> {
        self.validate()?;
        let noise = GaussianNoise { sigma: self.sigma, clip: false };
        Ok(Defended::shared(model, Arc::new(noise))?
            .with_eot(eot_samples, self.seed)?
            .with_average(EotAverage::Probabilities))
    }
}

/// Indices of the largest and second-largest counts (first maximum wins ties).
fn top_two(c: &[u64]) -> (usize, usize) {
    let mut a = 0;
    for (i, &v) in c.iter().enumerate() {
        if v > c[a] {
            a = i;
        }
    }
    let mut b = usize::from(a == 0);
    for (i, &v) in c.iter().enumerate() {
        if i != a && v > c[b] {
            b = i;
        }
    }
    (a, b)
}

/// Certified accuracy at each radius: the fraction of samples whose certified class is the true label with a
/// radius of at least `r` (Cohen et al.'s metric; abstentions count as wrong).
pub fn certified_accuracy(radii: &[f32], certs: &[Certification], labels: &[usize]) -> Result<Vec<f32>> {
    if certs.len() != labels.len() || certs.is_empty() {
        return Err(Error::ShapeMismatch {
            op: "certified_accuracy",
            expected: vec![labels.len()],
            got: vec![certs.len()],
        });
    }
    Ok(radii
        .iter()
        .map(|&r| {
            let ok = certs.iter().zip(labels).filter(|(c, &l)| c.class == Some(l) && c.radius >= r).count();
            ok as f32 / labels.len() as f32
        })
        .collect())
}
