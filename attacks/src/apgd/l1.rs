//! L1-APGD (Croce & Hein 2021, "Mind the box"): the sparse step with adaptive sparsity and step size, the stages of
//! AutoAttack's `use_largereps`, and one L1 run of [`Apgd`] (see the parent module's doc for what it follows).

use super::*;
use crate::l1_box::project_l1_box;

/// The L1 sparsity schedule's constants (AutoAttack's `attack_single_run`): the first sparsity 0.2 of the
/// coordinates (random start), the step's shrink 1.5 per check and its floor ε/10, the 5 % drop of ‖x_best − x‖₀
/// that resets the step, the period 0.04·N of the checks.
const L1_TOPK0: f32 = 0.2;
const L1_RED_STEP: f32 = 1.5;
const L1_MIN_STEP: f32 = 10.0;
const L1_SPARSER: f32 = 0.95;

/// The stages of one L1 run, (ε factor, steps): with `large`, ⌈0.3N⌉ steps at 3ε, ⌈0.3N⌉ at 2ε and the rest at ε
/// (AutoAttack's `use_largereps`, capped so that the total is N for N < 4); else N steps at ε.
pub(crate) fn l1_stages(steps: usize, large: bool) -> Vec<(f32, usize)> {
    if !large {
        return vec![(1.0, steps)];
    }
    let third = (3 * steps).div_ceil(10);
    let a = third.min(steps);
    let b = third.min(steps - a);
    vec![(3.0, a), (2.0, b), (1.0, steps - a - b)]
}

/// The sparse L1 direction of L1-APGD: with `topk` the fraction of coordinates to move, the threshold is the
/// ⌊(1 − topk)·D⌋-th smallest |g| (index clamped to [0, D − 1]), and the direction is sign(g) on the coordinates
/// with |g| at or above it, divided by the number of non-zero signs among them (AutoAttack's
/// `sparsegrad.sign() / L1_norm(sparsegrad.sign())`; its +1e-10 only guards a zero gradient, which moves nothing).
pub(crate) fn l1_sparse_direction(g: &[f32], topk: f32) -> Vec<f32> {
    let d = g.len();
    let mut mags: Vec<f32> = g.iter().map(|v| v.abs()).collect();
    let k = ((1.0 - topk) * d as f32).clamp(0.0, (d - 1) as f32) as usize;
    let (_, &mut thresh, _) = mags.select_nth_unstable_by(k, |a, b| a.total_cmp(b));
    let mut out: Vec<f32> = g.iter().map(|&v| if v.abs() >= thresh { crate::budget::sign(v) } else { 0.0 }).collect();
    let count = out.iter().filter(|v| **v != 0.0).count();
    if count > 0 {
        let c = count as f32;
        out.iter_mut().for_each(|v| *v /= c);
    }
    out
}

/// One L1-APGD step of row `cur` (the clean row `x`): `cur + η·dir` with [`l1_sparse_direction`], the perturbation
/// projected exactly onto the ε-ball of L1 ∩ the box (AutoAttack's `L1_projection`), clipped to the box.
pub(crate) fn l1_step(
    x: &[f32],
    cur: &[f32],
    g: &[f32],
    topk: f32,
    eta: f32,
    eps: f32,
    bounds: (f32, f32),
) -> Vec<f32> {
    let dir = l1_sparse_direction(g, topk);
    let mut delta: Vec<f32> = cur.iter().zip(&dir).zip(x).map(|((&c, &s), &xv)| c + eta * s - xv).collect();
    project_l1_box(&mut delta, x, eps, bounds);
    delta.iter().zip(x).map(|(&dv, &xv)| (xv + dv).clamp(bounds.0, bounds.1)).collect()
}

/// ‖a − x‖₀.
fn l0(x: &[f32], a: &[f32]) -> usize {
    x.iter().zip(a).filter(|(p, q)| p != q).count()
}

/// Rows of `x2` moved by `delta` rows projected onto the L1 ball of radius `eps[i]` ∩ the box.
fn project_rows_l1(x2: &Array2<f32>, delta: &mut Array2<f32>, eps: &[f32], bounds: (f32, f32)) -> Array2<f32> {
    for ((xr, mut dr), &e) in x2.rows().into_iter().zip(delta.rows_mut()).zip(eps) {
        project_l1_box(dr.as_slice_mut().expect("rows"), xr.as_slice().expect("rows"), e, bounds);
    }
    let mut out = x2 + &*delta;
    out.mapv_inplace(|v| v.clamp(bounds.0, bounds.1));
    out
}

impl Apgd {
    /// One L1-APGD run (Croce & Hein 2021, as AutoAttack's `attack_single_run` and `decr_eps_pgd` write it) on all
    /// rows of `x2`, the samples `who`: a Gaussian start projected onto the first stage's ball, then per stage
    /// sparse steps with the adaptive sparsity and step size; only the last stage (at ε) can succeed and stop early.
    pub(super) fn run_l1(
        &self,
        ctx: &Ctx,
        x2: &Array2<f32>,
        (who, labels): (&[usize], &[usize]),
        goals: (&Resolved, &Resolved),
        eps: &[f32],
        stream: u64,
    ) -> Result<Outcome> {
        let (n, d) = x2.dim();
        let bounds = ctx.p.bounds();
        let stages = l1_stages(self.steps, self.large_eps);
        // The start: x + P(t), t ~ N(0, I) per sample, P onto the first stage's ball ∩ box.
        let seeds = row_seeds(x2, ctx.p.seed, stream);
        let mut delta = Array2::<f32>::zeros((n, d));
        for (mut row, &s) in delta.rows_mut().into_iter().zip(&seeds) {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s);
            row.assign(&ArrayView1::from(&armoury::seed::normal_vec(&mut rng, d)[..d]));
        }
        let e0: Vec<f32> = eps.iter().map(|&e| stages[0].0 * e).collect();
        let mut x_start = project_rows_l1(x2, &mut delta, &e0, bounds);
        let last = stages.len() - 1;
        let mut result = None;
        for (s, &(factor, steps)) in stages.iter().enumerate() {
            let es: Vec<f32> = eps.iter().map(|&e| factor * e).collect();
            let mut delta = &x_start - x2;
            x_start = project_rows_l1(x2, &mut delta, &es, bounds);
            if s == last {
                make_feasible(x2, &mut x_start, Norm::L1, eps, bounds);
            } else if steps == 0 {
                continue;
            }
            // With the schedule every stage starts from a given point (AutoAttack's `x_init` branch).
            let stage =
                self.l1_stage(ctx, x2, (who, labels), goals, (&es, steps), x_start, (s == last, self.large_eps))?;
            x_start = stage.adv.clone();
            result = Some(stage);
        }
        Ok(result.expect("the last stage always runs"))
    }

    /// One stage of L1-APGD at the radii `es` from `x_cur`. In the last stage (`last`) the iterates are judged
    /// and, with `early_stop`, a sample stops at its first success; the outcome is then the success, else the
    /// highest-loss point. In an earlier stage the outcome's `adv` is the highest-loss point (the next start).
    #[allow(clippy::too_many_arguments)]
    fn l1_stage(
        &self,
        ctx: &Ctx,
        x2: &Array2<f32>,
        (who, labels): (&[usize], &[usize]),
        goals: (&Resolved, &Resolved),
        (es, steps): (&[f32], usize),
        mut x_cur: Array2<f32>,
        (last, from_init): (bool, bool),
    ) -> Result<Outcome> {
        let (n, d) = x2.dim();
        let bounds = ctx.p.bounds();
        let first = ctx.eval(&x_cur, (who, labels), self.loss, goals, steps > 0)?;
        let mut g_cur = first.grad.unwrap_or_else(|| Array2::zeros((n, d)));
        let (mut x_max, mut f_max, mut g_max) = (x_cur.clone(), first.objective.clone(), g_cur.clone());
        let mut success = if last { first.success } else { vec![false; n] };
        let (mut x_out, mut f_out) = (x_cur.clone(), first.objective);
        let mut eta: Vec<f32> = es.to_vec();
        let (mut topk, mut sp_old): (Vec<f32>, Vec<usize>) = if from_init {
            let sp: Vec<usize> = (0..n)
                .map(|i| l0(x2.row(i).as_slice().expect("rows"), x_cur.row(i).as_slice().expect("rows")))
                .collect();
            (sp.iter().map(|&s| s as f32 / d as f32 / L1_RED_STEP).collect(), sp)
        } else {
            (vec![L1_TOPK0; n], vec![d; n])
        };
        let period = ((0.04 * steps as f64) as usize).max(1);
        let mut counter = 0usize;
        let stops = |i: usize, success: &[bool]| last && self.early_stop && success[i];
        let mut active: Vec<usize> = (0..n).filter(|&i| !stops(i, &success)).collect();
        for k in 0..steps {
            if active.is_empty() {
                break;
            }
            let mut new = Array2::<f32>::zeros((active.len(), d));
            for (r, &i) in active.iter().enumerate() {
                let (xr, cur, g) = (x2.row(i), x_cur.row(i), g_cur.row(i));
                let row = l1_step(
                    xr.as_slice().expect("rows"),
                    cur.as_slice().expect("rows"),
                    g.as_slice().expect("rows"),
                    topk[i],
                    eta[i],
                    es[i],
                    bounds,
                );
                new.row_mut(r).assign(&ArrayView1::from(&row[..]));
            }
            let xa = x2.select(Axis(0), &active);
            let ea: Vec<f32> = active.iter().map(|&i| es[i]).collect();
            make_feasible(&xa, &mut new, Norm::L1, &ea, bounds);
            let la: Vec<usize> = active.iter().map(|&i| labels[i]).collect();
            let (lg, sg) = (subset_goal(goals.0, &active), subset_goal(goals.1, &active));
            let wa: Vec<usize> = active.iter().map(|&i| who[i]).collect();
            let e = ctx.eval(&new, (&wa, &la), self.loss, (&lg, &sg), k + 1 < steps)?;
            for (r, &i) in active.iter().enumerate() {
                let f = e.objective[r];
                x_cur.row_mut(i).assign(&new.row(r));
                if let Some(g) = &e.grad {
                    g_cur.row_mut(i).assign(&g.row(r));
                }
                if f > f_max[i] {
                    x_max.row_mut(i).assign(&new.row(r));
                    g_max.row_mut(i).assign(&g_cur.row(i));
                    f_max[i] = f;
                }
                if last && e.success[r] && (!success[i] || f > f_out[i]) {
                    x_out.row_mut(i).assign(&new.row(r));
                    f_out[i] = f;
                    success[i] = true;
                }
            }
            counter += 1;
            if counter == period {
                // The sparsity check: if ‖x_best − x‖₀ fell by more than 5 %, the step returns to ε and the
                // iterate to x_best, else the step shrinks by 1.5 (floor ε/10); the next steps move about
                // ‖x_best − x‖₀/1.5 coordinates.
                for &i in &active {
                    let sp = l0(x2.row(i).as_slice().expect("rows"), x_max.row(i).as_slice().expect("rows"));
                    let sparser = (sp as f32 / sp_old[i] as f32) < L1_SPARSER;
                    topk[i] = sp as f32 / d as f32 / L1_RED_STEP;
                    eta[i] = if sparser { es[i] } else { eta[i] / L1_RED_STEP };
                    eta[i] = eta[i].clamp(es[i] / L1_MIN_STEP, es[i]);
                    sp_old[i] = sp;
                    if sparser {
                        x_cur.row_mut(i).assign(&x_max.row(i));
                        g_cur.row_mut(i).assign(&g_max.row(i));
                    }
                }
                counter = 0;
            }
            active.retain(|&i| !stops(i, &success));
        }
        for i in 0..n {
            if !success[i] {
                x_out.row_mut(i).assign(&x_max.row(i));
                f_out[i] = f_max[i];
            }
        }
        Ok(Outcome { adv: x_out, success, objective: f_out })
    }
}

#[cfg(test)]
mod tests {
    use super::{l1_sparse_direction, l1_stages, l1_step};

    /// AutoAttack's `use_largereps` iterations: [⌈0.3N⌉, ⌈0.3N⌉, N − both] at 3ε, 2ε, ε.
    #[test]
    fn l1_stages_follow_autoattack() {
        assert_eq!(l1_stages(100, true), vec![(3.0, 30), (2.0, 30), (1.0, 40)]);
        assert_eq!(l1_stages(10, true), vec![(3.0, 3), (2.0, 3), (1.0, 4)]);
        assert_eq!(l1_stages(7, true), vec![(3.0, 3), (2.0, 3), (1.0, 1)]);
        // Fewer than 4 steps: the total stays N (AutoAttack would get a negative last stage).
        assert_eq!(l1_stages(2, true), vec![(3.0, 1), (2.0, 1), (1.0, 0)]);
        assert_eq!(l1_stages(1, true), vec![(3.0, 1), (2.0, 0), (1.0, 0)]);
        assert_eq!(l1_stages(100, false), vec![(1.0, 100)]);
    }

    /// The sparse step on a hand-built gradient, computed by hand. |g| sorted: 0, 0, 0.1, 0.25, 0.5, 1, 2, 2, 3, 4.
    #[test]
    fn l1_sparse_step_golden() {
        let g = [0.5, -3.0, 0.0, 2.0, -1.0, 0.25, 4.0, -2.0, 0.1, 0.0];
        // topk = 0.25: threshold index ⌊0.75·10⌋ = 7, |g| = 2 → coordinates 1, 3, 6, 7 (both 2s, ties in), sign / 4.
        let q = 0.25;
        let want = [0.0, -q, 0.0, q, 0.0, 0.0, q, -q, 0.0, 0.0];
        assert_eq!(l1_sparse_direction(&g, 0.25), want);
        // topk = 0: index clamped to D − 1 = 9, only the largest |g|; topk = 1: index 0, threshold 0, every
        // coordinate, but the two zero gradients have no sign: sign / 8.
        assert_eq!(l1_sparse_direction(&g, 0.0), [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
        let e = 0.125;
        assert_eq!(l1_sparse_direction(&g, 1.0), [e, -e, 0.0, e, -e, e, e, -e, e, 0.0]);
        // Sparsity 0.3 (0.3000000119 in f32): (1 − 0.3)·10 rounds to 7.0 in f32, as in torch's float32
        // `(1 - topk) * n_fts`, so index 7 again, not 6 (which would add the |g| = 1 coordinate).
        assert_eq!(l1_sparse_direction(&g, 0.3), l1_sparse_direction(&g, 0.25));
        assert_eq!(l1_sparse_direction(&[0.0; 4], 0.5), [0.0; 4]);

        // The step: η = 2 from x = 0.5 (coordinate 6 at 0.9: room 0.1 upward), no binding budget: x + 2·want.
        let mut x = [0.5f32; 10];
        x[6] = 0.9;
        let free = l1_step(&x, &x, &g, 0.25, 2.0, 100.0, (0.0, 1.0));
        let want_free = [0.5, 0.0, 0.5, 1.0, 0.5, 0.5, 1.0, 0.0, 0.5, 0.5];
        assert_eq!(free, want_free);
        // ε = 0.6: δ = (−0.5, 0.5, 0.5, −0.5) on 1, 3, 6, 7 projected onto the L1 ball ∩ box: coordinate 6 is capped
        // at its room 0.1, the other three share 0.5: 3·(0.5 − θ) = 0.5, θ = 1/3, |δ| = 1/6.
        let got = l1_step(&x, &x, &g, 0.25, 2.0, 0.6, (0.0, 1.0));
        let s = 1.0 / 6.0;
        let want = [0.5, 0.5 - s, 0.5, 0.5 + s, 0.5, 0.5, 1.0, 0.5 - s, 0.5, 0.5];
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-6, "coordinate {j}: {got:?} vs {want:?}");
        }
        let l1: f64 = got.iter().zip(&x).map(|(&a, &b)| (a as f64 - b as f64).abs()).sum();
        assert!((l1 - 0.6).abs() < 1e-6, "the budget is spent: {l1}");
        // From a moved point the step adds to the current perturbation: cur = x + 0.05 on coordinate 0 (not in
        // the support), η = 0.4: δ = (0.05, −0.1, 0.1, 0.1, −0.1), ‖δ‖₁ = 0.45 ≤ ε = 0.6 stays.
        let mut cur = x;
        cur[0] += 0.05;
        let got = l1_step(&x, &cur, &g, 0.25, 0.4, 0.6, (0.0, 1.0));
        let want = [0.55, 0.4, 0.5, 0.6, 0.5, 0.5, 1.0, 0.4, 0.5, 0.5];
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-6, "coordinate {j}: {got:?} vs {want:?}");
        }
    }
}
