//! Region-based classification (Cao & Gong 2017, "Mitigating evasion attacks to deep neural networks via
//! region-based classification"): the label most of m random points in the hypercube of radius r around the
//! input get, with r fitted on clean data.
//!
//! MindArmour's `RegionBasedDetector` adds one random scalar per image; here every pixel of every copy gets its
//! own uniform noise in [−r, r] (then clipped to the bounds), as the paper samples the hypercube.

use std::sync::Arc;

use armoury::classifier::{argmax_rows, Classifier, Counters};
use armoury::seed::{derive, sample_seed};
use armoury::{grad_enabled, no_grad, Detector, Error, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{check_batch, in_pieces, with_value};

/// The region-based classifier over `inner`, also usable as a detector.
///
/// As a [`Classifier`] its outputs are the vote fractions `[N, K]` over `samples` noisy copies (argmax: the
/// majority label, ties to the lowest class). For a tracked input the gradient is that of the mean logits of
/// the first `eot_samples` copies (EOT, Athalye et al. 2018) while the value stays the vote: an attack
/// differentiates the expectation over the noise and is judged by the vote.
///
/// As a [`Detector`] its score is the fraction of the copies whose label differs from `inner`'s label of the
/// input itself: adversarial inputs lie near a decision boundary, so their neighbourhood disagrees with them.
///
/// Copy k of sample i draws its noise from `sample_seed(derive(seed, k), 0, values of sample i)`, so results do
/// not depend on the batch, the order or the thread count.
pub struct RegionClassifier {
    inner: Arc<dyn Classifier>,
    radius: f32,
    samples: usize,
    eot_samples: usize,
    seed: u64,
    threshold: Option<f32>,
    counters: Counters,
}

impl RegionClassifier {
    /// The region classifier of radius `radius` (≥ 0, input units) voting over `samples` (≥ 1) copies.
    pub fn new(inner: Arc<dyn Classifier>, radius: f32, samples: usize, seed: u64) -> Result<RegionClassifier> {
        check_radius(radius)?;
        if samples == 0 {
            return Err(Error::invalid("RegionClassifier::new", "at least one sample is needed"));
        }
        Ok(RegionClassifier {
            inner,
            radius,
            samples,
            eot_samples: samples.min(8),
            seed,
            threshold: None,
            counters: Counters::default(),
        })
    }

    /// Sets how many copies the gradient averages (1..=samples).
    pub fn with_eot_samples(mut self, eot: usize) -> Result<RegionClassifier> {
        if eot == 0 || eot > self.samples {
            return Err(Error::invalid("RegionClassifier", format!("{eot} EOT samples of {}", self.samples)));
        }
        self.eot_samples = eot;
        Ok(self)
    }

    /// The radius r.
    pub fn radius(&self) -> f32 {
        self.radius
    }

    /// Copies per vote.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// The classifier voted over.
    pub fn inner(&self) -> &dyn Classifier {
        self.inner.as_ref()
    }

    /// Copy `k` of every sample of `x`: `clip(x + U[−r, r]^d)`.
    fn noisy(&self, x: &Tensor, k: usize) -> Result<Tensor> {
        let (n, c, h, w) = check_batch("RegionClassifier", x)?;
        let d = c * h * w;
        let v = x.value().as_standard_layout().iter().copied().collect::<Vec<f32>>();
        let mut noise = Vec::with_capacity(n * d);
        for i in 0..n {
            let mut rng =
                ChaCha8Rng::seed_from_u64(sample_seed(derive(self.seed, k as u64), 0, &v[i * d..(i + 1) * d]));
            noise.extend((0..d).map(|_| rng.random_range(-self.radius..=self.radius)));
        }
        let (lo, hi) = self.inner.bounds();
        Ok(x.add(&Tensor::from_vec(noise, x.shape())?)?.clamp(lo, hi))
    }

    /// The votes `[N][K]` of the copies of `x`.
    pub fn votes(&self, x: &Tensor) -> Result<Vec<Vec<u32>>> {
        let n = check_batch("RegionClassifier", x)?.0;
        let k = self.inner.num_classes();
        let mut votes = vec![vec![0u32; k]; n];
        let x = x.detach();
        for s in 0..self.samples {
            let z = no_grad(|| self.inner.forward(&self.noisy(&x, s)?))?;
            for (i, p) in argmax_rows(&matrix(&z)?).into_iter().enumerate() {
                votes[i][p.min(k - 1)] += 1;
            }
        }
        Ok(votes)
    }

    /// Fits the radius as Cao & Gong do: the largest of `radii` whose region classifier's accuracy on the clean
    /// `x`, `labels` is at least the point classifier's minus `tolerance`; sets and returns it (0 if none is).
    pub fn fit_radius(&mut self, x: &Tensor, labels: &[usize], radii: &[f32], tolerance: f32) -> Result<f32> {
        if labels.len() != check_batch("RegionClassifier::fit_radius", x)?.0 {
            return Err(Error::invalid("RegionClassifier::fit_radius", "one label per image"));
        }
        let accuracy =
            |pred: Vec<usize>| pred.iter().zip(labels).filter(|(p, l)| p == l).count() as f32 / labels.len() as f32;
        let base = accuracy(self.inner.predict(x)?);
        let mut sorted: Vec<f32> = radii.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let original = self.radius;
        for r in sorted {
            check_radius(r)?;
            self.radius = r;
            if accuracy(self.predict(x)?) >= base - tolerance {
                return Ok(r);
            }
        }
        self.radius = if radii.is_empty() { original } else { 0.0 };
        Ok(self.radius)
    }
}

fn matrix(z: &Tensor) -> Result<ndarray::Array2<f32>> {
    z.value()
        .as_standard_layout()
        .to_owned()
        .into_dimensionality()
        .map_err(|_| Error::invalid("RegionClassifier", "logits are not a matrix"))
}

fn check_radius(r: f32) -> Result<()> {
    if !(r.is_finite() && r >= 0.0) {
        return Err(Error::invalid("RegionClassifier", format!("radius {r} must be finite and ≥ 0")));
    }
    Ok(())
}

impl Classifier for RegionClassifier {
    armoury::delegate_classifier!(inner, counters);
    fn chunk_size(&self) -> Option<usize> {
        self.inner.chunk_size()
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let votes = self.votes(x)?;
        let (n, k) = (votes.len(), self.inner.num_classes());
        let m = self.samples as f32;
        let fractions: Vec<f32> = votes.iter().flat_map(|v| v.iter().map(|&c| c as f32 / m)).collect();
        if !(grad_enabled() && x.is_tracked()) {
            return Tensor::from_vec(fractions, &[n, k]);
        }
        let mut sum: Option<Tensor> = None;
        for s in 0..self.eot_samples {
            let z = self.inner.forward(&self.noisy(x, s)?)?;
            sum = Some(match sum {
                None => z,
                Some(a) => a.add(&z)?,
            });
        }
        let eot = sum.expect("at least one EOT sample").mul_scalar(1.0 / self.eot_samples as f32);
        with_value(&eot, fractions)
    }
}

impl Detector for RegionClassifier {
    fn name(&self) -> &str {
        "region"
    }
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        self.inner.check_input(x)?;
        let m = self.samples as f32;
        in_pieces(x, |xc| {
            let z = no_grad(|| self.inner.forward(xc))?;
            let point = argmax_rows(&matrix(&z)?);
            let votes = self.votes(xc)?;
            Ok(votes.iter().zip(point).map(|(v, p)| 1.0 - v[p.min(v.len() - 1)] as f32 / m).collect())
        })
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.threshold = Some(threshold);
    }
}
