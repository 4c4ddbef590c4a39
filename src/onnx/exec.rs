//! Running one compiled node on Armoury's tensor ops (so autodiff flows through the imported graph), or on
//! integers for shape arithmetic.

use super::attrs::NodeInfo;
use super::compile::{Bin, Kind, PadMode, SliceAttrs};
use super::ints;
use super::layers;
use super::value::{Ints, Value};
use crate::tensor::Tensor;
use crate::Result;

/// Normalises an ONNX axis (negative counts from the end) for a rank-`rank` tensor.
pub(crate) fn axis(info: &NodeInfo, a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let v = if a < 0 { a + r } else { a };
    // A scalar has no axis: `r.max(1)` here once let axis 0 index an empty shape.
    if v < 0 || v >= r {
        return Err(info.malformed(format!("axis {a} out of range for rank {rank}")));
    }
    Ok(v as usize)
}

/// Input `i`, which must be present.
pub(crate) fn req<'a>(info: &NodeInfo, ins: &[Option<&'a Value>], i: usize) -> Result<&'a Value> {
    ins.get(i).copied().flatten().ok_or_else(|| info.malformed(format!("input {i} is missing")))
}

/// Input `i` as integers, if present (`Gather` indices, `Reshape` shapes, axes, …). A tracked float tensor here
/// is not a constant and is rejected.
pub(crate) fn opt_ints(info: &NodeInfo, ins: &[Option<&Value>], i: usize) -> Result<Option<Ints>> {
    match ins.get(i).copied().flatten() {
        None => Ok(None),
        Some(Value::F(t)) if t.is_tracked() => Err(info.unsupported(format!("input {i} computed from the data"))),
        Some(v) => Ok(Some(v.to_ints())),
    }
}

fn ints(info: &NodeInfo, ins: &[Option<&Value>], i: usize) -> Result<Ints> {
    opt_ints(info, ins, i)?.ok_or_else(|| info.malformed(format!("input {i} is missing")))
}

/// A scalar constant input (Clip bounds, Pad value, Pow exponent).
pub(crate) fn opt_scalar(info: &NodeInfo, ins: &[Option<&Value>], i: usize) -> Result<Option<f32>> {
    match ins.get(i).copied().flatten() {
        None => Ok(None),
        Some(Value::F(t)) if t.is_tracked() => Err(info.unsupported(format!("input {i} computed from the data"))),
        Some(v) if v.shape().iter().all(|&d| d == 1) => Ok(v.floats().first().copied()),
        Some(v) => Err(info.unsupported(format!("input {i} of shape {:?} (a scalar is expected)", v.shape()))),
    }
}

fn tensor(info: &NodeInfo, ins: &[Option<&Value>], i: usize) -> Result<Tensor> {
    req(info, ins, i)?.to_tensor()
}

/// The product of some dimensions, an error when it overflows (the whole shape is checked elsewhere; a part of a
/// shape with a zero elsewhere can still overflow).
pub(crate) fn checked_product(info: &NodeInfo, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| info.malformed(format!("dimensions {dims:?} overflow")))
}

/// A value with the same data in a new shape.
fn reshape(v: &Value, shape: &[usize]) -> Result<Value> {
    match v {
        Value::F(t) => Ok(Value::F(t.reshape(shape)?)),
        Value::I(i) => {
            if crate::limits::checked_numel("onnx Reshape", shape)? != i.data.len() {
                return Err(crate::Error::ShapeMismatch {
                    op: "onnx Reshape",
                    expected: shape.to_vec(),
                    got: i.shape.clone(),
                });
            }
            Ok(Value::I(Ints { shape: shape.to_vec(), data: i.data.clone() }))
        }
    }
}

/// Runs `kind` on its inputs; returns its outputs in order.
pub(crate) fn exec(kind: &Kind, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
    let one = |v: Value| Ok(vec![v]);
    let x = || req(info, ins, 0);
    match kind {
        Kind::Identity { mask: false } => one(x()?.clone()),
        Kind::Identity { mask: true } => {
            let v = x()?.clone();
            let n = crate::limits::checked_numel("onnx Dropout mask", v.shape())?;
            let mask = Value::I(Ints { shape: v.shape().to_vec(), data: vec![1; n] });
            Ok(vec![v, mask])
        }
        Kind::Constant(v) => one(v.clone()),
        Kind::Binary(op) => match (x()?, req(info, ins, 1)?) {
            (Value::I(a), Value::I(b)) => one(Value::I(ints::binary(*op, a, b)?)),
            (a, b) => {
                let (a, b) = (a.to_tensor()?, b.to_tensor()?);
                one(Value::F(match op {
                    Bin::Add => a.add(&b)?,
                    Bin::Sub => a.sub(&b)?,
                    Bin::Mul => a.mul(&b)?,
                    Bin::Div => a.div(&b)?,
                }))
            }
        },
        Kind::Unary(k) => one(Value::F(x()?.to_tensor()?.unary(*k))),
        Kind::PRelu => {
            let (x, mut slope) = (tensor(info, ins, 0)?, tensor(info, ins, 1)?);
            // The output has the data's shape (the slope broadcasts to it, never the other way round).
            let trimmed = super::infer::prelu_slope_shape(info, x.shape(), slope.shape())?;
            if trimmed.len() != slope.rank() {
                slope = slope.reshape(&trimmed)?;
            }
            if slope.numel() == 1 && !slope.is_tracked() {
                return one(Value::F(x.leaky_relu(slope.item()?)));
            }
            // y = relu(x) − slope·relu(−x); ∂y/∂slope = min(x, 0).
            one(Value::F(x.relu().sub(&x.neg().relu().mul(&slope)?)?))
        }
        Kind::Clip { min, max } => one(clip(info, ins, *min, *max)?),
        Kind::Pow => {
            let p = opt_scalar(info, ins, 1)?.ok_or_else(|| info.malformed("Pow needs an exponent"))?;
            let t = tensor(info, ins, 0)?;
            one(Value::F(if p == 1.0 { t } else { t.powf(p) }))
        }
        Kind::Softmax { axis: a, log, legacy } => {
            one(Value::F(layers::softmax(info, &tensor(info, ins, 0)?, *a, *log, *legacy)?))
        }
        Kind::Conv { window, group, then } => {
            let b = match ins.get(2).copied().flatten() {
                Some(v) => Some(v.to_tensor()?),
                None => None,
            };
            one(Value::F(layers::conv(
                info,
                &tensor(info, ins, 0)?,
                &tensor(info, ins, 1)?,
                b.as_ref(),
                window,
                *group,
                *then,
            )?))
        }
        Kind::Gemm { alpha, beta, trans_a, trans_b } => {
            let c = match ins.get(2).copied().flatten() {
                Some(v) => Some(v.to_tensor()?),
                None => None,
            };
            let (a, b) = (tensor(info, ins, 0)?, tensor(info, ins, 1)?);
            one(Value::F(layers::gemm(&a, &b, c.as_ref(), *alpha, *beta, *trans_a, *trans_b)?))
        }
        Kind::MatMul => one(Value::F(layers::matmul(&tensor(info, ins, 0)?, &tensor(info, ins, 1)?)?)),
        Kind::MaxPool(w) => one(Value::F(layers::max_pool(info, &tensor(info, ins, 0)?, w)?)),
        Kind::AvgPool { window, count_include_pad } => {
            one(Value::F(layers::avg_pool(info, &tensor(info, ins, 0)?, window, *count_include_pad)?))
        }
        Kind::GlobalAvgPool => one(Value::F(layers::global_pool(info, &tensor(info, ins, 0)?, false)?)),
        Kind::GlobalMaxPool => one(Value::F(layers::global_pool(info, &tensor(info, ins, 0)?, true)?)),
        Kind::BatchNorm { eps } => {
            let t: Vec<Tensor> = (0..5).map(|i| tensor(info, ins, i)).collect::<Result<_>>()?;
            one(Value::F(layers::batch_norm(info, &t[0], &t[1], &t[2], &t[3], &t[4], *eps)?))
        }
        Kind::Flatten { axis: a } => one(flatten(info, ins, *a)?),
        Kind::Reshape { allowzero } => {
            let v = x()?;
            let spec = ints(info, ins, 1)?.data;
            one(reshape(v, &reshape_target(info, v.shape(), &spec, *allowzero)?)?)
        }
        Kind::Transpose { perm } => one(transpose(info, ins, perm)?),
        Kind::Concat { axis: a } => one(concat(info, ins, *a)?),
        Kind::Squeeze { axes } => one(squeeze(info, ins, axes)?),
        Kind::Unsqueeze { axes } => one(unsqueeze(info, ins, axes)?),
        Kind::Gather { axis: a } => one(gather(info, ins, *a)?),
        Kind::Slice { attrs } => one(slice(info, ins, attrs)?),
        Kind::Pad { mode, attrs } => one(pad(info, ins, *mode, attrs)?),
        Kind::Reduce { mean, axes, keepdims, noop_with_empty_axes } => {
            one(reduce(info, ins, *mean, axes, *keepdims, *noop_with_empty_axes)?)
        }
        Kind::Shape { start, end } => one(shape(info, ins, *start, *end)?),
        Kind::Cast { to } => one(cast(info, ins, *to)?),
    }
}

/// `clip` of the ONNX operator of that name.
fn clip(info: &NodeInfo, ins: &[Option<&Value>], min: Option<f32>, max: Option<f32>) -> Result<Value> {
    let lo = match min {
        Some(v) => Some(v),
        None => opt_scalar(info, ins, 1)?,
    };
    let hi = match max {
        Some(v) => Some(v),
        None => opt_scalar(info, ins, 2)?,
    };
    let t = tensor(info, ins, 0)?;
    Ok(Value::F(t.clamp(lo.unwrap_or(f32::NEG_INFINITY), hi.unwrap_or(f32::INFINITY))))
}

/// `slice` of the ONNX operator of that name.
fn slice(info: &NodeInfo, ins: &[Option<&Value>], attrs: &Option<SliceAttrs>) -> Result<Value> {
    let (starts, ends, axes, steps) = match attrs {
        Some((s, e, a)) => (s.clone(), e.clone(), a.clone(), None),
        None => (
            ints(info, ins, 1)?.data,
            ints(info, ins, 2)?.data,
            opt_ints(info, ins, 3)?.map(|i| i.data),
            opt_ints(info, ins, 4)?.map(|i| i.data),
        ),
    };
    layers::slice(info, req(info, ins, 0)?, &starts, &ends, axes.as_deref(), steps.as_deref())
}

/// `pad` of the ONNX operator of that name.
fn pad(info: &NodeInfo, ins: &[Option<&Value>], mode: PadMode, attrs: &Option<(Vec<i64>, f32)>) -> Result<Value> {
    let (pads, value) = match attrs {
        Some((p, v)) => (p.clone(), *v),
        None => (ints(info, ins, 1)?.data, opt_scalar(info, ins, 2)?.unwrap_or(0.0)),
    };
    let axes = opt_ints(info, ins, 3)?.map(|i| i.data);
    let t = tensor(info, ins, 0)?;
    Ok(Value::F(layers::pad(info, &t, &pads, axes.as_deref(), value, mode)?))
}

/// `shape` of the ONNX operator of that name.
fn shape(info: &NodeInfo, ins: &[Option<&Value>], start: i64, end: Option<i64>) -> Result<Value> {
    let s = req(info, ins, 0)?.shape();
    let r = s.len() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (a, b) = (clampi(start), clampi(end.unwrap_or(r)));
    let dims: Vec<i64> = s[a..b.max(a)].iter().map(|&d| d as i64).collect();
    Ok(Value::I(Ints::vector(dims)))
}

/// `flatten` of the ONNX operator of that name.
fn flatten(info: &NodeInfo, ins: &[Option<&Value>], a: i64) -> Result<Value> {
    let v = req(info, ins, 0)?;
    let s = v.shape();
    let r = s.len() as i64;
    let a = if a < 0 { a + r } else { a };
    if a < 0 || a > r {
        return Err(info.malformed(format!("Flatten axis {a} for rank {r}")));
    }
    let (lo, hi) = s.split_at(a as usize);
    let (lo, hi) = (checked_product(info, lo)?, checked_product(info, hi)?);
    reshape(v, &[lo, hi])
}

/// `transpose` of the ONNX operator of that name.
fn transpose(info: &NodeInfo, ins: &[Option<&Value>], perm: &Option<Vec<i64>>) -> Result<Value> {
    let v = req(info, ins, 0)?;
    let r = v.shape().len();
    let perm: Vec<usize> = match perm {
        Some(p) => p.iter().map(|&a| axis(info, a, r)).collect::<Result<_>>()?,
        None => (0..r).rev().collect(),
    };
    match v {
        Value::F(t) => Ok(Value::F(t.permute(&perm)?)),
        Value::I(i) => {
            let mut seen = vec![false; r];
            if perm.len() != r || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
                return Err(info.malformed(format!("perm {perm:?} for rank {r}")));
            }
            Ok(Value::I(ints::permute(i, &perm)?))
        }
    }
}

/// `concat` of the ONNX operator of that name.
fn concat(info: &NodeInfo, ins: &[Option<&Value>], a: i64) -> Result<Value> {
    let vals: Vec<&Value> = ins.iter().flatten().copied().collect();
    let first = vals.first().ok_or_else(|| info.malformed("Concat without inputs"))?;
    let ax = axis(info, a, first.shape().len())?;
    if vals.iter().all(|v| matches!(v, Value::I(_))) {
        let is: Vec<Ints> = vals.iter().map(|v| v.to_ints()).collect();
        return Ok(Value::I(ints::concat(&is, ax)?));
    }
    let ts: Vec<Tensor> = vals.iter().map(|v| v.to_tensor()).collect::<Result<_>>()?;
    Ok(Value::F(Tensor::concat(&ts, ax)?))
}

/// `squeeze` of the ONNX operator of that name.
fn squeeze(info: &NodeInfo, ins: &[Option<&Value>], axes: &Option<Vec<i64>>) -> Result<Value> {
    let v = req(info, ins, 0)?;
    let axes = match axes {
        Some(a) => Some(a.clone()),
        None => opt_ints(info, ins, 1)?.map(|i| i.data),
    };
    let s = v.shape();
    let drop: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis(info, a, s.len())).collect::<Result<_>>()?,
        None => (0..s.len()).filter(|&i| s[i] == 1).collect(),
    };
    if let Some(&bad) = drop.iter().find(|&&a| s[a] != 1) {
        return Err(info.malformed(format!("cannot squeeze axis {bad} of size {}", s[bad])));
    }
    let shape: Vec<usize> = (0..s.len()).filter(|i| !drop.contains(i)).map(|i| s[i]).collect();
    reshape(v, &shape)
}

/// `unsqueeze` of the ONNX operator of that name.
fn unsqueeze(info: &NodeInfo, ins: &[Option<&Value>], axes: &Option<Vec<i64>>) -> Result<Value> {
    let v = req(info, ins, 0)?;
    let axes = match axes {
        Some(a) => a.clone(),
        None => ints(info, ins, 1)?.data,
    };
    let r = v.shape().len() + axes.len();
    let mut axes: Vec<usize> = axes.iter().map(|&a| axis(info, a, r)).collect::<Result<_>>()?;
    axes.sort_unstable();
    axes.dedup();
    let mut shape = v.shape().to_vec();
    for &a in &axes {
        if a > shape.len() {
            return Err(info.malformed(format!("Unsqueeze axes {axes:?} for rank {}", v.shape().len())));
        }
        shape.insert(a, 1);
    }
    reshape(v, &shape)
}

/// `gather` of the ONNX operator of that name.
fn gather(info: &NodeInfo, ins: &[Option<&Value>], a: i64) -> Result<Value> {
    let v = req(info, ins, 0)?;
    let idx = ints(info, ins, 1)?;
    let s = v.shape().to_vec();
    let ax = axis(info, a, s.len())?;
    let d = s[ax] as i64;
    let flat: Vec<usize> = idx
        .data
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + d } else { i };
            if (0..d).contains(&j) {
                Ok(j as usize)
            } else {
                Err(info.malformed(format!("Gather index {i} out of range for size {d}")))
            }
        })
        .collect::<Result<_>>()?;
    let mut shape = s[..ax].to_vec();
    shape.extend_from_slice(&idx.shape);
    shape.extend_from_slice(&s[ax + 1..]);
    let picked = match v {
        Value::F(t) => Value::F(t.index_select(ax, &flat)?),
        Value::I(i) => Value::I(ints::select(i, ax, &flat)?),
    };
    reshape(&picked, &shape)
}

/// `reduce` of the ONNX operator of that name.
fn reduce(
    info: &NodeInfo,
    ins: &[Option<&Value>],
    mean: bool,
    axes: &Option<Vec<i64>>,
    keepdims: bool,
    noop_with_empty_axes: bool,
) -> Result<Value> {
    let t = tensor(info, ins, 0)?;
    let axes = match axes {
        Some(a) => a.clone(),
        None => opt_ints(info, ins, 1)?.map(|i| i.data).unwrap_or_default(),
    };
    if axes.is_empty() && noop_with_empty_axes {
        return Ok(Value::F(t));
    }
    let mut ax: Vec<usize> = axes.iter().map(|&a| axis(info, a, t.rank())).collect::<Result<_>>()?;
    ax.sort_unstable();
    ax.dedup();
    if ax.is_empty() {
        ax = (0..t.rank()).collect();
    }
    Ok(Value::F(if mean { t.mean(&ax, keepdims)? } else { t.sum(&ax, keepdims)? }))
}

/// `cast` of the ONNX operator of that name.
fn cast(info: &NodeInfo, ins: &[Option<&Value>], to: i32) -> Result<Value> {
    use super::proto::data_type as dt;
    let v = req(info, ins, 0)?;
    match to {
        dt::FLOAT | dt::DOUBLE | dt::FLOAT16 | dt::BFLOAT16 => Ok(Value::F(v.to_tensor()?)),
        dt::BOOL => {
            let f = v.floats();
            Ok(Value::I(Ints { shape: v.shape().to_vec(), data: f.iter().map(|&x| i64::from(x != 0.0)).collect() }))
        }
        dt::INT64 | dt::INT32 | dt::INT16 | dt::INT8 | dt::UINT8 | dt::UINT16 | dt::UINT32 | dt::UINT64 => {
            Ok(Value::I(v.to_ints()))
        }
        other => Err(info.unsupported(format!("Cast to data type {other}"))),
    }
}

/// The output shape of `Reshape` (0 copies the input dimension unless `allowzero`; one −1 is inferred).
pub(crate) fn reshape_target(info: &NodeInfo, input: &[usize], spec: &[i64], allowzero: bool) -> Result<Vec<usize>> {
    let total = crate::limits::checked_numel("onnx Reshape", input)?;
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => {
                out.push(*input.get(i).ok_or_else(|| info.malformed(format!("Reshape 0 at {i} beyond input rank")))?)
            }
            d if d >= 0 => out.push(d as usize),
            _ => return Err(info.malformed(format!("Reshape target {spec:?}"))),
        }
    }
    let known = out.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let Some(known) = known else {
        return Err(info.malformed(format!("Reshape target {spec:?} overflows")));
    };
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(crate::Error::ShapeMismatch { op: "onnx Reshape", expected: out, got: input.to_vec() });
        }
        out[i] = total / known;
    }
    Ok(out)
}
