//! Carlini–Wagner L2 (Carlini & Wagner 2017, "Towards Evaluating the Robustness of Neural Networks"), and the
//! helpers the other minimum-norm attacks share: gradients on a subset of the batch, the CW margin loss, the
//! κ-aware success test and the per-sample binary search over the constant c.
//!
//! The variable is w in tanh space, x' = (tanh(w) + 1)/2·(hi − lo) + lo, so every iterate lies in the box. The
//! objective is ‖x' − x‖₂² + c·f(x') with f = max(z_y − max_{j≠y} z_j, −κ) (untargeted) or
//! max(max_{j≠t} z_j − z_t, −κ) (targeted), minimised by Adam (β = 0.9, 0.999; ε = 1e-8) on w.
//!
//! Where Armoury differs from MindArmour: an iterate counts as a success only if the goal holds *with* the margin
//! κ (MindArmour's success test ignores κ). Everything is per sample — the binary search over c, the
//! early abort (loss not below 0.9999 of its value `steps/10` iterations earlier, as in Carlini's code, whereas
//! torchattacks aborts the whole batch) and the best (smallest-L2) successful iterate — so a sample's result does
//! not depend on the rest of the batch. A sample that is never successful is returned unchanged.

use std::ops::Range;

use armoury::attack::{Access, Algorithm, Budget, Norm, Problem, Resolved};
use armoury::{Error, Result, Tensor};
use ndarray::{Array2, Axis};

use crate::budget::{check_positive, rows, unrows};
use crate::losses::zero_non_finite;

/// Carlini–Wagner L2 attack.
///
/// ```
/// use armoury::{data, nn, Attack, Goal, ModuleClassifier};
/// use armoury_attacks::CarliniWagnerL2;
/// let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
/// let (x, y) = data::sample()?.test.batch(0..2)?;
/// let cw = CarliniWagnerL2 { steps: 10, binary_search_steps: 2, ..CarliniWagnerL2::default() };
/// let result = cw.run(&model, &x, &y, &Goal::Untargeted, 0)?;
/// assert!(result.gradients.iter().all(|&g| g <= 20));
/// # Ok::<(), armoury::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CarliniWagnerL2 {
    /// Initial constant c on the loss term (1e-3 in the paper; torchattacks uses 1 without binary search).
    pub c: f32,
    /// Confidence κ ≥ 0: the logit margin a success must reach.
    pub kappa: f32,
    /// Adam iterations per binary-search step.
    pub steps: usize,
    /// Adam learning rate.
    pub lr: f32,
    /// Runs with different c per sample (1: no search, c stays fixed).
    pub binary_search_steps: usize,
    /// Stop a sample's run when its loss has not improved for `steps/10` iterations.
    pub abort_early: bool,
}

impl Default for CarliniWagnerL2 {
    /// The paper's settings, with 1,000 iterations instead of 10,000.
    fn default() -> Self {
        CarliniWagnerL2 { c: 1e-3, kappa: 0.0, steps: 1000, lr: 0.01, binary_search_steps: 9, abort_early: true }
    }
}

impl CarliniWagnerL2 {
    /// torchattacks' defaults: c = 1, κ = 0, 100 Adam steps of lr 0.01, no binary search.
    pub fn torchattacks() -> Self {
        CarliniWagnerL2 { c: 1.0, steps: 100, binary_search_steps: 1, ..CarliniWagnerL2::default() }
    }
}

impl Algorithm for CarliniWagnerL2 {
    fn name(&self) -> String {
        format!(
            "CW-L2(c={}, kappa={}, steps={}, lr={}, search={})",
            self.c, self.kappa, self.steps, self.lr, self.binary_search_steps
        )
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    fn budget(&self) -> Budget {
        Budget::Minimal { norm: Norm::L2 }
    }

    fn validate(&self) -> Result<()> {
        check_positive("cw", "c", self.c)?;
        check_positive("cw", "lr", self.lr)?;
        check_kappa("cw", self.kappa)?;
        check_count("cw", "steps", self.steps)?;
        check_count("cw", "binary_search_steps", self.binary_search_steps)
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let (lo, hi) = p.bounds();
        let Start { x2, classes, targeted, already } = start(p, self.kappa)?;
        let (n, d) = x2.dim();
        let w0 = x2.mapv(|v| to_tanh_space(v, lo, hi));
        let mut best_l2 = vec![f64::INFINITY; n];
        let mut best = x2.clone();
        let mut search = vec![Search::new(self.c); n];
        let check_every = (self.steps / 10).max(1);
        for _ in 0..self.binary_search_steps {
            let mut w = w0.clone();
            let mut adam = Adam::new(n, d, self.lr);
            let mut active = already.iter().map(|a| !a).collect::<Vec<bool>>();
            let mut prev = vec![f64::INFINITY; n];
            let mut found = vec![false; n];
            for step in 0..self.steps {
                let idx: Vec<usize> = (0..n).filter(|&i| active[i]).collect();
                if idx.is_empty() {
                    break;
                }
                let ws = w.select(Axis(0), &idx);
                let xa = ws.mapv(|v| from_tanh_space(v, lo, hi));
                let cs: Vec<f32> = idx.iter().map(|&i| search[i].c).collect();
                let f = |z: &Tensor, r: Range<usize>| -> Result<Tensor> {
                    let cls: Vec<usize> = idx[r.clone()].iter().map(|&i| classes[i]).collect();
                    cw_loss(z, &cls, targeted, self.kappa)?.mul(&Tensor::from_slice(&cs[r.clone()], &[r.len()])?)
                };
                let met = |k: usize, z: &[f32]| succeeds(z, classes[idx[k]], targeted, self.kappa);
                let (values, mut gw, logits) = subset_gradient(p, &xa, &idx, &f, Some(&met))?;
                for (k, &i) in idx.iter().enumerate() {
                    let (xr, ar) = (x2.row(i), xa.row(k));
                    let l2sq: f64 = xr.iter().zip(ar).map(|(&a, &b)| ((b - a) as f64).powi(2)).sum();
                    if succeeds(logits.row(k).as_slice().expect("rows"), classes[i], targeted, self.kappa) {
                        found[i] = true;
                        if l2sq < best_l2[i] {
                            best_l2[i] = l2sq;
                            best.row_mut(i).assign(&ar);
                        }
                    }
                    // ∂/∂w of ‖x' − x‖² + c·f: (2(x' − x) + c·∂f/∂x')·(1 − tanh²w)·(hi − lo)/2.
                    let mut g = gw.row_mut(k);
                    for (((gv, &wv), &xv), &av) in g.iter_mut().zip(ws.row(k)).zip(xr).zip(ar) {
                        let t = wv.tanh();
                        *gv = (*gv + 2.0 * (av - xv)) * (1.0 - t * t) * 0.5 * (hi - lo);
                    }
                    let loss = l2sq + values[k] as f64;
                    if self.abort_early && step % check_every == 0 {
                        if loss > prev[i] * 0.9999 {
                            active[i] = false;
                        }
                        prev[i] = loss;
                    }
                }
                adam.step(&mut w, &gw, &idx);
            }
            for i in (0..n).filter(|&i| !already[i]) {
                search[i].update(found[i]);
            }
        }
        Ok(p.unrows(best))
    }
}

/// What the minimum-norm attacks start from: the input rows, each sample's class (its label, or its target),
/// whether the goal is targeted, and which samples already meet it with margin κ on the clean input.
pub(crate) struct Start {
    pub x2: Array2<f32>,
    pub classes: Vec<usize>,
    pub targeted: bool,
    pub already: Vec<bool>,
}

/// The [`Start`] of `p`: one counted forward pass on the clean inputs.
pub(crate) fn start(p: &Problem<'_>, kappa: f32) -> Result<Start> {
    let x2 = p.rows();
    let classes = goal_classes(p.goal, p.labels)?;
    let targeted = p.goal.is_targeted();
    let clean = p.logits(p.x, None)?;
    let already = (0..x2.nrows())
        .map(|i| clean.row(i).as_slice().is_some_and(|z| succeeds(z, classes[i], targeted, kappa)))
        .collect();
    Ok(Start { x2, classes, targeted, already })
}

/// The CW loss per sample: max(z_y − max_{j≠y} z_j, −κ) untargeted (y = `class`), max(max_{j≠t} z_j − z_t, −κ)
/// targeted (t = `class`). Zero or below once the goal is met with margin κ.
pub(crate) fn cw_loss(z: &Tensor, class: &[usize], targeted: bool, kappa: f32) -> Result<Tensor> {
    let m = z.cw_margin(class)?; // max_{j≠c} z_j − z_c
    let f = if targeted { m } else { m.neg() };
    Ok(f.clamp(-kappa, f32::INFINITY))
}

/// Whether logits `z` meet the goal for class `class` (true label, or target) with logit margin ≥ κ: untargeted,
/// the prediction differs from the label and max_{j≠y} z_j − z_y ≥ κ; targeted, the prediction is the target and
/// z_t − max_{j≠t} z_j ≥ κ.
pub(crate) fn succeeds(z: &[f32], class: usize, targeted: bool, kappa: f32) -> bool {
    let pred = z.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (j, &v)| if v > b.1 { (j, v) } else { b }).0;
    let other = z.iter().enumerate().filter(|(j, _)| *j != class).fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
    if targeted {
        pred == class && z[class] - other >= kappa
    } else {
        pred != class && other - z[class] >= kappa
    }
}

/// Which rows of a gradient are flat by design, from their logits (`(row, logits) → bool`).
pub(crate) type Flat<'a> = &'a (dyn Fn(usize, &[f32]) -> bool + Sync);

/// The value of `f`, its input gradient rows (non-finite entries zeroed) and the logits at the rows `xs` [m, D],
/// which are the samples `who` of the problem: one forward and one backward over these m samples only, counted
/// by the problem. Rows are checked for faults (zero or non-finite) except those that `flat` marks: a loss
/// clamped once the goal is met with margin κ (CW, EAD) has a zero gradient there by design.
pub(crate) fn subset_gradient(
    p: &Problem<'_>,
    xs: &Array2<f32>,
    who: &[usize],
    f: &(dyn Fn(&Tensor, Range<usize>) -> Result<Tensor> + Sync),
    flat: Option<Flat<'_>>,
) -> Result<(Vec<f32>, Array2<f32>, Array2<f32>)> {
    let Some(flat) = flat else {
        let (values, g, logits) = p.gradient(&subset(p, xs), Some(who), f)?;
        let mut g = rows(&g);
        zero_non_finite(&mut g);
        return Ok((values, g, logits));
    };
    let (values, g, logits) = p.model.gradient(&subset(p, xs), f)?;
    let mut g = rows(&g);
    let (clamped, checked): (Vec<usize>, Vec<usize>) =
        (0..who.len()).partition(|&r| flat(r, logits.row(r).as_slice().unwrap_or(&[])));
    for &r in &clamped {
        p.add_gradients(who[r], 1);
        p.add_queries(who[r], 1);
    }
    let checked_who: Vec<usize> = checked.iter().map(|&r| who[r]).collect();
    p.note_gradient(g.select(Axis(0), &checked).view(), Some(&checked_who));
    zero_non_finite(&mut g);
    Ok((values, g, logits))
}

/// Logits of the rows `xs` [m, D], the samples `who` of the problem (one counted forward over these m samples).
pub(crate) fn subset_logits(p: &Problem<'_>, xs: &Array2<f32>, who: &[usize]) -> Result<Array2<f32>> {
    p.logits(&subset(p, xs), Some(who))
}

/// Rows [m, D] in the problem's input shape.
fn subset(p: &Problem<'_>, xs: &Array2<f32>) -> Tensor {
    let mut s = p.x.shape().to_vec();
    s[0] = xs.nrows();
    unrows(xs.clone(), &s)
}

/// atanh of x mapped to (−1, 1), kept 1e-6 inside so that atanh stays finite.
fn to_tanh_space(v: f32, lo: f32, hi: f32) -> f32 {
    let u = ((v - lo) / (hi - lo) * 2.0 - 1.0).clamp(-1.0 + 1e-6, 1.0 - 1e-6);
    u.atanh()
}

/// (tanh(w) + 1)/2·(hi − lo) + lo, clamped against rounding.
fn from_tanh_space(w: f32, lo: f32, hi: f32) -> f32 {
    ((w.tanh() + 1.0) * 0.5 * (hi - lo) + lo).clamp(lo, hi)
}

/// One sample's binary search over c (Carlini's schedule): success sets the upper bound and bisects; failure
/// raises the lower bound and bisects, or multiplies c by 10 while there is no upper bound.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Search {
    pub(crate) c: f32,
    lo: f32,
    hi: f32,
}

impl Search {
    pub(crate) fn new(c: f32) -> Search {
        Search { c, lo: 0.0, hi: f32::INFINITY }
    }

    pub(crate) fn update(&mut self, success: bool) {
        if success {
            self.hi = self.hi.min(self.c);
            self.c = (self.lo + self.hi) / 2.0;
        } else {
            self.lo = self.lo.max(self.c);
            self.c = if self.hi.is_finite() { (self.lo + self.hi) / 2.0 } else { self.c * 10.0 };
        }
    }
}

/// Adam (Kingma & Ba 2015) on the rows of a parameter matrix; one step counter for the whole matrix, since every
/// row that steps does so at the same iteration.
struct Adam {
    m: Array2<f32>,
    v: Array2<f32>,
    t: Vec<i32>,
    lr: f32,
}

impl Adam {
    fn new(n: usize, d: usize, lr: f32) -> Adam {
        Adam { m: Array2::zeros((n, d)), v: Array2::zeros((n, d)), t: vec![0; n], lr }
    }

    /// Steps rows `idx` of `w` with gradient rows `g` (row k of `g` belongs to row `idx[k]` of `w`).
    fn step(&mut self, w: &mut Array2<f32>, g: &Array2<f32>, idx: &[usize]) {
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        for (k, &i) in idx.iter().enumerate() {
            self.t[i] += 1;
            let (c1, c2) = (1.0 - b1.powi(self.t[i]), 1.0 - b2.powi(self.t[i]));
            let mut wr = w.row_mut(i);
            let mut mr = self.m.row_mut(i);
            let mut vr = self.v.row_mut(i);
            for (((wv, mv), vv), &gv) in wr.iter_mut().zip(mr.iter_mut()).zip(vr.iter_mut()).zip(g.row(k)) {
                *mv = b1 * *mv + (1.0 - b1) * gv;
                *vv = b2 * *vv + (1.0 - b2) * gv * gv;
                *wv -= self.lr * (*mv / c1) / ((*vv / c2).sqrt() + eps);
            }
        }
    }
}

/// Rejects κ < 0 or non-finite.
pub(crate) fn check_kappa(op: &'static str, kappa: f32) -> Result<()> {
    if !kappa.is_finite() || kappa < 0.0 {
        return Err(Error::invalid(op, format!("kappa = {kappa} must be finite and ≥ 0")));
    }
    Ok(())
}

/// Rejects a zero count.
pub(crate) fn check_count(op: &'static str, what: &str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(Error::invalid(op, format!("{what} must be at least 1")));
    }
    Ok(())
}

/// The class each sample's loss is about: its label (untargeted) or its target (targeted).
pub(crate) fn goal_classes(goal: &Resolved, labels: &[usize]) -> Result<Vec<usize>> {
    (0..labels.len()).map(|i| goal.class(i, labels)).collect()
}
