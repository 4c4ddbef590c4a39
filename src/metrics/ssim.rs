//! Structural similarity (SSIM, Wang, Bovik, Sheikh & Simoncelli 2004, "Image quality assessment: from error
//! visibility to structural similarity", IEEE TIP 13(4)).
//!
//! The paper's settings: an 11×11 circular-symmetric Gaussian window with σ = 1.5 (normalised to sum 1), K1 =
//! 0.01, K2 = 0.03, C1 = (K1·L)², C2 = (K2·L)² with L the data range (a parameter, never guessed from the
//! values), local statistics weighted by the window with the population (not sample) covariance, and the mean
//! of the SSIM map as the image's score. Multi-channel images score the mean of their channels' scores.
//!
//! **Borders**: the map is computed only where the whole 11×11 window lies inside the image, i.e. the
//! (H − 10) × (W − 10) "valid" positions, so no padding value ever enters the score. This gives exactly
//! scikit-image's `structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
//! data_range=L)`, which filters with reflected borders and then crops the 5 border pixels on each side before
//! averaging — the cropped positions are exactly those whose window would read the padding. Images smaller than
//! 11 pixels in height or width have no valid position and are an error (scikit-image raises too).
//! The cross-check is `tests/fixtures/scripts/metrics_reference.py` (numpy, the same formula written
//! independently).

use crate::{Error, Result, Tensor};

const OP: &str = "ssim";

/// Side of the Gaussian window.
pub const SSIM_WINDOW: usize = 11;
/// Standard deviation of the Gaussian window, in pixels.
pub const SSIM_SIGMA: f64 = 1.5;
/// K1 of the luminance constant C1 = (K1·L)².
pub const SSIM_K1: f64 = 0.01;
/// K2 of the contrast constant C2 = (K2·L)².
pub const SSIM_K2: f64 = 0.03;

/// SSIM of two images of the same shape — `[C, H, W]`, `[H, W]` or `[1, C, H, W]` — with data range
/// `data_range` (max − min of the value range, e.g. 1 for images in [0, 1]; a classifier's
/// `bounds().1 − bounds().0`). 1 for identical images; the paper's settings and border rule are in the
/// [module docs](self).
///
/// Errors: different shapes, another rank, H or W below 11, a non-positive or non-finite data range, NaN or
/// infinite pixels.
pub fn ssim(a: &Tensor, b: &Tensor, data_range: f64) -> Result<f64> {
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch { op: OP, expected: a.shape().to_vec(), got: b.shape().to_vec() });
    }
    let shape = match *a.shape() {
        [h, w] => [1, h, w],
        [c, h, w] | [1, c, h, w] => [c, h, w],
        _ => return Err(a.rank_error(OP, 3)),
    };
    ssim_slices(&a.to_vec(), &b.to_vec(), shape, data_range)
}

/// SSIM of each pair of images of two batches `[N, C, H, W]` of the same shape: one score per sample (see
/// [`ssim`]).
pub fn ssim_batch(a: &Tensor, b: &Tensor, data_range: f64) -> Result<Vec<f64>> {
    if a.shape() != b.shape() {
        return Err(Error::ShapeMismatch { op: OP, expected: a.shape().to_vec(), got: b.shape().to_vec() });
    }
    let (n, c, h, w) = a.dims4(OP)?;
    let (va, vb) = (a.to_vec(), b.to_vec());
    let size = c * h * w;
    (0..n)
        .map(|i| ssim_slices(&va[i * size..(i + 1) * size], &vb[i * size..(i + 1) * size], [c, h, w], data_range))
        .collect()
}

/// SSIM of two images stored channel-major (`[C, H, W]`, row-major) in slices; see [`ssim`].
pub fn ssim_slices(a: &[f32], b: &[f32], shape: [usize; 3], data_range: f64) -> Result<f64> {
    let [c, h, w] = shape;
    let size = c.checked_mul(h).and_then(|v| v.checked_mul(w));
    if size != Some(a.len()) || a.len() != b.len() {
        return Err(Error::invalid(
            OP,
            format!("images of {} and {} values do not have shape {shape:?}", a.len(), b.len()),
        ));
    }
    if c == 0 {
        return Err(Error::invalid(OP, "an image needs at least one channel"));
    }
    if h < SSIM_WINDOW || w < SSIM_WINDOW {
        return Err(Error::invalid(
            OP,
            format!("images must be at least {SSIM_WINDOW}×{SSIM_WINDOW} for the Gaussian window, got {h}×{w}"),
        ));
    }
    if !(data_range.is_finite() && data_range > 0.0) {
        return Err(Error::invalid(OP, format!("data_range must be positive and finite, got {data_range}")));
    }
    if a.iter().chain(b).any(|v| !v.is_finite()) {
        return Err(Error::NonFinite { op: OP });
    }
    let window = gaussian_window();
    let mut scratch = Scratch::new(h, w);
    let total: f64 = (0..c)
        .map(|k| {
            channel_ssim(
                &a[k * h * w..(k + 1) * h * w],
                &b[k * h * w..(k + 1) * h * w],
                h,
                w,
                data_range,
                &window,
                &mut scratch,
            )
        })
        .sum();
    Ok(total / c as f64)
}

/// The 1-D Gaussian weights exp(−x²/2σ²), x = −5..=5, normalised to sum 1 (the 2-D window is their outer product).
fn gaussian_window() -> [f64; SSIM_WINDOW] {
    let r = (SSIM_WINDOW / 2) as f64;
    let mut g = [0.0; SSIM_WINDOW];
    for (i, v) in g.iter_mut().enumerate() {
        let x = i as f64 - r;
        *v = (-0.5 * x * x / (SSIM_SIGMA * SSIM_SIGMA)).exp();
    }
    let sum: f64 = g.iter().sum();
    g.iter_mut().for_each(|v| *v /= sum);
    g
}

/// Buffers reused across the channels of one image: the five products and their row-filtered versions.
struct Scratch {
    products: [Vec<f64>; 5],
    rows: [Vec<f64>; 5],
}

impl Scratch {
    fn new(h: usize, w: usize) -> Scratch {
        let vw = w - SSIM_WINDOW + 1;
        Scratch {
            products: std::array::from_fn(|_| vec![0.0; h * w]),
            rows: std::array::from_fn(|_| vec![0.0; h * vw]),
        }
    }
}

/// Mean SSIM over the valid positions of one channel: the window's weighted means of x, y, x², y², xy by a
/// separable filter (along rows, then along columns), then the SSIM formula at each position.
fn channel_ssim(
    a: &[f32],
    b: &[f32],
    h: usize,
    w: usize,
    data_range: f64,
    g: &[f64; SSIM_WINDOW],
    s: &mut Scratch,
) -> f64 {
    let (vh, vw) = (h - SSIM_WINDOW + 1, w - SSIM_WINDOW + 1);
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (x as f64, y as f64);
        s.products[0][i] = x;
        s.products[1][i] = y;
        s.products[2][i] = x * x;
        s.products[3][i] = y * y;
        s.products[4][i] = x * y;
    }
    for (p, r) in s.products.iter().zip(s.rows.iter_mut()) {
        for row in 0..h {
            let src = &p[row * w..(row + 1) * w];
            for (j, out) in r[row * vw..(row + 1) * vw].iter_mut().enumerate() {
                *out = g.iter().zip(&src[j..j + SSIM_WINDOW]).map(|(g, v)| g * v).sum();
            }
        }
    }
    let c1 = (SSIM_K1 * data_range).powi(2);
    let c2 = (SSIM_K2 * data_range).powi(2);
    let column =
        |r: &[f64], i: usize, j: usize| -> f64 { g.iter().enumerate().map(|(k, g)| g * r[(i + k) * vw + j]).sum() };
    let mut total = 0.0;
    for i in 0..vh {
        for j in 0..vw {
            let mx = column(&s.rows[0], i, j);
            let my = column(&s.rows[1], i, j);
            let vx = column(&s.rows[2], i, j) - mx * mx;
            let vy = column(&s.rows[3], i, j) - my * my;
            let vxy = column(&s.rows[4], i, j) - mx * my;
            total += ((2.0 * mx * my + c1) * (2.0 * vxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2));
        }
    }
    total / (vh * vw) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_is_normalised_and_symmetric() {
        let g = gaussian_window();
        assert!((g.iter().sum::<f64>() - 1.0).abs() < 1e-15);
        for k in 0..SSIM_WINDOW {
            assert_eq!(g[k], g[SSIM_WINDOW - 1 - k]);
        }
        // exp(−25/4.5) relative to the centre.
        assert!((g[0] / g[5] - (-25.0f64 / 4.5).exp()).abs() < 1e-15);
    }

    #[test]
    fn identical_images_score_one() {
        let a: Vec<f32> = (0..2 * 13 * 12).map(|i| ((i * 7919) % 255) as f32 / 255.0).collect();
        let s = ssim_slices(&a, &a, [2, 13, 12], 1.0).unwrap();
        assert!((s - 1.0).abs() < 1e-12, "{s}");
    }

    #[test]
    fn constant_images_follow_the_luminance_term() {
        // Two constant images: σ = 0 everywhere, so SSIM = (2·μx·μy + C1)/(μx² + μy² + C1) exactly.
        let (x, y) = (0.2f32, 0.6f32);
        let a = vec![x; 12 * 12];
        let b = vec![y; 12 * 12];
        let s = ssim_slices(&a, &b, [1, 12, 12], 1.0).unwrap();
        let (x, y) = (x as f64, y as f64);
        let c1 = 1e-4;
        let want = (2.0 * x * y + c1) / (x * x + y * y + c1);
        assert!((s - want).abs() < 1e-12, "{s} vs {want}");
    }

    #[test]
    fn misuse_is_an_error() {
        let a = vec![0.0f32; 10 * 10];
        assert!(ssim_slices(&a, &a, [1, 10, 10], 1.0).is_err());
        let a = vec![0.0f32; 11 * 11];
        assert!(ssim_slices(&a, &a, [1, 11, 11], 0.0).is_err());
        assert!(ssim_slices(&a, &a, [1, 11, 11], f64::NAN).is_err());
        assert!(ssim_slices(&a, &a[1..], [1, 11, 11], 1.0).is_err());
        let mut b = a.clone();
        b[3] = f32::NAN;
        assert!(ssim_slices(&a, &b, [1, 11, 11], 1.0).is_err());
    }
}
