//! Integer tensor arithmetic for shape computations (`Shape → Gather → Concat → Reshape` chains).

use ndarray::{ArrayD, Axis, IxDyn};

use super::value::Ints;
use crate::{Error, Result};

fn to_array(v: &Ints) -> Result<ArrayD<i64>> {
    crate::limits::checked_numel("onnx integer tensor", &v.shape)?;
    ArrayD::from_shape_vec(IxDyn(&v.shape), v.data.clone())
        .map_err(|e| Error::invalid("onnx integer tensor", format!("shape {:?}: {e}", v.shape)))
}

fn from_array(a: ArrayD<i64>) -> Ints {
    Ints { shape: a.shape().to_vec(), data: a.iter().copied().collect() }
}

/// Elementwise `f(a, b)` with broadcasting.
pub(crate) fn binary(a: &Ints, b: &Ints, f: impl Fn(i64, i64) -> Result<i64>) -> Result<Ints> {
    let shape = crate::ops::elementwise::broadcast_shape(&a.shape, &b.shape).ok_or_else(|| Error::Broadcast {
        op: "onnx integer arithmetic",
        lhs: a.shape.clone(),
        rhs: b.shape.clone(),
    })?;
    let n = crate::limits::checked_numel("onnx integer arithmetic", &shape)?;
    crate::limits::check_bytes(
        || format!("onnx integer arithmetic: shapes {:?} and {:?} broadcast to {shape:?}", a.shape, b.shape),
        n as u128 * 8,
        crate::limits::max_memory(),
    )?;
    let (aa, bb) = (to_array(a)?, to_array(b)?);
    let broadcast = || Error::Broadcast { op: "onnx integer arithmetic", lhs: a.shape.clone(), rhs: b.shape.clone() };
    let av = aa.broadcast(IxDyn(&shape)).ok_or_else(broadcast)?;
    let bv = bb.broadcast(IxDyn(&shape)).ok_or_else(broadcast)?;
    let data = av.iter().zip(bv.iter()).map(|(&x, &y)| f(x, y)).collect::<Result<_>>()?;
    Ok(Ints { shape, data })
}

/// Concatenation along `axis`.
pub(crate) fn concat(xs: &[Ints], axis: usize) -> Result<Ints> {
    let arrays: Vec<ArrayD<i64>> = xs.iter().map(to_array).collect::<Result<_>>()?;
    let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
    let out = ndarray::concatenate(Axis(axis), &views).map_err(|_| Error::ShapeMismatch {
        op: "onnx Concat",
        expected: xs.first().map(|x| x.shape.clone()).unwrap_or_default(),
        got: xs.iter().flat_map(|x| x.shape.clone()).collect(),
    })?;
    Ok(from_array(out))
}

/// The entries at `index` along `axis`.
pub(crate) fn select(x: &Ints, axis: usize, index: &[usize]) -> Result<Ints> {
    let a = to_array(x)?;
    if axis >= a.ndim() || index.iter().any(|&i| i >= a.shape()[axis]) {
        return Err(Error::invalid("onnx integer select", format!("indices on axis {axis} of shape {:?}", x.shape)));
    }
    let mut shape = x.shape.clone();
    shape[axis] = index.len();
    crate::limits::checked_numel("onnx integer select", &shape)?;
    Ok(from_array(a.select(Axis(axis), index)))
}

/// Axes permuted.
pub(crate) fn permute(x: &Ints, perm: &[usize]) -> Result<Ints> {
    Ok(from_array(to_array(x)?.permuted_axes(IxDyn(perm)).as_standard_layout().into_owned()))
}

/// `x` broadcast to `shape` (NumPy rules).
pub(crate) fn broadcast_to(x: &Ints, shape: &[usize]) -> Result<Ints> {
    let n = crate::limits::checked_numel("onnx integer broadcast", shape)?;
    crate::limits::check_bytes(
        || format!("onnx integer broadcast of {:?} to {shape:?}", x.shape),
        n as u128 * 8,
        crate::limits::max_memory(),
    )?;
    let a = to_array(x)?;
    let view = a.broadcast(IxDyn(shape)).ok_or_else(|| Error::Broadcast {
        op: "onnx integer broadcast",
        lhs: x.shape.clone(),
        rhs: shape.to_vec(),
    })?;
    Ok(Ints { shape: shape.to_vec(), data: view.iter().copied().collect() })
}
