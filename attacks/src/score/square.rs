//! Square Attack (Andriushchenko et al., ECCV 2020): random search over square-shaped updates at the vertices of
//! the L∞ ball (or with pseudo-Gaussian square patterns on the L2 sphere), accepted when the margin loss falls.

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Error, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use ndarray::ArrayView1;

use super::{rand_sign, search_lockstep, Ctx, Queries, Stepper};
use crate::budget::{Epsilon, Norm};

/// Square Attack, L∞ or L2, with the paper's schedule of square sizes.
///
/// One query per iteration; the iterations of all samples run in lockstep, so that each step's candidates go to
/// the model as one batch (results as if each sample ran alone). The loss is
/// the margin on log-probabilities for both goals (the paper uses cross-entropy for targeted runs; the margin
/// is what the official code uses untargeted and gives a clean success test). The schedule of the fraction
/// `p` of pixels changed is the official one, rescaled to the query budget (halving at 10, 50, 200, 500, 1000,
/// 2000, 4000, 6000 and 8000 of 10,000 iterations). Best-so-far is kept by construction (only improvements are
/// accepted); the attack stops at the first success.
#[derive(Clone, Debug)]
pub struct SquareAttack {
    /// L∞ or L2.
    pub norm: Norm,
    /// The budget ε.
    pub eps: Epsilon,
    /// Queries per sample, including the clean query and the initialisation.
    pub max_queries: u64,
    /// Initial fraction of pixels in a square (`p_init`).
    pub p_init: f32,
}

impl SquareAttack {
    /// L∞ Square Attack with `p_init` = 0.8 (ART's default) and 1,000 queries. On the fixture cnn (first 200
    /// test images, ε = 0.1) `p_init` 0.8 leaves 0.105–0.11 robust accuracy over seeds, 0.3 0.10–0.115 and 0.1
    /// 0.13–0.14.
    pub fn linf(eps: f32) -> SquareAttack {
        SquareAttack { norm: Norm::Linf, eps: Epsilon::Scalar(eps), max_queries: 1000, p_init: 0.8 }
    }

    /// L2 Square Attack with `p_init` = 0.1 and 1,000 queries.
    pub fn l2(eps: f32) -> SquareAttack {
        SquareAttack { norm: Norm::L2, p_init: 0.1, ..SquareAttack::linf(eps) }
    }

    /// The fraction of pixels at iteration `it` of `n_iters` (official `p_selection`).
    fn p_at(&self, it: u64, n_iters: u64) -> f32 {
        let it = (it as f64 / n_iters.max(1) as f64 * 10000.0) as u64;
        let div = match it {
            0..=10 => 1.0,
            11..=50 => 2.0,
            51..=200 => 4.0,
            201..=500 => 8.0,
            501..=1000 => 16.0,
            1001..=2000 => 32.0,
            2001..=4000 => 64.0,
            4001..=6000 => 128.0,
            6001..=8000 => 256.0,
            8001..=10000 => 512.0,
            _ => 1.0,
        };
        self.p_init / div
    }

    /// The L∞ starting point: vertical stripes, one sign per channel and column, in the ε-box.
    fn init_linf(&self, ctx: &Ctx, rng: &mut ChaCha8Rng) -> Vec<f32> {
        let (c, h, w) = ctx.chw;
        let mut start = ctx.x.clone();
        for ch in 0..c {
            for col in 0..w {
                let s = rand_sign(rng) * ctx.eps;
                for row in 0..h {
                    let j = (ch * h + row) * w + col;
                    start[j] = ctx.x[j] + s;
                }
            }
        }
        ctx.clamp_box(&mut start);
        start
    }

    /// The L2 starting point: a grid of pseudo-Gaussian squares of side h/5 with random signs per channel.
    fn init_l2(&self, ctx: &Ctx, rng: &mut ChaCha8Rng) -> Vec<f32> {
        let (c, h, w) = ctx.chw;
        let idx = |ch: usize, r: usize, col: usize| (ch * h + r) * w + col;
        let mut delta = vec![0.0f32; ctx.dim()];
        let s0 = (h / 5).max(1);
        let sp = (h - s0 * (h / s0)) / 2;
        let mut ch_ = sp;
        for _ in 0..h / s0 {
            let mut cw = sp;
            for _ in 0..w / s0 {
                let pert = meta_pseudo_gaussian(s0, rng);
                for ch in 0..c {
                    let sign = rand_sign(rng);
                    for a in 0..s0 {
                        for b in 0..s0 {
                            if ch_ + a < h && cw + b < w {
                                delta[idx(ch, ch_ + a, cw + b)] += pert[a * s0 + b] * sign;
                            }
                        }
                    }
                }
                cw += s0;
            }
            ch_ += s0;
        }
        self.l2_point(ctx, &delta)
    }

    /// The L∞ candidate of iteration `it` into `cand`: `best` with one square window moved to a vertex of the
    /// box (one random sign per channel), resampled until the window changes something (at most 10 tries; the
    /// official code loops until it does).
    fn next_linf(&self, ctx: &Ctx, it: u64, n_iters: u64, rng: &mut ChaCha8Rng, best: &[f32], cand: &mut [f32]) {
        let (c, h, w) = ctx.chw;
        let p = self.p_at(it, n_iters);
        let s = ((p * (h * w) as f32).sqrt().round() as usize).clamp(1, h.min(w).saturating_sub(1).max(1));
        let top = rng.random_range(0..=(h - s).saturating_sub(1));
        let left = rng.random_range(0..=(w - s).saturating_sub(1));
        cand.copy_from_slice(best);
        for _ in 0..10 {
            for ch in 0..c {
                let v = rand_sign(rng) * ctx.eps;
                for r in top..top + s {
                    for col in left..left + s {
                        let j = (ch * h + r) * w + col;
                        cand[j] = (ctx.x[j] + v).clamp(ctx.lo[j], ctx.hi[j]);
                    }
                }
            }
            if cand != best {
                break;
            }
        }
    }

    /// The L2 candidate of iteration `it`: the perturbation's mass in a second window moves into a first one,
    /// as a new pseudo-Gaussian square scaled to keep ‖δ‖₂ = ε (the official update).
    fn next_l2(&self, ctx: &Ctx, it: u64, n_iters: u64, rng: &mut ChaCha8Rng, best: &[f32]) -> Vec<f32> {
        let (c, h, w) = ctx.chw;
        let idx = |ch: usize, r: usize, col: usize| (ch * h + r) * w + col;
        let mut dc: Vec<f32> = best.iter().zip(&ctx.x).map(|(a, b)| a - b).collect();
        let p = self.p_at(it, n_iters);
        let mut s = ((p * (h * w) as f32).sqrt().round() as usize).max(3).min(h.min(w).saturating_sub(1)).max(1);
        if s % 2 == 0 {
            s = if s + 1 < h.min(w) { s + 1 } else { s - 1 };
        }
        let (r1, c1) = (rng.random_range(0..(h - s).max(1)), rng.random_range(0..(w - s).max(1)));
        let (r2, c2) = (rng.random_range(0..(h - s).max(1)), rng.random_range(0..(w - s).max(1)));
        let in1 = |r: usize, col: usize| r >= r1 && r < r1 + s && col >= c1 && col < c1 + s;
        let in2 = |r: usize, col: usize| r >= r2 && r < r2 + s && col >= c2 && col < c2 + s;
        let image_norm2: f64 = dc.iter().map(|v| (*v as f64).powi(2)).sum();
        let pert = meta_pseudo_gaussian(s, rng);
        for ch in 0..c {
            let (mut win1, mut both) = (0.0f64, 0.0f64);
            for r in 0..h {
                for col in 0..w {
                    let v = (dc[idx(ch, r, col)] as f64).powi(2);
                    if in1(r, col) {
                        win1 += v;
                    }
                    if in1(r, col) || in2(r, col) {
                        both += v;
                    }
                }
            }
            let sign = rand_sign(rng) as f64;
            let mut new: Vec<f64> = (0..s * s)
                .map(|k| pert[k] as f64 * sign + dc[idx(ch, r1 + k / s, c1 + k % s)] as f64 / (1e-10 + win1.sqrt()))
                .collect();
            let nn = new.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
            let avail = ((ctx.eps as f64).powi(2) - image_norm2).max(0.0) / c as f64 + both;
            new.iter_mut().for_each(|v| *v = *v / nn * avail.sqrt());
            for r in r2..r2 + s {
                for col in c2..c2 + s {
                    dc[idx(ch, r, col)] = 0.0;
                }
            }
            for (k, v) in new.iter().enumerate() {
                dc[idx(ch, r1 + k / s, c1 + k % s)] = *v as f32;
            }
        }
        self.l2_point(ctx, &dc)
    }

    /// x + ε·δ/‖δ‖₂ inside the bounds, feasible exactly.
    fn l2_point(&self, ctx: &Ctx, delta: &[f32]) -> Vec<f32> {
        let n = delta.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt().max(1e-12);
        let mut p: Vec<f32> =
            ctx.x.iter().zip(delta).map(|(&xv, &dv)| (xv as f64 + dv as f64 / n * ctx.eps as f64) as f32).collect();
        ctx.clamp_bounds(&mut p);
        ctx.enforce(&mut p, Norm::L2);
        p
    }
}

/// Where one sample's run of the Square Attack is.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    /// The clean input's query: an input that already fulfils the goal is returned unchanged.
    Clean,
    /// The starting point's query.
    Start,
    /// One square update per query.
    Search,
    Done,
}

/// One sample's Square Attack, stepped by [`search_lockstep`]: the clean query, the starting point, then one
/// square update per query until the budget is spent. Best-so-far is kept by construction (only improvements
/// are accepted); the run stops at the first success.
struct Run<'s> {
    attack: &'s SquareAttack,
    rng: ChaCha8Rng,
    phase: Phase,
    best: Vec<f32>,
    cand: Vec<f32>,
    loss: f32,
    it: u64,
    n_iters: u64,
}

impl<'s> Run<'s> {
    fn new(attack: &'s SquareAttack, ctx: &Ctx) -> Run<'s> {
        let rng = ChaCha8Rng::seed_from_u64(ctx.seed);
        let (best, cand) = (ctx.x.clone(), ctx.x.clone());
        Run { attack, rng, phase: Phase::Clean, best, cand, loss: f32::INFINITY, it: 0, n_iters: 0 }
    }
}

impl Stepper for Run<'_> {
    fn propose(&mut self, ctx: &Ctx) -> Result<bool> {
        if self.phase == Phase::Done || ctx.remaining() == 0 {
            return Ok(false);
        }
        let sq = self.attack;
        match self.phase {
            Phase::Start if sq.norm == Norm::L2 => self.cand = sq.init_l2(ctx, &mut self.rng),
            Phase::Start => self.cand = sq.init_linf(ctx, &mut self.rng),
            Phase::Search => loop {
                let it = self.it;
                self.it += 1;
                if sq.norm == Norm::L2 {
                    self.cand = sq.next_l2(ctx, it, self.n_iters, &mut self.rng, &self.best);
                } else {
                    sq.next_linf(ctx, it, self.n_iters, &mut self.rng, &self.best, &mut self.cand);
                }
                if self.cand != self.best {
                    break;
                }
            },
            Phase::Clean | Phase::Done => {}
        }
        Ok(true)
    }

    fn candidate(&self) -> &[f32] {
        &self.cand
    }

    fn observe(&mut self, ctx: &Ctx, p: ArrayView1<f32>) {
        let success = ctx.success(p);
        match self.phase {
            Phase::Clean => self.phase = if success { Phase::Done } else { Phase::Start },
            Phase::Start => {
                std::mem::swap(&mut self.best, &mut self.cand);
                self.loss = ctx.margin(p);
                self.n_iters = ctx.budget.saturating_sub(2);
                self.phase = if success { Phase::Done } else { Phase::Search };
            }
            Phase::Search => {
                let l = ctx.margin(p);
                if success || l < self.loss {
                    self.loss = l;
                    std::mem::swap(&mut self.best, &mut self.cand);
                }
                if success {
                    self.phase = Phase::Done;
                }
            }
            Phase::Done => {}
        }
    }

    fn answer(self) -> Vec<f32> {
        self.best
    }
}

/// The official `pseudo_gaussian_pert_rectangles`: nested rectangles weighted 1/(k+1)², unit L2 norm.
fn pseudo_gaussian(x: usize, y: usize) -> Vec<f32> {
    let mut delta = vec![0.0f64; x * y];
    let (xc, yc) = (x / 2 + 1, y / 2 + 1);
    let (mut c0, mut c1) = (xc as i64 - 1, yc as i64 - 1);
    for k in 0..xc.max(yc) {
        let (a0, a1) = (c0.max(0) as usize, ((c0 + 2 * k as i64 + 1) as usize).min(x));
        let (b0, b1) = (c1.max(0) as usize, ((c1 + 2 * k as i64 + 1) as usize).min(y));
        for i in a0..a1 {
            for j in b0..b1 {
                delta[i * y + j] += 1.0 / ((k + 1) * (k + 1)) as f64;
            }
        }
        c0 -= 1;
        c1 -= 1;
    }
    let n = delta.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
    delta.iter().map(|v| (v / n) as f32).collect()
}

/// The official `meta_pseudo_gaussian_pert`: two opposite-signed halves, transposed with probability ½.
fn meta_pseudo_gaussian(s: usize, rng: &mut impl Rng) -> Vec<f32> {
    let mut delta = vec![0.0f32; s * s];
    let top = s / 2;
    if top > 0 {
        delta[..top * s].copy_from_slice(&pseudo_gaussian(top, s));
    }
    let bottom = pseudo_gaussian(s - top, s);
    delta[top * s..].iter_mut().zip(&bottom).for_each(|(d, b)| *d = -b);
    let n = delta.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt().max(1e-12);
    delta.iter_mut().for_each(|v| *v = (*v as f64 / n) as f32);
    if rng.random::<f32>() > 0.5 {
        let t = delta.clone();
        for i in 0..s {
            for j in 0..s {
                delta[i * s + j] = t[j * s + i];
            }
        }
    }
    delta
}

impl Algorithm for SquareAttack {
    fn name(&self) -> String {
        format!(
            "Square-{}(eps={}, queries={}, p_init={})",
            self.norm.name(),
            self.eps.describe(),
            self.max_queries,
            self.p_init
        )
    }

    fn access(&self) -> Access {
        Access::Scores
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: self.norm, eps: self.eps.clone() }
    }

    fn query_budget(&self) -> Option<u64> {
        Some(self.max_queries)
    }

    fn validate(&self) -> Result<()> {
        if self.norm == Norm::L1 {
            return Err(Error::invalid("square", "the Square Attack is defined for L∞ and L2"));
        }
        if !(self.p_init > 0.0 && self.p_init <= 1.0) {
            return Err(Error::invalid("square", format!("p_init = {} must be in (0, 1]", self.p_init)));
        }
        Ok(())
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        search_lockstep(p, Queries { max_queries: self.max_queries, topk: None }, |ctx| Run::new(self, ctx))
    }
}
