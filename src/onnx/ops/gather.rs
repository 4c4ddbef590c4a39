//! Gather along an axis with constant indices (negative ones count from the end).

use std::sync::Arc;

use super::{axis, data_then_constants, input, ints, like, reshape_value, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::ints as int_ops;
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
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
            Value::F(t) => Value::F(t.index_select(ax, &flat)?),
            Value::I(i) => Value::I(int_ops::select(i, ax, &flat)?),
        };
        Ok(vec![reshape_value(&picked, &shape)?])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }
}
