//! Gather along an axis with constant indices (negative ones count from the end), and its inverse ScatterND.

use std::sync::Arc;

use super::{axis, checked_product, data_then_constants, input, ints, like, reshape_value, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::ints as int_ops;
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::{Ints, Value};
use crate::tensor::Tensor;
use crate::Result;

#[derive(Clone, Debug)]
struct Gather {
    axis: i64,
}

pub(super) fn gather(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Gather { axis: a.int("axis", 0)? }))
}

impl Gather {
    /// The axis and the output shape: the indices' shape replaces that axis. What it picks is checked against the
    /// element limit.
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<(usize, Vec<usize>)> {
        let (s, idx) = (input(info, ins, 0)?.shape(), input(info, ins, 1)?.shape());
        let ax = axis(info, self.axis, s.len())?;
        let mut shape = s[..ax].to_vec();
        shape.extend_from_slice(idx);
        shape.extend_from_slice(&s[ax + 1..]);
        let mut picked = s.to_vec();
        picked[ax] = idx.iter().try_fold(1usize, |p, &d| p.checked_mul(d)).unwrap_or(usize::MAX);
        crate::limits::checked_numel("onnx Gather", &picked)?;
        Ok((ax, shape))
    }
}

impl Op for Gather {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(like(input(info, ins, 0)?, self.out_shape(info, ins)?.1))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (ax, shape) = self.out_shape(info, ins)?;
        let v = input(info, ins, 0)?;
        let d = v.shape()[ax] as i64;
        let flat: Vec<usize> = ints(info, ins, 1)?
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
        let picked = match v {
            // One index: a view of that slice (the query, key or value of a packed attention projection), no copy.
            Value::F(t) if flat.len() == 1 => Value::F(t.narrow(ax, flat[0], 1)?),
            Value::F(t) => Value::F(t.index_select(ax, &flat)?),
            Value::I(i) => Value::I(int_ops::select(i, ax, &flat)?),
        };
        Ok(vec![reshape_value(&picked, &shape)?])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }
}

/// ScatterND (reduction `none`, the only form before opset 16): a copy of the data with the slices at `indices`
/// (constant; the last axis indexes the data's first axes) replaced by `updates`; a later index wins. On floats
/// the result picks rows from the data and the updates laid end to end ([`crate::Tensor::index_select`]), so the
/// gradient reaches the data where it was kept and each update where it was written.
#[derive(Clone, Debug)]
struct ScatterNd;

pub(super) fn scatter_nd(a: &Attrs) -> Result<Arc<dyn Op>> {
    let reduction = a.string("reduction", "none")?;
    if reduction != "none" {
        return Err(a.info.unsupported(format!("reduction = {reduction}")));
    }
    Ok(Arc::new(ScatterNd))
}

impl ScatterNd {
    /// Checks the shapes: `updates` = `indices[..-1]` ++ `data[k..]` with k = `indices[-1]` ≤ rank. Returns k.
    fn check<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<usize> {
        let (d, i, u) = (input(info, ins, 0)?.shape(), input(info, ins, 1)?.shape(), input(info, ins, 2)?.shape());
        let k = i
            .last()
            .copied()
            .filter(|&k| k <= d.len())
            .ok_or_else(|| info.malformed(format!("indices of shape {i:?} for data of shape {d:?}")))?;
        let mut want = i[..i.len() - 1].to_vec();
        want.extend_from_slice(&d[k..]);
        if u != want.as_slice() {
            return Err(crate::Error::ShapeMismatch { op: "onnx ScatterND", expected: want, got: u.to_vec() });
        }
        Ok(k)
    }
}

impl Op for ScatterNd {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        self.check(info, ins)?;
        let (d, u) = (input(info, ins, 0)?, input(info, ins, 2)?);
        Cost::one(Meta::Shape { shape: d.shape().to_vec(), int: d.is_int() && u.is_int() })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let k = self.check(info, ins)?;
        let (data, updates) = (input(info, ins, 0)?, input(info, ins, 2)?);
        let shape = data.shape().to_vec();
        let rows = checked_product(info, &shape[..k])?;
        let width = checked_product(info, &shape[k..])?;
        let ishape = input(info, ins, 1)?.shape();
        let n_updates = checked_product(info, &ishape[..ishape.len() - 1])?;
        // Row r of the result comes from row pick[r] of [data rows; update rows].
        let mut pick: Vec<usize> = (0..rows).collect();
        let idx = ints(info, ins, 1)?;
        for u in 0..n_updates {
            let mut row = 0usize;
            for (j, &i) in idx[u * k..(u + 1) * k].iter().enumerate() {
                let dim = shape[j] as i64;
                let i = if i < 0 { i + dim } else { i };
                if !(0..dim).contains(&i) {
                    return Err(info.malformed(format!("ScatterND index {i} out of range for size {dim}")));
                }
                row = row * shape[j] + i as usize;
            }
            pick[row] = rows + u;
        }
        Ok(vec![match (data, updates) {
            (Value::I(d), Value::I(u)) => {
                let data = pick.iter().flat_map(|&r| {
                    let (src, r) = if r < rows { (&d.data, r) } else { (&u.data, r - rows) };
                    src[r * width..(r + 1) * width].iter().copied()
                });
                Value::I(Ints { shape, data: data.collect() })
            }
            (d, u) => {
                let both = Tensor::concat(
                    &[d.to_tensor()?.reshape(&[rows, width])?, u.to_tensor()?.reshape(&[n_updates, width])?],
                    0,
                )?;
                Value::F(both.index_select(0, &pick)?.reshape(&shape)?)
            }
        }])
    }

    fn input_role(&self, i: usize) -> InputRole {
        if i == 1 {
            InputRole::Constant
        } else {
            InputRole::Data
        }
    }
}
