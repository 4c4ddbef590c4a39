//! Norms, budgets and projections shared by the attacks, the attack template and the training methods.

use crate::{Error, Result, Tensor};
use ndarray::{Axis, IxDyn};
use rayon::prelude::*;

/// The norm an attack's budget is measured in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// Sum of absolute values.
    L1,
    /// Euclidean.
    L2,
    /// Largest absolute value.
    Linf,
}

impl Norm {
    /// `l1`, `l2` or `linf`.
    pub fn name(self) -> &'static str {
        match self {
            Norm::L1 => "L1",
            Norm::L2 => "L2",
            Norm::Linf => "Linf",
        }
    }

    /// The norm of a vector, accumulated in f64.
    pub fn of(self, v: &[f32]) -> f64 {
        match self {
            Norm::L1 => v.iter().map(|&a| (a as f64).abs()).sum(),
            Norm::L2 => v.iter().map(|&a| (a as f64) * (a as f64)).sum::<f64>().sqrt(),
            Norm::Linf => v.iter().fold(0.0f64, |m, &a| m.max((a as f64).abs())),
        }
    }
}

impl std::str::FromStr for Norm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Norm> {
        match s.to_ascii_lowercase().as_str() {
            "l1" => Ok(Norm::L1),
            "l2" => Ok(Norm::L2),
            "linf" | "inf" | "l_inf" => Ok(Norm::Linf),
            _ => Err(Error::invalid("norm", format!("unknown norm '{s}' (expected l1, l2 or linf)"))),
        }
    }
}

/// A perturbation budget: one ε for every sample, or one per sample. Always in input units.
#[derive(Clone, Debug, PartialEq)]
pub enum Epsilon {
    /// The same budget for every sample.
    Scalar(f32),
    /// A budget per sample.
    PerSample(Vec<f32>),
}

impl From<f32> for Epsilon {
    fn from(e: f32) -> Self {
        Epsilon::Scalar(e)
    }
}

impl Epsilon {
    /// The budget of every sample of a batch of `n`, validated (finite, ≥ 0, one per sample).
    pub fn resolve(&self, n: usize) -> Result<Vec<f32>> {
        let v = match self {
            Epsilon::Scalar(e) => vec![*e; n],
            Epsilon::PerSample(v) => {
                if v.len() != n {
                    return Err(Error::ShapeMismatch { op: "epsilon", expected: vec![n], got: vec![v.len()] });
                }
                v.clone()
            }
        };
        if let Some(bad) = v.iter().find(|e| !e.is_finite() || **e < 0.0) {
            return Err(Error::invalid("epsilon", format!("ε = {bad} must be finite and ≥ 0")));
        }
        Ok(v)
    }

    /// A short description for attack names.
    pub fn describe(&self) -> String {
        match self {
            Epsilon::Scalar(e) => format!("{e}"),
            Epsilon::PerSample(_) => "per-sample".into(),
        }
    }
}

/// Rows of a batch `[N, …]` as an owned `[N, D]` array in standard layout.
pub fn rows(x: &Tensor) -> ndarray::Array2<f32> {
    let n = x.shape()[0];
    let d = x.numel() / n.max(1);
    x.value().as_standard_layout().into_owned().into_shape_with_order((n, d)).expect("N·D elements")
}

/// An `[N, D]` array back to the batch shape.
pub fn unrows(a: ndarray::Array2<f32>, shape: &[usize]) -> Tensor {
    Tensor::new(a.into_shape_with_order(IxDyn(shape)).expect("same element count").into_dyn())
}

/// Projects each row of `delta` onto the `norm`-ball of radius `eps[i]` (Euclidean projection; for L1 the
/// sort-based simplex projection of Duchi et al. 2008).
/// An error when `eps` does not give one radius per row or a radius is NaN or negative.
pub fn project_ball(delta: &mut ndarray::Array2<f32>, norm: Norm, eps: &[f32]) -> Result<()> {
    if eps.len() != delta.nrows() {
        return Err(Error::ShapeMismatch { op: "project_ball", expected: vec![delta.nrows()], got: vec![eps.len()] });
    }
    check_radius(eps)?;
    delta.axis_iter_mut(Axis(0)).into_par_iter().zip(eps).for_each(|(mut row, &e)| {
        project_radius(row.as_slice_mut().expect("standard layout rows"), norm, e);
    });
    Ok(())
}

fn check_radius(eps: &[f32]) -> Result<()> {
    match eps.iter().find(|e| e.is_nan() || **e < 0.0) {
        Some(bad) => Err(Error::invalid("projection", format!("radius ε = {bad} must be ≥ 0 and not NaN"))),
        None => Ok(()),
    }
}

/// Projects one perturbation row onto the `norm`-ball of radius `e` (see [`project_ball`]); an error for a NaN or
/// negative `e` (an infinite one leaves the row as it is).
pub fn project_row(r: &mut [f32], norm: Norm, e: f32) -> Result<()> {
    check_radius(&[e])?;
    project_radius(r, norm, e);
    Ok(())
}

/// [`project_row`] for a radius already checked.
fn project_radius(r: &mut [f32], norm: Norm, e: f32) {
    match norm {
        Norm::Linf => r.iter_mut().for_each(|v| *v = v.clamp(-e, e)),
        Norm::L2 => {
            let n = Norm::L2.of(r);
            if n > e as f64 {
                let s = (e as f64 / n) as f32;
                r.iter_mut().for_each(|v| *v *= s);
            }
        }
        Norm::L1 => project_l1(r, e),
    }
}

/// Euclidean projection onto the L1 ball of radius `eps`: soft-threshold at the θ that makes ‖·‖₁ = eps.
pub fn project_l1(r: &mut [f32], eps: f32) {
    if Norm::L1.of(r) <= eps as f64 {
        return;
    }
    if eps == 0.0 {
        r.fill(0.0);
        return;
    }
    let mut mags: Vec<f64> = r.iter().map(|v| (*v as f64).abs()).collect();
    mags.sort_by(|a, b| b.total_cmp(a));
    let (mut cum, mut theta) = (0.0f64, 0.0f64);
    for (k, &m) in mags.iter().enumerate() {
        cum += m;
        let t = (cum - eps as f64) / (k + 1) as f64;
        if m - t > 0.0 {
            theta = t;
        } else {
            break;
        }
    }
    r.iter_mut().for_each(|v| *v = (v.signum() as f64 * ((*v as f64).abs() - theta).max(0.0)) as f32);
}

/// Makes `adv` a feasible answer: inside `[lo, hi]` and within `eps[i]` of `x` in `norm`, measured exactly (in
/// f64 on the f32 values), nudging values toward `x` where rounding went past the budget.
pub fn enforce(x: &ndarray::Array2<f32>, adv: &mut ndarray::Array2<f32>, norm: Norm, eps: &[f32], bounds: (f32, f32)) {
    x.axis_iter(Axis(0)).into_par_iter().zip(adv.axis_iter_mut(Axis(0))).zip(eps).for_each(|((xv, mut av), &e)| {
        let (xr, ar) = (xv.as_slice().expect("rows"), av.as_slice_mut().expect("rows"));
        let into_bounds = |a: f32, xv: f32| {
            // NaN, and infinities the bounds do not catch, become x's value. Selects without short circuits
            // (a == a is "not NaN" as a float compare), so that the loops vectorise.
            let c = sel_min(sel_max(a, bounds.0), bounds.1);
            #[allow(clippy::eq_op)]
            let keep = (a == a) & (c.abs() < f32::INFINITY);
            if keep {
                c
            } else {
                xv
            }
        };
        if norm == Norm::Linf && e >= 0.0 {
            // One pass: into the bounds, into the ball rounded inward (every value of that interval is exactly
            // feasible, and a feasible value is left alone), then into the bounds widened to keep x feasible.
            for (a, &xv) in ar.iter_mut().zip(xr) {
                let (lo, hi) = linf_interval(xv, e);
                let c = sel_min(sel_max(into_bounds(*a, xv), lo), hi);
                *a = sel_min(sel_max(c, sel_min(bounds.0, xv)), sel_max(bounds.1, xv));
            }
            return;
        }
        for (a, &xv) in ar.iter_mut().zip(xr) {
            *a = into_bounds(*a, xv);
        }
        // Rounding x + δ to f32 can overshoot the budget by an ulp; shrink δ geometrically harder until the
        // exact norm fits (the shrink grows ×4 per round, so this ends within a few rounds).
        let mut shrink = 1e-7f64;
        let mut feasible = false;
        for _ in 0..32 {
            let n = exact_norm(norm, xr, ar);
            if n <= e as f64 {
                feasible = true;
                break;
            }
            match norm {
                // Reached only for an ε below 0 (or NaN): no shrinking helps; x is the answer (below).
                Norm::Linf => break,
                Norm::L2 | Norm::L1 => {
                    let s = (e as f64 / n) * (1.0 - shrink);
                    shrink = (shrink * 4.0).min(0.5);
                    for (a, &xv) in ar.iter_mut().zip(xr) {
                        let target = xv as f64 + ((*a as f64) - (xv as f64)) * s;
                        *a = target as f32;
                        if ((*a as f64) - (xv as f64)).abs() > (target - xv as f64).abs() {
                            *a = step_toward(*a, xv);
                        }
                    }
                }
            }
        }
        if !feasible && exact_norm(norm, xr, ar) > e as f64 {
            ar.copy_from_slice(xr); // cannot happen in practice; the clean input is always feasible
        }
    });
}

/// ‖adv − x‖ computed in f64 from the f32 values.
pub fn exact_norm(norm: Norm, x: &[f32], adv: &[f32]) -> f64 {
    let it = x.iter().zip(adv).map(|(&a, &b)| (b as f64) - (a as f64));
    match norm {
        Norm::L1 => it.map(f64::abs).sum(),
        Norm::L2 => it.map(|d| d * d).sum::<f64>().sqrt(),
        Norm::Linf => {
            // Eight running maxima (a select, which vectorises, where f64::max's NaN rule does not); NaN
            // differences are skipped, as f64::max skips them.
            let mut m = [0.0f64; 8];
            let (xc, ac) = (x.chunks_exact(8), adv.chunks_exact(8));
            let tail = xc.remainder().iter().zip(ac.remainder()).map(|(&a, &b)| ((b as f64) - (a as f64)).abs());
            for (xs, as_) in xc.zip(ac) {
                for k in 0..8 {
                    let d = ((as_[k] as f64) - (xs[k] as f64)).abs();
                    m[k] = if d > m[k] { d } else { m[k] };
                }
            }
            tail.chain(m).fold(0.0, |m, d| if d > m { d } else { m })
        }
    }
}

/// The f32 values within `e` of `x`, exactly: `[x − e, x + e]` with each end rounded toward `x` where f32
/// rounding put it outside (a correctly rounded end is at most one ulp out).
#[inline(always)]
fn linf_interval(x: f32, e: f32) -> (f32, f32) {
    // The rounding error of each end, exactly, by Knuth's two-sum (x ± e = end + err), in f32 and without
    // branches so that the loops calling this vectorise.
    let two_sum_err = |a: f32, b: f32, s: f32| {
        let bp = s - a;
        (a - (s - bp)) + (b - bp)
    };
    let (lo, hi) = (x - e, x + e);
    // lo below x − e (err > 0): one ulp up; hi above x + e (err < 0): one ulp down. Both ends move toward x.
    let lo = if two_sum_err(x, -e, lo) > 0.0 { next_up(lo) } else { lo };
    let hi = if two_sum_err(x, e, hi) < 0.0 { -next_up(-hi) } else { hi };
    (lo, hi)
}

/// `a` raised to `lo`, as `f32::clamp` does it (`a` kept when equal, so −0 stays −0, and NaN stays NaN): one
/// compare-and-select (x86's `maxps` with the operands swapped), where `f32::max`'s NaN rule costs three more
/// instructions per vector.
#[inline(always)]
fn sel_max(a: f32, lo: f32) -> f32 {
    if a < lo {
        lo
    } else {
        a
    }
}

/// `a` lowered to `hi`, as `f32::clamp` does it (see [`sel_max`]).
#[inline(always)]
fn sel_min(a: f32, hi: f32) -> f32 {
    if a > hi {
        hi
    } else {
        a
    }
}

/// The next f32 above finite `v` (as `f32::next_up`, which needs Rust 1.86), as integer selects.
#[inline(always)]
fn next_up(v: f32) -> f32 {
    let bits = v.to_bits();
    let up = if v > 0.0 { bits.wrapping_add(1) } else { bits.wrapping_sub(1) };
    f32::from_bits(if v == 0.0 { 1 } else { up })
}

/// The next f32 from `a` in the direction of `b`.
fn step_toward(a: f32, b: f32) -> f32 {
    if a == b {
        return a;
    }
    let bits = a.to_bits();
    let up = (b > a) == (a >= 0.0);
    if a == 0.0 {
        return if b > 0.0 { f32::from_bits(1) } else { -f32::from_bits(1) };
    }
    f32::from_bits(if up { bits + 1 } else { bits - 1 })
}

/// The gradient rows scaled for a steepest-ascent step of unit size in `norm`: sign (L∞), g/‖g‖₂ (L2), or, for L1,
/// the sparse direction of Tramèr & Boneh (2019): sign(g) on the coordinates at or above the `q`-quantile of
/// |g|, divided by their count. Rows with a zero gradient stay zero.
pub fn steepest(g: &ndarray::Array2<f32>, norm: Norm, l1_quantile: f32) -> ndarray::Array2<f32> {
    let mut out = g.clone();
    out.axis_iter_mut(Axis(0)).into_par_iter().for_each(|mut row| {
        steepest_row(row.as_slice_mut().expect("rows"), norm, l1_quantile);
    });
    out
}

/// [`steepest`] for one gradient row, in place.
pub fn steepest_row(r: &mut [f32], norm: Norm, l1_quantile: f32) {
    match norm {
        Norm::Linf => r.iter_mut().for_each(|v| *v = sign(*v)),
        Norm::L2 => {
            let n = Norm::L2.of(r);
            if n > 0.0 {
                r.iter_mut().for_each(|v| *v = (*v as f64 / n) as f32);
            }
        }
        Norm::L1 => {
            let mut mags: Vec<f32> = r.iter().map(|v| v.abs()).collect();
            let k = ((mags.len() as f32 * l1_quantile) as usize).min(mags.len() - 1);
            let (_, &mut thresh, _) = mags.select_nth_unstable_by(k, |a, b| a.total_cmp(b));
            let thresh = thresh.max(f32::MIN_POSITIVE);
            let count = r.iter().filter(|v| v.abs() >= thresh).count().max(1) as f32;
            r.iter_mut().for_each(|v| *v = if v.abs() >= thresh { sign(*v) / count } else { 0.0 });
        }
    }
}

/// sign with sign(0) = 0.
pub fn sign(v: f32) -> f32 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// An `[N, D]` array of uniform samples in the `norm`-ball of radius `eps[i]` around 0 (L∞: uniform in the cube;
/// L2: uniform in the ball; L1: uniform in the ball via exponential/Laplace sampling), one generator per row.
pub fn random_in_ball(n: usize, d: usize, norm: Norm, eps: &[f32], seeds: &[u64]) -> ndarray::Array2<f32> {
    use rand::{Rng, SeedableRng};
    let mut out = ndarray::Array2::zeros((n, d));
    out.axis_iter_mut(Axis(0)).into_par_iter().zip(eps).zip(seeds).for_each(|((mut row, &e), &s)| {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s);
        match norm {
            Norm::Linf => row.iter_mut().for_each(|v| *v = e * (2.0 * rng.random::<f32>() - 1.0)),
            Norm::L2 => {
                let z = crate::seed::normal_vec(&mut rng, d);
                let zn = Norm::L2.of(&z).max(1e-12);
                let radius = e as f64 * rng.random::<f64>().powf(1.0 / d as f64);
                row.iter_mut().zip(&z).for_each(|(v, &g)| *v = (g as f64 / zn * radius) as f32);
            }
            Norm::L1 => {
                // Laplace direction normalised to the L1 sphere, radius scaled by U^(1/d).
                let lap: Vec<f64> = (0..d)
                    .map(|_| -(1.0 - rng.random::<f64>()).ln() * if rng.random::<bool>() { 1.0 } else { -1.0 })
                    .collect();
                let ln: f64 = lap.iter().map(|v| v.abs()).sum::<f64>().max(1e-12);
                let radius = e as f64 * rng.random::<f64>().powf(1.0 / d as f64);
                row.iter_mut().zip(&lap).for_each(|(v, &g)| *v = (g / ln * radius) as f32);
            }
        }
    });
    out
}

/// Validates a positive step size.
pub fn check_positive(op: &'static str, what: &str, v: f32) -> Result<()> {
    if !v.is_finite() || v <= 0.0 {
        return Err(Error::invalid(op, format!("{what} = {v} must be positive")));
    }
    Ok(())
}

pub use crate::seed::row_seeds;

/// The diameter of the input box `[lo, hi]^d` in `norm` (L∞: the width; L2: width·√d; L1: width·d): the budget that
/// reaches every input of the box from every other.
pub fn box_diameter(norm: Norm, (lo, hi): (f32, f32), d: usize) -> f64 {
    let w = hi as f64 - lo as f64;
    match norm {
        Norm::Linf => w,
        Norm::L2 => w * (d as f64).sqrt(),
        Norm::L1 => w * d as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enforce_makes_every_norm_exactly_feasible() {
        // Deltas that sit on or a hair over the sphere, at small and large ε, where f32 rounding of x + δ bites.
        for (seed, &e) in [0.02f32, 1e-3, 0.5, 3.0].iter().enumerate() {
            for norm in [Norm::L1, Norm::L2, Norm::Linf] {
                let x = rows(&Tensor::uniform(&[8, 1, 7, 7], 0.1, 0.9, seed as u64));
                let d = random_in_ball(8, 49, norm, &[e; 8], &[seed as u64; 8]);
                let mut delta = d.clone();
                for mut r in delta.axis_iter_mut(Axis(0)) {
                    let n = norm.of(r.as_slice().unwrap());
                    if n > 0.0 {
                        r.mapv_inplace(|v| (v as f64 * (e as f64 / n) * (1.0 + 1e-6)) as f32);
                    }
                }
                let mut adv = &x + &delta;
                enforce(&x, &mut adv, norm, &[e; 8], (-10.0, 10.0));
                for (xr, ar) in x.axis_iter(Axis(0)).zip(adv.axis_iter(Axis(0))) {
                    let n = exact_norm(norm, xr.as_slice().unwrap(), ar.as_slice().unwrap());
                    assert!(n <= e as f64, "{norm:?} ε = {e}: {n}");
                    assert!(n >= 0.99 * e as f64, "{norm:?} ε = {e}: shrunk too far to {n}");
                }
            }
        }
    }

    #[test]
    fn enforce_pulls_far_values_into_the_linf_ball_at_once() {
        let x = ndarray::Array2::from_elem((1, 4), 0.5f32);
        let mut adv = ndarray::array![[9.0f32, -3.0, 0.5, 0.61]];
        enforce(&x, &mut adv, Norm::Linf, &[0.1], (-100.0, 100.0));
        assert!(adv.iter().zip(x.iter()).all(|(a, b)| ((*a as f64) - (*b as f64)).abs() <= 0.1f32 as f64));
        assert_eq!(adv[[0, 2]], 0.5);
    }

    /// The L∞ rule of `enforce` spelled out the slow way: into the bounds (NaN and uncaught infinities → x), and
    /// where the row is infeasible, into the rounded ball and widened bounds, then one ulp at a time toward x.
    fn enforce_linf_reference(x: &[f32], adv: &mut [f32], e: f32, (lo, hi): (f32, f32)) {
        for (a, &xv) in adv.iter_mut().zip(x) {
            *a = a.clamp(lo, hi);
            if !a.is_finite() {
                *a = xv;
            }
        }
        if exact_norm(Norm::Linf, x, adv) > e as f64 {
            for (a, &xv) in adv.iter_mut().zip(x) {
                *a = a.clamp(xv - e, xv + e).clamp(lo.min(xv), hi.max(xv));
                while ((*a as f64) - (xv as f64)).abs() > e as f64 {
                    *a = step_toward(*a, xv);
                }
            }
        }
    }

    #[test]
    fn enforce_linf_in_one_pass_matches_the_step_by_step_rule() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 1.0, 0.0, 1e-30];
        for &(e, bounds) in &[
            (0.1f32, (0.0f32, 1.0f32)),
            (0.3, (0.0, 1.0)),
            (1e-3, (-1.0, 1.0)),
            (0.1, (f32::NEG_INFINITY, f32::INFINITY)),
        ] {
            for round in 0..50 {
                let d = 64;
                // x sometimes outside the bounds; adv near the sphere (rounding overshoot), far out, or special.
                let x: Vec<f32> = (0..d).map(|_| rng.random_range(-0.2f32..1.2)).collect();
                let mut adv: Vec<f32> = x
                    .iter()
                    .map(|&xv| match rng.random_range(0..4) {
                        0 => xv + if rng.random::<bool>() { e } else { -e },
                        1 => xv + rng.random_range(-3.0f32..3.0) * e,
                        2 => specials[rng.random_range(0..specials.len())],
                        _ => xv,
                    })
                    .collect();
                if round % 5 == 0 {
                    // a feasible row (inside the bounds): left exactly as it is
                    adv = x.iter().map(|&xv| (xv + e * 0.5).clamp(bounds.0, bounds.1).max(xv - e)).collect();
                }
                let mut want = adv.clone();
                enforce_linf_reference(&x, &mut want, e, bounds);
                let xa = ndarray::Array2::from_shape_vec((1, d), x.clone()).unwrap();
                let mut got = ndarray::Array2::from_shape_vec((1, d), adv).unwrap();
                enforce(&xa, &mut got, Norm::Linf, &[e], bounds);
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.to_bits(), w.to_bits(), "ε = {e}, bounds {bounds:?}");
                }
                assert!(exact_norm(Norm::Linf, &x, got.as_slice().unwrap()) <= e as f64);
            }
        }
    }

    #[test]
    fn l1_projection_is_exact() {
        let mut v = [3.0f32, -1.0, 0.5, 0.0];
        project_l1(&mut v, 2.0);
        // soft threshold θ = 1: [2, 0, 0, 0]
        assert_eq!(v, [2.0, 0.0, 0.0, 0.0]);
        let mut w = [0.5f32, -0.25];
        project_l1(&mut w, 1.0);
        assert_eq!(w, [0.5, -0.25], "inside the ball: unchanged");
    }
}
