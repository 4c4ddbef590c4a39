//! Elementwise operators of one tensor and activations: Neg, Exp, Log, Sqrt, Erf, Relu, LeakyRelu, Sigmoid, Tanh,
//! Gelu (opset 20, `approximate` "none" or "tanh"), HardSigmoid, HardSwish (the core's [`UnaryKind`]), PRelu, Clip
//! (bounds as attributes before opset 11, inputs after) and Pow (a constant scalar exponent).

use std::sync::Arc;

use super::{data_then_constants, input, opt_scalar, tensor, InputRole, Op};
use crate::nn::plan::{Kind, Layer};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::ops::elementwise::broadcast_shape;
use crate::ops::UnaryKind;
use crate::Result;

/// A core unary op.
#[derive(Clone, Debug)]
pub(crate) struct Unary(pub(crate) UnaryKind);

fn unary(k: UnaryKind) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Unary(k)))
}

pub(super) fn neg(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::Neg)
}

pub(super) fn relu(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::Relu)
}

pub(super) fn sigmoid(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::Sigmoid)
}

pub(super) fn tanh(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::Tanh)
}

pub(super) fn exp(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::Exp)
}

pub(super) fn log(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::Log)
}

pub(super) fn sqrt(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::Sqrt)
}

pub(super) fn erf(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::Erf)
}

pub(super) fn gelu(a: &Attrs) -> Result<Arc<dyn Op>> {
    match a.string("approximate", "none")?.as_str() {
        "none" => unary(UnaryKind::Gelu),
        "tanh" => unary(UnaryKind::GeluTanh),
        other => Err(a.info.unsupported(format!("approximate = '{other}'"))),
    }
}

/// clamp(α·x + β, 0, 1); ONNX's defaults are α = 0.2, β = 0.5 (PyTorch's `hardsigmoid` exports α = 1/6).
pub(super) fn hard_sigmoid(a: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::HardSigmoid(a.float("alpha", 0.2)?, a.float("beta", 0.5)?))
}

pub(super) fn hard_swish(_: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::HardSwish)
}

pub(super) fn leaky_relu(a: &Attrs) -> Result<Arc<dyn Op>> {
    unary(UnaryKind::LeakyRelu(a.float("alpha", 0.01)?))
}

/// A float output of the first input's shape.
pub(crate) fn same_shape(info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
    Cost::one(Meta::float(input(info, ins, 0)?.shape().to_vec()))
}

impl Op for Unary {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        same_shape(info, ins)
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        Ok(vec![Value::F(tensor(info, ins, 0)?.unary(self.0))])
    }

    fn kind(&self) -> Kind {
        match self.0 {
            UnaryKind::Relu => Kind::Relu,
            UnaryKind::Sigmoid => Kind::Sigmoid,
            UnaryKind::Erf => Kind::Erf,
            _ => Kind::Opaque,
        }
    }

    fn describe(&self, info: &NodeInfo, _: &[Option<&Value>]) -> Result<Layer> {
        match self.kind() {
            Kind::Relu => Ok(Layer::Relu),
            Kind::Sigmoid => Ok(Layer::Sigmoid),
            Kind::Erf => Ok(Layer::Erf),
            _ => Err(info.malformed("planned as a fused Relu, Sigmoid or Erf")),
        }
    }
}

/// PRelu: y = relu(x) − slope·relu(−x); ∂y/∂slope = min(x, 0). The slope broadcasts to the data.
#[derive(Clone, Debug)]
struct PRelu;

pub(super) fn prelu(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(PRelu))
}

/// PRelu's slope broadcasts unidirectionally to the data (ONNX): the output has the data's shape. Returns the
/// slope's shape without the leading 1s beyond the data's rank (a one-element slope of any rank is accepted, as
/// exporters write `[1, 1, 1]` for a shared slope); an error when the slope would grow the data.
fn prelu_slope_shape(info: &NodeInfo, x: &[usize], slope: &[usize]) -> Result<Vec<usize>> {
    let extra = slope.len().saturating_sub(x.len());
    let trimmed = &slope[extra..];
    if slope[..extra].iter().all(|&d| d == 1) && broadcast_shape(x, trimmed).as_deref() == Some(x) {
        Ok(trimmed.to_vec())
    } else {
        Err(info.malformed(format!("PRelu slope of shape {slope:?} does not broadcast to the input's {x:?}")))
    }
}

impl Op for PRelu {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let (x, slope) = (input(info, ins, 0)?, input(info, ins, 1)?);
        prelu_slope_shape(info, x.shape(), slope.shape())?;
        Cost::one(Meta::float(x.shape().to_vec()))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (x, mut slope) = (tensor(info, ins, 0)?, tensor(info, ins, 1)?);
        let trimmed = prelu_slope_shape(info, x.shape(), slope.shape())?;
        if trimmed.len() != slope.rank() {
            slope = slope.reshape(&trimmed)?;
        }
        if slope.numel() == 1 && !slope.is_tracked() {
            return Ok(vec![Value::F(x.leaky_relu(slope.item()?))]);
        }
        Ok(vec![Value::F(x.relu().sub(&x.neg().relu().mul(&slope)?)?)])
    }
}

/// Clip: bounds from the attributes (opset < 11) or from inputs 1 and 2.
#[derive(Clone, Debug)]
struct Clip {
    min: Option<f32>,
    max: Option<f32>,
}

pub(super) fn clip(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Clip { min: a.opt_float("min")?, max: a.opt_float("max")? }))
}

impl Op for Clip {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        same_shape(info, ins)
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (lo, hi) = self.bounds(info, ins)?;
        Ok(vec![Value::F(tensor(info, ins, 0)?.clamp(lo, hi))])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }

    /// A Clip after a convolution runs inside it (ReLU6).
    fn kind(&self) -> Kind {
        Kind::Clip
    }

    fn describe(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Layer> {
        let (lo, hi) = self.bounds(info, ins)?;
        Ok(Layer::Clip { lo, hi })
    }
}

impl Clip {
    /// The bounds, from the attributes or the constant inputs 1 and 2; an absent one is infinite.
    fn bounds(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<(f32, f32)> {
        let lo = match self.min {
            Some(v) => Some(v),
            None => opt_scalar(info, ins, 1)?,
        };
        let hi = match self.max {
            Some(v) => Some(v),
            None => opt_scalar(info, ins, 2)?,
        };
        Ok((lo.unwrap_or(f32::NEG_INFINITY), hi.unwrap_or(f32::INFINITY)))
    }
}

/// Pow with a constant scalar exponent.
#[derive(Clone, Debug)]
struct Pow;

pub(super) fn pow(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Pow))
}

impl Op for Pow {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        same_shape(info, ins)
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let p = opt_scalar(info, ins, 1)?.ok_or_else(|| info.malformed("Pow needs an exponent"))?;
        let t = tensor(info, ins, 0)?;
        Ok(vec![Value::F(if p == 1.0 { t } else { t.powf(p) })])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }
}
