//! Shape inference: the shape of every value a node computes (and, for shape arithmetic, the value itself) and
//! the bytes it allocates, worked out without computing anything big. [`super::OnnxModel`] runs it over the
//! whole graph at load for a batch size, refusing a model whose intermediate values exceed the memory budget
//! with an error naming the node, and again before every node at run time, on the actual inputs.

use super::attrs::NodeInfo;
use super::compile::{Fused, Kind, PadMode, Window};
use super::exec::{self, axis, checked_product, reshape_target};
use super::layers::{pool_pads_for, slice_range, split_pads};
use super::value::{Ints, Value};
use crate::ops::elementwise::broadcast_shape;
use crate::ops::Pool2dParams;
use crate::{Error, Result};

/// What is known about a value before it is computed.
#[derive(Clone, Debug)]
pub(crate) enum Meta {
    /// The value itself (a constant, shape arithmetic, or at run time any input).
    Known(Value),
    /// Only the shape: a float tensor (`int` false) or an integer one.
    Shape { shape: Vec<usize>, int: bool },
}

impl Meta {
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            Meta::Known(v) => v.shape(),
            Meta::Shape { shape, .. } => shape,
        }
    }

    fn is_int(&self) -> bool {
        match self {
            Meta::Known(v) => matches!(v, Value::I(_)),
            Meta::Shape { int, .. } => *int,
        }
    }

    /// The bytes the value occupies (f32 or i64 elements).
    pub(crate) fn bytes(&self) -> u128 {
        let n: u128 = self.shape().iter().map(|&d| d as u128).product();
        n * if self.is_int() { 8 } else { 4 }
    }
}

/// A node's outputs as shapes (with their kinds) and the scratch memory it needs beyond them, in bytes.
pub(crate) struct Cost {
    pub(crate) outputs: Vec<Meta>,
    pub(crate) scratch: u128,
}

impl Cost {
    /// Outputs plus scratch.
    pub(crate) fn bytes(&self) -> u128 {
        self.outputs.iter().map(Meta::bytes).sum::<u128>() + self.scratch
    }
}

fn float(shape: Vec<usize>) -> Meta {
    Meta::Shape { shape, int: false }
}

fn input<'a>(info: &NodeInfo, ins: &[Option<&'a Meta>], i: usize) -> Result<&'a Meta> {
    ins.get(i).copied().flatten().ok_or_else(|| info.malformed(format!("input {i} is missing")))
}

/// Input `i` as known integers (a shape, axes, pads): an error when it is computed from the data.
fn known_ints(info: &NodeInfo, ins: &[Option<&Meta>], i: usize) -> Result<Option<Vec<i64>>> {
    match ins.get(i).copied().flatten() {
        None => Ok(None),
        Some(Meta::Known(Value::F(t))) if t.is_tracked() => {
            Err(info.unsupported(format!("input {i} computed from the data")))
        }
        Some(Meta::Known(v)) => Ok(Some(v.to_ints().data)),
        Some(Meta::Shape { .. }) => {
            Err(info.unsupported(format!("input {i} (a shape or axes) computed from the data")))
        }
    }
}

fn required_ints(info: &NodeInfo, ins: &[Option<&Meta>], i: usize) -> Result<Vec<i64>> {
    known_ints(info, ins, i)?.ok_or_else(|| info.malformed(format!("input {i} is missing")))
}

fn rank4(info: &NodeInfo, s: &[usize]) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(s)
        .map_err(|_| info.unsupported(format!("input of rank {} (only 2-D images, rank 4, are supported)", s.len())))
}

/// PRelu's slope broadcasts unidirectionally to the data (ONNX): the output has the data's shape. Returns the
/// slope's shape without the leading 1s beyond the data's rank (a one-element slope of any rank is accepted, as
/// exporters write `[1, 1, 1]` for a shared slope); an error when the slope would grow the data.
pub(crate) fn prelu_slope_shape(info: &NodeInfo, x: &[usize], slope: &[usize]) -> Result<Vec<usize>> {
    let extra = slope.len().saturating_sub(x.len());
    let trimmed = &slope[extra..];
    if slope[..extra].iter().all(|&d| d == 1) && broadcast_shape(x, trimmed).as_deref() == Some(x) {
        Ok(trimmed.to_vec())
    } else {
        Err(info.malformed(format!("PRelu slope of shape {slope:?} does not broadcast to the input's {x:?}")))
    }
}

/// The outputs and scratch memory of `kind` on inputs described by `ins`. Every output shape is checked to be a
/// valid array shape ([`crate::limits::checked_numel`]).
pub(crate) fn cost(kind: &Kind, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
    let cost = shapes(kind, info, ins)?;
    for m in &cost.outputs {
        crate::limits::checked_numel(&format!("onnx node '{}' ({})", info.name, info.op), m.shape())?;
    }
    Ok(cost)
}

fn shapes(kind: &Kind, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
    let x = || input(info, ins, 0);
    let s0 = || Ok::<_, Error>(x()?.shape().to_vec());
    let one = single;
    match kind {
        Kind::Identity { mask } => {
            let v = x()?.clone();
            let shape = v.shape().to_vec();
            let mut outputs = vec![v];
            if *mask {
                outputs.push(Meta::Shape { shape, int: true });
            }
            Ok(Cost { outputs, scratch: 0 })
        }
        Kind::Constant(v) => one(Meta::Known(v.clone())),
        Kind::PRelu => {
            let (a, b) = (x()?, input(info, ins, 1)?);
            prelu_slope_shape(info, a.shape(), b.shape())?;
            one(float(a.shape().to_vec()))
        }
        Kind::Binary(_) => {
            let (a, b) = (x()?, input(info, ins, 1)?);
            let shape = broadcast_shape(a.shape(), b.shape()).ok_or_else(|| Error::Broadcast {
                op: "onnx broadcast",
                lhs: a.shape().to_vec(),
                rhs: b.shape().to_vec(),
            })?;
            let int = a.is_int() && b.is_int();
            one(Meta::Shape { shape, int })
        }
        Kind::Unary(_) | Kind::Clip { .. } | Kind::Pow | Kind::Softmax { .. } | Kind::BatchNorm { .. } => {
            one(float(s0()?))
        }
        Kind::Conv { window, group, then } => {
            conv(info, x()?.shape(), input(info, ins, 1)?.shape(), window, *group, *then)
        }
        Kind::Gemm { trans_a, trans_b, .. } => {
            let (a, b) = (x()?.shape(), input(info, ins, 1)?.shape());
            let (&[r, c], &[p, q]) = (a, b) else {
                return Err(info.malformed(format!("Gemm of shapes {a:?} and {b:?}")));
            };
            let (m, k) = if *trans_a { (c, r) } else { (r, c) };
            let (k2, n) = if *trans_b { (q, p) } else { (p, q) };
            if k != k2 {
                return Err(Error::ShapeMismatch { op: "onnx Gemm", expected: a.to_vec(), got: b.to_vec() });
            }
            one(float(vec![m, n]))
        }
        Kind::MatMul => matmul(info, x()?.shape(), input(info, ins, 1)?.shape()),
        Kind::MaxPool(w) => pool(info, x()?.shape(), w, false),
        Kind::AvgPool { window, .. } => pool(info, x()?.shape(), window, true),
        Kind::GlobalAvgPool | Kind::GlobalMaxPool => {
            let mut s = s0()?;
            if s.len() < 3 {
                return Err(info.malformed(format!("input of rank {}", s.len())));
            }
            s[2..].fill(1);
            one(float(s))
        }
        Kind::Flatten { axis: a } => {
            let s = s0()?;
            let r = s.len() as i64;
            let a = if *a < 0 { a + r } else { *a };
            if a < 0 || a > r {
                return Err(info.malformed(format!("Flatten axis {a} for rank {r}")));
            }
            let (lo, hi) = s.split_at(a as usize);
            one(Meta::Shape { shape: vec![checked_product(info, lo)?, checked_product(info, hi)?], int: x()?.is_int() })
        }
        Kind::Reshape { allowzero } => {
            let spec = required_ints(info, ins, 1)?;
            let shape = reshape_target(info, x()?.shape(), &spec, *allowzero)?;
            if crate::limits::checked_numel("onnx Reshape", &shape)? != crate::limits::checked_numel("", x()?.shape())?
            {
                return Err(Error::ShapeMismatch { op: "onnx Reshape", expected: shape, got: s0()? });
            }
            one(Meta::Shape { shape, int: x()?.is_int() })
        }
        Kind::Transpose { perm } => transpose(info, x()?, perm.as_deref()),
        Kind::Concat { axis: a } => concat(info, ins, *a),
        Kind::Squeeze { axes } => squeeze(info, ins, axes.as_deref()),
        Kind::Unsqueeze { axes } => unsqueeze(info, ins, axes.as_deref()),
        Kind::Gather { axis: a } => gather(info, x()?, input(info, ins, 1)?.shape(), *a),
        Kind::Slice { attrs } => slice(info, ins, attrs),
        Kind::Pad { mode, attrs } => pad(info, ins, *mode, attrs),
        Kind::Reduce { axes, keepdims, noop_with_empty_axes, .. } => {
            reduce(info, ins, axes.as_deref(), *keepdims, *noop_with_empty_axes)
        }
        Kind::Shape { .. } => {
            // The one op whose value is always known: what it reads is a shape.
            let stand_in = Value::I(Ints { shape: s0()?, data: Vec::new() });
            let out = exec::exec(kind, info, &[Some(&stand_in)])?;
            one(Meta::Known(out.into_iter().next().ok_or_else(|| info.malformed("Shape computed nothing"))?))
        }
        Kind::Cast { to } => {
            use super::proto::data_type as dt;
            let int = !matches!(*to, dt::FLOAT | dt::DOUBLE | dt::FLOAT16 | dt::BFLOAT16);
            one(Meta::Shape { shape: s0()?, int })
        }
    }
}

/// Transpose by `perm` (reversed axes when absent), which must be a permutation of the input's axes.
fn transpose(info: &NodeInfo, x: &Meta, perm: Option<&[i64]>) -> Result<Cost> {
    let s = x.shape();
    let perm: Vec<usize> = match perm {
        Some(p) => p.iter().map(|&a| axis(info, a, s.len())).collect::<Result<_>>()?,
        None => (0..s.len()).rev().collect(),
    };
    let mut seen = vec![false; s.len()];
    if perm.len() != s.len() || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
        return Err(info.malformed(format!("perm {perm:?} for rank {}", s.len())));
    }
    single(Meta::Shape { shape: perm.iter().map(|&p| s[p]).collect(), int: x.is_int() })
}

/// Squeeze `axes` (an attribute, the second input, or every axis of size 1); each must have size 1.
fn squeeze(info: &NodeInfo, ins: &[Option<&Meta>], axes: Option<&[i64]>) -> Result<Cost> {
    let x = input(info, ins, 0)?;
    let s = x.shape();
    let axes = match axes {
        Some(a) => Some(a.to_vec()),
        None => known_ints(info, ins, 1)?,
    };
    let drop: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis(info, a, s.len())).collect::<Result<_>>()?,
        None => (0..s.len()).filter(|&i| s[i] == 1).collect(),
    };
    if let Some(&bad) = drop.iter().find(|&&a| s[a] != 1) {
        return Err(info.malformed(format!("cannot squeeze axis {bad} of size {}", s[bad])));
    }
    let shape = (0..s.len()).filter(|i| !drop.contains(i)).map(|i| s[i]).collect();
    single(Meta::Shape { shape, int: x.is_int() })
}

/// Unsqueeze at `axes` (an attribute or the second input), counted in the output's rank.
fn unsqueeze(info: &NodeInfo, ins: &[Option<&Meta>], axes: Option<&[i64]>) -> Result<Cost> {
    let x = input(info, ins, 0)?;
    let axes = match axes {
        Some(a) => a.to_vec(),
        None => required_ints(info, ins, 1)?,
    };
    let r = x.shape().len() + axes.len();
    let mut ax: Vec<usize> = axes.iter().map(|&a| axis(info, a, r)).collect::<Result<_>>()?;
    ax.sort_unstable();
    ax.dedup();
    let mut shape = x.shape().to_vec();
    for &a in &ax {
        if a > shape.len() {
            return Err(info.malformed(format!("Unsqueeze axes {ax:?}")));
        }
        shape.insert(a, 1);
    }
    single(Meta::Shape { shape, int: x.is_int() })
}

/// Gather along `a`: the indices' shape replaces that axis; what it picks is checked against the element limit.
fn gather(info: &NodeInfo, x: &Meta, idx: &[usize], a: i64) -> Result<Cost> {
    let s = x.shape();
    let ax = axis(info, a, s.len())?;
    let mut shape = s[..ax].to_vec();
    shape.extend_from_slice(idx);
    shape.extend_from_slice(&s[ax + 1..]);
    let mut picked = s.to_vec();
    picked[ax] = idx.iter().try_fold(1usize, |p, &d| p.checked_mul(d)).unwrap_or(usize::MAX);
    crate::limits::checked_numel("onnx Gather", &picked)?;
    single(Meta::Shape { shape, int: x.is_int() })
}

/// A reduction over `axes` (an attribute or the second input; all axes when empty, unless
/// `noop_with_empty_axes`), keeping reduced axes as 1 when `keepdims`.
fn reduce(info: &NodeInfo, ins: &[Option<&Meta>], axes: Option<&[i64]>, keepdims: bool, noop: bool) -> Result<Cost> {
    let s = input(info, ins, 0)?.shape().to_vec();
    let axes = match axes {
        Some(a) => a.to_vec(),
        None => known_ints(info, ins, 1)?.unwrap_or_default(),
    };
    if axes.is_empty() && noop {
        return single(float(s));
    }
    let mut ax: Vec<usize> = axes.iter().map(|&a| axis(info, a, s.len())).collect::<Result<_>>()?;
    if ax.is_empty() {
        ax = (0..s.len()).collect();
    }
    let shape = (0..s.len())
        .filter_map(|i| match (ax.contains(&i), keepdims) {
            (false, _) => Some(s[i]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    single(float(shape))
}

/// One output and no scratch.
fn single(m: Meta) -> Result<Cost> {
    Ok(Cost { outputs: vec![m], scratch: 0 })
}

/// Conv output `[n, o, ho, wo]` (halved by a fused 2×2 pooling), with the asymmetric padding copy and one
/// sample's unfolded columns per thread as scratch.
fn conv(info: &NodeInfo, x: &[usize], w: &[usize], win: &Window, group: usize, then: Fused) -> Result<Cost> {
    let [n, c, h, wd] = rank4(info, x)?;
    let [o, cg, kh, kw] = rank4(info, w)?;
    if kh == 0 || kw == 0 || cg.checked_mul(group) != Some(c) || o % group.max(1) != 0 {
        return Err(info.malformed(format!("Conv of input {x:?} with weight {w:?} and group {group}")));
    }
    let (sym, extra) = split_pads(win.padding([h, wd], [kh, kw]));
    let (hp, wp) = (h + extra[2].0 + extra[2].1, wd + extra[3].0 + extra[3].1);
    let out = |len, k, s, p, d| crate::ops::conv::out_size(len, k, s, p, d);
    let ho = out(hp, kh, win.strides[0], sym.0, win.dilations[0]);
    let wo = out(wp, kw, win.strides[1], sym.1, win.dilations[1]);
    let (Some(mut ho), Some(mut wo)) = (ho, wo) else {
        return Err(info.malformed(format!("kernel {kh}x{kw} does not fit input {h}x{wd}")));
    };
    let padded = if extra.iter().any(|&(a, b)| a + b > 0) { (n * c * hp * wp) as u128 * 4 } else { 0 };
    let columns = (cg * kh * kw) as u128 * (ho * wo) as u128 * 4 * rayon::current_num_threads() as u128;
    let mut scratch = padded + columns;
    if then == Fused::ReluMaxPool2 {
        // Counted as if the unpooled activations were held (the fused kernel needs less).
        scratch += (n * o) as u128 * (ho * wo) as u128 * 4;
        (ho, wo) = (ho / 2, wo / 2);
    }
    Ok(Cost { outputs: vec![float(vec![n, o, ho, wo])], scratch })
}

/// MaxPool / AveragePool output, with the explicit padding copy (and the averaging counts) as scratch.
fn pool(info: &NodeInfo, x: &[usize], win: &Window, avg: bool) -> Result<Cost> {
    let [n, c, h, w] = rank4(info, x)?;
    let (sym, extra) = pool_pads_for(info, h, w, win)?;
    let (hp, wp) = (h + extra[2].0 + extra[2].1, w + extra[3].0 + extra[3].1);
    let k = win.kernel.ok_or_else(|| info.malformed("kernel_shape is required"))?;
    let ho = Pool2dParams::out_len(hp, k[0], win.strides[0], sym.0, win.ceil_mode);
    let wo = Pool2dParams::out_len(wp, k[1], win.strides[1], sym.1, win.ceil_mode);
    let (Some(ho), Some(wo)) = (ho, wo) else {
        return Err(info.malformed(format!("window {k:?} does not fit input {h}x{w}")));
    };
    let padded = if extra.iter().any(|&(a, b)| a + b > 0) { (n * c * hp * wp) as u128 * 4 } else { 0 };
    let counts = if avg && padded > 0 { (hp * wp + ho * wo) as u128 * 4 } else { 0 };
    Ok(Cost { outputs: vec![float(vec![n, c, ho, wo])], scratch: padded + counts })
}

/// NumPy MatMul: vectors promoted, leading dimensions broadcast.
fn matmul(info: &NodeInfo, a: &[usize], b: &[usize]) -> Result<Cost> {
    let (mut a2, mut b2) = (a.to_vec(), b.to_vec());
    if a.len() == 1 {
        a2.insert(0, 1);
    }
    if b.len() == 1 {
        b2.push(1);
    }
    if a2.len() < 2 || b2.len() < 2 || a2[a2.len() - 1] != b2[b2.len() - 2] {
        return Err(info.malformed(format!("MatMul of shapes {a:?} and {b:?}")));
    }
    let lead = broadcast_shape(&a2[..a2.len() - 2], &b2[..b2.len() - 2]).ok_or_else(|| Error::Broadcast {
        op: "onnx MatMul",
        lhs: a.to_vec(),
        rhs: b.to_vec(),
    })?;
    let mut shape = lead;
    if a.len() > 1 {
        shape.push(a2[a2.len() - 2]);
    }
    if b.len() > 1 {
        shape.push(b2[b2.len() - 1]);
    }
    Ok(Cost { outputs: vec![float(shape)], scratch: 0 })
}

fn concat(info: &NodeInfo, ins: &[Option<&Meta>], a: i64) -> Result<Cost> {
    let vals: Vec<&Meta> = ins.iter().flatten().copied().collect();
    let first = vals.first().ok_or_else(|| info.malformed("Concat without inputs"))?;
    let ax = axis(info, a, first.shape().len())?;
    let mut shape = first.shape().to_vec();
    shape[ax] = 0;
    for v in &vals {
        let s = v.shape();
        let same = s.len() == shape.len() && (0..s.len()).all(|i| i == ax || s[i] == shape[i]);
        if !same {
            return Err(Error::ShapeMismatch { op: "onnx Concat", expected: first.shape().to_vec(), got: s.to_vec() });
        }
        shape[ax] = shape[ax].checked_add(s[ax]).ok_or_else(|| info.malformed("Concat size overflows"))?;
    }
    let int = vals.iter().all(|v| v.is_int());
    Ok(Cost { outputs: vec![Meta::Shape { shape, int }], scratch: 0 })
}

fn slice(info: &NodeInfo, ins: &[Option<&Meta>], attrs: &Option<super::compile::SliceAttrs>) -> Result<Cost> {
    let (starts, ends, axes, steps) = match attrs {
        Some((s, e, a)) => (s.clone(), e.clone(), a.clone(), None),
        None => (
            required_ints(info, ins, 1)?,
            required_ints(info, ins, 2)?,
            known_ints(info, ins, 3)?,
            known_ints(info, ins, 4)?,
        ),
    };
    let x = input(info, ins, 0)?;
    let mut shape = x.shape().to_vec();
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(info.malformed("starts, ends, axes and steps differ in length"));
    }
    for i in 0..starts.len() {
        let ax = axis(info, axes[i], shape.len())?;
        if steps[i] == 0 {
            return Err(info.malformed("slice step 0"));
        }
        shape[ax] = slice_range(shape[ax], starts[i], ends[i], steps[i]).1;
    }
    Ok(Cost { outputs: vec![Meta::Shape { shape, int: x.is_int() }], scratch: 0 })
}

fn pad(info: &NodeInfo, ins: &[Option<&Meta>], mode: PadMode, attrs: &Option<(Vec<i64>, f32)>) -> Result<Cost> {
    let pads = match attrs {
        Some((p, _)) => p.clone(),
        None => required_ints(info, ins, 1)?,
    };
    let s = input(info, ins, 0)?.shape().to_vec();
    let axes: Vec<usize> = match known_ints(info, ins, 3)? {
        Some(a) => a.iter().map(|&a| axis(info, a, s.len())).collect::<Result<_>>()?,
        None => (0..s.len()).collect(),
    };
    if pads.len() != 2 * axes.len() || pads.iter().any(|p| p.unsigned_abs() > 1 << 16) {
        return Err(info.malformed(format!("pads {pads:?} for {} axes", axes.len())));
    }
    let mut shape = s.clone();
    for (i, &a) in axes.iter().enumerate() {
        let d = shape[a] as i128 + i128::from(pads[i]) + i128::from(pads[i + axes.len()]);
        if d < 0 {
            return Err(info.malformed(format!("pads {pads:?} crop more than axis {a} holds")));
        }
        shape[a] = usize::try_from(d).map_err(|_| info.malformed("padded size overflows"))?;
    }
    // Reflect and edge padding gather along each axis in turn: one intermediate per axis at most.
    let scratch = if mode == PadMode::Constant { 0 } else { float(shape.clone()).bytes() };
    Ok(Cost { outputs: vec![float(shape)], scratch })
}
