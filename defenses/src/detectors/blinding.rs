//! Query blinding (Chen, Carlini & Wagner 2020, "Stateful Detection of Black-Box Adversarial Attacks", §6): the
//! adaptive attacker against a stateful detector transforms every query at random before sending it, so that
//! the queries of one attack no longer lie close together in the detector's encoding space.

use std::sync::Arc;

use armoury::classifier::{Classifier, Counters};
use armoury::seed::sample_seed;
use armoury::{Error, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The attacker's view of a watched model (e.g. [`super::Monitored`]): every query `x` is sent as
/// `clip(x + U[−r, r]^d)` — the paper's additive-noise blinding — and the answer to the noisy query is returned.
/// Query i's noise comes from `sample_seed(seed, 0, values of query i)`, so the same query is always blinded the
/// same way, whatever the batch. Gradients (for attacks that take them) pass straight through the noise.
pub struct QueryBlinding {
    inner: Arc<dyn Classifier>,
    radius: f32,
    seed: u64,
    counters: Counters,
}

impl QueryBlinding {
    /// Blinds the queries to `inner` with uniform noise of L∞ radius `radius` (finite, ≥ 0; input units).
    pub fn new(inner: Arc<dyn Classifier>, radius: f32, seed: u64) -> Result<QueryBlinding> {
        if !(radius.is_finite() && radius >= 0.0) {
            return Err(Error::invalid("QueryBlinding", format!("radius {radius} is not finite and ≥ 0")));
        }
        Ok(QueryBlinding { inner, radius, seed, counters: Counters::default() })
    }

    /// The noise radius r.
    pub fn radius(&self) -> f32 {
        self.radius
    }

    /// The query `x` as it is sent: each row plus its own uniform noise, clipped to the bounds.
    pub fn blind(&self, x: &Tensor) -> Result<Tensor> {
        let n = self.inner.check_input(x)?;
        let v: Vec<f32> = x.value().as_standard_layout().iter().copied().collect();
        let d = v.len() / n.max(1);
        let (lo, hi) = self.inner.bounds();
        let mut noise = Vec::with_capacity(v.len());
        for row in v.chunks_exact(d.max(1)) {
            let mut rng = ChaCha8Rng::seed_from_u64(sample_seed(self.seed, 0, row));
            noise.extend(row.iter().map(|&p| {
                let u = if self.radius > 0.0 { rng.random_range(-self.radius..=self.radius) } else { 0.0 };
                (p + u).clamp(lo, hi) - p
            }));
        }
        // x + (blinded − x): the value is the blinded query, the gradient that of x.
        x.add(&Tensor::from_vec(noise, x.shape())?)
    }
}

impl Classifier for QueryBlinding {
    armoury::delegate_classifier!(inner, counters);
    fn chunk_size(&self) -> Option<usize> {
        self.inner.chunk_size()
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.inner.forward(&self.blind(x)?)
    }
}
