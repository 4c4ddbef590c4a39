//! Total-variation minimisation (Guo, Rana, Cissé & van der Maaten 2018, "Countering adversarial images using
//! input transformations", §3.2), solved with Chambolle & Pock's primal–dual algorithm (2011).

use armoury::seed::sample_seed;
use armoury::{Error, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{batch_values, check_bounds, map_images, Transform};

/// Replaces each image channel `x` (rescaled to [0, 1] over the bounds) by the minimiser of
/// `½‖m ⊙ (z − x)‖² + λ·TV(z)`, with TV the isotropic total variation `Σ √((∂ₕz)² + (∂ᵥz)²)` (forward
/// differences, Neumann boundary) and `m` Guo et al.'s random pixel-dropout mask: each pixel (all its
/// channels) is kept with probability `keep_prob`, seeded per sample from the draw and the image's values; the
/// dropped pixels are in-painted by the TV term. With `keep_prob = 1` this is the ROF model (Rudin, Osher &
/// Fatemi 1992) and the transform is deterministic. Guo et al. write the data term unsquared; Armoury uses the
/// squared (ROF, scikit-image `denoise_tv_chambolle`) form, whose minimiser is unique. Not differentiable (BPDA);
/// random when `keep_prob < 1` (EOT).
///
/// The solver is Chambolle–Pock's Algorithm 1 (Algorithm 2, accelerated, when no pixel is dropped and the data
/// term is strongly convex) with τ = σ = 1/√8, run for `iterations` steps; the output is clipped to the bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TotalVariation {
    /// λ, the weight of the TV term (for inputs rescaled to [0, 1]), ≥ 0.
    pub weight: f32,
    /// Primal–dual iterations, ≥ 1.
    pub iterations: usize,
    /// Probability that a pixel is kept in the data term, in (0, 1].
    pub keep_prob: f32,
}

/// Guo et al.'s default: half the pixels dropped from the data term at every draw (a random transform, so
/// [`super::Defended`] averages it over EOT draws). For deterministic ROF denoising, use
/// [`TotalVariation::rof`].
impl Default for TotalVariation {
    fn default() -> Self {
        TotalVariation { weight: 0.05, iterations: 200, keep_prob: 0.5 }
    }
}

impl TotalVariation {
    /// Deterministic ROF denoising (Rudin, Osher & Fatemi 1992): every pixel kept (`keep_prob` 1).
    pub fn rof(weight: f32, iterations: usize) -> TotalVariation {
        TotalVariation { weight, iterations, keep_prob: 1.0 }
    }
}

/// Forward differences with a zero last row/column (Neumann boundary).
fn grad(z: &[f64], h: usize, w: usize, gx: &mut [f64], gy: &mut [f64]) {
    for i in 0..h {
        for j in 0..w {
            let k = i * w + j;
            gx[k] = if j + 1 < w { z[k + 1] - z[k] } else { 0.0 };
            gy[k] = if i + 1 < h { z[k + w] - z[k] } else { 0.0 };
        }
    }
}

/// The divergence, the negative adjoint of [`grad`].
fn div(px: &[f64], py: &[f64], h: usize, w: usize, out: &mut [f64]) {
    for i in 0..h {
        for j in 0..w {
            let k = i * w + j;
            let dx = if j + 1 < w { px[k] } else { 0.0 } - if j > 0 { px[k - 1] } else { 0.0 };
            let dy = if i + 1 < h { py[k] } else { 0.0 } - if i > 0 { py[k - w] } else { 0.0 };
            out[k] = dx + dy;
        }
    }
}

/// Isotropic TV of one plane.
fn plane_tv(z: &[f64], h: usize, w: usize) -> f64 {
    let (mut gx, mut gy) = (vec![0.0; h * w], vec![0.0; h * w]);
    grad(z, h, w, &mut gx, &mut gy);
    gx.iter().zip(&gy).map(|(a, b)| (a * a + b * b).sqrt()).sum()
}

/// The minimiser of `½‖m ⊙ (z − x)‖² + λ·TV(z)` for one plane by Chambolle–Pock.
pub(crate) fn rof(x: &[f64], mask: Option<&[bool]>, h: usize, w: usize, lambda: f64, iterations: usize) -> Vec<f64> {
    let n = h * w;
    if lambda == 0.0 {
        return x.to_vec();
    }
    let m: Vec<f64> = match mask {
        Some(k) => k.iter().map(|&b| if b { 1.0 } else { 0.0 }).collect(),
        None => vec![1.0; n],
    };
    let accelerate = mask.is_none();
    let (mut tau, mut sigma) = (1.0 / 8f64.sqrt(), 1.0 / 8f64.sqrt());
    let mut z = x.to_vec();
    let mut zbar = z.clone();
    let (mut px, mut py) = (vec![0.0; n], vec![0.0; n]);
    let (mut gx, mut gy, mut d) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for _ in 0..iterations {
        grad(&zbar, h, w, &mut gx, &mut gy);
        for k in 0..n {
            let (a, b) = (px[k] + sigma * gx[k], py[k] + sigma * gy[k]);
            let scale = ((a * a + b * b).sqrt() / lambda).max(1.0);
            px[k] = a / scale;
            py[k] = b / scale;
        }
        div(&px, &py, h, w, &mut d);
        let theta = if accelerate { 1.0 / (1.0 + 2.0 * tau).sqrt() } else { 1.0 };
        for k in 0..n {
            let old = z[k];
            z[k] = (z[k] + tau * d[k] + tau * m[k] * x[k]) / (1.0 + tau * m[k]);
            zbar[k] = z[k] + theta * (z[k] - old);
        }
        if accelerate {
            tau *= theta;
            sigma /= theta;
        }
    }
    z
}

/// The isotropic total variation of each image of a batch `[N, C, H, W]`, summed over its channels.
pub fn total_variation(x: &Tensor) -> Result<Vec<f32>> {
    let (v, [n, c, h, w]) = batch_values("total_variation", x)?;
    let hw = h * w;
    Ok((0..n)
        .map(|i| {
            (0..c)
                .map(|ch| {
                    let p: Vec<f64> = v[(i * c + ch) * hw..(i * c + ch + 1) * hw].iter().map(|&a| a as f64).collect();
                    plane_tv(&p, h, w)
                })
                .sum::<f64>() as f32
        })
        .collect())
}

impl Transform for TotalVariation {
    fn name(&self) -> String {
        format!("TotalVariation(weight={}, iterations={}, keep_prob={})", self.weight, self.iterations, self.keep_prob)
    }

    fn is_random(&self) -> bool {
        self.keep_prob < 1.0
    }

    fn validate(&self) -> Result<()> {
        if !(self.weight.is_finite() && self.weight >= 0.0) {
            return Err(Error::invalid("TotalVariation", format!("weight {} must be finite and ≥ 0", self.weight)));
        }
        if self.iterations == 0 {
            return Err(Error::invalid("TotalVariation", "at least one iteration is needed"));
        }
        if !(self.keep_prob > 0.0 && self.keep_prob <= 1.0) {
            return Err(Error::invalid("TotalVariation", format!("keep_prob {} must be in (0, 1]", self.keep_prob)));
        }
        Ok(())
    }

    fn apply(&self, x: &Tensor, bounds: (f32, f32), draw: u64) -> Result<Tensor> {
        self.validate()?;
        check_bounds("TotalVariation", bounds)?;
        let (_, c, h, w) = x.dims4("TotalVariation")?;
        let (lo, hi) = (bounds.0 as f64, bounds.1 as f64);
        let hw = h * w;
        map_images("TotalVariation", x, |_, img, out| {
            let mask: Option<Vec<bool>> = self.is_random().then(|| {
                let mut rng = ChaCha8Rng::seed_from_u64(sample_seed(draw, 0, img));
                (0..hw).map(|_| rng.random::<f32>() < self.keep_prob).collect()
            });
            for ch in 0..c {
                let p: Vec<f64> = img[ch * hw..(ch + 1) * hw].iter().map(|&a| (a as f64 - lo) / (hi - lo)).collect();
                let z = rof(&p, mask.as_deref(), h, w, self.weight as f64, self.iterations);
                for (o, v) in out[ch * hw..(ch + 1) * hw].iter_mut().zip(z) {
                    *o = (lo + v.clamp(0.0, 1.0) * (hi - lo)) as f32;
                }
            }
            Ok(())
        })
    }
}
