//! Max and average pooling over 2-D windows, parallel over (image, channel) planes, with their backward.

use ndarray::{Array4, ArrayD};
use rayon::prelude::*;

use super::{record, Op};
use crate::tensor::Tensor;
use crate::{Error, Result};

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

    fn out_len(len: usize, k: usize, s: usize, p: usize, ceil: bool) -> Option<usize> {
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
        let ho = Self::out_len(h, kh, self.stride.0, self.padding.0, self.ceil_mode);
        let wo = Self::out_len(w, kw, self.stride.1, self.padding.1, self.ceil_mode);
        match (ho, wo) {
            (Some(ho), Some(wo)) => Ok((n, c, h, w, ho, wo)),
            _ => Err(Error::invalid(op, format!("window {kh}x{kw} does not fit input {h}x{w}"))),
        }
    }
}

/// The clipped window `[start, end)` along one axis for output position `o`, plus the unclipped end.
#[inline]
fn window(o: usize, s: usize, p: usize, k: usize, len: usize) -> (usize, usize, usize) {
    let start = (o * s) as isize - p as isize;
    let end = start + k as isize;
    let padded_end = end.min((len + p) as isize);
    (start.max(0) as usize, (end.min(len as isize)) as usize, (padded_end - start) as usize)
}

fn max_pool2d(x: &Tensor, p: Pool2dParams) -> Result<Tensor> {
    let (n, c, h, w, ho, wo) = p.geometry("max_pool2d", x)?;
    let xs = x.value().as_standard_layout();
    let xs = xs.as_slice().expect("standard layout");
    let mut out = vec![0.0f32; n * c * ho * wo];
    let mut index = vec![0u32; n * c * ho * wo];
    out.par_chunks_mut(ho * wo).zip(index.par_chunks_mut(ho * wo)).zip(xs.par_chunks(h * w)).for_each(
        |((o, idx), plane)| {
            for i in 0..ho {
                let (r0, r1, _) = window(i, p.stride.0, p.padding.0, p.kernel.0, h);
                for j in 0..wo {
                    let (c0, c1, _) = window(j, p.stride.1, p.padding.1, p.kernel.1, w);
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
                    o[i * wo + j] = best;
                    idx[i * wo + j] = at as u32;
                }
            }
        },
    );
    let value = Array4::from_shape_vec((n, c, ho, wo), out).expect("sized above").into_dyn();
    Ok(record(value, Op::MaxPool2d { x: x.clone(), index }))
}

pub(crate) fn max_pool2d_backward(shape: &[usize], index: &[u32], g: &ArrayD<f32>) -> ArrayD<f32> {
    let (h, w) = (shape[2], shape[3]);
    let planes = shape[0] * shape[1];
    let per = index.len() / planes.max(1);
    let gs = g.as_standard_layout();
    let gs = gs.as_slice().expect("standard layout");
    let mut out = vec![0.0f32; shape.iter().product()];
    out.par_chunks_mut(h * w).zip(gs.par_chunks(per)).zip(index.par_chunks(per)).for_each(|((o, gp), ip)| {
        for (&gv, &i) in gp.iter().zip(ip) {
            o[i as usize] += gv;
        }
    });
    ArrayD::from_shape_vec(shape, out).expect("input-sized")
}

fn avg_pool2d(x: &Tensor, p: Pool2dParams) -> Result<Tensor> {
    let (n, c, h, w, ho, wo) = p.geometry("avg_pool2d", x)?;
    let xs = x.value().as_standard_layout();
    let xs = xs.as_slice().expect("standard layout");
    let mut out = vec![0.0f32; n * c * ho * wo];
    out.par_chunks_mut(ho * wo).zip(xs.par_chunks(h * w)).for_each(|(o, plane)| {
        for i in 0..ho {
            let (r0, r1, rn) = window(i, p.stride.0, p.padding.0, p.kernel.0, h);
            for j in 0..wo {
                let (c0, c1, cn) = window(j, p.stride.1, p.padding.1, p.kernel.1, w);
                let mut s = 0.0f32;
                for r in r0..r1 {
                    s += plane[r * w + c0..r * w + c1].iter().sum::<f32>();
                }
                let count = if p.count_include_pad { rn * cn } else { (r1 - r0) * (c1 - c0) };
                o[i * wo + j] = s / count.max(1) as f32;
            }
        }
    });
    let value = Array4::from_shape_vec((n, c, ho, wo), out).expect("sized above").into_dyn();
    Ok(record(value, Op::AvgPool2d { x: x.clone(), p }))
}

pub(crate) fn avg_pool2d_backward(shape: &[usize], p: &Pool2dParams, g: &ArrayD<f32>) -> ArrayD<f32> {
    let (h, w) = (shape[2], shape[3]);
    let (ho, wo) = (g.shape()[2], g.shape()[3]);
    let gs = g.as_standard_layout();
    let gs = gs.as_slice().expect("standard layout");
    let mut out = vec![0.0f32; shape.iter().product()];
    out.par_chunks_mut(h * w).zip(gs.par_chunks(ho * wo)).for_each(|(o, gp)| {
        for i in 0..ho {
            let (r0, r1, rn) = window(i, p.stride.0, p.padding.0, p.kernel.0, h);
            for j in 0..wo {
                let (c0, c1, cn) = window(j, p.stride.1, p.padding.1, p.kernel.1, w);
                let count = if p.count_include_pad { rn * cn } else { (r1 - r0) * (c1 - c0) };
                let v = gp[i * wo + j] / count.max(1) as f32;
                for r in r0..r1 {
                    o[r * w + c0..r * w + c1].iter_mut().for_each(|d| *d += v);
                }
            }
        }
    });
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
