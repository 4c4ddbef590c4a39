//! Decision-based (label-only) black-box attacks: HopSkipJump, the Boundary attack, Pointwise and salt-and-pepper
//! noise.
//!
//! Each attack implements [`armoury::Algorithm`] with [`Access::Labels`](armoury::attack::Access): the template
//! validates, resolves the goal (a least-likely target is refused — finding it needs the scores), keeps the
//! answers in the bounds, re-evaluates success and, for the minimum-norm attacks (HopSkipJump, Boundary,
//! Pointwise), sweeps ε by clipping the perturbation found (Foolbox's `MinimizationAttack`). Salt-and-pepper
//! noise minimises a pixel count, which no [`Norm`] measures: its budget is unbounded and it has no sweep.
//!
//! Every algorithm's core works on one sample through a [`Budgeted`] view of a [`LabelOracle`] — top-1 labels
//! only, so no score can leak into a decision-based attack (it does not compile against anything that exposes
//! scores). [`search_samples`] gives each sample its own oracle, attacks the samples in parallel (rayon, results
//! collected in order) and reports `queries[i]` = that sample's oracle count.
//!
//! Budget semantics shared by all four: `max_queries` bounds the number of inputs sent to the oracle for one
//! sample, including the first query of the clean input (an input the model already gets wrong is returned as
//! is). Batched evaluations (many candidates in one forward pass) are clipped to the remaining budget, so the
//! budget holds exactly. `max_queries = 0` returns the input unchanged without a query. The model pass that
//! re-evaluates success on the returned inputs is evaluation, not attack queries, and is not counted.
//! Each sample's random choices come from a generator seeded by [`sample_seed`] on the call's seed and the
//! sample's values, so results do not depend on the batch, the sample's position or the thread count.

mod boundary;
mod hsj;
mod pointwise;
mod salt_pepper;

pub use boundary::BoundaryAttack;
pub use hsj::{HopSkipJump, StepSearch};
pub use pointwise::Pointwise;
pub use salt_pepper::SaltAndPepper;

use armoury::attack::{Problem, Resolved};
use armoury::seed::sample_seed;
use armoury::{Error, LabelOracle, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::budget::{exact_norm, rows, unrows, Norm};

/// What a sample's attack counts as adversarial, from its label-only view: the core's one success rule
/// ([`armoury::attack::is_success`]) for this sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Criterion {
    /// The true label.
    pub label: usize,
    /// The target class of a targeted goal (`None`: any label other than the true one).
    pub target: Option<usize>,
    /// The classifier's rejection class, never a success (a detector that flags the input was not fooled).
    pub rejection: Option<usize>,
}

impl Criterion {
    /// Whether a predicted label fulfils the criterion.
    pub fn is_adversarial(self, prediction: usize) -> bool {
        armoury::attack::is_success(self.rejection, self.label, self.target, prediction)
    }
}

/// Where a minimisation attack starts: an adversarial input it then moves toward the original.
#[derive(Clone, Debug)]
pub enum Start {
    /// Images of uniform noise in the bounds, drawn from the sample's seeded generator (in batches of 1, 2, 4, …)
    /// until one is adversarial or `trials` have been tried; a sample with none is a failure (returned unchanged).
    Noise {
        /// Noise images tried at most.
        trials: usize,
    },
    /// The [`SaltAndPepper`] attack with these settings (from the same per-sample seed as a standalone
    /// `SaltAndPepper` run, so its result is reproducible).
    SaltAndPepper {
        /// Draws per noise fraction.
        repeats: usize,
        /// Binary-search steps on the fraction.
        search_steps: usize,
    },
    /// One starting input per sample, same shape as the attacked batch — for a targeted attack, e.g. an image of
    /// each target class. A start that is not adversarial makes that sample a failure.
    Given(Tensor),
}

impl Start {
    fn describe(&self) -> String {
        match self {
            Start::Noise { trials } => format!("noise({trials})"),
            Start::SaltAndPepper { repeats, search_steps } => format!("salt-pepper({repeats}x{search_steps})"),
            Start::Given(_) => "given".into(),
        }
    }

    /// Checks the settings that need no input (called by the template's validation).
    fn check(&self, op: &'static str) -> Result<()> {
        match self {
            Start::Noise { trials: 0 } => Err(Error::invalid(op, "noise start needs at least one trial")),
            Start::SaltAndPepper { repeats: 0, .. } => {
                Err(Error::invalid(op, "salt-and-pepper start needs repeats ≥ 1"))
            }
            _ => Ok(()),
        }
    }

    /// Checks a given start against the attacked batch `x`.
    fn check_against(&self, op: &'static str, x: &Tensor) -> Result<()> {
        match self {
            Start::Given(t) if t.shape() != x.shape() => {
                Err(Error::ShapeMismatch { op, expected: x.shape().to_vec(), got: t.shape().to_vec() })
            }
            Start::Given(t) if !t.all_finite() => Err(Error::NonFinite { op }),
            _ => Ok(()),
        }
    }

    /// The raw start of sample `i` (not yet moved toward `x`), or `None` when none was found within the budget.
    fn find(&self, v: &Budgeted, x: &[f32], i: usize, seed: u64) -> Result<Option<Vec<f32>>> {
        match self {
            Start::Noise { trials } => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ NOISE_STREAM);
                noise_search(v, x.len(), *trials, &mut rng)
            }
            Start::SaltAndPepper { repeats, search_steps } => {
                let adv = salt_pepper::salt_and_pepper(v, x, *repeats, *search_steps, seed, false)?;
                Ok((adv.as_slice() != x).then_some(adv))
            }
            Start::Given(t) => {
                let (lo, hi) = v.bounds();
                let s: Vec<f32> = armoury::attack::sample(t, i)?.iter().map(|a| a.clamp(lo, hi)).collect();
                let ok = v.adversarial(&s)?;
                Ok((ok.first() == Some(&true)).then_some(s))
            }
        }
    }
}

/// Stream tag of the noise start's generator.
const NOISE_STREAM: u64 = 0x6E6F_6973_6573_7461;

/// One sample's label-only oracle with its criterion and query budget: every query of a decision-based attack goes
/// through [`Budgeted::adversarial`], which never sends more inputs than the budget has left.
pub struct Budgeted<'o, 'a> {
    oracle: &'o LabelOracle<'a>,
    criterion: Criterion,
    budget: u64,
    spent_before: u64,
    dim: usize,
}

impl<'o, 'a> Budgeted<'o, 'a> {
    /// A view allowing `budget` more queries of `oracle`.
    pub fn new(oracle: &'o LabelOracle<'a>, criterion: Criterion, budget: u64) -> Self {
        let dim = oracle.meta().0.iter().product();
        Budgeted { oracle, criterion, budget, spent_before: oracle.queries(), dim }
    }

    /// Queries spent through this view.
    pub fn used(&self) -> u64 {
        self.oracle.queries() - self.spent_before
    }

    /// Queries left.
    pub fn remaining(&self) -> usize {
        self.budget.saturating_sub(self.used()) as usize
    }

    /// Input bounds.
    pub fn bounds(&self) -> (f32, f32) {
        self.oracle.meta().2
    }

    /// Shape of one input.
    pub fn input_shape(&self) -> &[usize] {
        self.oracle.meta().0
    }

    /// The criterion.
    pub fn criterion(&self) -> Criterion {
        self.criterion
    }

    /// Whether each input of `flat` (k inputs, row after row) is adversarial — for the first min(k, remaining)
    /// inputs only, in one oracle call; the answer is shorter than k when the budget runs out.
    pub fn adversarial(&self, flat: &[f32]) -> Result<Vec<bool>> {
        let k = (flat.len() / self.dim).min(self.remaining());
        if k == 0 {
            return Ok(Vec::new());
        }
        let mut shape = vec![k];
        shape.extend_from_slice(self.input_shape());
        let x = Tensor::from_slice(&flat[..k * self.dim], &shape)?;
        Ok(self.oracle.labels(&x)?.into_iter().map(|l| self.criterion.is_adversarial(l)).collect())
    }

    /// Whether one input is adversarial; `None` when the budget is spent.
    pub fn is_adversarial(&self, x: &[f32]) -> Result<Option<bool>> {
        Ok(self.adversarial(x)?.first().copied())
    }
}

/// Runs `one(i, view, x_i, seed_i)` on every sample of `p` in parallel, each with its own [`LabelOracle`] and a
/// budget of `budget` queries, and reports each sample's oracle count into `p`; the adversarial inputs in order.
pub(crate) fn search_samples(
    p: &Problem<'_>,
    budget: usize,
    one: impl Fn(usize, &Budgeted, &[f32], u64) -> Result<Vec<f32>> + Sync,
) -> Result<Tensor> {
    let x2 = rows(p.x);
    let n = x2.nrows();
    let out: Vec<Vec<f32>> = (0..n)
        .into_par_iter()
        .map(|i| {
            let oracle = LabelOracle::new(p.model);
            let target = match p.goal {
                Resolved::Untargeted => None,
                Resolved::Targeted(t) => Some(t[i]),
            };
            let criterion = Criterion { label: p.labels[i], target, rejection: p.model.rejection_class() };
            let view = Budgeted::new(&oracle, criterion, budget as u64);
            let xi = x2.row(i).to_vec();
            let adv = if budget == 0 { xi.clone() } else { one(i, &view, &xi, sample_seed(p.seed, 0, &xi))? };
            debug_assert!(oracle.queries() <= budget as u64, "budget exceeded");
            if adv.len() != xi.len() {
                return Err(Error::invalid("decision attack", "algorithm returned a wrong-sized row"));
            }
            p.add_queries(i, oracle.queries());
            Ok(adv)
        })
        .collect::<Result<_>>()?;
    let mut adv = x2;
    for (i, a) in out.into_iter().enumerate() {
        adv.row_mut(i).assign(&ndarray::ArrayView1::from(&a));
    }
    Ok(unrows(adv, p.x.shape()))
}

/// Uniform noise images in the bounds, in batches of 1, 2, 4, … (at most `trials` in all), until one is adversarial.
pub(crate) fn noise_search(v: &Budgeted, d: usize, trials: usize, rng: &mut ChaCha8Rng) -> Result<Option<Vec<f32>>> {
    let (lo, hi) = v.bounds();
    let (mut tried, mut batch) = (0, 1);
    while tried < trials && v.remaining() > 0 {
        let k = batch.min(trials - tried).min(v.remaining());
        let flat: Vec<f32> = (0..k * d).map(|_| rng.random_range(lo..=hi)).collect();
        let ok = v.adversarial(&flat)?;
        if let Some(j) = ok.iter().position(|&a| a) {
            return Ok(Some(flat[j * d..(j + 1) * d].to_vec()));
        }
        tried += k;
        batch *= 2;
    }
    Ok(None)
}

/// The input on the segment (L2: the blend (1 − α)x + αc) or in the box (L∞: c clipped to x ± α) at `alpha`.
pub(crate) fn project(norm: Norm, x: &[f32], c: &[f32], alpha: f64, bounds: (f32, f32)) -> Vec<f32> {
    match norm {
        Norm::Linf => {
            let a = alpha as f32;
            x.iter().zip(c).map(|(&xv, &cv)| cv.clamp(xv - a, xv + a).clamp(bounds.0, bounds.1)).collect()
        }
        _ => x
            .iter()
            .zip(c)
            .map(|(&xv, &cv)| (((1.0 - alpha) * xv as f64 + alpha * cv as f64) as f32).clamp(bounds.0, bounds.1))
            .collect(),
    }
}

/// HopSkipJump's binary search toward `x` for several adversarial candidates at once (Chen et al. 2020, Alg. 2):
/// L2 searches the blend factor α ∈ [0, 1] until `high − low ≤ θ`; L∞ searches the box radius in [0, ‖c − x‖∞]
/// until `high − low ≤ min(θ·‖c − x‖∞, θ)`. Each round queries the midpoints of all unfinished candidates in one
/// call (clipped to the budget). Returns the closest input known to be adversarial (exactly as queried) and its
/// distance, or the first candidate if the budget allowed no query.
pub(crate) fn boundary_search(
    v: &Budgeted,
    norm: Norm,
    x: &[f32],
    candidates: Vec<Vec<f32>>,
    theta: f64,
) -> Result<(Vec<f32>, f64)> {
    let bounds = v.bounds();
    let m = candidates.len();
    let d = x.len();
    let (mut low, mut high, thr): (Vec<f64>, Vec<f64>, Vec<f64>) = match norm {
        Norm::Linf => {
            let h: Vec<f64> = candidates.iter().map(|c| exact_norm(Norm::Linf, x, c)).collect();
            let t = h.iter().map(|&h| (h * theta).min(theta)).collect();
            (vec![0.0; m], h, t)
        }
        _ => (vec![0.0; m], vec![1.0; m], vec![theta; m]),
    };
    let mut best: Vec<Vec<f32>> = candidates.clone();
    loop {
        let active: Vec<usize> = (0..m).filter(|&j| (high[j] - low[j]) > thr[j]).collect();
        if active.is_empty() || v.remaining() == 0 {
            break;
        }
        let mids: Vec<f64> = active.iter().map(|&j| (high[j] + low[j]) / 2.0).collect();
        let mut flat = Vec::with_capacity(active.len() * d);
        for (&j, &a) in active.iter().zip(&mids) {
            flat.extend(project(norm, x, &candidates[j], a, bounds));
        }
        let ok = v.adversarial(&flat)?;
        for (k, &adv) in ok.iter().enumerate() {
            let j = active[k];
            if adv {
                high[j] = mids[k];
                best[j] = flat[k * d..(k + 1) * d].to_vec();
            } else {
                low[j] = mids[k];
            }
        }
    }
    let (j, dist) = best
        .iter()
        .map(|b| exact_norm(norm, x, b))
        .enumerate()
        .fold((0, f64::INFINITY), |(bj, bd), (j, dd)| if dd < bd { (j, dd) } else { (bj, bd) });
    Ok((best.swap_remove(j), dist))
}

/// Validates a query budget's companion settings.
pub(crate) fn check_count(op: &'static str, what: &str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(Error::invalid(op, format!("{what} must be at least 1")));
    }
    Ok(())
}
