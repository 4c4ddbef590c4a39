//! SimBA (Guo et al., ICML 2019, "Simple Black-box Adversarial Attacks"): walk an orthonormal basis in random
//! order, try −α·q and then +α·q, keep a step if it lowers the probability of the true class (untargeted) or
//! raises the target's (targeted).

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Error, Result, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{search_scored, shuffle, Ctx, Queries};
use crate::budget::{Epsilon, Norm};

/// The search basis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimbaBasis {
    /// Single pixels (SimBA).
    Pixel,
    /// The orthonormal 2-D DCT-II basis per channel, low frequencies first (SimBA-DCT): first the
    /// `freq`×`freq` lowest frequencies in random order, then rings of width `stride`, each in random order.
    Dct {
        /// Side of the low-frequency square tried first.
        freq: usize,
        /// Width of each following ring of frequencies.
        stride: usize,
    },
}

/// SimBA with an L∞ budget.
///
/// Deviation from the paper (which bounds the L2 norm implicitly by the step count): this is the L∞-bounded
/// variant — the perturbation is clipped to the ε-box (and the bounds) after every step, so ‖δ‖∞ ≤ ε always.
/// The step α is given in pixel units: a pixel step moves one value by `step`; a DCT step scales the basis
/// vector q so that its largest entry moves by `step` (α = step/‖q‖∞), as a unit-L2 DCT vector of a 28×28 image
/// has entries of only ~0.07. After clipping the DCT directions are no longer orthogonal, so a coordinate may
/// be revisited: when the order is exhausted a new random pass starts. Each trial costs one query (two when
/// −α fails); a direction that clipping makes a no-op is skipped without a query.
#[derive(Clone, Debug)]
pub struct SimBA {
    /// Pixel or DCT basis.
    pub basis: SimbaBasis,
    /// L∞ budget ε.
    pub eps: Epsilon,
    /// Step per coordinate in pixel units; `None` = ε.
    pub step: Option<f32>,
    /// Queries per sample, including the clean query.
    pub max_queries: u64,
}

impl SimBA {
    /// SimBA in the pixel basis, step ε, 10,000 queries.
    pub fn pixel(eps: f32) -> SimBA {
        SimBA { basis: SimbaBasis::Pixel, eps: Epsilon::Scalar(eps), step: None, max_queries: 10_000 }
    }

    /// SimBA-DCT: 14×14 low frequencies first (half the side of a 28×28 image), then rings of 7.
    pub fn dct(eps: f32) -> SimBA {
        SimBA { basis: SimbaBasis::Dct { freq: 14, stride: 7 }, ..SimBA::pixel(eps) }
    }

    /// The objective minimised: p_y untargeted, −p_t targeted.
    fn objective(ctx: &Ctx, p: &[f32]) -> f32 {
        match ctx.target {
            Some(t) => -p[t],
            None => p[ctx.label],
        }
    }

    fn order(&self, ctx: &Ctx, rng: &mut ChaCha8Rng) -> Vec<usize> {
        let (c, h, w) = ctx.chw;
        match self.basis {
            SimbaBasis::Pixel => {
                let mut o: Vec<usize> = (0..ctx.dim()).collect();
                shuffle(&mut o, rng);
                o
            }
            SimbaBasis::Dct { freq, stride } => {
                let ring = |u: usize, v: usize| {
                    let m = u.max(v);
                    if m < freq {
                        0
                    } else {
                        1 + (m - freq) / stride
                    }
                };
                let rings = 1 + h.max(w) / stride + 1;
                let mut groups: Vec<Vec<usize>> = vec![Vec::new(); rings];
                for ch in 0..c {
                    for u in 0..h {
                        for v in 0..w {
                            groups[ring(u, v).min(rings - 1)].push((ch * h + u) * w + v);
                        }
                    }
                }
                groups
                    .into_iter()
                    .flat_map(|mut g| {
                        shuffle(&mut g, rng);
                        g
                    })
                    .collect()
            }
        }
    }

    /// The pixel-space direction of coordinate `k`, scaled so its largest entry is 1, as (index, value) pairs.
    fn direction(&self, ctx: &Ctx, k: usize) -> Vec<(usize, f32)> {
        match self.basis {
            SimbaBasis::Pixel => vec![(k, 1.0)],
            SimbaBasis::Dct { .. } => {
                let (_, h, w) = ctx.chw;
                let ch = k / (h * w);
                let mut coeff = vec![0.0f32; h * w];
                coeff[k % (h * w)] = 1.0;
                let q = idct2(&coeff, h, w);
                let m = q.iter().fold(0.0f32, |a, v| a.max(v.abs())).max(1e-12);
                q.iter().enumerate().map(|(j, v)| (ch * h * w + j, v / m)).collect()
            }
        }
    }

    fn attack(&self, ctx: &Ctx) -> Result<Vec<f32>> {
        let mut rng = ChaCha8Rng::seed_from_u64(ctx.seed);
        let p = ctx.probs(ctx.x.clone())?;
        if ctx.success(p.row(0)) {
            return Ok(ctx.x.clone());
        }
        let mut step = self.step.unwrap_or(ctx.eps);
        let min_step = step / 8.0;
        let mut cur = ctx.x.clone();
        let mut obj = Self::objective(ctx, p.row(0).as_slice().expect("row"));
        let mut order = self.order(ctx, &mut rng);
        let (mut pos, mut pass_moved) = (0, false);
        while ctx.remaining() > 0 {
            if pos == order.len() {
                if !pass_moved {
                    // A whole pass without an improvement: finer steps, until they are an eighth of the first.
                    if step / 2.0 < min_step {
                        break;
                    }
                    step /= 2.0;
                }
                order = self.order(ctx, &mut rng);
                (pos, pass_moved) = (0, false);
            }
            let dir = self.direction(ctx, order[pos]);
            pos += 1;
            for sign in [-1.0f32, 1.0] {
                if ctx.remaining() == 0 {
                    break;
                }
                let mut cand = cur.clone();
                for &(j, v) in &dir {
                    cand[j] += sign * step * v;
                }
                ctx.clamp_box(&mut cand);
                if cand == cur {
                    continue;
                }
                let pc = ctx.probs(cand.clone())?;
                if ctx.success(pc.row(0)) {
                    return Ok(cand);
                }
                let o = Self::objective(ctx, pc.row(0).as_slice().expect("row"));
                if o < obj {
                    obj = o;
                    cur = cand;
                    pass_moved = true;
                    break;
                }
            }
        }
        Ok(cur)
    }
}

/// The orthonormal DCT-II matrix of size n: C[u][i] = a_u·cos(π(2i+1)u/2n), a_0 = √(1/n), a_u = √(2/n).
pub(crate) fn dct_matrix(n: usize) -> Vec<f64> {
    let mut c = vec![0.0; n * n];
    for u in 0..n {
        let a = if u == 0 { (1.0 / n as f64).sqrt() } else { (2.0 / n as f64).sqrt() };
        for i in 0..n {
            c[u * n + i] = a * (std::f64::consts::PI * (2 * i + 1) as f64 * u as f64 / (2 * n) as f64).cos();
        }
    }
    c
}

/// 2-D DCT-II of an h×w image (row-major): X = C_h · x · C_wᵀ (the search walks the basis through [`idct2`]).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn dct2(x: &[f32], h: usize, w: usize) -> Vec<f32> {
    let (ch, cw) = (dct_matrix(h), dct_matrix(w));
    let mut tmp = vec![0.0f64; h * w];
    for u in 0..h {
        for i in 0..h {
            let a = ch[u * h + i];
            for j in 0..w {
                tmp[u * w + j] += a * x[i * w + j] as f64;
            }
        }
    }
    let mut out = vec![0.0f32; h * w];
    for u in 0..h {
        for v in 0..w {
            out[u * w + v] = (0..w).map(|j| tmp[u * w + j] * cw[v * w + j]).sum::<f64>() as f32;
        }
    }
    out
}

/// The inverse (orthonormal DCT-III): x = C_hᵀ · X · C_w.
pub(crate) fn idct2(coeff: &[f32], h: usize, w: usize) -> Vec<f32> {
    let (ch, cw) = (dct_matrix(h), dct_matrix(w));
    let mut tmp = vec![0.0f64; h * w];
    for u in 0..h {
        for i in 0..h {
            let a = ch[u * h + i];
            for v in 0..w {
                tmp[i * w + v] += a * coeff[u * w + v] as f64;
            }
        }
    }
    let mut out = vec![0.0f32; h * w];
    for i in 0..h {
        for j in 0..w {
            out[i * w + j] = (0..w).map(|v| tmp[i * w + v] * cw[v * w + j]).sum::<f64>() as f32;
        }
    }
    out
}

impl Algorithm for SimBA {
    fn name(&self) -> String {
        let basis = match self.basis {
            SimbaBasis::Pixel => "pixel".to_string(),
            SimbaBasis::Dct { freq, stride } => format!("dct{freq}/{stride}"),
        };
        format!("SimBA-{basis}(eps={}, queries={})", self.eps.describe(), self.max_queries)
    }

    fn access(&self) -> Access {
        Access::Scores
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: Norm::Linf, eps: self.eps.clone() }
    }

    fn query_budget(&self) -> Option<u64> {
        Some(self.max_queries)
    }

    fn validate(&self) -> Result<()> {
        if let Some(s) = self.step {
            crate::budget::check_positive("simba", "step", s)?;
        }
        if let SimbaBasis::Dct { freq, stride } = self.basis {
            if freq == 0 || stride == 0 {
                return Err(Error::invalid("simba", "DCT freq and stride must be positive"));
            }
        }
        Ok(())
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        search_scored(p, Queries { max_queries: self.max_queries, topk: None }, |ctx| self.attack(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dct_is_orthonormal_and_inverts() {
        let (h, w) = (28, 28);
        let x: Vec<f32> = (0..h * w).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
        let back = idct2(&dct2(&x, h, w), h, w);
        assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() < 1e-5));
        let energy = |v: &[f32]| v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>();
        assert!((energy(&x) - energy(&dct2(&x, h, w))).abs() < 1e-3);
        // The DC coefficient is the mean times √(hw).
        let mean = x.iter().map(|&a| a as f64).sum::<f64>() / (h * w) as f64;
        assert!((dct2(&x, h, w)[0] as f64 - mean * 28.0).abs() < 1e-4);
    }
}
