//! The Boundary attack (Brendel, Rauber & Bethge 2018, "Decision-Based Adversarial Attacks: Reliable Attacks
//! Against Black-Box Machine Learning Models").

use std::collections::VecDeque;

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Error, Result, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{boundary_search, search_samples, Budgeted, Start};
use crate::budget::{exact_norm, Norm};

/// The Boundary attack (Brendel et al. 2018), L2: a random walk along the decision boundary that shrinks the
/// distance to the original.
///
/// Each step draws a Gaussian direction orthogonal to the source direction x* − x̃, scales it to
/// `spherical_step`·‖x* − x̃‖ and projects it back onto the sphere around x* (the orthogonal step), then moves
/// `source_step`·‖x* − x̃‖ toward x* (the source step); the candidate is kept if adversarial and closer. Every
/// `update_every` steps the orthogonal candidate alone is queried as well (in the same batch) and the step sizes
/// adapt to the success rates (Foolbox 3's schedule: orthogonal success over the last 100 checks above 0.5 →
/// both steps ×`step_adaptation`, below 0.2 → ÷; source-step success over the last 30 above 0.25 → source step ×,
/// below 0.1 → ÷). The attack stops when the source step falls below `convergence`.
///
/// The start is an adversarial uniform-noise image (or salt-and-pepper noise, or a given input) blended toward
/// x* by a binary search on the blend factor (tolerance 10⁻³) — Foolbox's linear search replaced by a binary one.
///
/// Budget: `max_queries` oracle inputs per sample, the clean check and the start included; the attack stops when
/// the budget or `steps` steps are spent. The best adversarial input found is returned.
#[derive(Clone, Debug)]
pub struct BoundaryAttack {
    /// Oracle queries per sample, at most.
    pub max_queries: usize,
    /// Steps at most.
    pub steps: usize,
    /// Initial orthogonal step, relative to the current distance.
    pub spherical_step: f32,
    /// Initial step toward the original, relative to the current distance.
    pub source_step: f32,
    /// Factor of the step-size adaptation.
    pub step_adaptation: f32,
    /// Steps between success-rate checks.
    pub update_every: usize,
    /// Stop when the source step falls below this.
    pub convergence: f32,
    /// Where each sample starts.
    pub start: Start,
}

impl Default for BoundaryAttack {
    /// Foolbox 3's settings (25,000 steps at most), within 10,000 queries.
    fn default() -> Self {
        BoundaryAttack {
            max_queries: 10_000,
            steps: 25_000,
            spherical_step: 1e-2,
            source_step: 1e-2,
            step_adaptation: 1.5,
            update_every: 10,
            convergence: 1e-7,
            start: Start::Noise { trials: 100 },
        }
    }
}

impl BoundaryAttack {
    /// The attack on one sample `x` (seed from [`armoury::seed::sample_seed`]) through a label-only view; `i`
    /// is its index for a [`Start::Given`] start. Returns the closest adversarial input found, or `x`.
    pub fn attack_one(&self, v: &Budgeted, x: &[f32], i: usize, seed: u64) -> Result<Vec<f32>> {
        if v.is_adversarial(x)? != Some(false) {
            return Ok(x.to_vec());
        }
        let Some(start) = self.start.find(v, x, i, seed)? else {
            return Ok(x.to_vec());
        };
        let (mut best, mut best_dist) = boundary_search(v, Norm::L2, x, vec![start], 1e-3)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x424F_554E_4441_5259);
        let (lo, hi) = v.bounds();
        let d = x.len();
        let (mut spherical, mut source) = (self.spherical_step as f64, self.source_step as f64);
        let mut stats_spherical: VecDeque<bool> = VecDeque::with_capacity(100);
        let mut stats_step: VecDeque<bool> = VecDeque::with_capacity(30);
        let a = self.step_adaptation as f64;
        for step in 0..self.steps {
            if v.remaining() == 0 || best_dist == 0.0 || source < self.convergence as f64 {
                break;
            }
            // Orthogonal step: η ⟂ (x* − x̃), ‖η‖ = spherical·‖x* − x̃‖, back onto the sphere by Pythagoras.
            let src: Vec<f64> = x.iter().zip(&best).map(|(&o, &b)| o as f64 - b as f64).collect();
            let src_norm = best_dist;
            let mut eta: Vec<f64> = armoury::seed::normal_vec(&mut rng, d).into_iter().map(f64::from).collect();
            let dot: f64 = eta.iter().zip(&src).map(|(e, s)| e * s).sum::<f64>() / (src_norm * src_norm);
            eta.iter_mut().zip(&src).for_each(|(e, s)| *e -= dot * s);
            let eta_norm = eta.iter().map(|e| e * e).sum::<f64>().sqrt().max(1e-12);
            let scale = spherical * src_norm / eta_norm;
            let shrink = 1.0 / (spherical * spherical + 1.0).sqrt();
            let sph: Vec<f32> = x
                .iter()
                .zip(&eta)
                .zip(&src)
                .map(|((&o, &e), &s)| ((o as f64 + shrink * (e * scale - s)) as f32).clamp(lo, hi))
                .collect();
            // Source step toward x*, correcting for the sphere's numerical deviation.
            let new_src: Vec<f64> = x.iter().zip(&sph).map(|(&o, &c)| o as f64 - c as f64).collect();
            let new_norm = new_src.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
            let length = (source * src_norm + new_norm - src_norm).max(0.0) / new_norm;
            let cand: Vec<f32> =
                sph.iter().zip(&new_src).map(|(&c, &s)| ((c as f64 + length * s) as f32).clamp(lo, hi)).collect();
            let check = step % self.update_every == 0;
            let mut flat = cand.clone();
            if check {
                flat.extend_from_slice(&sph);
            }
            let ok = v.adversarial(&flat)?;
            let Some(&cand_adv) = ok.first() else { break };
            if cand_adv {
                let dist = exact_norm(Norm::L2, x, &cand);
                if dist < best_dist {
                    best = cand;
                    best_dist = dist;
                }
            }
            if let (true, Some(&sph_adv)) = (check, ok.get(1)) {
                push(&mut stats_spherical, 100, sph_adv);
                push(&mut stats_step, 30, cand_adv);
                if stats_spherical.len() == 100 {
                    let p = rate(&stats_spherical);
                    if p > 0.5 {
                        spherical *= a;
                        source *= a;
                        stats_spherical.clear();
                    } else if p < 0.2 {
                        spherical /= a;
                        source /= a;
                        stats_spherical.clear();
                    }
                }
                if stats_step.len() == 30 {
                    let p = rate(&stats_step);
                    if p > 0.25 {
                        source *= a;
                        stats_step.clear();
                    } else if p < 0.1 {
                        source /= a;
                        stats_step.clear();
                    }
                }
            }
        }
        Ok(best)
    }
}

fn push(q: &mut VecDeque<bool>, cap: usize, v: bool) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(v);
}

fn rate(q: &VecDeque<bool>) -> f64 {
    q.iter().filter(|&&b| b).count() as f64 / q.len().max(1) as f64
}

impl Algorithm for BoundaryAttack {
    fn name(&self) -> String {
        format!("Boundary-L2(queries={}, steps={}, start={})", self.max_queries, self.steps, self.start.describe())
    }

    fn access(&self) -> Access {
        Access::Labels
    }

    fn budget(&self) -> Budget {
        Budget::Minimal { norm: Norm::L2 }
    }

    fn query_budget(&self) -> Option<u64> {
        Some(self.max_queries as u64)
    }

    fn validate(&self) -> Result<()> {
        let op = "boundary_attack";
        crate::budget::check_positive(op, "spherical_step", self.spherical_step)?;
        crate::budget::check_positive(op, "source_step", self.source_step)?;
        if !(self.step_adaptation > 1.0 && self.step_adaptation.is_finite()) {
            return Err(Error::invalid(op, format!("step adaptation {} must be > 1", self.step_adaptation)));
        }
        super::check_count(op, "update_every", self.update_every)?;
        if self.convergence.is_nan() || self.convergence < 0.0 {
            return Err(Error::invalid(op, "convergence must be ≥ 0"));
        }
        self.start.check(op)
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        self.start.check_against("boundary_attack", p.x)?;
        search_samples(p, self.max_queries, |i, v, xi, s| self.attack_one(v, xi, i, s))
    }
}
