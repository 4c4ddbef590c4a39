//! Constants and what is computed from shapes alone: Constant, Shape (`start`/`end` from opset 15) and Cast.

use std::sync::Arc;

use super::{input, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::proto::data_type as dt;
use crate::onnx::value::{Ints, Value};
use crate::tensor::Tensor;
use crate::Result;

/// A constant value.
#[derive(Clone, Debug)]
struct Constant(Value);

pub(super) fn constant(a: &Attrs) -> Result<Arc<dyn Op>> {
    let v = if let Some(t) = a.tensor("value")? {
        t
    } else if let Some(f) = a.opt_float("value_float")? {
        Value::F(Tensor::scalar(f))
    } else if let Some(fs) = a.floats("value_floats")? {
        let n = fs.len();
        Value::F(Tensor::from_vec(fs, &[n])?)
    } else if let Some(i) = a.opt_int("value_int")? {
        Value::I(Ints::scalar(i))
    } else if let Some(is) = a.ints("value_ints")? {
        Value::I(Ints::vector(is))
    } else if a.has("sparse_value") || a.has("value_string") || a.has("value_strings") {
        return Err(a.info.unsupported("a sparse or string Constant"));
    } else {
        return Err(a.info.malformed("Constant without a value"));
    };
    Ok(Arc::new(Constant(v)))
}

impl Op for Constant {
    fn infer(&self, _: &NodeInfo, _: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(Meta::Known(self.0.clone()))
    }

    fn run(&self, _: &NodeInfo, _: &[Option<&Value>]) -> Result<Vec<Value>> {
        Ok(vec![self.0.clone()])
    }
}

/// Shape: the input's dimensions `start..end` (negative counts from the end; both clamped).
#[derive(Clone, Debug)]
struct Shape {
    start: i64,
    end: Option<i64>,
}

pub(super) fn shape(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Shape { start: a.int("start", 0)?, end: a.opt_int("end")? }))
}

impl Shape {
    /// The one op whose value is always known: what it reads is a shape.
    fn value<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Value> {
        let s = input(info, ins, 0)?.shape();
        let r = s.len() as i64;
        let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let (a, b) = (clampi(self.start), clampi(self.end.unwrap_or(r)));
        Ok(Value::I(Ints::vector(s[a..b.max(a)].iter().map(|&d| d as i64).collect())))
    }
}

impl Op for Shape {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(Meta::Known(self.value(info, ins)?))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        Ok(vec![self.value(info, ins)?])
    }
}

/// Cast to a float type (a differentiable copy), to bool (≠ 0) or to an integer type (truncation).
#[derive(Clone, Debug)]
struct Cast {
    to: i32,
}

pub(super) fn cast(a: &Attrs) -> Result<Arc<dyn Op>> {
    a.ignore("saturate");
    let to = a.opt_int("to")?.ok_or_else(|| a.info.malformed("Cast needs 'to'"))? as i32;
    Ok(Arc::new(Cast { to }))
}

/// Whether ONNX data type `t` is a floating-point type (held as f32).
pub(crate) fn is_float_type(t: i32) -> bool {
    matches!(t, dt::FLOAT | dt::DOUBLE | dt::FLOAT16 | dt::BFLOAT16)
}

impl Op for Cast {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(Meta::Shape { shape: input(info, ins, 0)?.shape().to_vec(), int: !is_float_type(self.to) })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let v = input(info, ins, 0)?;
        let y = match self.to {
            t if is_float_type(t) => Value::F(v.to_tensor()?),
            dt::BOOL => {
                let f = v.floats();
                Value::I(Ints { shape: v.shape().to_vec(), data: f.iter().map(|&x| i64::from(x != 0.0)).collect() })
            }
            dt::INT64 | dt::INT32 | dt::INT16 | dt::INT8 | dt::UINT8 | dt::UINT16 | dt::UINT32 | dt::UINT64 => {
                Value::I(v.to_ints())
            }
            other => return Err(info.unsupported(format!("Cast to data type {other}"))),
        };
        Ok(vec![y])
    }
}
