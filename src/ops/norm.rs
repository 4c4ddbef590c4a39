//! Layer normalisation over the trailing axes, with its backward: one pass per row for the statistics, one for the
//! output, rows split across threads in fixed blocks (each row is computed alone, so the result depends neither on
//! the thread count nor on the batch).
//!
//! A fused primitive rather than a composition of mean, sub, pow, sqrt and div: the composition takes eleven passes
//! over the activations and as many temporaries, on the LayerNorm of every transformer block (issue 32's ViT and
//! ConvNeXt profiles), and its backward twice that.

use std::borrow::Cow;
use std::mem::MaybeUninit;

use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;

use super::shape::{standard, sum_to_shape};
use super::vmath::lane_sum;
use super::{record, Op, PAR_THRESHOLD};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Rows per task, and per partial sum of the scale's and bias's gradients: fixed, so that the order of every sum
/// is independent of the thread count.
const ROWS_PER_BLOCK: usize = 32;

/// What [`Op::LayerNorm`] keeps for its backward: per row, the mean and 1/√(var + ε).
pub(crate) struct LayerNormSaved {
    pub(crate) x: Tensor,
    pub(crate) scale: Option<Tensor>,
    pub(crate) bias: Option<Tensor>,
    pub(crate) axis: usize,
    pub(crate) mean: Vec<f32>,
    pub(crate) rstd: Vec<f32>,
    /// `x`'s values in row-major order when the forward had to copy them (a permuted view: ConvNeXt's channels-last
    /// transpose), so the backward does not copy them again.
    pub(crate) contiguous: Option<Vec<f32>>,
}

/// `f(first row, outputs)` over blocks of [`ROWS_PER_BLOCK`] rows of `d` values, in parallel when there is enough
/// work; the blocks' results in order.
fn for_row_blocks<T: Send>(
    out: &mut [MaybeUninit<f32>],
    d: usize,
    f: impl Fn(usize, &mut [MaybeUninit<f32>]) -> T + Sync + Send,
) -> Vec<T> {
    let block = ROWS_PER_BLOCK * d;
    if out.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(block).enumerate().map(|(i, o)| f(i * ROWS_PER_BLOCK, o)).collect()
    } else {
        out.chunks_mut(block).enumerate().map(|(i, o)| f(i * ROWS_PER_BLOCK, o)).collect()
    }
}

/// A scale or bias as `d` values: its own when it has the normalised shape, else broadcast to it.
fn per_feature(op: &'static str, t: &Tensor, norm_shape: &[usize]) -> Result<Vec<f32>> {
    let v = t.value().broadcast(IxDyn(norm_shape)).ok_or_else(|| Error::Broadcast {
        op,
        lhs: t.shape().to_vec(),
        rhs: norm_shape.to_vec(),
    })?;
    Ok(v.iter().copied().collect())
}

pub(crate) fn layer_norm(
    x: &Tensor,
    axis: usize,
    eps: f32,
    scale: Option<&Tensor>,
    bias: Option<&Tensor>,
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    const OP: &str = "layer_norm";
    if axis >= x.rank() {
        return Err(Error::invalid(OP, format!("axis {axis} out of range for shape {:?}", x.shape())));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(OP, format!("epsilon {eps} must be finite and non-negative")));
    }
    let norm_shape = &x.shape()[axis..];
    let d: usize = norm_shape.iter().product();
    if d == 0 {
        return Err(Error::invalid(OP, format!("normalised axes {norm_shape:?} of shape {:?} are empty", x.shape())));
    }
    let gamma = scale.map(|s| per_feature(OP, s, norm_shape)).transpose()?;
    let beta = bias.map(|b| per_feature(OP, b, norm_shape)).transpose()?;
    let xs = standard(x.value());
    let mut stats = Vec::new();
    // SAFETY: the row blocks cover the output and every row is written whole in each arm below.
    let out = unsafe {
        crate::ops::written(xs.len(), |out| {
            stats = for_row_blocks(out, d, |row0, o| {
                let mut stats = Vec::with_capacity(ROWS_PER_BLOCK);
                for (i, or) in o.chunks_exact_mut(d).enumerate() {
                    let xr = &xs[(row0 + i) * d..][..d];
                    let mu = lane_sum(xr, xr, |v, _| v) / d as f32;
                    let var = lane_sum(xr, xr, |v, _| (v - mu) * (v - mu)) / d as f32;
                    let rs = 1.0 / (var + eps).sqrt();
                    stats.push((mu, rs));
                    match (&gamma, &beta) {
                        (Some(g), Some(b)) => {
                            for (((o, &v), &g), &b) in or.iter_mut().zip(xr).zip(g).zip(b) {
                                o.write((v - mu) * rs * g + b);
                            }
                        }
                        (Some(g), None) => {
                            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(g) {
                                o.write((v - mu) * rs * g);
                            }
                        }
                        (None, Some(b)) => {
                            for ((o, &v), &b) in or.iter_mut().zip(xr).zip(b) {
                                o.write((v - mu) * rs + b);
                            }
                        }
                        (None, None) => {
                            for (o, &v) in or.iter_mut().zip(xr) {
                                o.write((v - mu) * rs);
                            }
                        }
                    }
                }
                stats
            });
        })
    };
    let (mean, rstd): (Vec<f32>, Vec<f32>) = stats.into_iter().flatten().unzip();
    let value = ArrayD::from_shape_vec(IxDyn(x.shape()), out).expect("one value per input");
    let contiguous = match xs {
        Cow::Owned(v) => Some(v),
        Cow::Borrowed(_) => None,
    };
    let saved = LayerNormSaved {
        x: x.clone(),
        scale: scale.cloned(),
        bias: bias.cloned(),
        axis,
        mean: mean.clone(),
        rstd: rstd.clone(),
        contiguous,
    };
    Ok((record(value, Op::LayerNorm(Box::new(saved))), mean, rstd))
}

/// With x̂ = (x − μ)·r (r = 1/√(var + ε)) and y = x̂·γ + β: ∂L/∂β = Σ_rows g, ∂L/∂γ = Σ_rows g·x̂ and
/// ∂L/∂x = r·(g·γ − mean(g·γ) − x̂·mean(g·γ·x̂)), the means over each row.
pub(crate) fn layer_norm_backward(s: &LayerNormSaved, g: &ArrayD<f32>, need: &[bool]) -> Vec<Option<ArrayD<f32>>> {
    let xs = s.contiguous.as_deref().map_or_else(|| standard(s.x.value()), Cow::Borrowed);
    let gs = standard(g);
    let norm_shape = &s.x.shape()[s.axis..];
    let d: usize = norm_shape.iter().product();
    let gamma: Option<Vec<f32>> =
        s.scale.as_ref().map(|t| per_feature("layer_norm", t, norm_shape).expect("checked in the forward"));
    let gx = need[0].then(|| {
        // SAFETY: the row blocks cover the output and every row is written whole.
        let out = unsafe {
            crate::ops::written(xs.len(), |out| {
                for_row_blocks(out, d, |row0, o| {
                    let mut dy = vec![0.0f32; d];
                    for (i, or) in o.chunks_exact_mut(d).enumerate() {
                        let row = row0 + i;
                        let (mu, r) = (s.mean[row], s.rstd[row]);
                        let gr = &gs[row * d..][..d];
                        match &gamma {
                            Some(gm) => dy.iter_mut().zip(gr).zip(gm).for_each(|((o, &g), &w)| *o = g * w),
                            None => dy.copy_from_slice(gr),
                        }
                        let xr = &xs[row * d..][..d];
                        let mean_dy = lane_sum(&dy, &dy, |a, _| a) / d as f32;
                        let mean_dy_xhat = lane_sum(&dy, xr, |a, v| a * ((v - mu) * r)) / d as f32;
                        for ((o, &a), &v) in or.iter_mut().zip(&dy).zip(xr) {
                            o.write(r * (a - mean_dy - (v - mu) * r * mean_dy_xhat));
                        }
                    }
                });
            })
        };
        ArrayD::from_shape_vec(IxDyn(s.x.shape()), out).expect("one gradient per input")
    });
    let mut grads = vec![gx];
    let rows = xs.len() / d;
    let want_scale = s.scale.is_some() && need[1];
    let want_bias = s.bias.as_ref().is_some() && need[1 + usize::from(s.scale.is_some())];
    // Per block: [Σ g·x̂, Σ g] over its rows.
    let block = |b: usize| {
        let (mut gw, mut gb) = (vec![0.0f32; d], vec![0.0f32; d]);
        for row in b * ROWS_PER_BLOCK..((b + 1) * ROWS_PER_BLOCK).min(rows) {
            let (gr, xr, mu, r) = (&gs[row * d..][..d], &xs[row * d..][..d], s.mean[row], s.rstd[row]);
            for (((w, bb), &gv), &v) in gw.iter_mut().zip(gb.iter_mut()).zip(gr).zip(xr) {
                *w += gv * ((v - mu) * r);
                *bb += gv;
            }
        }
        [gw, gb]
    };
    let blocks = rows.div_ceil(ROWS_PER_BLOCK);
    let partials: Vec<[Vec<f32>; 2]> = if !(want_scale || want_bias) {
        Vec::new()
    } else if xs.len() >= PAR_THRESHOLD {
        (0..blocks).into_par_iter().map(block).collect()
    } else {
        (0..blocks).map(block).collect()
    };
    // Which of the two sums, over the blocks in order, shaped as the parameter `t`.
    let total = |which: usize, t: &Tensor| {
        let mut sum = vec![0.0f32; d];
        for p in &partials {
            sum.iter_mut().zip(&p[which]).for_each(|(s, &v)| *s += v);
        }
        let full = ArrayD::from_shape_vec(IxDyn(norm_shape), sum).expect("d values");
        sum_to_shape(full, t.shape())
    };
    if let Some(t) = &s.scale {
        grads.push(want_scale.then(|| total(0, t)));
    }
    if let Some(t) = &s.bias {
        grads.push(want_bias.then(|| total(1, t)));
    }
    grads
}

/// Normalisation.
impl Tensor {
    /// Layer normalisation over every axis from `axis` on: each row (the trailing axes flattened) minus its mean,
    /// over √(its biased variance + `eps`), then times `scale` and plus `bias` (each of the trailing axes' shape, or
    /// broadcastable to it), as PyTorch's `layer_norm(x, x.shape[axis:], scale, bias, eps)` and ONNX's
    /// LayerNormalization.
    ///
    /// Derivatives, with x̂ the normalised row, r = 1/√(var + ε) and g the output's gradient: ∂/∂bias = Σ g,
    /// ∂/∂scale = Σ g·x̂ (over the leading axes), ∂/∂x = r·(g·scale − mean(g·scale) − x̂·mean(g·scale·x̂)).
    pub fn layer_norm(&self, axis: usize, eps: f32, scale: Option<&Tensor>, bias: Option<&Tensor>) -> Result<Tensor> {
        Ok(layer_norm(self, axis, eps, scale, bias)?.0)
    }
}
