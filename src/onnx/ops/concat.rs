//! Concat along an axis, of float tensors (differentiable) or of integers (shape arithmetic).

use std::sync::Arc;

use super::{axis, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::ints;
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::{Ints, Value};
use crate::tensor::Tensor;
use crate::{Error, Result};

#[derive(Clone, Debug)]
struct Concat {
    axis: i64,
}

pub(super) fn concat(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Concat { axis: a.opt_int("axis")?.ok_or_else(|| a.info.malformed("axis is required"))? }))
}

impl Concat {
    /// The present inputs, the axis and the output shape; every input must match the first off the axis.
    fn plan<'a, A: Arg>(&self, info: &NodeInfo, ins: &[Option<&'a A>]) -> Result<(Vec<&'a A>, usize, Vec<usize>)> {
        let vals: Vec<&A> = ins.iter().flatten().copied().collect();
        let first = vals.first().ok_or_else(|| info.malformed("Concat without inputs"))?;
        let ax = axis(info, self.axis, first.shape().len())?;
        let mut shape = first.shape().to_vec();
        shape[ax] = 0;
        for v in &vals {
            let s = v.shape();
            if s.len() != shape.len() || (0..s.len()).any(|i| i != ax && s[i] != shape[i]) {
                return Err(Error::ShapeMismatch {
                    op: "onnx Concat",
                    expected: first.shape().to_vec(),
                    got: s.to_vec(),
                });
            }
            shape[ax] = shape[ax].checked_add(s[ax]).ok_or_else(|| info.malformed("Concat size overflows"))?;
        }
        Ok((vals, ax, shape))
    }
}

impl Op for Concat {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let (vals, _, shape) = self.plan(info, ins)?;
        Cost::one(Meta::Shape { shape, int: vals.iter().all(|v| v.is_int()) })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (vals, ax, _) = self.plan(info, ins)?;
        if vals.iter().all(|v| v.is_int()) {
            let is: Vec<Ints> = vals.iter().map(|v| v.to_ints()).collect();
            return Ok(vec![Value::I(ints::concat(&is, ax)?)]);
        }
        let ts: Vec<Tensor> = vals.iter().map(|v| v.to_tensor()).collect::<Result<_>>()?;
        Ok(vec![Value::F(Tensor::concat(&ts, ax)?)])
    }
}
