//! Square Attack (Andriushchenko et al., ECCV 2020) as AutoAttack runs it (Croce & Hein 2020,
//! `autoattack/square.py`): random search over square-shaped updates at the vertices of the L∞ ball, or with
//! pseudo-Gaussian square patterns on the L2 sphere, or — AutoAttack's L1 branch (Croce & Hein 2021, "Mind the
//! box") — with L1-normalised square patterns projected onto the L1 ball ∩ the box; accepted when the logit
//! loss falls.

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Error, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use ndarray::ArrayView1;

use super::{rand_sign, search_lockstep, Ctx, Queries, Stepper};
use crate::budget::{Epsilon, Norm};
use crate::l1_box::project_l1_box;

/// Square Attack, L∞, L2 or L1, following AutoAttack's `square.py` (the standard version's settings).
///
/// What is AutoAttack's:
/// - **Loss and success** on the logits (`margin_and_loss`): untargeted, the margin z_y − max_{j≠y} z_j
///   (`loss='margin'`, the standard version's); targeted, the cross-entropy of the target's logit, with the
///   margin max_{j≠t} z_j − z_t. Decisions do not change when the logits are scaled. A candidate is accepted when
///   its loss is lower than the best one's or it succeeds; the sample stops at its first success.
/// - **The schedule** of the fraction `p` of pixels in a square: [`SquareAttack::p_selection`], by default
///   (`rescale_schedule = false`, AutoAttack's `resc_schedule=False`) on the raw iteration number.
/// - **`p_init` = 0.8** for every norm, and the square sizes: L∞ `max(round(√(p·h·w)), 1)`, L2 and L1
///   `max(round(√(p·h·w)), 3)` made odd, each at most min(h, w); window corners in `[0, h − s)` as
///   `random_int` draws them.
/// - **Starting points and updates**: L∞ vertical stripes of ±ε, then one window per iteration moved to a
///   vertex (one sign per channel); L2 and L1 a grid of h/5-squares of (pseudo-Gaussian) patterns with a sign
///   per channel, then per iteration the mass of a second window moved into a first one as a new pattern.
///   L2 keeps ‖δ‖₂ = ε; L1 (AutoAttack's L1 branch, reproduced with its quirks: patterns weighted 1/(k+1)⁴ and
///   L1-normalised, each channel's new window given c × (its share of the slack plus the two windows' mass))
///   projects onto the L1 ball of radius ε(1 − 10⁻⁶) ∩ the box exactly (AutoAttack's `L1_projection`,
///   here [`crate::l1_box`]).
///
/// Where it differs, and why:
/// - Every sample draws its own windows and patterns (AutoAttack draws one window position and one pattern per
///   iteration for the whole batch), so results do not depend on the batch; the random numbers are not torch's.
/// - Success is the classifier's own: its first maximum fulfils the goal and is not the classifier's
///   rejection class (AutoAttack's internal test is margin ≤ 0, which counts exact ties as successes).
/// - The budget `max_queries` counts every query: the clean input's (an input that already fulfils the goal
///   is returned unchanged), the starting point's, then one per iteration; AutoAttack's `n_queries = 5000` is
///   5,000 iterations after the start. An L∞ iteration whose square changes nothing (every pixel of the window
///   already at the drawn vertex) is not sent to the model: AutoAttack spends a query on it and can accept
///   nothing from it, so this saves the query without changing a decision.
/// - Images smaller than 5 pixels high start from 1-pixel squares (AutoAttack divides by h/5 = 0).
/// - One run, no restarts (AutoAttack's standard version runs one).
///
/// The iterations of all samples run in lockstep, so that each step's candidates go to the model as one batch
/// (results as if each sample ran alone).
#[derive(Clone, Debug)]
pub struct SquareAttack {
    /// L∞, L2 or L1.
    pub norm: Norm,
    /// The budget ε.
    pub eps: Epsilon,
    /// Queries per sample, including the clean query and the starting point's.
    pub max_queries: u64,
    /// Initial fraction of pixels in a square (`p_init`; AutoAttack's standard 0.8).
    pub p_init: f32,
    /// Whether the schedule of `p` is stretched to the query budget (AutoAttack's `resc_schedule`: the
    /// iteration number is read as a share of 10,000 iterations). False by default, as in AutoAttack's standard
    /// version (`resc_schedule=False`): the halvings happen at the raw iterations 10, 50, 200, 500, 1000, 2000,
    /// 4000, 6000 and 8000 whatever the budget.
    pub rescale_schedule: bool,
}

impl SquareAttack {
    /// L∞ Square Attack with AutoAttack's standard settings (`p_init` = 0.8, schedule not rescaled) and 1,000
    /// queries (AutoAttack's standard cascade runs 5,000: set `max_queries`).
    pub fn linf(eps: f32) -> SquareAttack {
        SquareAttack {
            norm: Norm::Linf,
            eps: Epsilon::Scalar(eps),
            max_queries: 1000,
            p_init: 0.8,
            rescale_schedule: false,
        }
    }

    /// L2 Square Attack with AutoAttack's standard settings (`p_init` = 0.8) and 1,000 queries.
    pub fn l2(eps: f32) -> SquareAttack {
        SquareAttack { norm: Norm::L2, ..SquareAttack::linf(eps) }
    }

    /// L1 Square Attack (AutoAttack's L1 branch) with AutoAttack's standard settings (`p_init` = 0.8) and
    /// 1,000 queries.
    pub fn l1(eps: f32) -> SquareAttack {
        SquareAttack { norm: Norm::L1, ..SquareAttack::linf(eps) }
    }

    /// The fraction of pixels in a square at iteration `it` (from 0) of `n_iters` — AutoAttack's
    /// `p_selection`: `p_init` halved once past each of the iterations 10, 50, 200, 500, 1000, 2000, 4000,
    /// 6000 and 8000 (`p_init`/512 beyond 8000). With [`SquareAttack::rescale_schedule`] the iteration is first
    /// mapped to `⌊it / n_iters · 10000⌋`; otherwise `n_iters` is not used.
    pub fn p_selection(&self, it: u64, n_iters: u64) -> f32 {
        let it = if self.rescale_schedule { (it as f64 / n_iters as f64 * 10000.0) as u64 } else { it };
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
            _ => 512.0,
        };
        self.p_init / div
    }

    /// The side of the square at iteration `it`: `max(round(√(p·h·w)), min_side)` (Python's round: ties to
    /// even), made odd when `odd` (L2, L1), at most min(h, w).
    fn side(&self, ctx: &Ctx, it: u64, n_iters: u64, min_side: usize, odd: bool) -> usize {
        let (_, h, w) = ctx.chw;
        let p = self.p_selection(it, n_iters) as f64;
        let mut s = ((p * (h * w) as f64).sqrt().round_ties_even() as usize).max(min_side);
        if odd && s.is_multiple_of(2) {
            s += 1;
        }
        s.min(h.min(w)).max(1)
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

    /// The L2 and L1 starting perturbation: a grid of squares of side h/5 (at least 1), each the norm's
    /// pattern ([`meta_pattern`]) with a random sign per channel.
    fn init_grid(&self, ctx: &Ctx, rng: &mut ChaCha8Rng) -> Vec<f32> {
        let (c, h, w) = ctx.chw;
        let idx = |ch: usize, r: usize, col: usize| (ch * h + r) * w + col;
        let mut delta = vec![0.0f32; ctx.dim()];
        let s0 = (h / 5).max(1);
        let sp = h.saturating_sub(s0 * 5) / 2;
        let mut vh = sp;
        for _ in 0..h / s0 {
            let mut vw = sp;
            for _ in 0..w / s0 {
                let pert = meta_pattern(s0, self.norm, rng);
                for ch in 0..c {
                    let sign = rand_sign(rng);
                    for a in 0..s0 {
                        for b in 0..s0 {
                            if vh + a < h && vw + b < w {
                                delta[idx(ch, vh + a, vw + b)] += pert[a * s0 + b] * sign;
                            }
                        }
                    }
                }
                vw += s0;
            }
            vh += s0;
        }
        delta
    }

    /// The L∞ candidate of iteration `it` into `cand`: `best` with one square window moved to a vertex of the
    /// box (one random sign per channel).
    fn next_linf(&self, ctx: &Ctx, it: u64, n_iters: u64, rng: &mut ChaCha8Rng, best: &[f32], cand: &mut [f32]) {
        let (c, h, w) = ctx.chw;
        let s = self.side(ctx, it, n_iters, 1, false);
        let top = rng.random_range(0..(h - s).max(1));
        let left = rng.random_range(0..(w - s).max(1));
        cand.copy_from_slice(best);
        for ch in 0..c {
            let v = rand_sign(rng) * ctx.eps;
            for r in top..top + s {
                for col in left..left + s {
                    let j = (ch * h + r) * w + col;
                    cand[j] = (ctx.x[j] + v).clamp(ctx.lo[j], ctx.hi[j]);
                }
            }
        }
    }

    /// The L2 or L1 candidate of iteration `it`: per channel, the perturbation's mass in a second window
    /// moves into a first one as a new pattern plus the first window's old perturbation (normalised), scaled
    /// as AutoAttack does — L2: to √((ε² − ‖δ‖₂²)₊/c + ‖δ_windows‖₂²); L1: to c·((ε − ‖δ‖₁)₊/c + ‖δ_windows‖₁).
    fn next_lp(&self, ctx: &Ctx, it: u64, n_iters: u64, rng: &mut ChaCha8Rng, best: &[f32]) -> Vec<f32> {
        let (c, h, w) = ctx.chw;
        let l1 = self.norm == Norm::L1;
        let idx = |ch: usize, r: usize, col: usize| (ch * h + r) * w + col;
        let mut dc: Vec<f32> = best.iter().zip(&ctx.x).map(|(a, b)| a - b).collect();
        let s = self.side(ctx, it, n_iters, 3, true);
        let (r1, c1) = (rng.random_range(0..(h - s).max(1)), rng.random_range(0..(w - s).max(1)));
        let (r2, c2) = (rng.random_range(0..(h - s).max(1)), rng.random_range(0..(w - s).max(1)));
        let in1 = |r: usize, col: usize| r >= r1 && r < r1 + s && col >= c1 && col < c1 + s;
        let in2 = |r: usize, col: usize| r >= r2 && r < r2 + s && col >= c2 && col < c2 + s;
        // |v| or v², summed: the norm's mass.
        let mass = |v: f64| if l1 { v.abs() } else { v * v };
        let image: f64 = dc.iter().map(|&v| mass(v as f64)).sum();
        let pert = meta_pattern(s, self.norm, rng);
        let eps = ctx.eps as f64;
        for ch in 0..c {
            let (mut win1, mut both) = (0.0f64, 0.0f64);
            for r in 0..h {
                for col in 0..w {
                    let v = mass(dc[idx(ch, r, col)] as f64);
                    if in1(r, col) {
                        win1 += v;
                    }
                    if in1(r, col) || in2(r, col) {
                        both += v;
                    }
                }
            }
            let win1 = if l1 { win1 } else { win1.sqrt() };
            let sign = rand_sign(rng) as f64;
            let mut new: Vec<f64> = (0..s * s)
                .map(|k| pert[k] as f64 * sign + dc[idx(ch, r1 + k / s, c1 + k % s)] as f64 / (1e-12 + win1))
                .collect();
            let scale = if l1 {
                let n: f64 = new.iter().map(|v| v.abs()).sum();
                ((eps - image).max(0.0) / c as f64 + both) * c as f64 / (1e-12 + n)
            } else {
                let n = new.iter().map(|v| v * v).sum::<f64>().sqrt();
                ((eps * eps - image).max(0.0) / c as f64 + both).sqrt() / (1e-12 + n)
            };
            new.iter_mut().for_each(|v| *v *= scale);
            for r in r2..r2 + s {
                for col in c2..c2 + s {
                    dc[idx(ch, r, col)] = 0.0;
                }
            }
            for (k, v) in new.iter().enumerate() {
                dc[idx(ch, r1 + k / s, c1 + k % s)] = *v as f32;
            }
        }
        self.lp_point(ctx, dc)
    }

    /// The point for the perturbation `delta` (L2, L1), feasible exactly: L2 x + ε·δ/‖δ‖₂ in the bounds
    /// (AutoAttack's `normalize` then clamp); L1 x + the projection of δ onto the L1 ball of radius
    /// ε(1 − 10⁻⁶) ∩ the box (AutoAttack's `L1_projection`).
    fn lp_point(&self, ctx: &Ctx, mut delta: Vec<f32>) -> Vec<f32> {
        let mut p: Vec<f32> = if self.norm == Norm::L1 {
            project_l1_box(&mut delta, &ctx.x, ctx.eps * (1.0 - 1e-6), ctx.bounds);
            ctx.x.iter().zip(&delta).map(|(&xv, &dv)| xv + dv).collect()
        } else {
            let n = 1e-12 + delta.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
            ctx.x.iter().zip(&delta).map(|(&xv, &dv)| (xv as f64 + dv as f64 / n * ctx.eps as f64) as f32).collect()
        };
        ctx.clamp_bounds(&mut p);
        ctx.enforce(&mut p, self.norm);
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

/// An L∞ iteration that changes nothing is skipped without a query; after this many in a row the candidate is
/// sent anyway (as AutoAttack would), so that a degenerate box cannot stall the run.
const MAX_SKIPPED: u32 = 1000;

/// One sample's Square Attack, stepped by [`search_lockstep`]: the clean query, the starting point, then one
/// square update per query until the budget is spent. Best-so-far is kept by construction (only improvements
/// are accepted); the run stops at the first success.
struct Run<'s> {
    attack: &'s SquareAttack,
    rng: ChaCha8Rng,
    phase: Phase,
    best: Vec<f32>,
    cand: Vec<f32>,
    /// The best candidate's loss (AutoAttack's `loss_min`).
    loss: f64,
    it: u64,
    n_iters: u64,
}

impl<'s> Run<'s> {
    fn new(attack: &'s SquareAttack, ctx: &Ctx) -> Run<'s> {
        let rng = ChaCha8Rng::seed_from_u64(ctx.seed);
        let (best, cand) = (ctx.x.clone(), ctx.x.clone());
        Run { attack, rng, phase: Phase::Clean, best, cand, loss: f64::INFINITY, it: 0, n_iters: 0 }
    }
}

impl Stepper for Run<'_> {
    const LOGITS: bool = true;

    fn propose(&mut self, ctx: &Ctx) -> Result<bool> {
        if self.phase == Phase::Done || ctx.remaining() == 0 {
            return Ok(false);
        }
        let sq = self.attack;
        match self.phase {
            Phase::Start if sq.norm == Norm::Linf => self.cand = sq.init_linf(ctx, &mut self.rng),
            Phase::Start => {
                // L2 scales the grid to ε; L1 projects the grid itself (unit L1 mass per square and channel),
                // as AutoAttack does.
                let d = sq.init_grid(ctx, &mut self.rng);
                self.cand = sq.lp_point(ctx, d);
            }
            Phase::Search => {
                let mut skipped = 0;
                loop {
                    let it = self.it;
                    self.it += 1;
                    if sq.norm == Norm::Linf {
                        sq.next_linf(ctx, it, self.n_iters, &mut self.rng, &self.best, &mut self.cand);
                    } else {
                        self.cand = sq.next_lp(ctx, it, self.n_iters, &mut self.rng, &self.best);
                    }
                    skipped += 1;
                    if self.cand != self.best || skipped >= MAX_SKIPPED {
                        break;
                    }
                }
            }
            Phase::Clean | Phase::Done => {}
        }
        Ok(true)
    }

    fn candidate(&self) -> &[f32] {
        &self.cand
    }

    fn observe(&mut self, ctx: &Ctx, z: ArrayView1<f32>) {
        let success = ctx.goal_met(first_max(z));
        match self.phase {
            Phase::Clean => self.phase = if success { Phase::Done } else { Phase::Start },
            Phase::Start => {
                std::mem::swap(&mut self.best, &mut self.cand);
                self.loss = loss(ctx, z);
                self.n_iters = ctx.budget.saturating_sub(2);
                self.phase = if success { Phase::Done } else { Phase::Search };
            }
            Phase::Search => {
                let l = loss(ctx, z);
                if l < self.loss || success {
                    self.loss = self.loss.min(l);
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

/// The class of the first maximum of the logits (the classifier's prediction, [`armoury::Classifier::predict`]).
fn first_max(z: ArrayView1<f32>) -> usize {
    z.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0
}

/// AutoAttack's `margin_and_loss` loss, minimised: untargeted the logit margin z_y − max_{j≠y} z_j
/// (`loss='margin'`), targeted the cross-entropy log Σ_j e^{z_j} − z_t (in f64, shifted by the largest logit).
fn loss(ctx: &Ctx, z: ArrayView1<f32>) -> f64 {
    match ctx.target {
        None => {
            let y = ctx.label;
            let other =
                z.iter().enumerate().filter(|(j, _)| *j != y).fold(f64::NEG_INFINITY, |m, (_, &v)| m.max(v as f64));
            z[y] as f64 - other
        }
        Some(t) => {
            let m = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let sum: f64 = z.iter().map(|&v| (v as f64 - m).exp()).sum();
            m + sum.ln() - z[t] as f64
        }
    }
}

/// AutoAttack's `eta_rectangles`: nested rectangles around the centre of an x × y patch weighted 1/(k+1)² and
/// L2-normalised (L2), or weighted 1/(k+1)⁴ and L1-normalised (L1).
fn rectangles(x: usize, y: usize, norm: Norm) -> Vec<f64> {
    let mut delta = vec![0.0f64; x * y];
    let (xc, yc) = (x / 2 + 1, y / 2 + 1);
    let (mut c0, mut c1) = (xc as i64 - 1, yc as i64 - 1);
    let power = if norm == Norm::L1 { 4 } else { 2 };
    for k in 0..xc.max(yc) {
        let (a0, a1) = (c0.max(0) as usize, ((c0 + 2 * k as i64 + 1) as usize).min(x));
        let (b0, b1) = (c1.max(0) as usize, ((c1 + 2 * k as i64 + 1) as usize).min(y));
        for i in a0..a1 {
            for j in b0..b1 {
                delta[i * y + j] += 1.0 / ((k + 1) as f64).powi(power);
            }
        }
        c0 -= 1;
        c1 -= 1;
    }
    normalise(&mut delta, norm);
    delta
}

/// Divides by the L1 norm (L1) or the L2 norm (otherwise); all zeros stay zeros.
fn normalise(v: &mut [f64], norm: Norm) {
    let n = if norm == Norm::L1 {
        v.iter().map(|a| a.abs()).sum::<f64>()
    } else {
        v.iter().map(|a| a * a).sum::<f64>().sqrt()
    };
    if n > 0.0 {
        v.iter_mut().for_each(|a| *a /= n);
    }
}

/// AutoAttack's `eta`: an s × s pattern of two opposite-signed halves of [`rectangles`], normalised in the
/// norm, transposed with probability ½.
fn meta_pattern(s: usize, norm: Norm, rng: &mut impl Rng) -> Vec<f32> {
    let mut delta = vec![0.0f64; s * s];
    let top = s / 2;
    if top > 0 {
        delta[..top * s].copy_from_slice(&rectangles(top, s, norm));
    }
    let bottom = rectangles(s - top, s, norm);
    delta[top * s..].iter_mut().zip(&bottom).for_each(|(d, b)| *d = -b);
    normalise(&mut delta, norm);
    let mut out: Vec<f32> = delta.iter().map(|&v| v as f32).collect();
    if rng.random::<f32>() > 0.5 {
        for i in 0..s {
            for j in 0..s {
                out[i * s + j] = delta[j * s + i] as f32;
            }
        }
    }
    out
}

impl Algorithm for SquareAttack {
    fn name(&self) -> String {
        format!(
            "Square-{}(eps={}, queries={}, p_init={}{})",
            self.norm.name(),
            self.eps.describe(),
            self.max_queries,
            self.p_init,
            if self.rescale_schedule { ", rescaled schedule" } else { "" }
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
        if !(self.p_init > 0.0 && self.p_init <= 1.0) {
            return Err(Error::invalid("square", format!("p_init = {} must be in (0, 1]", self.p_init)));
        }
        Ok(())
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        search_lockstep(p, Queries { max_queries: self.max_queries, topk: None }, |ctx| Run::new(self, ctx))
    }
}
