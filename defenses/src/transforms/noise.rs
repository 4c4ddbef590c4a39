//! Additive Gaussian noise: the random transform behind randomized smoothing.

use armoury::seed::normal_vec;
use armoury::seed::sample_seed;
use armoury::{Error, Result, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{batch_values, check_bounds, Transform};

/// `x + σ·ε`, ε ~ N(0, I), drawn per sample from a ChaCha8 generator seeded with
/// `sample_seed(draw, 0, sample values)`; optionally clipped to the bounds. Random (EOT) and differentiable: the
/// noise is a constant added on the graph, so the gradient is exact.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GaussianNoise {
    /// Noise standard deviation in input units, > 0.
    pub sigma: f32,
    /// Clip the noisy input to the classifier's bounds (Cohen et al. do not).
    pub clip: bool,
}

impl Default for GaussianNoise {
    fn default() -> Self {
        GaussianNoise { sigma: 0.25, clip: false }
    }
}

impl GaussianNoise {
    /// The noise for every sample of `x` under `draw` (a constant tensor of x's shape).
    pub fn noise(&self, x: &Tensor, draw: u64) -> Result<Tensor> {
        let (v, [n, c, h, w]) = batch_values("GaussianNoise", x)?;
        let d = c * h * w;
        let mut out = Vec::with_capacity(v.len());
        for i in 0..n {
            let mut rng = ChaCha8Rng::seed_from_u64(sample_seed(draw, 0, &v[i * d..(i + 1) * d]));
            out.extend(normal_vec(&mut rng, d).into_iter().map(|z| z * self.sigma));
        }
        Tensor::from_vec(out, &[n, c, h, w])
    }
}

impl Transform for GaussianNoise {
    fn name(&self) -> String {
        format!("GaussianNoise(sigma={}{})", self.sigma, if self.clip { ", clip" } else { "" })
    }

    fn is_random(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<()> {
        if !(self.sigma.is_finite() && self.sigma > 0.0) {
            return Err(Error::invalid("GaussianNoise", format!("sigma {} must be positive and finite", self.sigma)));
        }
        Ok(())
    }

    fn apply(&self, x: &Tensor, bounds: (f32, f32), draw: u64) -> Result<Tensor> {
        let y = armoury::no_grad(|| self.differentiable(&x.detach(), bounds, draw).expect("always differentiable"))?;
        Ok(y.detach())
    }

    fn differentiable(&self, x: &Tensor, bounds: (f32, f32), draw: u64) -> Option<Result<Tensor>> {
        let run = || {
            self.validate()?;
            check_bounds("GaussianNoise", bounds)?;
            let y = x.add(&self.noise(x, draw)?)?;
            Ok(if self.clip { y.clamp(bounds.0, bounds.1) } else { y })
        };
        Some(run())
    }
}
