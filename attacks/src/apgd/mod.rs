//! Auto-PGD (Croce & Hein 2020, "Reliable evaluation of adversarial robustness with an ensemble of diverse
//! parameter-free attacks"): PGD with momentum and a step size that halves at checkpoints when progress stalls,
//! restarting from the best point found so far. [`ApgdTargeted`] is AutoAttack's APGD-T: the targeted DLR loss
//! against each of the top non-true classes in turn.
//!
//! Per sample, vectorised over the batch: step size η⁽⁰⁾ = 2ε; x⁽¹⁾ = P(x⁽⁰⁾ + η∇̂f(x⁽⁰⁾)), then
//! z⁽ᵏ⁺¹⁾ = P(x⁽ᵏ⁾ + η∇̂f(x⁽ᵏ⁾)) and x⁽ᵏ⁺¹⁾ = P(x⁽ᵏ⁾ + α(z⁽ᵏ⁺¹⁾ − x⁽ᵏ⁾) + (1 − α)(x⁽ᵏ⁾ − x⁽ᵏ⁻¹⁾)) with α = 0.75
//! (∇̂ is sign(∇) for L∞, ∇/‖∇‖₂ for L2; P projects onto the ε-ball, then the input box). At the checkpoints
//! w_j = ⌈p_j·N⌉ (p₀ = 0, p₁ = 0.22, p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06)) η halves and the iterate
//! jumps back to x_max if (1) the loss rose in fewer than ρ·(w_j − w_{j−1}) of the steps since the last
//! checkpoint, or (2) η was not halved at the last checkpoint and f_max has not improved since.
//!
//! Where Armoury departs from the references:
//! - MindArmour's APGD never re-evaluates its loss after the first step; here the loss and its gradient are
//!   re-evaluated at every iterate, as in the paper.
//! - Checkpoints follow the paper's p_j sequence exactly (AutoAttack's code uses a shrinking-period
//!   approximation) and condition 1 is the paper's strict "< ρ"; condition 2 applies from the first checkpoint
//!   (w₀ = 0), as in the paper.
//! - With `early_stop` (the default) a sample stops as soon as an iterate fulfils the goal, and restarts run only
//!   on samples not yet fooled (as AutoAttack does): the result keeps the success, gradients are counted per
//!   sample. Samples already fooled on the clean input, or with ε = 0, are returned unchanged without a gradient.
//! - The random start is uniform on the ε-sphere (L∞: ε·t/‖t‖∞ for t uniform in the cube; L2: a uniform
//!   direction of length ε), as in the reference code, then clipped to the box.
//! - A sweep (the attack template's) runs ε in increasing order and carries each sample's success at a smaller ε
//!   to the larger ones (the smaller perturbation is feasible there), so robust accuracy never rises with ε.
//! - Every gradient and forward goes through the template's [`Problem`], which counts them per sample and notes
//!   zero or non-finite gradients; a non-finite gradient entry gives no direction.
//!
//! L1 ([`Apgd::l1`], [`ApgdTargeted::l1`]) is L1-APGD (Croce & Hein 2021, "Mind the box"), following the L1
//! branch of AutoAttack's `autopgd_base.py` (`attack_single_run`, `decr_eps_pgd`) and the L1 standard version of
//! `autoattack.py`: the start is x + P(t), t ~ N(0, I), P the exact Euclidean projection onto the L1 ball ∩ box
//! ([`project_l1_box`], AutoAttack's `L1_projection`); a step moves the coordinates with |∇| at or above the
//! ⌊(1 − k)·D⌋-th smallest (ties in) by η·sign(∇)/(their count), then projects onto the L1 ball ∩ box, with no
//! momentum (the code computes α = 0.75 but its L1 branch does not use it) and no condition 1/2: instead, every
//! max(⌊0.04·N⌋, 1) steps the sparsity check sets k = ‖x_best − x‖₀/(1.5·D) and, if ‖x_best − x‖₀ fell below 0.95
//! of its value at the last check, resets η to ε and the iterate to x_best, else divides η by 1.5, η kept in
//! [ε/10, ε]. It starts at η = ε and k = 0.2 (with the schedule: k = ‖x₀ − x‖₀/(1.5·D) from the given start). The
//! schedule ([`Apgd::large_eps`], AutoAttack's `use_largereps`) runs ⌈0.3N⌉ steps at 3ε, ⌈0.3N⌉ at 2ε and the
//! rest at ε, each stage from the last one's highest-loss point projected onto the smaller ball. AutoAttack's L1
//! standard version: APGD-CE with 5 restarts, APGD-T with 5 target classes and 1 restart, both with the schedule.
//! Where Armoury departs from that code in L1:
//! - Only the last stage (at ε) can succeed, and early stop and the restarts work there exactly as in L∞/L2;
//!   the 3ε and 2ε stages run every step on every sample (their points are outside the budget; AutoAttack also
//!   counts only the last stage's success, and runs every step of every stage).
//! - A run costs N gradients, not AutoAttack's N + 1 per stage: a stage's last point gets a forward only, and the
//!   next stage's projected start its own gradient. N < 4 keeps the total N (AutoAttack's last stage would be
//!   negative).
//! - The random start comes from the per-sample seed (independent of batch and threads), not torch's global
//!   generator; the step's 1e-10 guard is replaced by moving nothing when the gradient is zero.
//! - ρ and the momentum α are ignored in L1.

use std::ops::Range;

use armoury::attack::{Access, Algorithm, Budget, Problem, Resolved};
use armoury::classifier::argmax_rows;
use armoury::{Error, Result, Tensor};
use ndarray::{Array2, ArrayView1, Axis};
use rand::SeedableRng;

use crate::budget::{enforce, exact_norm, random_in_ball, row_seeds, rows, steepest, unrows, Epsilon, Norm};
use crate::losses::{zero_non_finite, Loss};

/// Auto-PGD (Croce & Hein 2020) in L∞ or L2; L1-APGD (Croce & Hein 2021) in L1.
#[derive(Clone, Debug)]
pub struct Apgd {
    /// The budget's norm: [`Norm::Linf`], [`Norm::L2`] or [`Norm::L1`] (sparse L1-APGD).
    pub norm: Norm,
    /// The budget ε.
    pub eps: Epsilon,
    /// Iterations N_iter per restart (100).
    pub steps: usize,
    /// Runs from independent random starts; each runs only on the samples not yet fooled (1).
    pub restarts: usize,
    /// The objective: cross-entropy (APGD-CE) or the difference of logits ratio (APGD-DLR); the margin loss works too.
    pub loss: Loss,
    /// Condition 1's threshold ρ on the fraction of steps that increased the loss (0.75).
    pub rho: f32,
    /// Momentum weight α of the new step (0.75; 1 is plain PGD with the adaptive step).
    pub alpha_momentum: f32,
    /// Stop a sample at its first successful iterate (true).
    pub early_stop: bool,
    /// L1 only: AutoAttack's `use_largereps` — each run spends ⌈0.3N⌉ steps at 3ε, ⌈0.3N⌉ at 2ε and the rest at
    /// ε, each stage starting from the previous one's highest-loss point projected onto the smaller ball (true in
    /// [`Apgd::l1`], false elsewhere; an error in L∞ and L2).
    pub large_eps: bool,
}

impl Apgd {
    /// APGD-CE in L∞: 100 steps, 1 restart, ρ = 0.75, α = 0.75.
    pub fn linf(eps: f32) -> Apgd {
        Apgd {
            norm: Norm::Linf,
            eps: Epsilon::Scalar(eps),
            steps: 100,
            restarts: 1,
            loss: Loss::CrossEntropy,
            rho: 0.75,
            alpha_momentum: 0.75,
            early_stop: true,
            large_eps: false,
        }
    }

    /// APGD-CE in L2.
    pub fn l2(eps: f32) -> Apgd {
        Apgd { norm: Norm::L2, ..Apgd::linf(eps) }
    }

    /// L1-APGD-CE (Croce & Hein 2021) with AutoAttack's standard L1 settings: 100 steps, 5 restarts, the
    /// 3ε → 2ε → ε schedule ([`Apgd::large_eps`]). ρ and the momentum α are not used in L1.
    pub fn l1(eps: f32) -> Apgd {
        Apgd { norm: Norm::L1, restarts: 5, large_eps: true, ..Apgd::linf(eps) }
    }

    fn check(&self) -> Result<()> {
        if self.large_eps && self.norm != Norm::L1 {
            return Err(Error::invalid("apgd", "the larger-ε schedule (large_eps) is AutoAttack's L1 setting only"));
        }
        if self.restarts == 0 {
            return Err(Error::invalid("apgd", "restarts must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.rho) {
            return Err(Error::invalid("apgd", format!("ρ = {} must be in [0, 1]", self.rho)));
        }
        if !(self.alpha_momentum > 0.0 && self.alpha_momentum <= 1.0) {
            return Err(Error::invalid("apgd", format!("momentum α = {} must be in (0, 1]", self.alpha_momentum)));
        }
        Ok(())
    }
}

/// The checkpoints w_1 < w_2 < … < `steps` at which APGD may halve its step (Croce & Hein 2020, §3.2): w_j =
/// ⌈p_j·N⌉ with p₀ = 0, p₁ = 0.22, p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06). Computed in hundredths so
/// the ceilings are exact.
pub fn checkpoints(steps: usize) -> Vec<usize> {
    let (mut prev, mut p) = (0usize, 22usize);
    let mut w = Vec::new();
    while p < 100 {
        let c = (p * steps).div_ceil(100);
        if c > 0 && c < steps && w.last() < Some(&c) {
            w.push(c);
        }
        let next = p + (p - prev).saturating_sub(3).max(6);
        (prev, p) = (p, next);
    }
    w
}

/// What one pass of the attack achieved on some rows.
pub(crate) struct Outcome {
    pub adv: Array2<f32>,
    pub success: Vec<bool>,
    pub objective: Vec<f32>,
}

/// The objective, optionally its gradient, and the success flags at some rows.
struct Eval {
    objective: Vec<f32>,
    grad: Option<Array2<f32>>,
    success: Vec<bool>,
}

/// The problem, through which every evaluation is counted.
pub(crate) struct Ctx<'a, 'p> {
    pub p: &'a Problem<'p>,
}

/// The goal restricted to the samples `idx`.
pub(crate) fn subset_goal(goal: &Resolved, idx: &[usize]) -> Resolved {
    match goal {
        Resolved::Untargeted => Resolved::Untargeted,
        Resolved::Targeted(t) => Resolved::Targeted(idx.iter().map(|&i| t[i]).collect()),
    }
}

impl Ctx<'_, '_> {
    /// The objective (and its gradient) at the rows `xa`, which are the samples `who` of the problem.
    fn eval(
        &self,
        xa: &Array2<f32>,
        (who, labels): (&[usize], &[usize]),
        loss: Loss,
        goals: (&Resolved, &Resolved),
        grad: bool,
    ) -> Result<Eval> {
        let (loss_goal, success_goal) = goals;
        let m = xa.nrows();
        let mut shape = self.p.x.shape().to_vec();
        shape[0] = m;
        let t = unrows(xa.clone(), &shape);
        let (objective, grad, z) = if grad {
            let f = |z: &Tensor, r: Range<usize>| loss.objective(z, r, labels, loss_goal);
            let (v, g, z) = self.p.gradient(&t, Some(who), &f)?;
            let mut g = rows(&g);
            zero_non_finite(&mut g);
            (v, Some(g), z)
        } else {
            let z = self.p.logits(&t, Some(who))?;
            let zt = Tensor::new(z.clone().into_dyn());
            (loss.objective(&zt, 0..m, labels, loss_goal)?.to_vec(), None, z)
        };
        let reject = self.p.model.rejection_class();
        let success = argmax_rows(&z)
            .iter()
            .enumerate()
            .map(|(i, &c)| success_goal.is_success(reject, i, labels[i], c))
            .collect();
        Ok(Eval { objective, grad, success })
    }
}

/// Moves `v` into the `norm`-ball of radius `eps` around `x`, then into the box.
fn project_row(norm: Norm, x: &[f32], v: &mut [f32], eps: f32, (lo, hi): (f32, f32)) {
    match norm {
        Norm::L2 => {
            let n = x.iter().zip(v.iter()).map(|(&a, &b)| ((b - a) as f64).powi(2)).sum::<f64>().sqrt();
            if n > eps as f64 {
                let s = (eps as f64 / n) as f32;
                v.iter_mut().zip(x).for_each(|(b, &a)| *b = a + (*b - a) * s);
            }
        }
        _ => v.iter_mut().zip(x).for_each(|(b, &a)| *b = b.clamp(a - eps, a + eps)),
    }
    v.iter_mut().for_each(|b| *b = b.clamp(lo, hi));
}

/// [`enforce`], then, for L2 rows its rounding-limited nudges left a hair over budget (small ε, f32 rounding
/// of x + δ), a geometric shrink toward `x` until ‖adv − x‖₂ ≤ ε holds exactly in f64.
fn make_feasible(x: &Array2<f32>, adv: &mut Array2<f32>, norm: Norm, eps: &[f32], bounds: (f32, f32)) {
    enforce(x, adv, norm, eps, bounds);
    if norm != Norm::L2 {
        return;
    }
    for ((xr, mut ar), &e) in x.rows().into_iter().zip(adv.rows_mut()).zip(eps) {
        let (xs, a) = (xr.as_slice().expect("rows"), ar.as_slice_mut().expect("rows"));
        for k in 0.. {
            let n = exact_norm(Norm::L2, xs, a);
            if n <= e as f64 {
                break;
            }
            if k == 40 {
                a.copy_from_slice(xs);
                break;
            }
            let s = ((e as f64 / n) * (1.0 - 1e-7 * 2f64.powi(k))).max(0.0);
            a.iter_mut().zip(xs).for_each(|(v, &xv)| *v = (xv as f64 + (*v as f64 - xv as f64) * s) as f32);
        }
    }
}

impl Apgd {
    /// The random start on the ε-sphere, clipped to the box and made exactly feasible.
    fn start(&self, x2: &Array2<f32>, eps: &[f32], seed: u64, stream: u64, bounds: (f32, f32)) -> Array2<f32> {
        let (n, d) = x2.dim();
        let seeds = row_seeds(x2, seed, stream);
        let mut delta = random_in_ball(n, d, self.norm, eps, &seeds);
        for (mut row, &e) in delta.axis_iter_mut(Axis(0)).zip(eps) {
            let r = row.as_slice_mut().expect("standard layout rows");
            let nrm = self.norm.of(r);
            if nrm > 0.0 {
                let s = e as f64 / nrm;
                r.iter_mut().for_each(|v| *v = (*v as f64 * s) as f32);
            }
        }
        let mut adv = x2 + &delta;
        adv.mapv_inplace(|v| v.clamp(bounds.0, bounds.1));
        make_feasible(x2, &mut adv, self.norm, eps, bounds);
        adv
    }

    /// The next iterate of each active row `i` (row `r` of `dir`): the step `z = x_cur + η·dir` projected, then,
    /// after the first step, the momentum mix of `z`, `x_cur` and `x_prev` (Croce & Hein's eq. 2), projected.
    #[allow(clippy::too_many_arguments)]
    fn propose(
        &self,
        x2: &Array2<f32>,
        (x_cur, x_prev): (&Array2<f32>, &Array2<f32>),
        dir: &Array2<f32>,
        active: &[usize],
        (eta, eps): (&[f32], &[f32]),
        first: bool,
        bounds: (f32, f32),
    ) -> Array2<f32> {
        let a = self.alpha_momentum;
        let mut new = Array2::<f32>::zeros((active.len(), x2.ncols()));
        for (r, &i) in active.iter().enumerate() {
            let xr = x2.row(i);
            let xr = xr.as_slice().expect("rows");
            let (cur, prev) = (x_cur.row(i), x_prev.row(i));
            let mut z: Vec<f32> = cur.iter().zip(dir.row(r)).map(|(&c, &s)| c + eta[i] * s).collect();
            project_row(self.norm, xr, &mut z, eps[i], bounds);
            let mut out = new.row_mut(r);
            let o = out.as_slice_mut().expect("rows");
            if first {
                o.copy_from_slice(&z);
            } else {
                for (((o, &zv), &c), &p) in o.iter_mut().zip(&z).zip(cur.iter()).zip(prev.iter()) {
                    *o = c + a * (zv - c) + (1.0 - a) * (c - p);
                }
                project_row(self.norm, xr, o, eps[i], bounds);
            }
        }
        new
    }

    /// One APGD run (`steps` ≥ 1) from restart stream `stream` on all rows of `x2`, the samples `who`.
    #[allow(clippy::too_many_arguments)]
    fn run_once(
        &self,
        ctx: &Ctx,
        x2: &Array2<f32>,
        who: &[usize],
        labels: &[usize],
        goals: (&Resolved, &Resolved),
        eps: &[f32],
        stream: u64,
    ) -> Result<Outcome> {
        if self.norm == Norm::L1 {
            return self.run_l1(ctx, x2, (who, labels), goals, eps, stream);
        }
        let n = x2.nrows();
        let bounds = ctx.p.bounds();
        let mut x_cur = self.start(x2, eps, ctx.p.seed, stream, bounds);
        let first = ctx.eval(&x_cur, (who, labels), self.loss, goals, true)?;
        let mut f_cur = first.objective;
        let mut g_cur = first.grad.expect("gradient requested");
        let (mut x_max, mut f_max, mut g_max) = (x_cur.clone(), f_cur.clone(), g_cur.clone());
        let mut x_prev = x_cur.clone();
        let mut success = first.success;
        let (mut x_out, mut f_out) = (x_cur.clone(), f_cur.clone());
        let mut eta: Vec<f32> = eps.iter().map(|e| 2.0 * e).collect();
        let w = checkpoints(self.steps);
        let (mut cp, mut last_w) = (0usize, 0usize);
        let mut increases = vec![0usize; n];
        let mut f_max_last = f_max.clone();
        let mut reduced_last = vec![false; n];
        let mut active: Vec<usize> = (0..n).filter(|&i| !(self.early_stop && success[i])).collect();
        for k in 0..self.steps {
            if active.is_empty() {
                break;
            }
            let dir = steepest(&g_cur.select(Axis(0), &active), self.norm, 0.0);
            let mut new = self.propose(x2, (&x_cur, &x_prev), &dir, &active, (&eta, eps), k == 0, bounds);
            let xa = x2.select(Axis(0), &active);
            let ea: Vec<f32> = active.iter().map(|&i| eps[i]).collect();
            make_feasible(&xa, &mut new, self.norm, &ea, bounds);
            let la: Vec<usize> = active.iter().map(|&i| labels[i]).collect();
            let (lg, sg) = (subset_goal(goals.0, &active), subset_goal(goals.1, &active));
            let with_grad = k + 1 < self.steps;
            let wa: Vec<usize> = active.iter().map(|&i| who[i]).collect();
            let e = ctx.eval(&new, (&wa, &la), self.loss, (&lg, &sg), with_grad)?;
            for (r, &i) in active.iter().enumerate() {
                let f = e.objective[r];
                x_prev.row_mut(i).assign(&x_cur.row(i));
                x_cur.row_mut(i).assign(&new.row(r));
                if let Some(g) = &e.grad {
                    g_cur.row_mut(i).assign(&g.row(r));
                }
                increases[i] += usize::from(f > f_cur[i]);
                f_cur[i] = f;
                if f > f_max[i] {
                    x_max.row_mut(i).assign(&new.row(r));
                    g_max.row_mut(i).assign(&g_cur.row(i));
                    f_max[i] = f;
                }
                if e.success[r] && (!success[i] || f > f_out[i]) {
                    x_out.row_mut(i).assign(&new.row(r));
                    f_out[i] = f;
                    success[i] = true;
                }
            }
            if w.get(cp) == Some(&(k + 1)) {
                let period = (w[cp] - last_w) as f64;
                for &i in &active {
                    let stalled = (increases[i] as f64) < self.rho as f64 * period;
                    let flat = !reduced_last[i] && f_max[i] <= f_max_last[i];
                    let reduce = stalled || flat;
                    if reduce {
                        eta[i] /= 2.0;
                        x_cur.row_mut(i).assign(&x_max.row(i));
                        g_cur.row_mut(i).assign(&g_max.row(i));
                        f_cur[i] = f_max[i];
                    }
                    reduced_last[i] = reduce;
                    f_max_last[i] = f_max[i];
                    increases[i] = 0;
                }
                last_w = w[cp];
                cp += 1;
            }
            active.retain(|&i| !(self.early_stop && success[i]));
        }
        for i in 0..n {
            if !success[i] {
                x_out.row_mut(i).assign(&x_max.row(i));
                f_out[i] = f_max[i];
            }
        }
        Ok(Outcome { adv: x_out, success, objective: f_out })
    }

    /// The clean inputs as an outcome: success where the goal already holds.
    pub(crate) fn clean(
        &self,
        ctx: &Ctx,
        x2: &Array2<f32>,
        labels: &[usize],
        goals: (&Resolved, &Resolved),
    ) -> Result<Outcome> {
        let all: Vec<usize> = (0..labels.len()).collect();
        let e = ctx.eval(x2, (&all, labels), self.loss, goals, false)?;
        Ok(Outcome { adv: x2.clone(), success: e.success, objective: e.objective })
    }

    /// Runs the restarts on the samples of `out` not yet successful (and with ε > 0), merging into `out`: a
    /// success replaces a failure, else the higher objective wins (`replace` forces the first run's points in).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attack_into(
        &self,
        ctx: &Ctx,
        x2: &Array2<f32>,
        labels: &[usize],
        goals: (&Resolved, &Resolved),
        eps: &[f32],
        out: &mut Outcome,
        stream_base: u64,
        mut replace: bool,
    ) -> Result<()> {
        if self.steps == 0 {
            return Ok(());
        }
        for r in 0..self.restarts {
            let todo: Vec<usize> = (0..labels.len()).filter(|&i| !out.success[i] && eps[i] > 0.0).collect();
            if todo.is_empty() {
                break;
            }
            let xs = x2.select(Axis(0), &todo);
            let ls: Vec<usize> = todo.iter().map(|&i| labels[i]).collect();
            let es: Vec<f32> = todo.iter().map(|&i| eps[i]).collect();
            let (lg, sg) = (subset_goal(goals.0, &todo), subset_goal(goals.1, &todo));
            let o = self.run_once(ctx, &xs, &todo, &ls, (&lg, &sg), &es, stream_base.wrapping_add(r as u64))?;
            for (k, &i) in todo.iter().enumerate() {
                if replace
                    || (o.success[k] && !out.success[i])
                    || (o.success[k] == out.success[i] && o.objective[k] > out.objective[i])
                {
                    out.adv.row_mut(i).assign(&o.adv.row(k));
                    out.success[i] = o.success[k];
                    out.objective[i] = o.objective[k];
                }
            }
            replace = false;
        }
        Ok(())
    }
}

mod l1;

impl Algorithm for Apgd {
    fn name(&self) -> String {
        format!(
            "APGD-{}-{}(eps={}, steps={}, restarts={})",
            self.loss.name().to_uppercase(),
            self.norm.name(),
            self.eps.describe(),
            self.steps,
            self.restarts
        )
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: self.norm, eps: self.eps.clone() }
    }

    fn validate(&self) -> Result<()> {
        self.check()
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let ctx = Ctx { p };
        let x2 = p.rows();
        let mut out = self.clean(&ctx, &x2, p.labels, (p.goal, p.goal))?;
        self.attack_into(&ctx, &x2, p.labels, (p.goal, p.goal), p.eps, &mut out, 0, true)?;
        Ok(p.unrows(out.adv))
    }
}

/// AutoAttack's targeted APGD (APGD-T): for an untargeted goal, runs [`Apgd`] with a targeted loss (DLR-targeted
/// by default) against each of the `target_classes` classes the model ranks highest on the clean input apart from
/// the true one, in turn, each time only on the samples not yet misclassified; success is any misclassification.
/// A sample that is never fooled keeps the point with the highest targeted objective. With a targeted goal it is
/// plain targeted [`Apgd`] on `base`.
#[derive(Clone, Debug)]
pub struct ApgdTargeted {
    /// The attack run per target class (its loss is taken with the target).
    pub base: Apgd,
    /// How many of the top non-true classes to target (9).
    pub target_classes: usize,
}

impl ApgdTargeted {
    /// APGD-T with the targeted DLR loss in L∞: 100 steps and 1 restart per target, 9 targets.
    pub fn linf(eps: f32) -> ApgdTargeted {
        ApgdTargeted { base: Apgd { loss: Loss::Dlr, ..Apgd::linf(eps) }, target_classes: 9 }
    }

    /// APGD-T in L2.
    pub fn l2(eps: f32) -> ApgdTargeted {
        ApgdTargeted { base: Apgd { loss: Loss::Dlr, ..Apgd::l2(eps) }, target_classes: 9 }
    }

    /// L1-APGD-T with AutoAttack's standard L1 settings (`set_version('standard')`): the 3ε → 2ε → ε schedule,
    /// 100 steps and 1 restart per target, 5 target classes (9 in L∞ and L2).
    pub fn l1(eps: f32) -> ApgdTargeted {
        ApgdTargeted { base: Apgd { loss: Loss::Dlr, restarts: 1, ..Apgd::l1(eps) }, target_classes: 5 }
    }

    /// The untargeted search: the targeted loss against each top class in turn.
    fn outcome(&self, p: &Problem<'_>) -> Result<Outcome> {
        let (ctx, x2, labels) = (Ctx { p }, p.rows(), p.labels);
        let z = p.logits(p.x, None)?; // the ranking's forward pass
        let k = p.model.num_classes();
        // Non-true classes by decreasing clean logit (ties: lower index first).
        let ranked: Vec<Vec<usize>> = z
            .rows()
            .into_iter()
            .zip(labels)
            .map(|(r, &y)| {
                let mut c: Vec<usize> = (0..k).filter(|&j| j != y).collect();
                c.sort_by(|&a, &b| r[b].total_cmp(&r[a]).then(a.cmp(&b)));
                c
            })
            .collect();
        let untargeted = Resolved::Untargeted;
        let targets = |j: usize| Resolved::Targeted(ranked.iter().map(|c| c[j]).collect());
        let mut out = self.base.clean(&ctx, &x2, labels, (&targets(0), &untargeted))?;
        for j in 0..self.target_classes.min(k - 1) {
            let stream = (j as u64) << 32;
            self.base.attack_into(&ctx, &x2, labels, (&targets(j), &untargeted), p.eps, &mut out, stream, j == 0)?;
        }
        Ok(out)
    }
}

impl Algorithm for ApgdTargeted {
    fn validate(&self) -> Result<()> {
        self.base.check()?;
        if self.target_classes == 0 {
            return Err(Error::invalid("apgd-t", "target_classes must be at least 1"));
        }
        Ok(())
    }

    fn name(&self) -> String {
        format!(
            "APGD-T-{}-{}(eps={}, steps={}, targets={})",
            self.base.loss.name().to_uppercase(),
            self.base.norm.name(),
            self.base.eps.describe(),
            self.base.steps,
            self.target_classes
        )
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    fn budget(&self) -> Budget {
        self.base.budget()
    }

    /// With a targeted goal, plain targeted [`Apgd`] on `base`.
    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        match p.goal {
            Resolved::Targeted(_) => self.base.search(p),
            Resolved::Untargeted => Ok(p.unrows(self.outcome(p)?.adv)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::checkpoints;

    #[test]
    fn checkpoints_follow_the_paper() {
        // p = 0.22, 0.41, 0.57, 0.70, 0.80, 0.87, 0.93, 0.99.
        assert_eq!(checkpoints(100), vec![22, 41, 57, 70, 80, 87, 93, 99]);
        assert_eq!(checkpoints(10), vec![3, 5, 6, 7, 8, 9]);
        assert!(checkpoints(1).is_empty());
    }
}
