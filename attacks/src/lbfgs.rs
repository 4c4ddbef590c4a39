//! Box-constrained L-BFGS (Szegedy et al. 2014, "Intriguing properties of neural networks").
//!
//! Per sample, minimise F(x') = ‖x' − x‖₂² + c·L(x') over the box [lo, hi] — the paper's c·|r| + loss_f(x + r, l)
//! with the constant moved to the loss (the same minimisers, c ↔ 1/c), so that, as in Carlini–Wagner and Foolbox,
//! a failure raises c and a success lowers it in the per-sample binary search. L is the cross-entropy toward the
//! target (the paper's formulation); untargeted, L = −log Σ_{j≠y} p_j (the cross-entropy of "any class but y"),
//! which is smooth and vanishes as p_y → 0.
//!
//! The minimiser is projected L-BFGS rather than a full L-BFGS-B: the two-loop recursion (memory `memory`) on the
//! gradient of exactly F — MindArmour's gradient is not that of its objective — restricted to the free variables
//! (a variable at a bound whose gradient points outward is held), projection onto the box, and a backtracking
//! Armijo line search. Every accepted iterate is judged, and the smallest-L2 success is kept; a sample never
//! successful is returned unchanged, one already adversarial is returned unchanged with no work.

use std::ops::Range;

use armoury::attack::{Access, Algorithm, Budget, Norm, Problem};
use armoury::{Reduction, Result, Tensor};
use ndarray::Array2;

use crate::budget::check_positive;
use crate::cw::{check_count, start, subset_gradient, succeeds, Search, Start};
use crate::losses::one_hot;

/// Szegedy et al.'s box-constrained L-BFGS attack.
///
/// ```
/// use armoury::{data, nn, Attack, Goal, ModuleClassifier};
/// use armoury_attacks::LbfgsB;
/// let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
/// let (x, y) = data::sample()?.test.batch(0..2)?;
/// let attack = LbfgsB { max_iter: 10, binary_search_steps: 2, ..LbfgsB::default() };
/// let result = attack.run(&model, &x, &y, &Goal::Targeted(vec![1, 1]), 0)?;
/// assert_eq!(result.success.len(), 2);
/// # Ok::<(), armoury::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LbfgsB {
    /// Initial constant on the loss term.
    pub c: f32,
    /// Runs with different c per sample (1: c stays fixed).
    pub binary_search_steps: usize,
    /// L-BFGS iterations per run.
    pub max_iter: usize,
    /// Correction pairs kept by the two-loop recursion.
    pub memory: usize,
}

impl Default for LbfgsB {
    fn default() -> Self {
        LbfgsB { c: 0.1, binary_search_steps: 6, max_iter: 100, memory: 10 }
    }
}

impl LbfgsB {
    fn check(&self) -> Result<()> {
        check_positive("lbfgs", "c", self.c)?;
        check_count("lbfgs", "binary_search_steps", self.binary_search_steps)?;
        check_count("lbfgs", "max_iter", self.max_iter)?;
        check_count("lbfgs", "memory", self.memory)
    }
}

/// The loss L per sample of logits `z` toward `class`: CE(z, t) targeted, −log Σ_{j≠y} softmax(z)_j untargeted.
fn loss(z: &Tensor, class: &[usize], targeted: bool) -> Result<Tensor> {
    if targeted {
        return z.cross_entropy(class, Reduction::None);
    }
    let (m, k) = z.dims2("lbfgs loss")?;
    let others = z.log_softmax(1)?.masked_fill(&one_hot(m, k, class), f32::NEG_INFINITY)?;
    let top = others.max(1, true)?.detach();
    let lse = others.sub(&top)?.exp().sum(&[1], false)?.log().add(&top.reshape(&[m])?)?;
    Ok(lse.neg())
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&p, &q)| p as f64 * q as f64).sum()
}

/// One sample's optimiser state.
struct State {
    x: Vec<f32>,
    f: f64,
    g: Vec<f32>,
    history: Vec<(Vec<f32>, Vec<f32>, f64)>,
    alpha: f32,
    dir: Vec<f32>,
    trials: usize,
    running: bool,
}

/// The free-variable mask: a variable at a bound whose gradient pushes outward is held.
fn free(x: &[f32], g: &[f32], lo: f32, hi: f32) -> Vec<bool> {
    x.iter().zip(g).map(|(&v, &gv)| !((v <= lo && gv > 0.0) || (v >= hi && gv < 0.0))).collect()
}

/// −H·g by the two-loop recursion on the free variables (zero on the held ones).
fn direction(s: &State, lo: f32, hi: f32) -> Vec<f32> {
    let mask = free(&s.x, &s.g, lo, hi);
    let mut q: Vec<f64> = s.g.iter().zip(&mask).map(|(&g, &m)| if m { g as f64 } else { 0.0 }).collect();
    let mut a = vec![0f64; s.history.len()];
    for (j, (sv, yv, rho)) in s.history.iter().enumerate().rev() {
        a[j] = rho * sv.iter().zip(&q).map(|(&p, &r)| p as f64 * r).sum::<f64>();
        q.iter_mut().zip(yv).for_each(|(r, &y)| *r -= a[j] * y as f64);
    }
    let gamma = s.history.last().map_or(1.0, |(sv, yv, _)| dot(sv, yv) / dot(yv, yv).max(1e-30));
    q.iter_mut().for_each(|r| *r *= gamma);
    for (j, (sv, yv, rho)) in s.history.iter().enumerate() {
        let b = rho * yv.iter().zip(&q).map(|(&y, &r)| y as f64 * r).sum::<f64>();
        q.iter_mut().zip(sv).for_each(|(r, &p)| *r += (a[j] - b) * p as f64);
    }
    q.iter().zip(&mask).map(|(&r, &m)| if m { -r as f32 } else { 0.0 }).collect()
}

impl Algorithm for LbfgsB {
    fn name(&self) -> String {
        format!("L-BFGS-B(c={}, search={}, max_iter={})", self.c, self.binary_search_steps, self.max_iter)
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    fn budget(&self) -> Budget {
        Budget::Minimal { norm: Norm::L2 }
    }

    fn validate(&self) -> Result<()> {
        self.check()
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let (lo, hi) = p.bounds();
        let Start { x2, classes, targeted, already } = start(p, 0.0)?;
        let n = x2.nrows();
        let todo: Vec<usize> = (0..n).filter(|&i| !already[i]).collect();
        let mut best = x2.clone();
        let mut best_l2 = vec![f64::INFINITY; n];
        let mut search = vec![Search::new(self.c); n];
        let x0: Vec<Vec<f32>> = (0..n).map(|i| x2.row(i).to_vec()).collect();
        // F and ∇F at the rows `pts` of samples `who`; records successes.
        let mut evaluate = |who: &[usize],
                            pts: &[Vec<f32>],
                            cs: &[f32],
                            found: &mut [bool],
                            pos: &[usize]|
         -> Result<Vec<(f64, Vec<f32>)>> {
            let d = x2.ncols();
            let flat: Vec<f32> = pts.iter().flatten().copied().collect();
            let xs = Array2::from_shape_vec((who.len(), d), flat).expect("rows of D");
            let cls: Vec<usize> = who.iter().map(|&i| classes[i]).collect();
            let f = |z: &Tensor, r: Range<usize>| -> Result<Tensor> {
                loss(z, &cls[r.clone()], targeted)?.mul(&Tensor::from_slice(&cs[r.clone()], &[r.len()])?)
            };
            let (vals, g, logits) = subset_gradient(p, &xs, who, &f, None)?;
            let mut out = Vec::with_capacity(who.len());
            for (r, &i) in who.iter().enumerate() {
                let p = &pts[r];
                let l2sq: f64 = p.iter().zip(&x0[i]).map(|(&a, &b)| ((a - b) as f64).powi(2)).sum();
                if succeeds(logits.row(r).as_slice().expect("rows"), classes[i], targeted, 0.0) {
                    found[pos[r]] = true;
                    if l2sq < best_l2[i] {
                        best_l2[i] = l2sq;
                        best.row_mut(i).iter_mut().zip(p).for_each(|(b, &v)| *b = v);
                    }
                }
                let gr: Vec<f32> =
                    g.row(r).iter().zip(p).zip(&x0[i]).map(|((&gv, &a), &b)| gv + 2.0 * (a - b)).collect();
                out.push((l2sq + vals[r] as f64, gr));
            }
            Ok(out)
        };
        for _ in 0..self.binary_search_steps {
            if todo.is_empty() {
                break;
            }
            let cs_all: Vec<f32> = todo.iter().map(|&i| search[i].c).collect();
            let mut found = vec![false; todo.len()];
            let pos: Vec<usize> = (0..todo.len()).collect();
            let pts: Vec<Vec<f32>> = todo.iter().map(|&i| x0[i].clone()).collect();
            let first = evaluate(&todo, &pts, &cs_all, &mut found, &pos)?;
            let mut st: Vec<State> = pts
                .into_iter()
                .zip(first)
                .map(|(x, (f, g))| State {
                    x,
                    f,
                    g,
                    history: Vec::new(),
                    alpha: 1.0,
                    dir: Vec::new(),
                    trials: 0,
                    running: true,
                })
                .collect();
            for _ in 0..self.max_iter {
                // Directions; the first step (no curvature yet) has unit L2 length.
                set_directions(&mut st, lo, hi);
                // Backtracking Armijo line search, all pending samples evaluated together.
                let mut pending: Vec<usize> = (0..st.len()).filter(|&k| st[k].running).collect();
                if pending.is_empty() {
                    break;
                }
                while !pending.is_empty() {
                    let trial: Vec<Vec<f32>> = pending
                        .iter()
                        .map(|&k| {
                            let s = &st[k];
                            s.x.iter().zip(&s.dir).map(|(&v, &dv)| (v + s.alpha * dv).clamp(lo, hi)).collect()
                        })
                        .collect();
                    let who: Vec<usize> = pending.iter().map(|&k| todo[k]).collect();
                    let cs: Vec<f32> = pending.iter().map(|&k| cs_all[k]).collect();
                    let res = evaluate(&who, &trial, &cs, &mut found, &pending)?;
                    let mut still = Vec::new();
                    for ((k, xn), (fnew, gnew)) in pending.iter().copied().zip(trial).zip(res) {
                        if try_step(&mut st[k], xn, fnew, gnew, self.memory) {
                            still.push(k);
                        }
                    }
                    pending = still;
                }
            }
            for (k, &i) in todo.iter().enumerate() {
                search[i].update(found[k]);
            }
        }
        Ok(p.unrows(best))
    }
}

/// Sets each running sample's search direction and initial step; stops those with no usable direction.
/// The first step (no curvature yet) has unit L2 length.
fn set_directions(st: &mut [State], lo: f32, hi: f32) {
    for s in st.iter_mut().filter(|s| s.running) {
        let mut dir = direction(s, lo, hi);
        let slope = dot(&dir, &s.g);
        if slope >= 0.0 || slope.is_nan() {
            s.history.clear();
            dir = direction(s, lo, hi);
        }
        let dn = dot(&dir, &dir).sqrt();
        if dn == 0.0 || !dn.is_finite() {
            s.running = false;
            continue;
        }
        s.alpha = if s.history.is_empty() { (1.0 / dn).min(1.0) as f32 } else { 1.0 };
        s.dir = dir;
        s.trials = 0;
    }
}

/// One Armijo test of the trial point `xn`: accepts it (updating the curvature history) or halves
/// the step; returns whether the sample still needs another trial.
fn try_step(s: &mut State, xn: Vec<f32>, fnew: f64, gnew: Vec<f32>, memory: usize) -> bool {
    let step: Vec<f32> = xn.iter().zip(&s.x).map(|(&a, &b)| a - b).collect();
    let decrease = dot(&s.g, &step);
    if fnew.is_finite() && fnew <= s.f + 1e-4 * decrease {
        let yv: Vec<f32> = gnew.iter().zip(&s.g).map(|(&a, &b)| a - b).collect();
        let sy = dot(&step, &yv);
        if sy > 1e-10 {
            if s.history.len() == memory {
                s.history.remove(0);
            }
            s.history.push((step, yv, 1.0 / sy));
        }
        let rel = (s.f - fnew) / s.f.abs().max(1.0);
        s.x = xn;
        s.g = gnew;
        s.f = fnew;
        if rel < 1e-9 {
            s.running = false;
        }
        false
    } else {
        s.trials += 1;
        s.alpha *= 0.5;
        if s.trials >= 20 {
            s.running = false;
            false
        } else {
            true
        }
    }
}
