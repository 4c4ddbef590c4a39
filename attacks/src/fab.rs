//! FAB, the fast adaptive boundary attack (Croce & Hein 2020, "Minimally distorted adversarial examples with a
//! fast adaptive boundary attack"), in L∞, L2 and L1, untargeted and targeted; with `target_classes > 0` and an
//! untargeted goal it is AutoAttack's FAB-T (the boundary against each of the top non-true classes in turn,
//! success being any misclassification).
//!
//! Per sample, from x⁽⁰⁾ = x (or a random start for restarts after the first): linearise the logit differences
//! f_j = z_j − z_y at the iterate x⁽ᵏ⁾, take the class j whose linearised boundary is nearest in the attack's
//! norm (|f_j| / ‖∇f_j‖_q, q the dual norm), and project both x⁽ᵏ⁾ and the original x onto the intersection of
//! that hyperplane with the input box: δ₁ = P(x⁽ᵏ⁾) − x⁽ᵏ⁾, δ₂ = P(x) − x. The next iterate is the biased step
//! x⁽ᵏ⁺¹⁾ = clip((1 − α)(x⁽ᵏ⁾ + η δ₁) + α (x + η δ₂)) with α = min(‖δ₁‖/(‖δ₁‖ + ‖δ₂‖), α_max), which keeps the
//! iterate near x. When an iterate is adversarial it is kept if smaller than the best so far, and the iterate is
//! pulled back toward x: x⁽ᵏ⁺¹⁾ = x + β (x⁽ᵏ⁺¹⁾ − x). The output is the smallest adversarial point found (x if
//! none was found); the template reports it as a minimum-norm attack and clips it to each ε of a sweep.
//!
//! The projection onto {z : wᵀz = b} ∩ [lo, hi]ᴰ has a closed form per norm after one sort, derived here from the
//! KKT conditions (the reference code's vectorised bisections compute the same points):
//! with r = |b − wᵀt| and each coordinate moving only toward the side that reduces the residual, by at most its
//! room to the box, the smallest L∞ step moves every coordinate by min(λ, room_i); the smallest L2 step by
//! min(μ|w_i|, room_i); the smallest L1 step fills coordinates in decreasing order of |w_i|. λ and μ solve a
//! piecewise-linear equation, found by walking the sorted break points. If the hyperplane does not meet the box,
//! every coordinate moves to its bound (the box point nearest the hyperplane).
//!
//! Where Armoury differs from AutoAttack's code: success is checked on the logits of the next linearisation's
//! forward pass (one forward per step instead of two; an adversarial iterate that is pulled back costs one more
//! forward for that sample only); restarts and further targets run only on samples with nothing found within
//! `stop_at` (AutoAttack's ε), or on all samples when `stop_at` is `None`; with a targeted goal the boundary
//! linearised is that between the target and the strongest other class at the iterate (reaching the target
//! needs all of them), where AutoAttack's targeted FAB uses the true class and counts any misclassification.

use armoury::attack::{Access, Algorithm, Budget, Problem, Resolved};
use armoury::classifier::argmax_rows;
use armoury::{Error, Result, Tensor};
use ndarray::{Array2, Axis};
use rayon::prelude::*;

use crate::budget::{random_in_ball, row_seeds, Norm};
use crate::cw::check_count;
use crate::deepfool::{difference_gradient, forward_graph};
use crate::losses::zero_non_finite;

/// The fast adaptive boundary attack (Croce & Hein 2020).
///
/// ```
/// use armoury::{data, nn, Attack, Goal, ModuleClassifier};
/// use armoury_attacks::Fab;
/// let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
/// let (x, y) = data::sample()?.test.batch(0..4)?;
/// let result = Fab { steps: 10, ..Fab::linf() }.run(&model, &x, &y, &Goal::Untargeted, 0)?;
/// assert_eq!(result.norms.len(), 4);
/// # Ok::<(), armoury::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Fab {
    /// The norm minimised: L∞, L2 or L1.
    pub norm: Norm,
    /// Iterations per run (100).
    pub steps: usize,
    /// Runs per target; runs after the first start from a random point at distance `restart_radius / 2` (1).
    pub restarts: usize,
    /// The radius of random restarts, in the attack's norm (AutoAttack's ε: 0.3 L∞, 1.0 L2, 5.0 L1).
    pub restart_radius: f32,
    /// Largest bias toward the original point, α_max (0.1).
    pub alpha_max: f32,
    /// Overshoot η of the projection step (1.05).
    pub eta: f32,
    /// Backward step β toward x after an adversarial iterate (0.9).
    pub beta: f32,
    /// For an untargeted goal: 0 linearises every class at once (FAB); k > 0 runs FAB-T against each of the top
    /// k non-true classes by clean logit in turn (AutoAttack: 9).
    pub target_classes: usize,
    /// Skip further restarts and targets for a sample already broken within this norm (AutoAttack's ε).
    pub stop_at: Option<f32>,
}

impl Fab {
    /// Untargeted FAB in L∞ with the paper's settings: 100 steps, 1 run, α_max = 0.1, η = 1.05, β = 0.9.
    pub fn linf() -> Fab {
        Fab {
            norm: Norm::Linf,
            steps: 100,
            restarts: 1,
            restart_radius: 0.3,
            alpha_max: 0.1,
            eta: 1.05,
            beta: 0.9,
            target_classes: 0,
            stop_at: None,
        }
    }

    /// Untargeted FAB in L2.
    pub fn l2() -> Fab {
        Fab { norm: Norm::L2, restart_radius: 1.0, ..Fab::linf() }
    }

    /// Untargeted FAB in L1.
    pub fn l1() -> Fab {
        Fab { norm: Norm::L1, restart_radius: 5.0, ..Fab::linf() }
    }

    /// AutoAttack's FAB-T in `norm` at budget `eps`: 9 target classes, 1 run each, restarts of radius ε, no
    /// further target for a sample broken within ε.
    pub fn targeted(norm: Norm, eps: f32) -> Fab {
        let base = match norm {
            Norm::Linf => Fab::linf(),
            Norm::L2 => Fab::l2(),
            Norm::L1 => Fab::l1(),
        };
        Fab { target_classes: 9, restart_radius: eps, stop_at: Some(eps), ..base }
    }

    fn check(&self) -> Result<()> {
        check_count("fab", "steps", self.steps)?;
        check_count("fab", "restarts", self.restarts)?;
        let finite_pos = |v: f32| v.is_finite() && v > 0.0;
        if !finite_pos(self.restart_radius) {
            return Err(Error::invalid(
                "fab",
                format!("restart radius {} must be finite and > 0", self.restart_radius),
            ));
        }
        if !(0.0..=1.0).contains(&self.alpha_max) {
            return Err(Error::invalid("fab", format!("α_max = {} must be in [0, 1]", self.alpha_max)));
        }
        if !finite_pos(self.eta) {
            return Err(Error::invalid("fab", format!("η = {} must be finite and > 0", self.eta)));
        }
        if !(self.beta > 0.0 && self.beta <= 1.0) {
            return Err(Error::invalid("fab", format!("β = {} must be in (0, 1]", self.beta)));
        }
        if let Some(s) = self.stop_at.filter(|s| !s.is_finite() || *s < 0.0) {
            return Err(Error::invalid("fab", format!("stop_at = {s} must be finite and ≥ 0")));
        }
        Ok(())
    }
}

/// Which boundary a run linearises, and what counts as success, for each of its rows.
#[derive(Clone, Copy)]
enum Boundary {
    /// Every class other than the label (untargeted FAB); success: any other class.
    AllClasses,
    /// The class `t` against the label (FAB-T); success: any other class than the label.
    Pair(usize),
    /// The target `t` against the strongest other class; success: exactly `t`.
    Reach(usize),
}

/// The per-sample state of one run over some rows.
struct Run<'a> {
    x0: Array2<f32>,
    who: &'a [usize],
    labels: Vec<usize>,
    bounds: Vec<Boundary>,
}

/// The linearisation at a point: f_j and ∇f_j of the nearest boundary, per row.
struct Linear {
    f: Vec<f64>,
    w: Array2<f32>,
}

impl Fab {
    /// The nearest linearised boundary at each row of `xs` (rows `rows` of the run), and the predicted classes.
    fn linearise(
        &self,
        p: &Problem<'_>,
        run: &Run<'_>,
        xs: &Array2<f32>,
        rows_: &[usize],
    ) -> Result<(Linear, Vec<usize>)> {
        let (m, d) = xs.dim();
        let (pieces, logits) = forward_graph(p.model, xs, p.x.shape())?;
        let who: Vec<usize> = rows_.iter().map(|&r| run.who[r]).collect();
        who.iter().for_each(|&i| p.add_queries(i, 1));
        let k = p.model.num_classes();
        let preds = argmax_rows(&logits);
        // Columns of (to, from) pairs: the candidate boundaries, one backward each.
        let all = rows_.iter().any(|&r| matches!(run.bounds[r], Boundary::AllClasses));
        let columns = if all { k - 1 } else { 1 };
        let mut best = Linear { f: vec![f64::INFINITY; m], w: Array2::zeros((m, d)) };
        let mut best_dist = vec![f64::INFINITY; m];
        for c in 0..columns {
            let (to, from): (Vec<usize>, Vec<usize>) = rows_
                .iter()
                .enumerate()
                .map(|(q, &r)| {
                    let y = run.labels[r];
                    match run.bounds[r] {
                        Boundary::AllClasses => (if c < y { c } else { c + 1 }, y),
                        Boundary::Pair(t) => (t, y),
                        Boundary::Reach(t) => {
                            let z = logits.row(q);
                            let other =
                                (0..k).filter(|&j| j != t).max_by(|&a, &b| z[a].total_cmp(&z[b]).then(b.cmp(&a)));
                            (t, other.expect("at least two classes"))
                        }
                    }
                })
                .unzip();
            let mut g = difference_gradient(p.model, &pieces, &to, &from, d)?;
            p.note_backward(g.view(), Some(&who));
            zero_non_finite(&mut g);
            for q in 0..m {
                let f = (logits[[q, to[q]]] - logits[[q, from[q]]]) as f64;
                let gn = dual(self.norm).of(g.row(q).as_slice().expect("rows"));
                let dist = f.abs() / (gn + 1e-12);
                if dist < best_dist[q] {
                    best_dist[q] = dist;
                    best.f[q] = f;
                    best.w.row_mut(q).assign(&g.row(q));
                }
            }
        }
        Ok((best, preds))
    }

    /// One FAB run over the rows of `run`, from x or from a random start (`start = Some(stream)`): the smallest
    /// adversarial point of each row and its norm (∞ and x when none was found).
    fn run_once(&self, p: &Problem<'_>, run: &Run<'_>, start: Option<u64>) -> Result<(Array2<f32>, Vec<f64>)> {
        let (n, d) = run.x0.dim();
        let (lo, hi) = p.bounds();
        let mut x1 = run.x0.clone();
        if let Some(stream) = start {
            let seeds = row_seeds(&run.x0, p.seed, stream);
            let mut delta = random_in_ball(n, d, self.norm, &vec![1.0; n], &seeds);
            let r = 0.5 * self.restart_radius as f64;
            for (mut x, mut dl) in x1.rows_mut().into_iter().zip(delta.rows_mut()) {
                let s = dl.as_slice_mut().expect("rows");
                let nrm = self.norm.of(s).max(1e-12);
                x.iter_mut()
                    .zip(s.iter())
                    .for_each(|(v, &e)| *v = (*v as f64 + e as f64 * r / nrm).clamp(lo as f64, hi as f64) as f32);
            }
        }
        let mut best = run.x0.clone();
        let mut best_norm = vec![f64::INFINITY; n];
        let all: Vec<usize> = (0..n).collect();
        let (mut lin, _) = self.linearise(p, run, &x1, &all)?;
        for it in 0..self.steps {
            x1 = self.step(run, &x1, &lin, (lo, hi));
            let last = it + 1 == self.steps;
            let preds = if last {
                let who: Vec<usize> = run.who.to_vec();
                argmax_rows(&p.logits(&unrows_like(p, &x1), Some(&who))?)
            } else {
                let (l, preds) = self.linearise(p, run, &x1, &all)?;
                lin = l;
                preds
            };
            let reject = p.model.rejection_class();
            let adv: Vec<usize> = (0..n).filter(|&r| success(reject, run.bounds[r], run.labels[r], preds[r])).collect();
            for &r in &adv {
                let delta: Vec<f32> = x1.row(r).iter().zip(run.x0.row(r)).map(|(a, b)| a - b).collect();
                let nrm = self.norm.of(&delta);
                if nrm < best_norm[r] {
                    best_norm[r] = nrm;
                    best.row_mut(r).assign(&x1.row(r));
                }
                let beta = self.beta;
                let back: Vec<f32> = run.x0.row(r).iter().zip(&delta).map(|(&x, &dl)| x + beta * dl).collect();
                x1.row_mut(r).assign(&ndarray::ArrayView1::from(&back));
            }
            if !last && !adv.is_empty() {
                // The pulled-back rows need the linearisation at their new point.
                let xs = x1.select(Axis(0), &adv);
                let (l, _) = self.linearise(p, run, &xs, &adv)?;
                for (q, &r) in adv.iter().enumerate() {
                    lin.f[r] = l.f[q];
                    lin.w.row_mut(r).assign(&l.w.row(q));
                }
            }
        }
        Ok((best, best_norm))
    }

    /// The biased projection step from `x1` for every row.
    fn step(&self, run: &Run<'_>, x1: &Array2<f32>, lin: &Linear, (lo, hi): (f32, f32)) -> Array2<f32> {
        let (n, d) = x1.dim();
        let mut out = Array2::<f32>::zeros((n, d));
        out.axis_iter_mut(Axis(0)).into_par_iter().enumerate().for_each(|(r, mut o)| {
            let (xc, x0, w) = (x1.row(r), run.x0.row(r), lin.w.row(r));
            let (xc, x0, w) = (xc.as_slice().expect("rows"), x0.as_slice().expect("rows"), w.as_slice().expect("rows"));
            // The hyperplane {z : wᵀz = b} with b = wᵀx1 − f (the zero of the linearisation at x1).
            let b = dot(w, xc) - lin.f[r];
            let d1 = project_hyperplane_box(self.norm, xc, w, b, (lo, hi));
            let d2 = project_hyperplane_box(self.norm, x0, w, b, (lo, hi));
            let a1 = self.norm.of(&d1).max(1e-8);
            let a2 = self.norm.of(&d2).max(1e-8);
            let alpha = (a1 / (a1 + a2)).clamp(0.0, self.alpha_max as f64) as f32;
            let eta = self.eta;
            for (j, v) in o.iter_mut().enumerate() {
                let next = (xc[j] + eta * d1[j]) * (1.0 - alpha) + (x0[j] + eta * d2[j]) * alpha;
                *v = next.clamp(lo, hi);
            }
        });
        out
    }

    /// The runs for targets/restarts over the samples not yet done, merged into `(best, norm)`.
    fn attack(&self, p: &Problem<'_>) -> Result<Tensor> {
        let x2 = p.rows();
        let n = x2.nrows();
        let z = p.logits(p.x, None)?;
        let preds = argmax_rows(&z);
        let reject = p.model.rejection_class();
        let k = p.model.num_classes();
        let targeted_goal = p.goal.is_targeted();
        // Already fulfilled on the clean input: returned unchanged.
        let mut norms: Vec<f64> = (0..n)
            .map(|i| {
                let ok = p.goal.is_success(reject, i, p.labels[i], preds[i]);
                if ok {
                    0.0
                } else {
                    f64::INFINITY
                }
            })
            .collect();
        let mut best = x2.clone();
        let rounds: Vec<Option<usize>> = match (targeted_goal, self.target_classes) {
            (false, t) if t > 0 => (0..t.min(k - 1)).map(Some).collect(),
            _ => vec![None],
        };
        // Non-true classes by decreasing clean logit (ties: lower index first).
        let ranked: Vec<Vec<usize>> = z
            .rows()
            .into_iter()
            .zip(p.labels)
            .map(|(r, &y)| {
                let mut c: Vec<usize> = (0..k).filter(|&j| j != y).collect();
                c.sort_by(|&a, &b| r[b].total_cmp(&r[a]).then(a.cmp(&b)));
                c
            })
            .collect();
        for (ti, round) in rounds.iter().enumerate() {
            for restart in 0..self.restarts {
                let stop = self.stop_at.map_or(0.0, |s| s as f64);
                let todo: Vec<usize> =
                    (0..n).filter(|&i| norms[i] > 0.0 && (self.stop_at.is_none() || norms[i] > stop)).collect();
                if todo.is_empty() {
                    break;
                }
                let bounds = todo
                    .iter()
                    .map(|&i| match (p.goal, round) {
                        (Resolved::Targeted(t), _) => Boundary::Reach(t[i]),
                        (Resolved::Untargeted, Some(j)) => Boundary::Pair(ranked[i][*j]),
                        (Resolved::Untargeted, None) => Boundary::AllClasses,
                    })
                    .collect();
                let run = Run {
                    x0: x2.select(Axis(0), &todo),
                    who: &todo,
                    labels: todo.iter().map(|&i| p.labels[i]).collect(),
                    bounds,
                };
                let stream = ((ti as u64) << 32) | restart as u64;
                let (b, bn) = self.run_once(p, &run, (restart > 0).then_some(stream))?;
                for (q, &i) in todo.iter().enumerate() {
                    if bn[q] < norms[i] {
                        norms[i] = bn[q];
                        best.row_mut(i).assign(&b.row(q));
                    }
                }
            }
        }
        Ok(p.unrows(best))
    }
}

fn unrows_like(p: &Problem<'_>, a: &Array2<f32>) -> Tensor {
    let mut shape = p.x.shape().to_vec();
    shape[0] = a.nrows();
    crate::budget::unrows(a.clone(), &shape)
}

/// The core's success rule ([`armoury::attack::is_success`]) for a run's boundary.
fn success(reject: Option<usize>, b: Boundary, label: usize, pred: usize) -> bool {
    let target = match b {
        Boundary::AllClasses | Boundary::Pair(_) => None,
        Boundary::Reach(t) => Some(t),
    };
    armoury::attack::is_success(reject, label, target, pred)
}

/// The dual norm: distances to a hyperplane with normal w are |f| / ‖w‖_q.
fn dual(norm: Norm) -> Norm {
    match norm {
        Norm::Linf => Norm::L1,
        Norm::L2 => Norm::L2,
        Norm::L1 => Norm::Linf,
    }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&u, &v)| u as f64 * v as f64).sum()
}

/// A coordinate that can move: (index, a_i = |w_i|, room_i, dir_i).
type Coord = (usize, f64, f64, f64);

/// The smallest step δ in `norm` with wᵀ(t + δ) = b and lo ≤ t + δ ≤ hi (t inside the box); when the hyperplane
/// does not meet the box, the step to the box corner nearest it. Coordinates with w_i = 0 never move.
pub fn project_hyperplane_box(norm: Norm, t: &[f32], w: &[f32], b: f64, (lo, hi): (f32, f32)) -> Vec<f32> {
    let d = t.len();
    let mut delta = vec![0f32; d];
    let c = b - dot(w, t); // the residual wᵀδ must cover
    if c == 0.0 || !c.is_finite() {
        return delta;
    }
    // Each coordinate moves in direction dir_i = sign(w_i c), gaining a_i = |w_i| per unit, up to room_i. The
    // coordinates that can move, as (index, a_i, room_i, dir_i), computed once: the sorts below compare
    // precomputed keys (most of FAB's time outside the model went to recomputing them inside comparisons).
    let r = c.abs();
    let live: Vec<Coord> = (0..d)
        .filter_map(|i| {
            let dir = if (w[i] as f64 * c) > 0.0 { 1.0f64 } else { -1.0 };
            let room = if dir > 0.0 { (hi - t[i]).max(0.0) as f64 } else { (t[i] - lo).max(0.0) as f64 };
            (w[i] != 0.0 && room > 0.0).then_some((i, (w[i] as f64).abs(), room, dir))
        })
        .collect();
    let capacity: f64 = live.iter().map(|&(_, a, room, _)| a * room).sum();
    let mut set = |(i, _, room, dir): Coord, m: f64| delta[i] = (dir * m.min(room)) as f32;
    if capacity <= r {
        live.iter().for_each(|&v| set(v, f64::INFINITY));
        return delta;
    }
    // Sorted by a key, ties to the lower index (the index is unique, so the unstable sort is deterministic).
    let sorted = |key: &dyn Fn(&Coord) -> f64| {
        let mut order: Vec<(f64, usize)> = live.iter().enumerate().map(|(q, v)| (key(v), q)).collect();
        order.sort_unstable_by(|x, y| x.0.total_cmp(&y.0).then(live[x.1].0.cmp(&live[y.1].0)));
        order
    };
    match norm {
        Norm::L1 => {
            // Fill the coordinates with the largest |w_i| first: each unit of L1 there buys the most.
            let mut left = r;
            for (_, q) in sorted(&|v| -v.1) {
                let (a, room) = (live[q].1, live[q].2);
                let gain = a * room;
                if gain >= left {
                    set(live[q], left / a);
                    break;
                }
                set(live[q], f64::INFINITY);
                left -= gain;
            }
        }
        Norm::Linf | Norm::L2 => {
            // Coordinate i moves by min(s·k_i, room_i) with k_i = 1 (L∞) or |w_i| (L2); find s with
            // Σ a_i min(s k_i, room_i) = r by walking the break points s_i = room_i / k_i in increasing order.
            let k = |a: f64| if norm == Norm::Linf { 1.0 } else { a };
            let (mut done, mut slope) = (0.0f64, live.iter().map(|&(_, a, _, _)| a * k(a)).sum::<f64>());
            let mut s = 0.0;
            for (si, q) in sorted(&|v| v.2 / k(v.1)) {
                let (a, room) = (live[q].1, live[q].2);
                // Below si every remaining coordinate is still moving: g(s) = done + slope·s.
                if done + slope * si >= r {
                    break;
                }
                done += a * room;
                slope -= a * k(a);
                s = si;
            }
            if slope > 0.0 {
                s = ((r - done) / slope).max(s);
            }
            for &v in &live {
                set(v, s * k(v.1));
            }
        }
    }
    delta
}

impl Algorithm for Fab {
    fn name(&self) -> String {
        let t = if self.target_classes > 0 { format!("-T(targets={})", self.target_classes) } else { String::new() };
        format!("FAB{t}-{}(steps={}, restarts={})", self.norm.name(), self.steps, self.restarts)
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    fn budget(&self) -> Budget {
        Budget::Minimal { norm: self.norm }
    }

    fn validate(&self) -> Result<()> {
        self.check()
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        if p.model.num_classes() < 2 {
            return Err(Error::invalid("fab", "FAB needs at least two classes"));
        }
        self.attack(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_min(norm: Norm, t: &[f32], w: &[f32], b: f64) -> Vec<f32> {
        let d = project_hyperplane_box(norm, t, w, b, (0.0, 1.0));
        let z: Vec<f32> = t.iter().zip(&d).map(|(a, b)| a + b).collect();
        assert!(z.iter().all(|v| (0.0..=1.0).contains(v)), "{z:?}");
        assert!((dot(w, &z) - b).abs() < 1e-5, "on the plane: {} vs {b}", dot(w, &z));
        d
    }

    #[test]
    fn projections_reach_the_plane_with_the_hand_computed_step() {
        let t = [0.5f32, 0.5, 0.9];
        let w = [1.0f32, 2.0, 1.0];
        // wᵀt = 2.4; b = 3.4 needs wᵀδ = 1.
        // L∞: every coordinate moves up by λ, capped at room (0.5, 0.5, 0.1): 0.1 + 3λ' … λ = (1 − 0.1)/3 = 0.3.
        let d = check_min(Norm::Linf, &t, &w, 3.4);
        assert!((d[0] - 0.3).abs() < 1e-6 && (d[1] - 0.3).abs() < 1e-6 && (d[2] - 0.1).abs() < 1e-6, "{d:?}");
        // L2: δ_i = min(μ w_i, room_i): μ(1 + 4) capped … coordinate 3 caps at μ = 0.1; then 0.1 + μ·5 = 1 → μ = 0.18.
        let d = check_min(Norm::L2, &t, &w, 3.4);
        assert!((d[0] - 0.18).abs() < 1e-6 && (d[1] - 0.36).abs() < 1e-6 && (d[2] - 0.1).abs() < 1e-6, "{d:?}");
        // L1: the largest |w| first: coordinate 2 gives 2·0.5 = 1 exactly.
        let d = check_min(Norm::L1, &t, &w, 3.4);
        assert!(d[0].abs() < 1e-7 && (d[1] - 0.5).abs() < 1e-6 && d[2].abs() < 1e-7, "{d:?}");
        // Downward: b = 1.4 (wᵀδ = −1): L∞ moves each down by 0.25.
        let d = check_min(Norm::Linf, &t, &w, 1.4);
        assert!(d.iter().all(|v| (v + 0.25).abs() < 1e-6), "{d:?}");
    }

    #[test]
    fn an_unreachable_plane_gives_the_nearest_corner() {
        let d = project_hyperplane_box(Norm::L2, &[0.5, 0.5], &[1.0, -1.0], 5.0, (0.0, 1.0));
        assert_eq!(d, vec![0.5, -0.5]);
        let d = project_hyperplane_box(Norm::Linf, &[0.5, 0.5], &[0.0, 1.0], 0.5, (0.0, 1.0));
        assert_eq!(d, vec![0.0, 0.0], "already on the plane");
    }

    /// Against brute force on random problems: no feasible point on a fine grid of the plane is closer.
    #[test]
    fn projections_are_minimal_on_random_problems() {
        use rand::Rng;
        let mut g = armoury::seed::rng(5);
        for norm in [Norm::Linf, Norm::L2, Norm::L1] {
            for _ in 0..200 {
                let t: Vec<f32> = (0..2).map(|_| g.random::<f32>()).collect();
                let w: Vec<f32> = (0..2).map(|_| g.random::<f32>() * 2.0 - 1.0).collect();
                let b = dot(&w, &[g.random::<f32>(), g.random::<f32>()]);
                let d = check_min(norm, &t, &w, b);
                let best = norm.of(&d);
                // Points of the plane inside the box: parametrise by the first coordinate.
                for s in 0..=2000 {
                    let z0 = s as f64 / 2000.0;
                    if w[1].abs() < 1e-3 {
                        continue;
                    }
                    let z1 = (b - w[0] as f64 * z0) / w[1] as f64;
                    if !(0.0..=1.0).contains(&z1) {
                        continue;
                    }
                    let cand = [(z0 - t[0] as f64) as f32, (z1 - t[1] as f64) as f32];
                    assert!(norm.of(&cand) >= best - 1e-5, "{norm:?} t={t:?} w={w:?} b={b}: {cand:?} beats {d:?}");
                }
            }
        }
    }
}
