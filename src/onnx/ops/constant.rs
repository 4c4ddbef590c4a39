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

/// ConstantOfShape: a tensor of the shape in input 0 filled with the one-element `value` (float 0 by default).
#[derive(Clone, Debug)]
struct ConstantOfShape {
    value: Value,
}

pub(super) fn constant_of_shape(a: &Attrs) -> Result<Arc<dyn Op>> {
    let value = a.tensor("value")?.unwrap_or(Value::F(Tensor::scalar(0.0)));
    if value.numel() != 1 {
        return Err(a.info.malformed(format!("value of shape {:?} (one element is expected)", value.shape())));
    }
    Ok(Arc::new(ConstantOfShape { value }))
}

impl ConstantOfShape {
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>> {
        let dims = super::ints(info, ins, 0)?;
        dims.iter()
            .map(|&d| usize::try_from(d).map_err(|_| info.malformed(format!("ConstantOfShape of {dims:?}"))))
            .collect()
    }
}

impl Op for ConstantOfShape {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(Meta::Shape { shape: self.out_shape(info, ins)?, int: self.value.is_int() })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let shape = self.out_shape(info, ins)?;
        let n = crate::limits::checked_numel("onnx ConstantOfShape", &shape)?;
        Ok(vec![match &self.value {
            Value::I(i) => Value::I(Ints { shape, data: vec![i.data[0]; n] }),
            Value::F(t) => Value::F(Tensor::full(&shape, t.to_vec()[0])),
        }])
    }

    fn input_role(&self, _: usize) -> super::InputRole {
        super::InputRole::Constant
    }
}

/// Range(start, limit, delta): start, start + delta, … while before limit; ⌈(limit − start)/delta⌉ entries (none
/// when negative). Integers when all three are, else floats; the bounds must be known (they decide the shape).
#[derive(Clone, Debug)]
struct Range;

pub(super) fn range(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Range))
}

/// The bounds of a Range, as integers or floats.
enum Bounds {
    /// Start and delta.
    Int(i64, i64),
    /// Start and delta.
    Float(f64, f64),
}

impl Range {
    fn bounds<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<(Bounds, usize)> {
        let mut vals = Vec::with_capacity(3);
        for i in 0..3 {
            let v = input(info, ins, i)?.known().ok_or_else(|| {
                info.unsupported(format!("input {i} (a bound, which decides the shape) computed from the data"))
            })?;
            if v.numel() != 1 {
                return Err(info.malformed(format!("input {i} of shape {:?} (a scalar is expected)", v.shape())));
            }
            vals.push(v);
        }
        let (bounds, n) = if vals.iter().all(|v| v.is_int()) {
            let [s, l, d] = [0, 1, 2].map(|i| vals[i].to_ints().data[0]);
            if d == 0 {
                return Err(info.malformed("Range with delta 0"));
            }
            let (span, d128) = (i128::from(l) - i128::from(s), i128::from(d));
            // ⌈span/d⌉: truncation, plus one when the exact quotient is positive and not whole.
            let q = span / d128;
            let n = if span % d128 != 0 && (span < 0) == (d128 < 0) { q + 1 } else { q }.max(0);
            (Bounds::Int(s, d), n)
        } else {
            let [s, l, d] = [0, 1, 2].map(|i| f64::from(vals[i].floats()[0]));
            if d == 0.0 || !(s.is_finite() && l.is_finite() && d.is_finite()) {
                return Err(info.malformed(format!("Range({s}, {l}, {d})")));
            }
            (Bounds::Float(s, d), ((l - s) / d).ceil().max(0.0) as i128)
        };
        let n = usize::try_from(n).map_err(|_| info.malformed("Range too long"))?;
        crate::limits::checked_numel("onnx Range", &[n])?;
        Ok((bounds, n))
    }
}

impl Op for Range {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let (bounds, n) = self.bounds(info, ins)?;
        Cost::one(Meta::Shape { shape: vec![n], int: matches!(bounds, Bounds::Int(..)) })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        Ok(vec![match self.bounds(info, ins)? {
            (Bounds::Int(s, d), n) => {
                Value::I(Ints::vector((0..n as i64).map(|k| s.wrapping_add(k.wrapping_mul(d))).collect()))
            }
            (Bounds::Float(s, d), n) => {
                Value::F(Tensor::from_vec((0..n).map(|k| (s + k as f64 * d) as f32).collect(), &[n])?)
            }
        }])
    }

    fn input_role(&self, _: usize) -> super::InputRole {
        super::InputRole::Constant
    }
}
