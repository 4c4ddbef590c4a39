//! Elementwise operators of two tensors with NumPy broadcasting: Add, Sub, Mul, Div — on floats (differentiable)
//! or, for shape arithmetic, on integers (division truncates, as onnxruntime).

use std::sync::Arc;

use super::{input, Op};
use crate::nn::plan::{Kind, Layer};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::ints;
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::ops::elementwise::broadcast_shape;
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Debug)]
struct Binary(Bin);

pub(super) fn add(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Binary(Bin::Add)))
}

pub(super) fn sub(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Binary(Bin::Sub)))
}

pub(super) fn mul(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Binary(Bin::Mul)))
}

pub(super) fn div(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Binary(Bin::Div)))
}

/// The broadcast shape of inputs 0 and 1.
pub(crate) fn broadcast2<A: Arg>(info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>> {
    let (a, b) = (input(info, ins, 0)?, input(info, ins, 1)?);
    broadcast_shape(a.shape(), b.shape()).ok_or_else(|| Error::Broadcast {
        op: "onnx broadcast",
        lhs: a.shape().to_vec(),
        rhs: b.shape().to_vec(),
    })
}

impl Op for Binary {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let shape = broadcast2(info, ins)?;
        let int = input(info, ins, 0)?.is_int() && input(info, ins, 1)?.is_int();
        Cost::one(Meta::Shape { shape, int })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let y = match (input(info, ins, 0)?, input(info, ins, 1)?) {
            (Value::I(a), Value::I(b)) => Value::I(ints::binary(a, b, |x, y| match self.0 {
                Bin::Add => Ok(x.wrapping_add(y)),
                Bin::Sub => Ok(x.wrapping_sub(y)),
                Bin::Mul => Ok(x.wrapping_mul(y)),
                Bin::Div if y == 0 => Err(Error::invalid("onnx Div", "integer division by zero")),
                Bin::Div => Ok(x.wrapping_div(y)),
            })?),
            (a, b) => {
                let (a, b) = (a.to_tensor()?, b.to_tensor()?);
                Value::F(match self.0 {
                    Bin::Add => a.add(&b)?,
                    Bin::Sub => a.sub(&b)?,
                    Bin::Mul => a.mul(&b)?,
                    Bin::Div => a.div(&b)?,
                })
            }
        };
        Ok(vec![y])
    }

    /// An Add is a residual connection to the fuser (an Add and the Relu after it run as one step), a Mul a
    /// product (a Sigmoid and the Mul of its input by it run as one SiLU).
    fn kind(&self) -> Kind {
        match self.0 {
            Bin::Add => Kind::Add,
            Bin::Mul => Kind::Mul,
            Bin::Div => Kind::Div,
            _ => Kind::Opaque,
        }
    }

    /// The operand that is not the fused step's data input.
    fn describe(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Layer> {
        match (self.kind(), ins) {
            (Kind::Add, [Some(other), None] | [None, Some(other)]) => Ok(Layer::Add { other: other.to_tensor()? }),
            (Kind::Mul, [Some(other), None] | [None, Some(other)]) => Ok(Layer::Mul { other: other.to_tensor()? }),
            (Kind::Div, [None, Some(other)]) => Ok(Layer::Div { other: other.to_tensor()? }),
            _ => Err(info.malformed("planned as a fused residual Add, a SiLU's Mul or a GELU's nodes")),
        }
    }
}

/// Mod with broadcasting: with `fmod = 0` (integers only) the remainder takes the divisor's sign (Python's `%`);
/// with `fmod = 1` the dividend's (C's `fmod`). On floats (which need `fmod = 1`), a − b·trunc(a/b) with the
/// quotient held constant: ∂/∂a = 1, ∂/∂b = −trunc(a/b).
#[derive(Clone, Debug)]
struct Mod {
    fmod: bool,
}

pub(super) fn modulo(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Mod { fmod: a.int("fmod", 0)? != 0 }))
}

impl Op for Mod {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let int = input(info, ins, 0)?.is_int() && input(info, ins, 1)?.is_int();
        if !int && !self.fmod {
            return Err(info.malformed("Mod of floating-point tensors needs fmod = 1"));
        }
        Cost::one(Meta::Shape { shape: broadcast2(info, ins)?, int })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let y = match (input(info, ins, 0)?, input(info, ins, 1)?) {
            (Value::I(a), Value::I(b)) => Value::I(ints::binary(a, b, |x, y| {
                if y == 0 {
                    return Err(Error::invalid("onnx Mod", "integer division by zero"));
                }
                let r = x.wrapping_rem(y);
                Ok(if !self.fmod && r != 0 && (r < 0) != (y < 0) { r + y } else { r })
            })?),
            _ if !self.fmod => return Err(info.malformed("Mod of floating-point tensors needs fmod = 1")),
            (a, b) => {
                let (a, b) = (a.to_tensor()?, b.to_tensor()?);
                let q = a.detach().div(&b.detach())?.value().mapv(f32::trunc);
                Value::F(a.sub(&b.mul(&crate::Tensor::new(q))?)?)
            }
        };
        Ok(vec![y])
    }
}
