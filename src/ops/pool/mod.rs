//! Max and average pooling over 2-D windows, parallel over (image, channel) planes, with their backward: 2×2
//! windows of stride 2 tiling the plane on `simd::pool` (or their unrolled loops), every other window, stride,
//! padding and ceil mode on the separable per-plane passes of [`plane`].

mod plane;

use ndarray::{Array4, ArrayD};
use rayon::prelude::*;

use super::shape::standard;
use super::{record, Op};
use crate::tensor::{Array, Tensor};
use crate::{Error, Result};
use plane::{window, Windows};

/// Window, stride and padding of a pooling op (PyTorch's meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dParams {
    /// Window size (rows, columns).
    pub kernel: (usize, usize),
    /// Step between windows (rows, columns).
    pub stride: (usize, usize),
    /// Implicit padding on each side (−∞ for max, zeros for average).
    pub padding: (usize, usize),
    /// Round the output size up instead of down (windows must still start inside the padded input).
    pub ceil_mode: bool,
    /// Average pooling: divide by the full window, padding included (PyTorch's default), or only by the
    /// entries inside the input.
    pub count_include_pad: bool,
}

impl Pool2dParams {
    /// A `k×k` window with stride `k`, no padding.
    pub fn square(k: usize) -> Self {
        Pool2dParams { kernel: (k, k), stride: (k, k), padding: (0, 0), ceil_mode: false, count_include_pad: true }
    }

    pub(crate) fn out_len(len: usize, k: usize, s: usize, p: usize, ceil: bool) -> Option<usize> {
        let span = (len + 2 * p).checked_sub(k)?;
        let mut o = if ceil { span.div_ceil(s) + 1 } else { span / s + 1 };
        // PyTorch: the last window must start inside the input or the left padding.
        if ceil && (o - 1) * s >= len + p {
            o -= 1;
        }
        Some(o)
    }

    fn geometry(&self, op: &'static str, x: &Tensor) -> Result<(usize, usize, usize, usize, usize, usize)> {
        let (n, c, h, w) = x.dims4(op)?;
        let (kh, kw) = self.kernel;
        if kh == 0 || kw == 0 || self.stride.0 == 0 || self.stride.1 == 0 {
            return Err(Error::invalid(op, format!("kernel and stride must be positive: {self:?}")));
        }
        if 2 * self.padding.0 > kh || 2 * self.padding.1 > kw {
            return Err(Error::invalid(op, format!("padding must be at most half the kernel: {self:?}")));
        }
        if h == 0 || w == 0 {
            return Err(Error::invalid(op, format!("empty image planes {h}x{w}")));
        }
        let ho = Self::out_len(h, kh, self.stride.0, self.padding.0, self.ceil_mode);
        let wo = Self::out_len(w, kw, self.stride.1, self.padding.1, self.ceil_mode);
        match (ho, wo) {
            (Some(ho), Some(wo)) => Ok((n, c, h, w, ho, wo)),
            _ => Err(Error::invalid(op, format!("window {kh}x{kw} does not fit input {h}x{w}"))),
        }
    }
}

/// The maximum of one window and its flat index in the plane: rows `r0..r1`, columns `c0..c1`, scanned row-major;
/// a later value wins when it is larger or NaN (so NaN propagates, as PyTorch).
#[inline]
fn window_max(plane: &[f32], w: usize, (r0, r1): (usize, usize), (c0, c1): (usize, usize)) -> (f32, usize) {
    let mut best = f32::NEG_INFINITY;
    let mut at = r0 * w + c0;
    for r in r0..r1 {
        for (cc, &v) in plane[r * w + c0..r * w + c1].iter().enumerate() {
            if v > best || v.is_nan() {
                best = v;
                at = r * w + c0 + cc;
            }
        }
    }
    (best, at)
}

/// Max pooling of one plane into `o` (and the arg-max into `idx` when it is not empty).
pub(crate) fn max_pool_plane(
    plane: &[f32],
    o: &mut [f32],
    idx: &mut [u32],
    h: usize,
    w: usize,
    wo: usize,
    p: &Pool2dParams,
) {
    let ho = o.len() / wo;
    let ((kh, kw), (sh, sw)) = (p.kernel, p.stride);
    let inside = p.padding == (0, 0) && (ho - 1) * sh + kh <= h && (wo - 1) * sw + kw <= w;
    if inside && (kh, kw, sh, sw) == (2, 2, 2, 2) && super::simd::max_pool_2x2(plane, h, w, o, idx) {
        return;
    }
    if inside && (kh, kw, sh, sw) == (2, 2, 2, 2) && idx.is_empty() && !plane.iter().fold(false, |a, v| a | v.is_nan())
    {
        // Values only, no NaN in the plane: the maximum of each row pair, then of each column pair — two
        // vectorisable passes. (With no NaN, `f32::max` is the exact maximum, so this equals the scan below.)
        let mut rows = vec![0.0f32; w];
        for (i, orow) in o.chunks_exact_mut(wo).enumerate() {
            let (top, bottom) = (&plane[2 * i * w..2 * i * w + w], &plane[(2 * i + 1) * w..(2 * i + 1) * w + w]);
            for ((r, &t), &b) in rows.iter_mut().zip(top).zip(bottom) {
                *r = t.max(b);
            }
            for (d, pair) in orow.iter_mut().zip(rows.chunks_exact(2)) {
                *d = pair[0].max(pair[1]);
            }
        }
        return;
    }
    if inside && (kh, kw, sh, sw) == (2, 2, 2, 2) {
        // The common 2×2/2 window, unrolled and branch-free (random data mispredicts every comparison): the value
        // is the maximum, or NaN if any entry is NaN; the index is the first maximum, or the last NaN — the same
        // answer as the row-major scan of `window_max`.
        for (i, orow) in o.chunks_exact_mut(wo).enumerate() {
            let (top, bottom) = (&plane[2 * i * w..2 * i * w + w], &plane[(2 * i + 1) * w..(2 * i + 1) * w + w]);
            for (j, d) in orow.iter_mut().enumerate() {
                let (a, b, c, e) = (top[2 * j], top[2 * j + 1], bottom[2 * j], bottom[2 * j + 1]);
                let m = a.max(b).max(c.max(e));
                let nan = a.is_nan() | b.is_nan() | c.is_nan() | e.is_nan();
                *d = if nan { f32::NAN } else { m };
                if !idx.is_empty() {
                    let at = if nan {
                        [a, b, c, e].iter().rposition(|v| v.is_nan()).expect("one is NaN")
                    } else {
                        // First of the entries equal to the maximum, without a data-dependent branch.
                        let eq = u32::from(a == m) | u32::from(b == m) << 1 | u32::from(c == m) << 2 | 8;
                        eq.trailing_zeros() as usize
                    };
                    idx[i * wo + j] = ((2 * i + at / 2) * w + 2 * j + at % 2) as u32;
                }
            }
        }
        return;
    }
    for i in 0..ho {
        let (r0, r1, _) = window(i, sh, p.padding.0, kh, h);
        for j in 0..wo {
            let (c0, c1, _) = window(j, sw, p.padding.1, kw, w);
            let (best, at) = window_max(plane, w, (r0, r1), (c0, c1));
            o[i * wo + j] = best;
            if !idx.is_empty() {
                idx[i * wo + j] = at as u32;
            }
        }
    }
}

/// Whether `p` is the 2×2 window of stride 2 tiling the `h × w` plane from its corner into `ho × wo` (the shape
/// of [`max_pool_plane`]'s fast paths and `simd::pool`'s kernels).
fn tiles_2x2(p: &Pool2dParams, h: usize, w: usize, ho: usize, wo: usize) -> bool {
    p.kernel == (2, 2) && p.stride == (2, 2) && p.padding == (0, 0) && 2 * ho <= h && 2 * wo <= w
}

/// `f(buffer, input plane, output plane)` over every plane in parallel (a row buffer per task).
fn per_plane(
    xs: &[f32],
    out: &mut [f32],
    (h, w, per): (usize, usize, usize),
    fill: f32,
    win: &Windows,
    f: impl Fn(&mut Vec<f32>, &[f32], &mut [f32]) + Sync + Send,
) {
    out.par_chunks_mut(per)
        .zip(xs.par_chunks(h * w))
        .with_min_len(8)
        .for_each_init(|| win.buffer(fill), |buf, (o, plane)| f(buf, plane, o));
}

fn max_pool2d(x: &Tensor, p: Pool2dParams) -> Result<Tensor> {
    let (n, c, h, w, ho, wo) = p.geometry("max_pool2d", x)?;
    let xs = standard(x.value());
    let xs = &xs[..];
    // No arg-max is stored: the backward finds it again from the input and the output.
    let mut out = vec![0.0f32; n * c * ho * wo];
    let (win, tiles) = (Windows::new(&p, h, w, ho, wo), tiles_2x2(&p, h, w, ho, wo));
    per_plane(xs, &mut out, (h, w, ho * wo), f32::NEG_INFINITY, &win, |buf, plane, o| {
        if tiles {
            max_pool_plane(plane, o, &mut [], h, w, wo, &p)
        } else {
            win.max(plane, o, buf)
        }
    });
    let value = Array4::from_shape_vec((n, c, ho, wo), out).expect("sized above").into_dyn();
    Ok(record(value, Op::MaxPool2d { x: x.clone(), p }))
}

pub(crate) fn max_pool2d_backward(x: &Tensor, p: &Pool2dParams, out: &Array, g: &ArrayD<f32>) -> ArrayD<f32> {
    let shape = x.shape();
    let (h, w, ho, wo) = (shape[2], shape[3], g.shape()[2], g.shape()[3]);
    let planes = shape[0] * shape[1];
    if planes == 0 || g.is_empty() {
        // No plane (batch × channels = 0): nothing to scatter, and chunks of size 0 are not allowed.
        return ArrayD::zeros(shape);
    }
    let per = ho * wo;
    let gs = standard(g);
    let gs = &gs[..];
    let xs = standard(x.value());
    let xs = &xs[..];
    let os = standard(out);
    let os = &os[..];
    let win = Windows::new(p, h, w, ho, wo);
    let len = planes * h * w;
    let mut dx = Vec::with_capacity(len);
    // 2×2 tiles on the vector kernels write every element of a plane (no zero fill); any other window, or a
    // plane holding a NaN, takes the separable backward over zeros.
    let dense = tiles_2x2(p, h, w, ho, wo) && super::simd::accelerated();
    dx.spare_capacity_mut()[..len]
        .par_chunks_mut(h * w)
        .zip(xs.par_chunks(h * w))
        .zip(os.par_chunks(per).zip(gs.par_chunks(per)))
        .with_min_len(8)
        .for_each(|((d, plane), (op, gp))| {
            if !(dense && super::simd::max_pool_2x2_backward(plane, h, w, op, gp, d)) {
                d.iter_mut().for_each(|slot| {
                    slot.write(0.0);
                });
                // SAFETY: every element was just initialised.
                let d = unsafe { &mut *(d as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) };
                win.max_backward(plane, op, gp, d);
            }
        });
    // SAFETY: every plane was written in full, by the kernel or by the fill.
    unsafe { dx.set_len(len) };
    ArrayD::from_shape_vec(shape, dx).expect("input-sized")
}

fn avg_pool2d(x: &Tensor, p: Pool2dParams) -> Result<Tensor> {
    let (n, c, h, w, ho, wo) = p.geometry("avg_pool2d", x)?;
    let xs = standard(x.value());
    let xs = &xs[..];
    let mut out = vec![0.0f32; n * c * ho * wo];
    let win = Windows::new(&p, h, w, ho, wo);
    per_plane(xs, &mut out, (h, w, ho * wo), 0.0, &win, |buf, plane, o| win.avg(plane, o, buf));
    let value = Array4::from_shape_vec((n, c, ho, wo), out).expect("sized above").into_dyn();
    Ok(record(value, Op::AvgPool2d { x: x.clone(), p }))
}

pub(crate) fn avg_pool2d_backward(shape: &[usize], p: &Pool2dParams, g: &ArrayD<f32>) -> ArrayD<f32> {
    let (h, w) = (shape[2], shape[3]);
    let (ho, wo) = (g.shape()[2], g.shape()[3]);
    if g.is_empty() || h * w == 0 {
        return ArrayD::zeros(shape);
    }
    let gs = standard(g);
    let gs = &gs[..];
    let mut out = vec![0.0f32; shape.iter().product()];
    let win = Windows::new(p, h, w, ho, wo);
    out.par_chunks_mut(h * w)
        .zip(gs.par_chunks(ho * wo))
        .with_min_len(8)
        .for_each_init(|| win.buffer(0.0), |buf, (o, gp)| win.avg_backward(gp, o, buf));
    ArrayD::from_shape_vec(shape, out).expect("input-sized")
}

/// Pooling.
impl Tensor {
    /// Max pooling of [N, C, H, W]; the gradient goes to each window's (first) maximum.
    pub fn max_pool2d(&self, params: Pool2dParams) -> Result<Tensor> {
        max_pool2d(self, params)
    }

    /// Average pooling of [N, C, H, W]; the gradient is spread evenly over each window.
    pub fn avg_pool2d(&self, params: Pool2dParams) -> Result<Tensor> {
        avg_pool2d(self, params)
    }

    /// Global average pooling: [N, C, H, W] → [N, C, 1, 1].
    pub fn global_avg_pool2d(&self) -> Result<Tensor> {
        self.dims4("global_avg_pool2d")?;
        self.mean(&[2, 3], true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2×2 backward that finds the arg-max again from input and output (dense, no stored index) sends each
    /// gradient where the stored first-maximum index would: planes full of ties, odd sizes (an unpooled last row
    /// and column get zero), rows wider than one vector, and a plane with a NaN (the scan's last-NaN rule).
    #[test]
    fn dense_2x2_backward_matches_the_index_scatter() {
        for (seed, &(h, w)) in [(6usize, 8usize), (7, 9), (24, 24), (12, 12), (5, 41)].iter().enumerate() {
            let n = 3 * h * w;
            let mut vals: Vec<f32> = (0..n).map(|i| ((i * 7919 + seed) % 5) as f32 - 2.0).collect();
            if seed == 1 {
                vals[w + 3] = f32::NAN;
            }
            let x = Tensor::from_vec(vals.clone(), &[1, 3, h, w]).unwrap().variable();
            let y = x.max_pool2d(Pool2dParams::square(2)).unwrap();
            let (ho, wo) = (h / 2, w / 2);
            let r = Tensor::uniform(&[1, 3, ho, wo], -1.0, 1.0, seed as u64);
            let got = y.mul(&r).unwrap().sum_all().grad_wrt(&[&x]).unwrap()[0].to_vec();
            let rs = r.to_vec();
            let mut want = vec![0.0f32; n];
            for c in 0..3 {
                let (mut o, mut idx) = (vec![0.0; ho * wo], vec![0u32; ho * wo]);
                max_pool_plane(&vals[c * h * w..(c + 1) * h * w], &mut o, &mut idx, h, w, wo, &Pool2dParams::square(2));
                for (k, &i) in idx.iter().enumerate() {
                    want[c * h * w + i as usize] += rs[c * ho * wo + k];
                }
            }
            assert_eq!(got, want, "{h}x{w}");
        }
    }

    /// The unrolled 2×2 path gives the same values (NaN included) and arg-max (first maximum, last NaN) as the
    /// generic row-major scan.
    #[test]
    fn unrolled_2x2_matches_the_generic_scan() {
        let (h, w) = (6, 8);
        let p = Pool2dParams::square(2);
        // Few distinct values, so windows hold ties; one NaN window and an all −∞ window.
        let mut plane: Vec<f32> = (0..h * w).map(|i| ((i * 7919) % 5) as f32 - 2.0).collect();
        plane[2 * w + 3] = f32::NAN;
        for i in [4 * w + 4, 4 * w + 5, 5 * w + 4, 5 * w + 5] {
            plane[i] = f32::NEG_INFINITY;
        }
        let (ho, wo) = (h / 2, w / 2);
        let (mut o, mut idx) = (vec![0.0; ho * wo], vec![0u32; ho * wo]);
        max_pool_plane(&plane, &mut o, &mut idx, h, w, wo, &p);
        for i in 0..ho {
            for j in 0..wo {
                let (best, at) = window_max(&plane, w, (2 * i, 2 * i + 2), (2 * j, 2 * j + 2));
                let k = i * wo + j;
                assert!(o[k] == best || (o[k].is_nan() && best.is_nan()), "value at {i},{j}");
                assert_eq!(idx[k] as usize, at, "index at {i},{j}");
            }
        }
        let mut o2 = vec![0.0; ho * wo];
        max_pool_plane(&plane, &mut o2, &mut [], h, w, wo, &p);
        assert!(o.iter().zip(&o2).all(|(a, b)| a == b || (a.is_nan() && b.is_nan())));
        // Without the NaN the values-only path takes its vectorised two-pass route, and the indexed path its
        // vector kernel where the CPU has one: same values, same first-maximum indices as the scan.
        for (h, w) in [(6, 8), (4, 40), (2, 2), (8, 66)] {
            let plane: Vec<f32> = (0..h * w).map(|i| ((i * 7919) % 5) as f32 - 2.0).collect();
            let (ho, wo) = (h / 2, w / 2);
            let (mut o, mut idx, mut o2) = (vec![0.0; ho * wo], vec![0u32; ho * wo], vec![0.0; ho * wo]);
            max_pool_plane(&plane, &mut o, &mut idx, h, w, wo, &p);
            max_pool_plane(&plane, &mut o2, &mut [], h, w, wo, &p);
            assert_eq!(o, o2);
            for i in 0..ho {
                for j in 0..wo {
                    let (best, at) = window_max(&plane, w, (2 * i, 2 * i + 2), (2 * j, 2 * j + 2));
                    assert_eq!((o[i * wo + j], idx[i * wo + j] as usize), (best, at), "{h}x{w} at {i},{j}");
                }
            }
        }
    }
}
