//! Score-based black-box attacks: they see only the model's scores — probabilities, or logits for Square (as
//! AutoAttack's reads them) — or, NES's label-only setting, only its top-1 label, through a per-sample
//! [`ScoreOracle`] / [`LabelOracle`] (or [`search_lockstep`]'s batches) that counts every queried input.
//!
//! Each attack implements [`armoury::Algorithm`] with [`Access::Scores`](armoury::attack::Access) (NES label-only:
//! `Labels`) and a fixed budget in its norm; the template validates, resolves the goal and the per-sample ε,
//! makes the answers exactly feasible, re-evaluates success and sweeps. What is shared here is the algorithm
//! machinery: [`search_scored`] runs the attack on one sample at a time ([`Ctx`]), the samples in parallel with
//! rayon, each with a seed derived from the call's seed and the sample's own values
//! ([`armoury::seed::sample_seed`]) — so results do not depend on the batch, the sample's position or the
//! thread count.
//!
//! Queries: a sample's budget of `max_queries` is never exceeded — every call to the oracle is clipped to what
//! remains — and `AttackResult::queries[i]` is that sample's oracle count. The first query of every attack is
//! the clean input: an input that already fulfils the goal is returned unchanged. ε = 0 or `max_queries = 0`
//! return the input without a query. With [`Goal::LeastLikely`](armoury::Goal::LeastLikely) the template reads
//! the clean scores once per sample to find the target and counts that query; it is charged to the sample's
//! budget here (so `max_queries = 1` leaves no query for the attack, and `max_queries = 0` with a least-likely
//! target is an error, since the target cannot be found without a query). A label-only attack refuses the
//! least-likely target: finding it needs the scores.

use std::sync::atomic::{AtomicU64, Ordering};

use armoury::attack::{Problem, Resolved};
use armoury::seed::sample_seed;
use armoury::{Error, LabelOracle, Result, ScoreOracle, Tensor};
use ndarray::{Array2, ArrayView1};
use rand::Rng;
use rayon::prelude::*;

use crate::budget::{enforce, rows, unrows, Norm};

mod genetic;
mod nes;
mod pso;
mod simba;
mod spsa;
mod square;

pub use genetic::GenAttack;
pub use nes::{Nes, NesSetting};
pub use pso::ParticleSwarm;
pub use simba::{SimBA, SimbaBasis};
pub use spsa::Spsa;
pub use square::SquareAttack;

/// One sample's view of the attack: its clean values, goal, budget, seed and the counting oracles.
pub(crate) struct Ctx<'a> {
    score: ScoreOracle<'a>,
    label_oracle: LabelOracle<'a>,
    /// Clean values, row-major (C, H, W).
    pub x: Vec<f32>,
    /// Channels, height, width.
    pub chw: (usize, usize, usize),
    /// True label.
    pub label: usize,
    /// Target class of a targeted goal.
    pub target: Option<usize>,
    /// The classifier's rejection class (never a success).
    pub rejection: Option<usize>,
    /// Budget ε of this sample.
    pub eps: f32,
    /// Query budget of this sample.
    pub budget: u64,
    /// This sample's seed.
    pub seed: u64,
    /// Input bounds.
    pub bounds: (f32, f32),
    /// Per-coordinate lower end of the L∞ ε-box ∩ bounds (exact: |lo − x| ≤ ε in f64).
    pub lo: Vec<f32>,
    /// Per-coordinate upper end of the L∞ ε-box ∩ bounds.
    pub hi: Vec<f32>,
    /// Only the `k` largest probabilities are revealed (the others read as 0).
    pub topk: Option<usize>,
    /// Queries [`search_lockstep`] made for this sample outside its oracles (in batches with other samples).
    batched: AtomicU64,
}

impl Ctx<'_> {
    /// Input values per sample.
    pub fn dim(&self) -> usize {
        self.x.len()
    }

    /// Queries spent so far.
    pub fn queries(&self) -> u64 {
        self.score.queries() + self.label_oracle.queries() + self.batched.load(Ordering::Relaxed)
    }

    /// Queries left.
    pub fn remaining(&self) -> u64 {
        self.budget.saturating_sub(self.queries())
    }

    fn tensor(&self, data: Vec<f32>) -> Result<Tensor> {
        let (c, h, w) = self.chw;
        let m = data.len() / self.dim();
        if m as u64 > self.remaining() || m == 0 || data.len() != m * self.dim() {
            return Err(Error::invalid("score attack", format!("{m} queries with {} left", self.remaining())));
        }
        Tensor::from_vec(data, &[m, c, h, w])
    }

    /// Probabilities of the candidates stored back to back in `data` (one row each), as one batched query.
    /// The caller keeps the count within [`Ctx::remaining`].
    pub fn probs(&self, data: Vec<f32>) -> Result<Array2<f32>> {
        let mut p = self.score.probabilities(&self.tensor(data)?)?;
        reveal(&mut p, self.topk);
        Ok(p)
    }

    /// Probabilities of one candidate.
    pub fn probs1(&self, row: &[f32]) -> Result<Vec<f32>> {
        Ok(self.probs(row.to_vec())?.row(0).to_vec())
    }

    /// Top-1 labels of the candidates stored back to back in `data` (label-only access).
    pub fn labels(&self, data: Vec<f32>) -> Result<Vec<usize>> {
        self.label_oracle.labels(&self.tensor(data)?)
    }

    /// Whether a predicted class fulfils the goal: the core's rule ([`armoury::attack::is_success`]), never the
    /// classifier's rejection class.
    pub fn goal_met(&self, class: usize) -> bool {
        armoury::attack::is_success(self.rejection, self.label, self.target, class)
    }

    /// Whether the probabilities fulfil the goal (first maximum, as the model's prediction).
    pub fn success(&self, p: ArrayView1<f32>) -> bool {
        let top = p
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) });
        self.goal_met(top.0)
    }

    /// The margin loss on log-probabilities, minimised (negative ⇔ the goal is met): untargeted
    /// log p_y − max_{j≠y} log p_j, targeted max_{j≠t} log p_j − log p_t.
    pub fn margin(&self, p: ArrayView1<f32>) -> f32 {
        let c = self.target.unwrap_or(self.label);
        let other = p.iter().enumerate().filter(|(j, _)| *j != c).fold(0.0f32, |m, (_, &v)| m.max(v));
        let own = log(p[c]) - log(other);
        if self.target.is_some() {
            -own
        } else {
            own
        }
    }

    /// GenAttack's fitness, maximised: targeted log p_t − log Σ_{j≠t} p_j, untargeted log Σ_{j≠y} p_j − log p_y.
    pub fn fitness(&self, p: ArrayView1<f32>) -> f32 {
        let c = self.target.unwrap_or(self.label);
        let rest: f64 = p.iter().enumerate().filter(|(j, _)| *j != c).map(|(_, &v)| v as f64).sum();
        let own = log(p[c]) - log(rest as f32);
        if self.target.is_some() {
            own
        } else {
            -own
        }
    }

    /// Clamps `row` into the L∞ ε-box around x intersected with the bounds.
    pub fn clamp_box(&self, row: &mut [f32]) {
        for ((v, &l), &h) in row.iter_mut().zip(&self.lo).zip(&self.hi) {
            *v = v.clamp(l, h);
        }
    }

    /// Clamps `row` into the bounds only.
    pub fn clamp_bounds(&self, row: &mut [f32]) {
        let (lo, hi) = self.bounds;
        row.iter_mut().for_each(|v| *v = v.clamp(lo, hi));
    }

    /// Makes `row` feasible in `norm` exactly (see [`crate::budget::enforce`]).
    pub fn enforce(&self, row: &mut Vec<f32>, norm: Norm) {
        let x = Array2::from_shape_vec((1, self.dim()), self.x.clone()).expect("one row");
        let mut a = Array2::from_shape_vec((1, self.dim()), std::mem::take(row)).expect("one row");
        enforce(&x, &mut a, norm, &[self.eps], self.bounds);
        *row = a.into_raw_vec_and_offset().0;
    }

    /// The post-success reduction step of GenAttack and the particle swarm: moves blocks of changed values back
    /// to the clean input while it stays adversarial, halving the block size when no block can go back, for at
    /// most `max_queries` queries (and never beyond the budget). `adv` must fulfil the goal.
    pub fn reduce(&self, mut adv: Vec<f32>, max_queries: u64, rng: &mut impl Rng) -> Result<Vec<f32>> {
        let stop = self.queries() + max_queries.min(self.remaining());
        let mut changed: Vec<usize> = (0..self.dim()).filter(|&j| adv[j] != self.x[j]).collect();
        shuffle(&mut changed, rng);
        let mut block = (changed.len() / 4).max(1);
        while !changed.is_empty() && self.queries() < stop {
            let mut kept = Vec::with_capacity(changed.len());
            let mut progress = false;
            for chunk in changed.chunks(block) {
                if self.queries() >= stop {
                    kept.extend_from_slice(chunk);
                    continue;
                }
                let mut cand = adv.clone();
                chunk.iter().for_each(|&j| cand[j] = self.x[j]);
                let p = self.probs(cand.clone())?;
                if self.success(p.row(0)) {
                    adv = cand;
                    progress = true;
                } else {
                    kept.extend_from_slice(chunk);
                }
            }
            changed = kept;
            if !progress {
                if block == 1 {
                    break;
                }
                block = (block / 2).max(1);
            }
        }
        Ok(adv)
    }
}

/// Keeps only the `topk` largest probabilities of each row (ties to the lower class), the others read as 0.
fn reveal(p: &mut Array2<f32>, topk: Option<usize>) {
    let Some(k) = topk else { return };
    for mut row in p.rows_mut() {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for &j in order.iter().skip(k) {
            row[j] = 0.0;
        }
    }
}

fn log(p: f32) -> f32 {
    p.max(f32::MIN_POSITIVE).ln()
}

/// Fisher–Yates shuffle with the given generator.
pub(crate) fn shuffle<T>(v: &mut [T], rng: &mut impl Rng) {
    for i in (1..v.len()).rev() {
        let j = rng.random_range(0..=i);
        v.swap(i, j);
    }
}

/// What a score attack sets of its oracle: the query budget per sample and (partial information) the number of
/// probabilities the oracle reveals.
pub(crate) struct Queries {
    pub max_queries: u64,
    pub topk: Option<usize>,
}

/// Runs `algorithm` on every sample of `p` in parallel (results in order), each through its own counting
/// oracles with what is left of its query budget after the queries the template already charged it (the
/// least-likely target's), and reports each sample's oracle count into `p`. A sample with ε = 0 or no query
/// left is returned as it is, without a query.
pub(crate) fn search_scored<F>(p: &Problem<'_>, q: Queries, algorithm: F) -> Result<Tensor>
where
    F: Fn(&Ctx) -> Result<Vec<f32>> + Sync,
{
    let (x2, chw) = inputs(p)?;
    let (n, d) = x2.dim();
    let out: Vec<Result<Vec<f32>>> = (0..n)
        .into_par_iter()
        .map(|i| {
            let Some(ctx) = context(p, &q, i, x2.row(i).to_vec(), chw) else {
                return Ok(x2.row(i).to_vec());
            };
            let adv = algorithm(&ctx)?;
            if adv.len() != d {
                return Err(Error::invalid("score attack", "algorithm returned a wrong-sized row"));
            }
            p.add_queries(i, ctx.queries());
            Ok(adv)
        })
        .collect();
    let mut adv = Vec::with_capacity(n * d);
    for r in out {
        adv.extend_from_slice(&r?);
    }
    let a = Array2::from_shape_vec((n, d), adv).map_err(|e| Error::invalid("score attack", e.to_string()))?;
    Ok(unrows(a, p.x.shape()))
}

/// One sample's search written as a sequence of one-candidate queries, so that [`search_lockstep`] can send the
/// candidates of all samples' current step to the model as one batch.
pub(crate) trait Stepper: Send {
    /// Whether the step reads the candidates' logits (AutoAttack's Square: a margin that scales with them)
    /// instead of their probabilities; either way each candidate row is one counted query. Logits have no
    /// partial-information setting: with `topk` set, [`search_lockstep`] refuses a logit reader.
    const LOGITS: bool = false;
    /// Prepares the next candidate ([`Stepper::candidate`]) and returns true, or returns false when the search
    /// is over. It must not return true when the sample has no query left ([`Ctx::remaining`]).
    fn propose(&mut self, ctx: &Ctx) -> Result<bool>;
    /// The candidate [`Stepper::propose`] prepared, one row.
    fn candidate(&self) -> &[f32];
    /// The candidate's (revealed) probabilities, or its logits when [`Stepper::LOGITS`].
    fn observe(&mut self, ctx: &Ctx, p: ArrayView1<f32>);
    /// The search's answer.
    fn answer(self) -> Vec<f32>;
}

/// At most this many candidates go to the model in one call (bounding the activations' memory).
const LOCKSTEP_ROWS: usize = 1024;

/// Runs one [`Stepper`] per sample of `p` in lockstep: every step, each live sample proposes one candidate, the
/// candidates go to the model together (in calls of at most [`LOCKSTEP_ROWS`]) and each sample observes its
/// row — probabilities, or logits for a [`Stepper::LOGITS`] reader, one counted query either way. The model's
/// rows do not depend on the other rows of a batch, and each sample's randomness is its own (seeded as in
/// [`search_scored`]), so the results equal those of the samples run one at a time, bit for bit, at a fraction
/// of the cost of one-image model calls. Query accounting is as in [`search_scored`].
pub(crate) fn search_lockstep<S, F>(p: &Problem<'_>, q: Queries, start: F) -> Result<Tensor>
where
    S: Stepper,
    F: Fn(&Ctx) -> S + Sync,
{
    if S::LOGITS && q.topk.is_some() {
        return Err(Error::invalid("score attack", "logits cannot be read with only the top-k scores revealed"));
    }
    let (x2, chw) = inputs(p)?;
    let (n, d) = x2.dim();
    let ctxs: Vec<Option<Ctx>> = (0..n).map(|i| context(p, &q, i, x2.row(i).to_vec(), chw)).collect();
    let mut states: Vec<Option<S>> = ctxs.par_iter().map(|c| c.as_ref().map(&start)).collect();
    let mut live: Vec<bool> = states.iter().map(Option::is_some).collect();
    while live.iter().any(|&l| l) {
        let proposed: Vec<bool> = states
            .par_iter_mut()
            .zip(&ctxs)
            .zip(&live)
            .map(|((s, c), &l)| match (s, c) {
                (Some(s), Some(c)) if l => s.propose(c),
                _ => Ok(false),
            })
            .collect::<Result<_>>()?;
        let rows: Vec<usize> = (0..n).filter(|&i| proposed[i]).collect();
        let mut probs = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(LOCKSTEP_ROWS) {
            let mut batch = Vec::with_capacity(chunk.len() * d);
            for &i in chunk {
                let (s, c) = (states[i].as_ref().expect("live"), ctxs[i].as_ref().expect("live"));
                if c.remaining() == 0 || s.candidate().len() != d {
                    return Err(Error::invalid(
                        "score attack",
                        "a step proposed a query over the budget or of the wrong size",
                    ));
                }
                batch.extend_from_slice(s.candidate());
                c.batched.fetch_add(1, Ordering::Relaxed);
            }
            let t = Tensor::from_vec(batch, &[chunk.len(), chw.0, chw.1, chw.2])?;
            let pr = if S::LOGITS {
                p.model.logits(&t)?
            } else {
                let mut pr = p.model.probabilities(&t)?;
                reveal(&mut pr, q.topk);
                pr
            };
            probs.push(pr);
        }
        let mut slot = vec![None; n];
        for (k, &i) in rows.iter().enumerate() {
            slot[i] = Some((k / LOCKSTEP_ROWS, k % LOCKSTEP_ROWS));
        }
        states.par_iter_mut().zip(&ctxs).zip(&slot).for_each(|((s, c), r)| {
            if let (Some(s), Some(c), Some((b, k))) = (s, c, r) {
                s.observe(c, probs[*b].row(*k));
            }
        });
        live = proposed;
    }
    let mut adv = Vec::with_capacity(n * d);
    for (i, (s, c)) in states.into_iter().zip(&ctxs).enumerate() {
        match (s, c) {
            (Some(s), Some(c)) => {
                p.add_queries(i, c.queries());
                adv.extend_from_slice(&s.answer());
            }
            _ => adv.extend(x2.row(i).iter().copied()),
        }
    }
    let a = Array2::from_shape_vec((n, d), adv).map_err(|e| Error::invalid("score attack", e.to_string()))?;
    Ok(unrows(a, p.x.shape()))
}

/// The inputs of `p` as rows, and their (channels, height, width).
fn inputs(p: &Problem<'_>) -> Result<(Array2<f32>, (usize, usize, usize))> {
    match p.x.shape() {
        [_, c, h, w] => Ok((rows(p.x), (*c, *h, *w))),
        s => Err(Error::invalid("score attack", format!("inputs must be [N, C, H, W], got {s:?}"))),
    }
}

/// Sample `i`'s context (clean row `xi`), with what is left of its query budget after the queries the template
/// already charged it; `None` when it has ε = 0 or no query left (it is returned as it is, without a query).
fn context<'a>(p: &Problem<'a>, q: &Queries, i: usize, xi: Vec<f32>, chw: (usize, usize, usize)) -> Option<Ctx<'a>> {
    let eps = p.eps[i];
    let charged = p.queries(i);
    if eps == 0.0 || q.max_queries <= charged {
        return None;
    }
    let bounds = p.bounds();
    let (lo, hi) = box_ends(&xi, eps, bounds);
    Some(Ctx {
        score: ScoreOracle::new(p.model),
        label_oracle: LabelOracle::new(p.model),
        seed: sample_seed(p.seed, 0, &xi),
        x: xi,
        chw,
        label: p.labels[i],
        target: match p.goal {
            Resolved::Targeted(t) => Some(t[i]),
            Resolved::Untargeted => None,
        },
        rejection: p.model.rejection_class(),
        eps,
        budget: q.max_queries - charged,
        bounds,
        lo,
        hi,
        topk: q.topk,
        batched: AtomicU64::new(0),
    })
}

/// The per-coordinate ends of the L∞ ε-box around `x` within `bounds`, nudged so that |end − x| ≤ ε holds
/// exactly in f64.
fn box_ends(x: &[f32], eps: f32, bounds: (f32, f32)) -> (Vec<f32>, Vec<f32>) {
    let fit = |v: f32, xv: f32| {
        let mut v = v.clamp(bounds.0, bounds.1);
        while ((v as f64) - (xv as f64)).abs() > eps as f64 {
            v = step_toward(v, xv);
        }
        v
    };
    let lo = x.iter().map(|&xv| fit(xv - eps, xv).min(xv.clamp(bounds.0, bounds.1))).collect();
    let hi = x.iter().map(|&xv| fit(xv + eps, xv).max(xv.clamp(bounds.0, bounds.1))).collect();
    (lo, hi)
}

/// The next f32 from `a` toward `b`.
fn step_toward(a: f32, b: f32) -> f32 {
    if a == b || a.is_nan() || b.is_nan() {
        return b;
    }
    if a == 0.0 {
        return if b > 0.0 { f32::from_bits(1) } else { -f32::from_bits(1) };
    }
    let away = (b > a) == (a > 0.0);
    f32::from_bits(if away { a.to_bits() + 1 } else { a.to_bits() - 1 })
}

/// A uniform ±1.
pub(crate) fn rand_sign(rng: &mut impl Rng) -> f32 {
    if rng.random::<bool>() {
        1.0
    } else {
        -1.0
    }
}

/// The standard-normal vector of length `d` (Box–Muller, as the core's generator).
pub(crate) fn normal(rng: &mut impl Rng, d: usize) -> Vec<f32> {
    armoury::seed::normal_vec(rng, d)
}
