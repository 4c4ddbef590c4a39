//! Comparison and selection: Equal, Not and Where. Their masks are booleans (held as 0/1 integers); on the shape
//! path they fold once the input shape is known. Where between float tensors is on the data path and
//! differentiable in both branches.

use std::sync::Arc;

use super::binary::broadcast2;
use super::{input, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::ints;
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::{Ints, Value};
use crate::ops::elementwise::broadcast_shape;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Equal: a == b elementwise with broadcasting (integers exactly; floats as f32).
#[derive(Clone, Debug)]
struct Equal;

pub(super) fn equal(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Equal))
}

impl Op for Equal {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(Meta::Shape { shape: broadcast2(info, ins)?, int: true })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let eq = match (input(info, ins, 0)?, input(info, ins, 1)?) {
            (Value::I(a), Value::I(b)) => ints::binary(a, b, |x, y| Ok(i64::from(x == y)))?,
            (a, b) => {
                let (a, b) = (floats_as_ints(a), floats_as_ints(b));
                ints::binary(&a, &b, |x, y| Ok(i64::from(f32::from_bits(x as u32) == f32::from_bits(y as u32))))?
            }
        };
        Ok(vec![Value::I(eq)])
    }

    /// A float initialiser compared is a constant, not a parameter.
    fn input_role(&self, _: usize) -> InputRole {
        InputRole::Constant
    }
}

/// The f32 bit patterns of a value (so the integer broadcast can carry floats).
fn floats_as_ints(v: &Value) -> Ints {
    Ints { shape: v.shape().to_vec(), data: v.floats().iter().map(|f| i64::from(f.to_bits())).collect() }
}

/// Not: the logical negation of a boolean tensor.
#[derive(Clone, Debug)]
struct Not;

pub(super) fn not(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Not))
}

impl Op for Not {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(Meta::Shape { shape: input(info, ins, 0)?.shape().to_vec(), int: true })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = input(info, ins, 0)?;
        let data = x.floats().iter().map(|&v| i64::from(v == 0.0)).collect();
        Ok(vec![Value::I(Ints { shape: x.shape().to_vec(), data })])
    }

    fn input_role(&self, _: usize) -> InputRole {
        InputRole::Constant
    }
}

/// Where(condition, x, y): x where the condition holds, else y, all three broadcast together. Between float
/// tensors it picks from the two branches broadcast and laid end to end ([`Tensor::index_select`]), so the
/// gradient flows to each branch where it was picked (and sums over broadcast axes), and an infinite value in the
/// branch not picked never leaks into the result.
#[derive(Clone, Debug)]
struct Where;

pub(super) fn where_(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Where))
}

impl Where {
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>> {
        let (c, x, y) = (input(info, ins, 0)?.shape(), input(info, ins, 1)?.shape(), input(info, ins, 2)?.shape());
        let broadcast = || Error::Broadcast { op: "onnx Where", lhs: c.to_vec(), rhs: x.to_vec() };
        broadcast_shape(&broadcast_shape(c, x).ok_or_else(broadcast)?, y).ok_or_else(broadcast)
    }
}

impl Op for Where {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let int = input(info, ins, 1)?.is_int() && input(info, ins, 2)?.is_int();
        Cost::one(Meta::Shape { shape: self.out_shape(info, ins)?, int })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let shape = self.out_shape(info, ins)?;
        let cond = ints::broadcast_to(&input(info, ins, 0)?.to_ints(), &shape)?;
        let (x, y) = (input(info, ins, 1)?, input(info, ins, 2)?);
        if let (Value::I(x), Value::I(y)) = (x, y) {
            let (x, y) = (ints::broadcast_to(x, &shape)?, ints::broadcast_to(y, &shape)?);
            let data =
                cond.data.iter().zip(x.data.iter().zip(&y.data)).map(|(&c, (&a, &b))| if c != 0 { a } else { b });
            return Ok(vec![Value::I(Ints { shape, data: data.collect() })]);
        }
        let n = cond.data.len();
        let flat = |v: &Value| -> Result<Tensor> {
            let t = v.to_tensor()?;
            let t = if t.shape() == shape.as_slice() { t } else { t.broadcast_to(&shape)? };
            t.reshape(&[n])
        };
        let both = Tensor::concat(&[flat(x)?, flat(y)?], 0)?;
        let pick: Vec<usize> = cond.data.iter().enumerate().map(|(i, &c)| if c != 0 { i } else { n + i }).collect();
        Ok(vec![Value::F(both.index_select(0, &pick)?.reshape(&shape)?)])
    }

    fn input_role(&self, i: usize) -> InputRole {
        if i == 0 {
            InputRole::Constant
        } else {
            InputRole::Data
        }
    }
}
