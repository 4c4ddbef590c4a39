//! Salt-and-pepper noise with a search on the noise fraction (as Foolbox's `SaltAndPepperNoiseAttack`, Rauber et
//! al. 2017, used as the starting point of the Pointwise attack of Schott et al. 2019).

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{check_count, search_samples, Budgeted};
use crate::budget::{exact_norm, Norm};

/// Salt-and-pepper noise: a fraction p of the pixels set to the lower bound (pepper, p/2) or the upper bound
/// (salt, p/2), the same across a pixel's channels.
///
/// p grows geometrically (2⁻⁸, 2⁻⁷, …, 1) with `repeats` draws per fraction, queried in one batch, and stops at
/// the first fraction where a draw is adversarial (early stop on success); then `search_steps` rounds of binary
/// search on p between the last failing and the first succeeding fraction, `repeats` draws per round. The
/// adversarial draw with the smallest L2 perturbation is kept; a sample never made adversarial is returned
/// unchanged.
///
/// Budget: `max_queries` oracle inputs per sample, the clean check included; a batch of draws is clipped to what
/// is left. At most 1 + 9·repeats + search_steps·repeats are used.
#[derive(Clone, Debug)]
pub struct SaltAndPepper {
    /// Oracle queries per sample, at most.
    pub max_queries: usize,
    /// Draws per noise fraction (one batched query).
    pub repeats: usize,
    /// Binary-search rounds on the fraction after the first success.
    pub search_steps: usize,
}

impl Default for SaltAndPepper {
    fn default() -> Self {
        SaltAndPepper { max_queries: 1_000, repeats: 10, search_steps: 10 }
    }
}

/// Stream tag of the draws' generator.
const STREAM: u64 = 0x5341_4C54_5045_5050;

/// The attack on one sample through a label-only view (seed from [`armoury::seed::sample_seed`]); the clean
/// input is queried first only if `check_clean` (a caller that already knows it is not adversarial skips it).
pub(crate) fn salt_and_pepper(
    v: &Budgeted,
    x: &[f32],
    repeats: usize,
    search_steps: usize,
    seed: u64,
    check_clean: bool,
) -> Result<Vec<f32>> {
    if check_clean && v.is_adversarial(x)? != Some(false) {
        return Ok(x.to_vec());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ STREAM);
    let shape = v.input_shape();
    let channels = if shape.len() == 3 { shape[0] } else { 1 };
    let positions = x.len() / channels;
    let (lo, hi) = v.bounds();
    let d = x.len();
    let draw = |p: f64, rng: &mut ChaCha8Rng| -> Vec<f32> {
        let mut flat = Vec::with_capacity(repeats * d);
        for _ in 0..repeats {
            let mut y = x.to_vec();
            for pos in 0..positions {
                let u = rng.random::<f64>();
                let value = if u < p / 2.0 {
                    lo
                } else if u >= 1.0 - p / 2.0 {
                    hi
                } else {
                    continue;
                };
                (0..channels).for_each(|c| y[c * positions + pos] = value);
            }
            flat.extend(y);
        }
        flat
    };
    let mut best: Option<(Vec<f32>, f64)> = None;
    // Returns whether any draw was adversarial, keeping the closest.
    let try_fraction = |p: f64, rng: &mut ChaCha8Rng, best: &mut Option<(Vec<f32>, f64)>| -> Result<bool> {
        let flat = draw(p, rng);
        let ok = v.adversarial(&flat)?;
        let mut any = false;
        for (j, _) in ok.iter().enumerate().filter(|(_, &a)| a) {
            any = true;
            let cand = &flat[j * d..(j + 1) * d];
            let dist = exact_norm(Norm::L2, x, cand);
            let closer = match best {
                Some(b) => dist < b.1,
                None => true,
            };
            if closer {
                *best = Some((cand.to_vec(), dist));
            }
        }
        Ok(any)
    };
    let (mut low, mut high) = (0.0f64, None);
    for k in 0..=8 {
        if v.remaining() == 0 {
            break;
        }
        let p = 2f64.powi(k - 8);
        if try_fraction(p, &mut rng, &mut best)? {
            high = Some(p);
            break;
        }
        low = p;
    }
    if let Some(mut high) = high {
        for _ in 0..search_steps {
            if v.remaining() == 0 {
                break;
            }
            let mid = (low + high) / 2.0;
            if try_fraction(mid, &mut rng, &mut best)? {
                high = mid;
            } else {
                low = mid;
            }
        }
    }
    Ok(best.map_or_else(|| x.to_vec(), |b| b.0))
}

impl Algorithm for SaltAndPepper {
    fn name(&self) -> String {
        format!("SaltAndPepper(queries={}, repeats={}, search={})", self.max_queries, self.repeats, self.search_steps)
    }

    fn access(&self) -> Access {
        Access::Labels
    }

    /// Unbounded: the attack minimises the number of changed pixels, which no [`Norm`] measures (there is no
    /// L0 budget), so only the bounds are enforced and there is no sweep.
    fn budget(&self) -> Budget {
        Budget::Unbounded
    }

    fn query_budget(&self) -> Option<u64> {
        Some(self.max_queries as u64)
    }

    fn validate(&self) -> Result<()> {
        check_count("salt_and_pepper", "repeats", self.repeats)
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        search_samples(p, self.max_queries, |_, v, xi, s| {
            salt_and_pepper(v, xi, self.repeats, self.search_steps, s, true)
        })
    }
}
