//! DeepFool (Moosavi-Dezfooli, Fawzi & Frossard 2016, "DeepFool: a simple and accurate method to fool deep
//! neural networks"): linearise the classifier around the current point and step to the nearest linearised
//! decision boundary among the top-`candidates` classes, until the label changes.
//!
//! Each iteration builds the graph once per piece of the batch and runs one backward per candidate class
//! (vector–Jacobian products of z_k − z_y), so a sample costs `candidates − 1` gradient evaluations per
//! iteration. The step to class k is r = |f_k|/‖w_k‖₂² · w_k (L2) or |f_k|/‖w_k‖₁ · sign(w_k) (L∞), with
//! f_k = z_k − z_y and w_k = ∇f_k; the returned point is clip(x + (1 + overshoot)·Σ r_i).
//!
//! Like Foolbox and MindArmour, the overshoot alone carries the point across the boundary (the paper's code adds
//! 1e-4 to each step's length; we don't, which reproduces MindArmour's golden values) — except on an exact tie of
//! the two logits, where the overshoot of a zero step is zero and the paper's 1e-4 is used. The paper has no box;
//! Armoury's DeepFool is box-aware: a coordinate at a bound that the step would push outward is dropped from the
//! linearisation (its gradient entry is zeroed), and a clipped coordinate keeps only the realised part of Σr.
//! Clipping alone (Foolbox, MindArmour) makes each step fall short by the clipped part, so on images with
//! saturated pixels the iterates creep toward the boundary without crossing it (18 of 100 Fashion-MNIST test
//! images on the fixture cnn). Where Armoury differs from MindArmour: MindArmour's L∞ step is |f|/‖w‖₁ · sign(w)/‖w‖₁ (an extra division) and it multiplies the
//! total perturbation by the width of the bounds; Armoury takes the paper's step. The candidate classes are the
//! top `candidates` of the clean logits, as in the paper's implementation (MindArmour uses all classes).

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Classifier, Error, Result, Tensor};
use ndarray::{Array2, Axis};
use rayon::prelude::*;

use crate::budget::{rows, sign, unrows, Norm};
use crate::cw::check_count;
use crate::losses::zero_non_finite;

/// DeepFool, untargeted, L2 or L∞.
///
/// ```
/// use armoury::{data, nn, Attack, Goal, ModuleClassifier};
/// use armoury_attacks::DeepFool;
/// let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
/// let (x, y) = data::sample()?.test.batch(0..4)?;
/// let result = DeepFool::default().run(&model, &x, &y, &Goal::Untargeted, 0)?;
/// assert_eq!(result.norms.len(), 4);
/// # Ok::<(), armoury::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct DeepFool {
    /// L2 or L∞ (the dual norm measures the distance to each linearised boundary).
    pub norm: Norm,
    /// The total perturbation is multiplied by 1 + overshoot.
    pub overshoot: f32,
    /// Iterations at most.
    pub max_iter: usize,
    /// Classes considered: the true class and the next `candidates − 1` classes by clean logit (10 in the paper).
    pub candidates: usize,
}

impl Default for DeepFool {
    fn default() -> Self {
        DeepFool { norm: Norm::L2, overshoot: 0.02, max_iter: 50, candidates: 10 }
    }
}

impl DeepFool {
    /// DeepFool-L∞ with the paper's settings.
    pub fn linf() -> DeepFool {
        DeepFool { norm: Norm::Linf, ..DeepFool::default() }
    }

    fn check(&self) -> Result<()> {
        if self.norm == Norm::L1 {
            return Err(Error::invalid("deepfool", "norm must be L2 or Linf"));
        }
        if !self.overshoot.is_finite() || self.overshoot < 0.0 {
            return Err(Error::invalid("deepfool", format!("overshoot {} must be finite and ≥ 0", self.overshoot)));
        }
        check_count("deepfool", "max_iter", self.max_iter)?;
        if self.candidates < 2 {
            return Err(Error::invalid("deepfool", "candidates must be at least 2"));
        }
        Ok(())
    }
}

/// One piece of the batch with its graph: the input variable, the logits, the rows it covers.
pub(crate) struct Piece {
    xv: Tensor,
    z: Tensor,
    start: usize,
}

/// Builds the graph for `xs` [m, D] (pieces of the classifier's chunk size, in parallel), counted as one forward.
pub(crate) fn forward_graph(
    model: &dyn Classifier,
    xs: &Array2<f32>,
    shape: &[usize],
) -> Result<(Vec<Piece>, Array2<f32>)> {
    let m = xs.nrows();
    let chunk = model.chunk_size().filter(|&c| c > 0).unwrap_or(m).max(1);
    let starts: Vec<usize> = (0..m).step_by(chunk).collect();
    let pieces = starts
        .into_par_iter()
        .map(|s| {
            let len = chunk.min(m - s);
            let mut sh = shape.to_vec();
            sh[0] = len;
            let xv = unrows(xs.slice(ndarray::s![s..s + len, ..]).to_owned(), &sh).variable();
            // The task may be stolen by a worker inside a no_grad scope: record the graph regardless.
            let z = armoury::enable_grad(|| model.forward(&xv))?;
            Ok(Piece { xv, z, start: s })
        })
        .collect::<Result<Vec<Piece>>>()?;
    model.counters().add_forward(m);
    let k = model.num_classes();
    let mut logits = Array2::zeros((m, k));
    for p in &pieces {
        let z = rows(&p.z);
        if z.ncols() != k {
            return Err(Error::ShapeMismatch {
                op: "deepfool logits",
                expected: vec![z.nrows(), k],
                got: p.z.shape().to_vec(),
            });
        }
        logits.slice_mut(ndarray::s![p.start..p.start + z.nrows(), ..]).assign(&z);
    }
    Ok((pieces, logits))
}

/// ∇(z_{to[i]} − z_{from[i]}) for every row of the graph, one backward per piece; rows [m, D].
pub(crate) fn difference_gradient(
    model: &dyn Classifier,
    pieces: &[Piece],
    to: &[usize],
    from: &[usize],
    d: usize,
) -> Result<Array2<f32>> {
    let m = to.len();
    let parts = pieces
        .par_iter()
        .map(|p| {
            armoury::enable_grad(|| {
                let len = p.z.shape()[0];
                let r = p.start..p.start + len;
                let f = p.z.pick(&to[r.clone()])?.sub(&p.z.pick(&from[r])?)?;
                let g = f.grad_wrt(&[&p.xv])?.pop().expect("one target, one gradient");
                Ok(rows(&g))
            })
        })
        .collect::<Result<Vec<Array2<f32>>>>()?;
    model.counters().add_backward(m);
    let mut out = Array2::zeros((m, d));
    for (p, g) in pieces.iter().zip(parts) {
        out.slice_mut(ndarray::s![p.start..p.start + g.nrows(), ..]).assign(&g);
    }
    Ok(out)
}

impl Algorithm for DeepFool {
    fn name(&self) -> String {
        format!(
            "DeepFool-{}(overshoot={}, max_iter={}, candidates={})",
            self.norm.name(),
            self.overshoot,
            self.max_iter,
            self.candidates
        )
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
        if p.goal.is_targeted() {
            return Err(Error::invalid("deepfool", "DeepFool is untargeted; use Goal::Untargeted"));
        }
        let (model, labels, shape) = (p.model, p.labels, p.x.shape());
        let (lo, hi) = p.bounds();
        let x2 = p.rows();
        let (n, d) = x2.dim();
        let k = model.num_classes();
        let clean = p.logits(p.x, None)?;
        let by_rank = candidates_by_rank(&clean, labels, self.candidates.min(k) - 1);
        let preds = armoury::classifier::argmax_rows(&clean);
        let mut active: Vec<usize> = (0..n).filter(|&i| preds[i] == labels[i]).collect();
        let mut adv = x2.clone();
        let mut r_tot = Array2::<f32>::zeros((n, d));
        for it in 0..self.max_iter {
            if active.is_empty() {
                break;
            }
            let mut xs = adv.select(Axis(0), &active);
            let (mut pieces, mut logits) = forward_graph(model, &xs, shape)?;
            active.iter().for_each(|&i| p.add_queries(i, 1));
            if it > 0 {
                // Stop the samples that are now misclassified; rebuild the graph without them.
                let now = armoury::classifier::argmax_rows(&logits);
                let still: Vec<bool> = active.iter().zip(&now).map(|(&i, &p)| p == labels[i]).collect();
                if still.iter().any(|s| !s) {
                    active = active.iter().zip(&still).filter(|(_, &s)| s).map(|(&i, _)| i).collect();
                    if active.is_empty() {
                        break;
                    }
                    xs = adv.select(Axis(0), &active);
                    (pieces, logits) = forward_graph(model, &xs, shape)?;
                    active.iter().for_each(|&i| p.add_queries(i, 1));
                }
            }
            let m = active.len();
            let from: Vec<usize> = active.iter().map(|&i| labels[i]).collect();
            // Best (distance, gradient row) per active sample.
            let mut best: Vec<(f64, Vec<f32>)> = vec![(f64::INFINITY, Vec::new()); m];
            for column in &by_rank {
                let to: Vec<usize> = active.iter().map(|&i| column[i]).collect();
                let mut g = difference_gradient(model, &pieces, &to, &from, d)?;
                p.note_backward(g.view(), Some(&active));
                zero_non_finite(&mut g);
                // Box-aware linearisation: a coordinate at a bound the step would push outward cannot move.
                ndarray::Zip::from(&mut g).and(&xs).for_each(|gv, &a| {
                    if (a <= lo && *gv < 0.0) || (a >= hi && *gv > 0.0) {
                        *gv = 0.0;
                    }
                });
                for (r, b) in best.iter_mut().enumerate() {
                    // On an exact tie (f = 0) the step and the overshoot are both zero and the iterate would
                    // stay on the boundary, where the arg-max tie-break may keep the label: take the paper's
                    // 1e-4 there.
                    let f = match (logits[[r, to[r]]] - logits[[r, from[r]]]).abs() as f64 {
                        0.0 => 1e-4,
                        f => f,
                    };
                    let wn = match self.norm {
                        Norm::Linf => Norm::L1.of(g.row(r).as_slice().expect("rows")),
                        _ => Norm::L2.of(g.row(r).as_slice().expect("rows")),
                    };
                    let dist = f / (wn + 1e-8);
                    if dist < b.0 {
                        *b = (dist, g.row(r).to_vec());
                    }
                }
            }
            let stuck = self.step(&active, &best, &x2, &mut adv, &mut r_tot, (lo, hi));
            // A zero (or non-finite) gradient for every candidate: nothing to follow.
            active.retain(|i| !stuck.contains(i));
        }
        Ok(p.unrows(adv))
    }
}

impl DeepFool {
    /// Moves each active sample along its best linearised step; returns the samples with nothing to follow.
    fn step(
        &self,
        active: &[usize],
        best: &[(f64, Vec<f32>)],
        x2: &Array2<f32>,
        adv: &mut Array2<f32>,
        r_tot: &mut Array2<f32>,
        (lo, hi): (f32, f32),
    ) -> Vec<usize> {
        let scale = 1.0 + self.overshoot;
        let mut stuck = Vec::new();
        for (r, &i) in active.iter().enumerate() {
            let (dist, w) = &best[r];
            if !dist.is_finite() || w.iter().all(|&v| v == 0.0) {
                stuck.push(i);
                continue;
            }
            let step: Vec<f32> = match self.norm {
                Norm::Linf => w.iter().map(|&v| (*dist * sign(v) as f64) as f32).collect(),
                _ => {
                    let wn = Norm::L2.of(w) + 1e-8;
                    w.iter().map(|&v| (*dist * v as f64 / wn) as f32).collect()
                }
            };
            // x' = clip(x + (1 + overshoot)·Σr); a clipped coordinate keeps only the part of Σr realised.
            let mut ar = adv.row_mut(i);
            let mut rt = r_tot.row_mut(i);
            for (((a, t), &xv), &s) in ar.iter_mut().zip(rt.iter_mut()).zip(x2.row(i)).zip(&step) {
                *t += s;
                let v = xv + scale * *t;
                *a = v.clamp(lo, hi);
                if *a != v {
                    *t = (*a - xv) / scale;
                }
            }
        }
        stuck
    }
}

/// The other candidate classes of each sample, by rank: `by_rank[c][i]` is sample i's candidate of rank c, the
/// next `count` classes by clean logit (ties by index).
fn candidates_by_rank(clean: &Array2<f32>, labels: &[usize], count: usize) -> Vec<Vec<usize>> {
    let k = clean.ncols();
    let others: Vec<Vec<usize>> = (0..clean.nrows())
        .map(|i| {
            let z = clean.row(i);
            let mut order: Vec<usize> = (0..k).filter(|&j| j != labels[i]).collect();
            order.sort_by(|&a, &b| z[b].total_cmp(&z[a]).then(a.cmp(&b)));
            order.truncate(count);
            order
        })
        .collect();
    (0..count).map(|c| others.iter().map(|o| o[c]).collect()).collect()
}
