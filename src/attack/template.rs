//! The attack template (Foolbox's `FixedEpsilonAttack` and `MinimizationAttack` base classes, as one trait): an
//! attack writes its algorithm alone — [`Algorithm::search`] over a validated [`Problem`] — and the blanket
//! implementation of [`Attack`] does what every attack shares:
//!
//! 1. validate the settings ([`Algorithm::validate`]), the inputs (shape, finite, non-empty) and the labels;
//! 2. resolve the goal for the attack's [`Access`]: a least-likely target is refused for label-only attacks (it
//!    needs scores) and costs a counted query per sample for score-based ones — in every result of a sweep too,
//!    visible to the search as [`Problem::queries`] so that a per-sample query budget charges it, and refused
//!    when the attack's [`Algorithm::query_budget`] is 0; random targets avoid a classifier's rejection class;
//! 3. resolve the per-sample budget ([`Budget`]) and run the algorithm with the caller's seed;
//! 4. enforce the budget exactly on what it returns: inside the input bounds, and within ε of x in the attack's
//!    norm for fixed budgets (measured in f64 on the f32 values);
//! 5. re-evaluate success by running the model on the returned inputs, and report per-sample norms, gradients,
//!    queries and gradient faults (zero or non-finite gradients) that the [`Problem`] tallied;
//! 6. sweep a list of ε: fixed-budget attacks run per ε in ascending order and carry each sample's success
//!    forward to the larger budgets; minimum-norm attacks run once and clip their perturbation to each ε
//!    (Foolbox), also carrying successes forward. Robust accuracy therefore never rises with ε.

use std::sync::atomic::{AtomicU64, Ordering};

use ndarray::{Array2, ArrayView2, Axis};

use super::budget::{enforce, project_row, rows, unrows, Epsilon, Norm};
use super::{resolve_goal_for, Attack, AttackResult, Goal, GradientFaults, Resolved};
use crate::classifier::Classifier;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// What an attack reads of the model: the template resolves goals and counts work by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Gradients (white-box).
    Gradients,
    /// Output scores only (score-based black-box).
    Scores,
    /// Predicted labels only (decision-based black-box).
    Labels,
}

/// The budget an attack works to.
#[derive(Clone, Debug)]
pub enum Budget {
    /// Within `eps` of x in `norm` (Foolbox's `FixedEpsilonAttack`): the template enforces it exactly.
    Fixed {
        /// The norm.
        norm: Norm,
        /// The budget.
        eps: Epsilon,
    },
    /// As small a perturbation in `norm` as the attack can find (Foolbox's `MinimizationAttack`).
    Minimal {
        /// The norm the attack minimises.
        norm: Norm,
    },
    /// No norm budget (a pixel count, a fixed noise level): only the input bounds are enforced; no sweep.
    Unbounded,
}

impl Budget {
    /// The norm the budget is measured in (`None`: unbounded).
    pub fn norm(&self) -> Option<Norm> {
        match self {
            Budget::Fixed { norm, .. } | Budget::Minimal { norm } => Some(*norm),
            Budget::Unbounded => None,
        }
    }
}

/// A validated attack problem: what the template hands to [`Algorithm::search`].
pub struct Problem<'a> {
    /// The classifier.
    pub model: &'a dyn Classifier,
    /// The inputs, checked against the classifier (shape, finite, non-empty).
    pub x: &'a Tensor,
    /// The true labels, checked.
    pub labels: &'a [usize],
    /// The goal with every target resolved.
    pub goal: &'a Resolved,
    /// Per-sample budget for [`Budget::Fixed`] (empty otherwise).
    pub eps: &'a [f32],
    /// The seed of every random choice of this call.
    pub seed: u64,
    work: Work,
}

/// Per-sample tallies of the work a search does through its [`Problem`].
struct Work {
    gradients: Vec<AtomicU64>,
    queries: Vec<AtomicU64>,
    zero: Vec<AtomicU64>,
    non_finite: Vec<AtomicU64>,
}

impl Work {
    fn new(n: usize) -> Work {
        let z = || (0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Work { gradients: z(), queries: z(), zero: z(), non_finite: z() }
    }

    fn take(v: &[AtomicU64]) -> Vec<u64> {
        v.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }
}

/// The type of a per-sample objective over logits (see [`Classifier::gradient`]).
pub type Objective<'f> = dyn Fn(&Tensor, std::ops::Range<usize>) -> Result<Tensor> + Sync + 'f;

impl<'a> Problem<'a> {
    /// A problem over already validated parts (the template builds these; tests of an algorithm may too).
    pub fn new(
        model: &'a dyn Classifier,
        x: &'a Tensor,
        labels: &'a [usize],
        goal: &'a Resolved,
        eps: &'a [f32],
        seed: u64,
    ) -> Problem<'a> {
        Problem { model, x, labels, goal, eps, seed, work: Work::new(labels.len()) }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no samples (never, for a validated problem).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The classifier's input bounds.
    pub fn bounds(&self) -> (f32, f32) {
        self.model.bounds()
    }

    /// The inputs as `[N, D]` rows.
    pub fn rows(&self) -> Array2<f32> {
        rows(self.x)
    }

    /// `[N, D]` rows back to the input shape.
    pub fn unrows(&self, a: Array2<f32>) -> Tensor {
        unrows(a, self.x.shape())
    }

    /// [`Classifier::gradient`] of `f` at `x`, whose row `r` is sample `samples[r]` (`None`: row `r` is sample `r`).
    /// Counts a gradient and a query for each row, and notes rows whose gradient is all zero or not finite.
    pub fn gradient(
        &self,
        x: &Tensor,
        samples: Option<&[usize]>,
        f: &Objective<'_>,
    ) -> Result<(Vec<f32>, Tensor, Array2<f32>)> {
        let out = self.model.gradient(x, f)?;
        let g = out.1.value();
        let r = g.shape().first().copied().unwrap_or(0);
        match g.view().into_shape_with_order((r, g.len() / r.max(1))) {
            Ok(view) => self.note_gradient(view, samples),
            Err(_) => self.note_gradient(rows(&out.1).view(), samples),
        }
        Ok(out)
    }

    /// Counts a gradient and a query for each row of the gradient rows `g` (row `r` being sample `samples[r]`),
    /// and notes the rows that are all zero or not finite — for gradients an algorithm computes without
    /// [`Problem::gradient`].
    pub fn note_gradient(&self, g: ArrayView2<'_, f32>, samples: Option<&[usize]>) {
        self.note_rows(g, samples, true);
    }

    /// Like [`Problem::note_gradient`] but counts no query: for further backward passes over a forward pass
    /// already counted (DeepFool's backward per candidate class over one graph).
    pub fn note_backward(&self, g: ArrayView2<'_, f32>, samples: Option<&[usize]>) {
        self.note_rows(g, samples, false);
    }

    fn note_rows(&self, g: ArrayView2<'_, f32>, samples: Option<&[usize]>, query: bool) {
        for (row, part) in g.rows().into_iter().enumerate() {
            let i = samples.map_or(row, |m| m[row]);
            self.work.gradients[i].fetch_add(1, Ordering::Relaxed);
            self.work.queries[i].fetch_add(u64::from(query), Ordering::Relaxed);
            if part.iter().any(|v| !v.is_finite()) {
                self.work.non_finite[i].fetch_add(1, Ordering::Relaxed);
            } else if part.iter().all(|&v| v == 0.0) {
                self.work.zero[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// [`Classifier::logits`] of `x` (row `r` being sample `samples[r]`), counting a query per row.
    pub fn logits(&self, x: &Tensor, samples: Option<&[usize]>) -> Result<Array2<f32>> {
        let z = self.model.logits(x)?;
        for row in 0..z.nrows() {
            self.add_queries(samples.map_or(row, |m| m[row]), 1);
        }
        Ok(z)
    }

    /// The queries tallied for sample `i` so far — before the search runs, the one query a least-likely target
    /// cost a score-based attack (so that its per-sample query budget can charge it).
    pub fn queries(&self, i: usize) -> u64 {
        self.work.queries[i].load(Ordering::Relaxed)
    }

    /// Adds `q` queries to sample `i`'s tally (black-box attacks that count through their own oracle).
    pub fn add_queries(&self, i: usize, q: u64) {
        self.work.queries[i].fetch_add(q, Ordering::Relaxed);
    }

    /// Adds `g` gradient evaluations to sample `i`'s tally, without a gradient to inspect (estimated gradients).
    pub fn add_gradients(&self, i: usize, g: u64) {
        self.work.gradients[i].fetch_add(g, Ordering::Relaxed);
    }
}

/// An attack's algorithm, behind the template: implementing it makes the type an [`Attack`].
pub trait Algorithm: Send + Sync {
    /// A short name with the main settings, e.g. `PGD-Linf(eps=0.1, steps=40)`.
    fn name(&self) -> String;

    /// What the attack reads of the model.
    fn access(&self) -> Access;

    /// The budget the attack works to.
    fn budget(&self) -> Budget;

    /// Checks the settings (step sizes, iteration counts, …); called before anything runs.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// The model queries the attack may spend per sample, if it has such a budget (black-box attacks): a
    /// score-based attack with a budget of 0 cannot pay the query a least-likely target costs, and the template
    /// refuses that goal before reading any score.
    fn query_budget(&self) -> Option<u64> {
        None
    }

    /// The goal this attack pursues whatever the caller asks (the least-likely-class method), if any.
    fn fixed_goal(&self) -> Option<Goal> {
        None
    }

    /// The adversarial inputs for `p` (shape of `p.x`). They need not be exactly feasible: the template clips
    /// them into the bounds and, for fixed budgets, into the ε-ball, exactly.
    fn search(&self, p: &Problem<'_>) -> Result<Tensor>;

    /// Adversarial inputs for several budgets at once (`eps[k]` for every sample, ascending), when the algorithm
    /// can share work across them (FGSM needs one gradient for all); `None` runs [`Algorithm::search`] per ε.
    fn search_sweep(&self, _p: &Problem<'_>, _eps: &[f32]) -> Option<Result<Vec<Tensor>>> {
        None
    }
}

impl<A: Algorithm> Attack for A {
    fn name(&self) -> String {
        Algorithm::name(self)
    }

    fn budget_kind(&self) -> Option<Budget> {
        Some(Algorithm::budget(self))
    }

    fn run(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        labels: &[usize],
        goal: &Goal,
        seed: u64,
    ) -> Result<AttackResult> {
        let (result, _) = run_template(self, model, x, labels, goal, seed, true)?;
        result.ok_or_else(|| Error::invalid("attack", "internal: evaluation was asked for"))
    }

    fn generate(&self, model: &dyn Classifier, x: &Tensor, labels: &[usize], goal: &Goal, seed: u64) -> Result<Tensor> {
        Ok(run_template(self, model, x, labels, goal, seed, false)?.1)
    }

    fn sweep(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        labels: &[usize],
        goal: &Goal,
        eps: &[f32],
        seed: u64,
    ) -> Result<Vec<AttackResult>> {
        sweep_template(self, model, x, labels, goal, eps, seed)
    }
}

/// Validates, resolves the goal and the budget: the prologue every attack shares.
fn prologue<A: Algorithm + ?Sized>(
    a: &A,
    model: &dyn Classifier,
    x: &Tensor,
    labels: &[usize],
    goal: &Goal,
) -> Result<(Resolved, Vec<f32>)> {
    a.validate()?;
    if resolution_costs_a_query(a, goal) && a.query_budget() == Some(0) {
        return Err(Error::invalid(
            "least-likely target",
            format!("{} has a budget of 0 queries, and finding the least-likely class takes one per sample", a.name()),
        ));
    }
    let fixed = a.fixed_goal();
    let goal = resolve_goal_for(model, x, labels, fixed.as_ref().unwrap_or(goal), a.access())?;
    let eps = match a.budget() {
        Budget::Fixed { eps, .. } => eps.resolve(labels.len())?,
        Budget::Minimal { .. } | Budget::Unbounded => Vec::new(),
    };
    Ok((goal, eps))
}

fn run_template<A: Algorithm + ?Sized>(
    a: &A,
    model: &dyn Classifier,
    x: &Tensor,
    labels: &[usize],
    goal: &Goal,
    seed: u64,
    evaluate: bool,
) -> Result<(Option<AttackResult>, Tensor)> {
    let (resolved, eps) = prologue(a, model, x, labels, goal)?;
    let p = Problem::new(model, x, labels, &resolved, &eps, seed);
    charge_resolution(a, &p, goal);
    let adv = feasible(a, &p, a.search(&p)?, &eps)?;
    if !evaluate {
        return Ok((None, adv));
    }
    let result = finish(&p, adv.clone())?;
    Ok((Some(result), adv))
}

/// Whether resolving `goal` reads the scores of every clean input as a counted query: a least-likely target of
/// a score-based attack (a label-only attack refuses it; a white-box attack's forward passes are not queries).
fn resolution_costs_a_query<A: Algorithm + ?Sized>(a: &A, goal: &Goal) -> bool {
    a.access() == Access::Scores && a.fixed_goal().as_ref().unwrap_or(goal) == &Goal::LeastLikely
}

/// Charges the query of [`resolution_costs_a_query`] to every sample of `p`, before its search runs.
fn charge_resolution<A: Algorithm + ?Sized>(a: &A, p: &Problem<'_>, goal: &Goal) {
    if resolution_costs_a_query(a, goal) {
        (0..p.len()).for_each(|i| p.add_queries(i, 1));
    }
}

/// The returned inputs made feasible: into the bounds, and into the ε-ball for fixed budgets.
fn feasible<A: Algorithm + ?Sized>(a: &A, p: &Problem<'_>, adv: Tensor, eps: &[f32]) -> Result<Tensor> {
    if adv.shape() != p.x.shape() {
        return Err(Error::ShapeMismatch {
            op: "attack result",
            expected: p.x.shape().to_vec(),
            got: adv.shape().to_vec(),
        });
    }
    let x2 = p.rows();
    let mut a2 = rows(&adv);
    match a.budget() {
        Budget::Fixed { norm, .. } => enforce(&x2, &mut a2, norm, eps, p.bounds()),
        Budget::Minimal { .. } | Budget::Unbounded => {
            let inf = vec![f32::INFINITY; p.len()];
            enforce(&x2, &mut a2, Norm::Linf, &inf, p.bounds())
        }
    }
    Ok(p.unrows(a2))
}

/// The result of a search: success re-evaluated on the returned inputs, norms, and the tallied work.
fn finish(p: &Problem<'_>, adv: Tensor) -> Result<AttackResult> {
    let gradients = Work::take(&p.work.gradients);
    let queries = Work::take(&p.work.queries);
    let faults = Work::take(&p.work.zero)
        .into_iter()
        .zip(Work::take(&p.work.non_finite))
        .map(|(zero, non_finite)| GradientFaults { zero, non_finite })
        .collect();
    let mut r = AttackResult::evaluate(p.model, p.x, adv, p.labels, p.goal.clone(), gradients, queries)?;
    r.gradient_faults = faults;
    Ok(r)
}

fn sweep_template<A: Algorithm + ?Sized>(
    a: &A,
    model: &dyn Classifier,
    x: &Tensor,
    labels: &[usize],
    goal: &Goal,
    eps: &[f32],
    seed: u64,
) -> Result<Vec<AttackResult>> {
    for &e in eps {
        Epsilon::Scalar(e).resolve(1)?;
    }
    let asked = goal;
    let (goal, _) = prologue(a, model, x, labels, goal)?;
    let n = labels.len();
    let mut order: Vec<usize> = (0..eps.len()).collect();
    order.sort_by(|&i, &j| eps[i].total_cmp(&eps[j]));
    let mut results: Vec<Option<AttackResult>> = (0..eps.len()).map(|_| None).collect();
    match a.budget() {
        Budget::Unbounded => {
            return Err(Error::invalid("sweep", format!("{} has no perturbation budget to sweep", a.name())));
        }
        Budget::Fixed { norm, .. } => {
            let sorted: Vec<f32> = order.iter().map(|&k| eps[k]).collect();
            let sp = Problem::new(model, x, labels, &goal, &[], seed);
            charge_resolution(a, &sp, asked);
            let shared = a.search_sweep(&sp, &sorted).transpose()?;
            let mut carried: Option<AttackResult> = None;
            for (pos, &k) in order.iter().enumerate() {
                let ev = vec![eps[k]; n];
                let p = Problem::new(model, x, labels, &goal, &ev, seed);
                let adv = match &shared {
                    Some(all) => {
                        p.work.absorb(&sp.work); // the shared work counts toward every budget's result
                        all[pos].clone()
                    }
                    None => {
                        charge_resolution(a, &p, asked);
                        a.search(&p)?
                    }
                };
                let adv = feasible(a, &p, adv, &ev)?;
                let r = carry_forward(finish(&p, adv)?, carried.as_ref(), norm, eps[k], x)?;
                carried = Some(r.clone());
                results[k] = Some(r);
            }
        }
        Budget::Minimal { norm } => {
            let p = Problem::new(model, x, labels, &goal, &[], seed);
            charge_resolution(a, &p, asked);
            let adv = feasible(a, &p, a.search(&p)?, &[])?;
            let x2 = p.rows();
            let found = rows(&adv);
            let mut carried: Option<AttackResult> = None;
            for &k in &order {
                // Foolbox's MinimizationAttack: the perturbation clipped to ε, success re-evaluated. A sample
                // found within ε keeps its input exactly: x + (a − x) can round a value by an ulp, and a
                // minimum-norm answer sits on the decision boundary, where an ulp can undo it.
                let mut a2 = found.clone();
                for (i, mut r) in a2.axis_iter_mut(Axis(0)).enumerate() {
                    let (xi, ai) = (x2.row(i), found.row(i));
                    let (xs, fs) = (xi.as_slice().expect("standard rows"), ai.as_slice().expect("standard rows"));
                    if super::budget::exact_norm(norm, xs, fs) > eps[k] as f64 {
                        let mut delta: Vec<f32> = fs.iter().zip(xs).map(|(a, b)| a - b).collect();
                        project_row(&mut delta, norm, eps[k])?;
                        r.iter_mut().zip(xs).zip(&delta).for_each(|((v, &xv), &d)| *v = xv + d);
                    }
                }
                enforce(&x2, &mut a2, norm, &vec![eps[k]; n], p.bounds());
                let q = Problem::new(model, x, labels, &goal, &[], seed);
                q.work.absorb(&p.work);
                let r = carry_forward(finish(&q, p.unrows(a2))?, carried.as_ref(), norm, eps[k], x)?;
                carried = Some(r.clone());
                results[k] = Some(r);
            }
        }
    }
    Ok(results.into_iter().map(|r| r.expect("every ε ran")).collect())
}

impl Work {
    /// Adds another tally to this one.
    fn absorb(&self, other: &Work) {
        let add = |a: &[AtomicU64], b: &[AtomicU64]| {
            a.iter().zip(b).for_each(|(a, b)| {
                a.fetch_add(b.load(Ordering::Relaxed), Ordering::Relaxed);
            })
        };
        add(&self.gradients, &other.gradients);
        add(&self.queries, &other.queries);
        add(&self.zero, &other.zero);
        add(&self.non_finite, &other.non_finite);
    }
}

/// `r` with the samples that `prev` (the result at a smaller budget) broke and `r` did not replaced by `prev`'s
/// — their adversarial input is within the larger budget too — so success never falls as ε grows.
fn carry_forward(
    mut r: AttackResult,
    prev: Option<&AttackResult>,
    norm: Norm,
    eps: f32,
    x: &Tensor,
) -> Result<AttackResult> {
    let Some(prev) = prev else { return Ok(r) };
    let lost: Vec<usize> = (0..r.success.len()).filter(|&i| prev.success[i] && !r.success[i]).collect();
    if lost.is_empty() {
        return Ok(r);
    }
    let (x2, p2) = (rows(x), rows(&prev.adversarial));
    let mut a2 = rows(&r.adversarial);
    for &i in &lost {
        let within =
            super::budget::exact_norm(norm, x2.row(i).as_slice().expect("rows"), p2.row(i).as_slice().expect("rows"))
                <= eps as f64;
        if within {
            a2.row_mut(i).assign(&p2.row(i));
            r.success[i] = true;
            r.predictions[i] = prev.predictions[i];
            r.norms[i] = prev.norms[i];
        }
    }
    r.adversarial = unrows(a2, x.shape());
    Ok(r)
}
