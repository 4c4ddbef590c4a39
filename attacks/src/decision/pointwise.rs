//! The Pointwise attack (Schott, Rauber, Bethge & Brendel 2019, "Towards the first adversarially robust neural
//! network model on MNIST"), an L0 minimiser.

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Result, Tensor};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{check_count, search_samples, Budgeted, Start};
use crate::budget::{exact_norm, Norm};

/// Pointwise (Schott et al. 2019): from an adversarial start, repeatedly visits the changed input values in random
/// order and resets each to its original value if the input stays adversarial, until a full pass resets none
/// (a local L0 minimum). Then, if `refine`, a binary search of `refine_steps` steps moves each remaining changed
/// value toward its original (Foolbox's L2 refinement), in passes until a pass shrinks the L2 distance by less
/// than 1%.
///
/// Every accept/reject decision depends on the previous one, so the queries are sequential (one input each);
/// only the start's search is batched. Values are treated individually (a pixel's channels separately), as L0
/// in [`armoury::Norms`] counts values.
///
/// Budget: `max_queries` oracle inputs per sample, the clean check and the start included; when it runs out the
/// current input (always one the oracle called adversarial) is returned. A sample without a start is returned
/// unchanged. The result never changes more values than its start.
#[derive(Clone, Debug)]
pub struct Pointwise {
    /// Oracle queries per sample, at most.
    pub max_queries: usize,
    /// Where each sample starts (salt-and-pepper noise by default, as in Foolbox).
    pub start: Start,
    /// Binary-search the remaining changed values toward the original after the L0 phase.
    pub refine: bool,
    /// Steps of each value's binary search.
    pub refine_steps: usize,
}

impl Default for Pointwise {
    fn default() -> Self {
        Pointwise {
            max_queries: 5_000,
            start: Start::SaltAndPepper { repeats: 10, search_steps: 10 },
            refine: true,
            refine_steps: 10,
        }
    }
}

impl Pointwise {
    /// The attack on one sample `x` (seed from [`armoury::seed::sample_seed`]) through a label-only view; `i`
    /// is its index for a [`Start::Given`] start.
    pub fn attack_one(&self, v: &Budgeted, x: &[f32], i: usize, seed: u64) -> Result<Vec<f32>> {
        if v.is_adversarial(x)? != Some(false) {
            return Ok(x.to_vec());
        }
        let Some(mut adv) = self.start.find(v, x, i, seed)? else {
            return Ok(x.to_vec());
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x504F_494E_5457_4953);
        let changed = |a: &[f32], rng: &mut ChaCha8Rng| {
            let mut idx: Vec<usize> = (0..x.len()).filter(|&j| a[j] != x[j]).collect();
            idx.shuffle(rng);
            idx
        };
        // L0: reset values while the input stays adversarial.
        loop {
            let mut any = false;
            for j in changed(&adv, &mut rng) {
                let old = adv[j];
                adv[j] = x[j];
                match v.is_adversarial(&adv)? {
                    Some(true) => any = true,
                    Some(false) => adv[j] = old,
                    None => {
                        adv[j] = old;
                        return Ok(adv);
                    }
                }
            }
            if !any {
                break;
            }
        }
        if !self.refine {
            return Ok(adv);
        }
        // L2: binary search of each changed value between the original (not adversarial) and its current value.
        loop {
            let before = exact_norm(Norm::L2, x, &adv);
            for j in changed(&adv, &mut rng) {
                let (mut good, mut bad) = (adv[j], x[j]);
                for _ in 0..self.refine_steps {
                    let mid = (good + bad) / 2.0;
                    if mid == good || mid == bad {
                        break;
                    }
                    adv[j] = mid;
                    match v.is_adversarial(&adv)? {
                        Some(true) => good = mid,
                        Some(false) => bad = mid,
                        None => {
                            adv[j] = good;
                            return Ok(adv);
                        }
                    }
                }
                adv[j] = good;
            }
            if exact_norm(Norm::L2, x, &adv) > 0.99 * before {
                break;
            }
        }
        Ok(adv)
    }
}

impl Algorithm for Pointwise {
    fn name(&self) -> String {
        format!("Pointwise-L0(queries={}, start={}, refine={})", self.max_queries, self.start.describe(), self.refine)
    }

    fn access(&self) -> Access {
        Access::Labels
    }

    /// Minimal in L2: the L0 phase has no [`Norm`] to report, and the refinement minimises L2 (Foolbox's
    /// distance for it); a sweep clips the perturbation found in L2.
    fn budget(&self) -> Budget {
        Budget::Minimal { norm: Norm::L2 }
    }

    fn query_budget(&self) -> Option<u64> {
        Some(self.max_queries as u64)
    }

    fn validate(&self) -> Result<()> {
        self.start.check("pointwise")?;
        if self.refine {
            check_count("pointwise", "refine_steps", self.refine_steps)?;
        }
        Ok(())
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        self.start.check_against("pointwise", p.x)?;
        search_samples(p, self.max_queries, |i, v, xi, s| self.attack_one(v, xi, i, s))
    }
}
