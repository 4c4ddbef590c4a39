//! Integer tensor arithmetic for shape computations (`Shape → Gather → Concat → Reshape` chains).

use ndarray::{ArrayD, Axis, IxDyn};

use super::compile::Bin;
use super::value::Ints;
use crate::{Error, Result};

fn to_array(v: &Ints) -> ArrayD<i64> {
    ArrayD::from_shape_vec(IxDyn(&v.shape), v.data.clone()).expect("Ints keep data and shape consistent")
}

fn from_array(a: ArrayD<i64>) -> Ints {
    Ints { shape: a.shape().to_vec(), data: a.iter().copied().collect() }
}

/// Elementwise `a op b` with broadcasting (division truncates, as onnxruntime).
pub(crate) fn binary(op: Bin, a: &Ints, b: &Ints) -> Result<Ints> {
    let shape = crate::ops::elementwise::broadcast_shape(&a.shape, &b.shape).ok_or_else(|| Error::Broadcast {
        op: "onnx integer arithmetic",
        lhs: a.shape.clone(),
        rhs: b.shape.clone(),
    })?;
    let (aa, bb) = (to_array(a), to_array(b));
    let av = aa.broadcast(IxDyn(&shape)).expect("broadcast shape");
    let bv = bb.broadcast(IxDyn(&shape)).expect("broadcast shape");
    let mut data = Vec::with_capacity(av.len());
    for (&x, &y) in av.iter().zip(bv.iter()) {
        data.push(match op {
            Bin::Add => x.wrapping_add(y),
            Bin::Sub => x.wrapping_sub(y),
            Bin::Mul => x.wrapping_mul(y),
            Bin::Div => {
                if y == 0 {
                    return Err(Error::invalid("onnx Div", "integer division by zero"));
                }
                x.wrapping_div(y)
            }
        });
    }
    Ok(Ints { shape, data })
}

/// Concatenation along `axis`.
pub(crate) fn concat(xs: &[Ints], axis: usize) -> Result<Ints> {
    let arrays: Vec<ArrayD<i64>> = xs.iter().map(to_array).collect();
    let views: Vec<_> = arrays.iter().map(|a| a.view()).collect();
    let out = ndarray::concatenate(Axis(axis), &views).map_err(|_| Error::ShapeMismatch {
        op: "onnx Concat",
        expected: xs.first().map(|x| x.shape.clone()).unwrap_or_default(),
        got: xs.iter().flat_map(|x| x.shape.clone()).collect(),
    })?;
    Ok(from_array(out))
}

/// The entries at `index` along `axis`.
pub(crate) fn select(x: &Ints, axis: usize, index: &[usize]) -> Ints {
    from_array(to_array(x).select(Axis(axis), index))
}

/// Axes permuted.
pub(crate) fn permute(x: &Ints, perm: &[usize]) -> Ints {
    from_array(to_array(x).permuted_axes(IxDyn(perm)).as_standard_layout().into_owned())
}
