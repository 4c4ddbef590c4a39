//! The Euclidean projection onto the intersection of an L1 ball and the input box, which sparse L1 descent
//! (Tramèr & Boneh 2019) needs so that no budget is spent outside the box.

/// Euclidean projection of δ onto {‖δ‖₁ ≤ ε} ∩ {lo ≤ x + δ ≤ hi} (x in the box): δᵢ = sign(δᵢ)·min(max(|δᵢ| − θ,
/// 0), uᵢ), uᵢ the room toward sign(δᵢ), with the smallest θ ≥ 0 that meets the budget — exact, from the sorted
/// breakpoints of the piecewise-linear ‖δ(θ)‖₁ (the projection of Croce & Hein 2021's L1-APGD).
pub(crate) fn project_l1_box(delta: &mut [f32], x: &[f32], eps: f32, (lo, hi): (f32, f32)) {
    let room: Vec<f64> = delta
        .iter()
        .zip(x)
        .map(|(&v, &xv)| if v >= 0.0 { hi as f64 - xv as f64 } else { xv as f64 - lo as f64 }.max(0.0))
        .collect();
    let mag: Vec<f64> = delta.iter().map(|&v| (v as f64).abs()).collect();
    let at = |theta: f64, i: usize| (mag[i] - theta).max(0.0).min(room[i]);
    let total: f64 = (0..mag.len()).map(|i| at(0.0, i)).sum();
    let theta = if total <= eps as f64 {
        0.0
    } else {
        // ‖δ(θ)‖₁ falls with slope −(number of coordinates strictly between their two breakpoints).
        let mut events: Vec<(f64, i32)> = Vec::with_capacity(2 * mag.len());
        let mut slope = 0i64;
        for (i, &m) in mag.iter().enumerate() {
            if m == 0.0 {
                continue;
            }
            let start = m - room[i];
            if start > 0.0 {
                events.push((start, 1));
            } else {
                slope += 1;
            }
            events.push((m, -1));
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        let (mut prev, mut s, mut theta) = (0.0f64, total, f64::NAN);
        for (t, kind) in events {
            let next = s - slope as f64 * (t - prev);
            if next <= eps as f64 && slope > 0 {
                theta = prev + (s - eps as f64) / slope as f64;
                break;
            }
            (prev, s) = (t, next);
            slope += i64::from(kind);
        }
        if theta.is_nan() {
            prev
        } else {
            theta
        }
    };
    for (i, v) in delta.iter_mut().enumerate() {
        *v = (if *v >= 0.0 { 1.0 } else { -1.0 } * at(theta, i)) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::project_l1_box;
    use rand::{Rng, SeedableRng};

    fn dist2(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&p, &q)| (p as f64 - q as f64).powi(2)).sum()
    }

    /// θ by plain bisection on ‖δ(θ)‖₁ = ε: an independent reference for the breakpoint solution.
    fn reference(v: &[f32], x: &[f32], eps: f32, (lo, hi): (f32, f32)) -> Vec<f32> {
        let at = |t: f64| -> Vec<f64> {
            v.iter()
                .zip(x)
                .map(|(&d, &xv)| {
                    let m = ((d as f64).abs() - t).max(0.0);
                    if d >= 0.0 {
                        m.min(hi as f64 - xv as f64)
                    } else {
                        -m.min(xv as f64 - lo as f64)
                    }
                })
                .collect()
        };
        let l1 = |t: f64| at(t).iter().map(|d| d.abs()).sum::<f64>();
        let (mut a, mut b) = (0.0, v.iter().map(|d| d.abs() as f64).fold(0.0, f64::max));
        if l1(0.0) <= eps as f64 {
            b = 0.0;
        }
        for _ in 0..200 {
            let m = (a + b) / 2.0;
            if l1(m) > eps as f64 {
                a = m;
            } else {
                b = m;
            }
        }
        at(b).into_iter().map(|d| d as f32).collect()
    }

    /// The L1-ball ∩ box projection is feasible, matches a bisection reference, and no feasible point (random ones,
    /// and small moves around the result) is closer to the projected vector: it is the Euclidean projection.
    #[test]
    fn l1_box_projection_is_the_euclidean_projection() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let bounds = (0.0f32, 1.0f32);
        for case in 0..300 {
            let d = 1 + case % 6;
            // Inputs with many coordinates on the box edges.
            let x: Vec<f32> = (0..d).map(|_| [0.0, 1.0, rng.random::<f32>()][rng.random_range(0..3)]).collect();
            let v: Vec<f32> = (0..d).map(|_| 2.0 * rng.random::<f32>() - 1.0).collect();
            let eps = rng.random::<f32>() * 1.5;
            let mut p = v.clone();
            project_l1_box(&mut p, &x, eps, bounds);
            let l1: f64 = p.iter().map(|&q| (q as f64).abs()).sum();
            assert!(l1 <= eps as f64 * (1.0 + 1e-5) + 1e-7, "case {case}: ‖δ‖₁ = {l1} > ε = {eps}");
            for (&q, &xv) in p.iter().zip(&x) {
                assert!(xv + q >= bounds.0 - 1e-6 && xv + q <= bounds.1 + 1e-6, "case {case}: outside the box");
            }
            let r = reference(&v, &x, eps, bounds);
            for (a, b) in p.iter().zip(&r) {
                assert!((a - b).abs() < 1e-5, "case {case}: {p:?} vs reference {r:?}");
            }
            let best = dist2(&p, &v);
            for k in 0..400 {
                // A feasible point: in the box, then shrunk toward 0 into the ball (0 is in the box's interval).
                let mut z: Vec<f32> = if k % 2 == 0 {
                    x.iter().map(|&xv| rng.random_range(bounds.0..=bounds.1) - xv).collect()
                } else {
                    p.iter()
                        .zip(&x)
                        .map(|(&q, &xv)| (q + 0.05 * (rng.random::<f32>() - 0.5)).clamp(-xv, 1.0 - xv))
                        .collect()
                };
                let zl1: f64 = z.iter().map(|&q| (q as f64).abs()).sum();
                if zl1 > eps as f64 {
                    let s = (eps as f64 / zl1) as f32;
                    z.iter_mut().for_each(|q| *q *= s);
                }
                // 1e-6: the f32 roundings of p and of the shrunk z (which may then exceed ε by an ulp).
                assert!(dist2(&z, &v) >= best - 1e-6, "case {case}: {z:?} is closer to {v:?} than {p:?}");
            }
        }
    }
}
