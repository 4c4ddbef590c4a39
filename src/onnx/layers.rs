//! The ONNX operators that need more than one core op: convolution and pooling with ONNX padding rules,
//! Gemm, NumPy-style MatMul, BatchNormalization, Softmax, Slice and Pad.

use super::attrs::NodeInfo;
use super::compile::{Fused, PadMode, Window};
use super::exec::axis;
use super::ints;
use super::value::Value;
use crate::ops::{Conv2dParams, Pool2dParams};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// (before, after) padding of the four axes of an NCHW tensor.
pub(crate) type Pads = [(usize, usize); 4];

fn dims4(info: &NodeInfo, x: &Tensor) -> Result<(usize, usize, usize, usize)> {
    if x.rank() != 4 {
        return Err(info.unsupported(format!("input of rank {} (only 2-D images, rank 4, are supported)", x.rank())));
    }
    x.dims4("onnx")
}

/// Splits `[top, left, bottom, right]` into the symmetric part (rows, columns) and the rest as explicit padding.
pub(crate) fn split_pads(p: [usize; 4]) -> ((usize, usize), Pads) {
    let (ph, pw) = (p[0].min(p[2]), p[1].min(p[3]));
    ((ph, pw), [(0, 0), (0, 0), (p[0] - ph, p[2] - ph), (p[1] - pw, p[3] - pw)])
}

fn has_extra(extra: &Pads) -> bool {
    extra.iter().any(|&(a, b)| a + b > 0)
}

/// Conv: the symmetric part of the padding goes to the kernel, any asymmetric remainder is padded first; the
/// bias is fused into the convolution.
pub(crate) fn conv(
    info: &NodeInfo,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    win: &Window,
    group: usize,
    then: Fused,
) -> Result<Tensor> {
    let (_, _, h, wd) = dims4(info, x)?;
    if w.rank() != 4 {
        return Err(info.unsupported(format!("weight of rank {} (only 2-D convolution)", w.rank())));
    }
    let k = [w.shape()[2], w.shape()[3]];
    if k.contains(&0) {
        return Err(info.malformed(format!("weight of shape {:?}", w.shape())));
    }
    if win.kernel.is_some_and(|kk| kk != k) {
        return Err(info.malformed(format!("kernel_shape {:?} disagrees with weight {:?}", win.kernel, w.shape())));
    }
    let (sym, extra) = split_pads(win.padding([h, wd], k));
    let padded;
    let x = if has_extra(&extra) {
        padded = x.pad(&extra, 0.0)?;
        &padded
    } else {
        x
    };
    let p = Conv2dParams {
        stride: (win.strides[0], win.strides[1]),
        padding: sym,
        dilation: (win.dilations[0], win.dilations[1]),
        groups: group,
    };
    match then {
        Fused::Nothing => x.conv2d(w, b, p),
        Fused::Relu => x.conv2d_relu(w, b, p),
        Fused::ReluMaxPool2 => x.conv2d_relu_max_pool2(w, b, p),
    }
}

fn pool_params(win: &Window, padding: (usize, usize), count_include_pad: bool) -> Result<Pool2dParams> {
    let kernel = win.kernel.ok_or_else(|| Error::invalid("onnx pooling", "no kernel_shape"))?;
    Ok(Pool2dParams {
        kernel: (kernel[0], kernel[1]),
        stride: (win.strides[0], win.strides[1]),
        padding,
        ceil_mode: win.ceil_mode,
        count_include_pad,
    })
}

/// The padding of a pooling window: symmetric and at most half the kernel goes to the pooling op, anything else
/// is padded explicitly.
fn pool_pads(info: &NodeInfo, x: &Tensor, win: &Window) -> Result<((usize, usize), Pads)> {
    let (_, _, h, w) = dims4(info, x)?;
    pool_pads_for(info, h, w, win)
}

/// [`pool_pads`] for an input of `h × w`.
pub(crate) fn pool_pads_for(info: &NodeInfo, h: usize, w: usize, win: &Window) -> Result<((usize, usize), Pads)> {
    let k = win.kernel.ok_or_else(|| info.malformed("kernel_shape is required"))?;
    let p = win.padding([h, w], k);
    if p[0] == p[2] && p[1] == p[3] && 2 * p[0] <= k[0] && 2 * p[1] <= k[1] {
        return Ok(((p[0], p[1]), [(0, 0); 4]));
    }
    Ok(((0, 0), [(0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])]))
}

/// MaxPool (explicit padding is −∞).
pub(crate) fn max_pool(info: &NodeInfo, x: &Tensor, win: &Window) -> Result<Tensor> {
    let (sym, extra) = pool_pads(info, x, win)?;
    let x = if has_extra(&extra) { x.pad(&extra, f32::NEG_INFINITY)? } else { x.clone() };
    x.max_pool2d(pool_params(win, sym, true)?)
}

/// AveragePool. With asymmetric padding that must not be counted, the window sums are divided by the number
/// of real entries in each window (the same pooling applied to a mask of ones).
pub(crate) fn avg_pool(info: &NodeInfo, x: &Tensor, win: &Window, count_include_pad: bool) -> Result<Tensor> {
    let (sym, extra) = pool_pads(info, x, win)?;
    if !has_extra(&extra) {
        return x.avg_pool2d(pool_params(win, sym, count_include_pad)?);
    }
    let p = pool_params(win, (0, 0), true)?;
    let sums = x.pad(&extra, 0.0)?.avg_pool2d(p)?;
    if count_include_pad {
        return Ok(sums);
    }
    let (_, _, h, w) = x.dims4("onnx AveragePool")?;
    let counts = Tensor::ones(&[1, 1, h, w]).pad(&extra, 0.0)?.avg_pool2d(p)?;
    sums.div(&counts)
}

/// GlobalAveragePool / GlobalMaxPool over every axis after the channels.
pub(crate) fn global_pool(info: &NodeInfo, x: &Tensor, max: bool) -> Result<Tensor> {
    if x.rank() < 3 {
        return Err(info.malformed(format!("input of rank {}", x.rank())));
    }
    let axes: Vec<usize> = (2..x.rank()).collect();
    if !max {
        return x.mean(&axes, true);
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let m = x.reshape(&[n, c, x.numel() / (n * c).max(1)])?.max(2, true)?;
    let mut shape = vec![n, c];
    shape.resize(x.rank(), 1);
    m.reshape(&shape)
}

/// Gemm: α·op(A)·op(B) + β·C. `transB` uses a strided view of B (the GEMM reads strides, no copy).
pub(crate) fn gemm(
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> Result<Tensor> {
    let a = if trans_a { a.t()? } else { a.clone() };
    let b = if trans_b { b.t()? } else { b.clone() };
    let mut y = a.matmul(&b)?;
    if alpha != 1.0 {
        y = y.mul_scalar(alpha);
    }
    match c {
        Some(c) if beta == 1.0 => y.add(c),
        Some(c) => y.add(&c.mul_scalar(beta)),
        None => Ok(y),
    }
}

/// MatMul with NumPy semantics: vectors are promoted, leading (batch) dimensions broadcast.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (va, vb) = (a.rank() == 1, b.rank() == 1);
    let a = if va { a.unsqueeze(0)? } else { a.clone() };
    let b = if vb { b.unsqueeze(1)? } else { b.clone() };
    if a.rank() < 2 || b.rank() < 2 {
        return Err(Error::RankMismatch { op: "onnx MatMul", expected: 2, got: a.rank().min(b.rank()), shape: vec![] });
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    let mut y = if ra == 2 && rb == 2 {
        a.matmul(&b)?
    } else if rb == 2 {
        let lead = a.shape()[..ra - 2].to_vec();
        let p: usize = lead.iter().product();
        let mut shape = lead;
        shape.extend([m, n]);
        a.reshape(&[p * m, k])?.matmul(&b)?.reshape(&shape)?
    } else {
        let (la, lb) = (&a.shape()[..ra - 2], &b.shape()[..rb - 2]);
        let lead = crate::ops::elementwise::broadcast_shape(la, lb).ok_or_else(|| Error::Broadcast {
            op: "onnx MatMul",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        })?;
        let p: usize = lead.iter().product();
        let full = |t: &Tensor, r: usize, c: usize| -> Result<Tensor> {
            let mut s = lead.clone();
            s.extend([r, c]);
            let t = if t.shape() == s.as_slice() { t.clone() } else { t.broadcast_to(&s)? };
            t.reshape(&[p, r, c])
        };
        let mut shape = lead.clone();
        shape.extend([m, n]);
        full(&a, m, k)?.matmul(&full(&b, b.shape()[rb - 2], n)?)?.reshape(&shape)?
    };
    if vb {
        y = y.squeeze(y.rank() - 1)?;
    }
    if va {
        y = y.squeeze(y.rank() - if vb { 1 } else { 2 })?;
    }
    Ok(y)
}

/// BatchNormalization in inference: y = x·a + (B − mean·a) with a = scale/√(var + ε) per channel; the scale
/// and B stay differentiable, mean and var are running statistics.
pub(crate) fn batch_norm(
    info: &NodeInfo,
    x: &Tensor,
    scale: &Tensor,
    bias: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    if x.rank() < 2 {
        return Err(info.malformed(format!("input of rank {}", x.rank())));
    }
    let c = x.shape()[1];
    for t in [scale, bias, mean, var] {
        if t.shape() != [c] {
            return Err(Error::ShapeMismatch {
                op: "onnx BatchNormalization",
                expected: vec![c],
                got: t.shape().to_vec(),
            });
        }
    }
    let mut bshape = vec![1; x.rank()];
    bshape[1] = c;
    let a = scale.mul(&var.add_scalar(eps).powf(-0.5))?;
    let shift = bias.sub(&mean.mul(&a)?)?;
    x.mul(&a.reshape(&bshape)?)?.add(&shift.reshape(&bshape)?)
}

/// Softmax / LogSoftmax; the legacy form (opset < 13) works on the input flattened to 2-D at `axis`.
pub(crate) fn softmax(info: &NodeInfo, x: &Tensor, a: i64, log: bool, legacy: bool) -> Result<Tensor> {
    let f = |t: &Tensor, ax: usize| if log { t.log_softmax(ax) } else { t.softmax(ax) };
    let ax = axis(info, a, x.rank())?;
    if !legacy || ax + 1 == x.rank() {
        return f(x, ax);
    }
    let (lo, hi) = x.shape().split_at(ax);
    f(&x.reshape(&[lo.iter().product(), hi.iter().product()])?, 1)?.reshape(x.shape())
}

/// The first index and the number of indices a slice picks along an axis of size `d` (ONNX clamping rules), in
/// closed form: an axis of an empty tensor may be declared huge, and listing its indices would never end.
pub(crate) fn slice_range(d: usize, start: i64, end: i64, step: i64) -> (usize, usize) {
    if d == 0 {
        return (0, 0);
    }
    let d = d as i128;
    let norm = |v: i64| if v < 0 { i128::from(v) + d } else { i128::from(v) };
    let (s, e, step) = (norm(start), norm(end), i128::from(step));
    let (first, span) = if step > 0 {
        let (s, e) = (s.clamp(0, d), e.clamp(0, d));
        (s, e - s)
    } else {
        let (s, e) = (s.clamp(0, d - 1), e.clamp(-1, d - 1));
        (s, s - e)
    };
    let count = if span > 0 { (span + step.abs() - 1) / step.abs() } else { 0 };
    (first as usize, count as usize)
}

/// The indices of a [`slice_range`] with its step.
fn slice_indices(first: usize, count: usize, step: i64) -> Vec<usize> {
    (0..count as i128).map(|k| (first as i128 + k * i128::from(step)) as usize).collect()
}

/// Slice (any steps; contiguous unit-step ranges are views).
pub(crate) fn slice(
    info: &NodeInfo,
    v: &Value,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Value> {
    let r = v.shape().len();
    let axes: Vec<i64> = axes.map_or_else(|| (0..starts.len() as i64).collect(), <[i64]>::to_vec);
    let steps: Vec<i64> = steps.map_or_else(|| vec![1; starts.len()], <[i64]>::to_vec);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(info.malformed("starts, ends, axes and steps differ in length"));
    }
    let mut out = v.clone();
    for i in 0..starts.len() {
        let ax = axis(info, axes[i], r)?;
        if steps[i] == 0 {
            return Err(info.malformed("slice step 0"));
        }
        let (first, count) = slice_range(out.shape()[ax], starts[i], ends[i], steps[i]);
        // A unit step is a view; so is any slice of an empty tensor (its values do not matter, only the shape).
        let view = steps[i] == 1 || out.numel() == 0;
        out = match &out {
            Value::F(t) if view => Value::F(t.narrow(ax, if steps[i] == 1 && count > 0 { first } else { 0 }, count)?),
            Value::F(t) => Value::F(t.index_select(ax, &slice_indices(first, count, steps[i]))?),
            Value::I(x) if x.data.is_empty() => {
                let mut shape = x.shape.clone();
                shape[ax] = count;
                Value::I(super::value::Ints { shape, data: Vec::new() })
            }
            Value::I(x) => Value::I(ints::select(x, ax, &slice_indices(first, count, steps[i]))?),
        };
    }
    Ok(out)
}

/// Pad: `pads` = begins then ends for `axes` (all axes by default); negative pads crop.
pub(crate) fn pad(
    info: &NodeInfo,
    x: &Tensor,
    pads: &[i64],
    axes: Option<&[i64]>,
    value: f32,
    mode: PadMode,
) -> Result<Tensor> {
    let r = x.rank();
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis(info, a, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(info.malformed(format!("{} pads for {} axes", pads.len(), axes.len())));
    }
    if pads.iter().any(|p| p.unsigned_abs() > 1 << 16) {
        return Err(info.malformed(format!("pads {pads:?} out of range")));
    }
    let mut pp = vec![(0i64, 0i64); r];
    for (i, &a) in axes.iter().enumerate() {
        pp[a] = (pads[i], pads[i + axes.len()]);
    }
    // Crop first (negative pads), then pad.
    let mut t = x.clone();
    for (a, &(b, e)) in pp.iter().enumerate() {
        let (cb, ce) = ((-b).max(0) as usize, (-e).max(0) as usize);
        if cb + ce > 0 {
            let d = t.shape()[a];
            if cb + ce > d {
                return Err(info.malformed(format!("pads {pads:?} crop more than axis {a} holds")));
            }
            t = t.narrow(a, cb, d - cb - ce)?;
        }
    }
    let pos: Vec<(usize, usize)> = pp.iter().map(|&(b, e)| (b.max(0) as usize, e.max(0) as usize)).collect();
    if mode == PadMode::Constant {
        return if pos.iter().all(|&(b, e)| b + e == 0) { Ok(t) } else { t.pad(&pos, value) };
    }
    for (a, &(b, e)) in pos.iter().enumerate() {
        if b + e == 0 {
            continue;
        }
        let d = t.shape()[a] as i64;
        if d == 0 || (mode == PadMode::Reflect && (b as i64 >= d || e as i64 >= d)) {
            return Err(info.malformed(format!("reflect padding {b},{e} needs more than {d} entries")));
        }
        let idx: Vec<usize> = (-(b as i64)..d + e as i64)
            .map(|j| match mode {
                PadMode::Edge => j.clamp(0, d - 1) as usize,
                _ => {
                    (if j < 0 {
                        -j
                    } else if j >= d {
                        2 * (d - 1) - j
                    } else {
                        j
                    }) as usize
                }
            })
            .collect();
        t = t.index_select(a, &idx)?;
    }
    Ok(t)
}
