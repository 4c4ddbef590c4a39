//! Gemm (transA/B, alpha, beta) and MatMul with NumPy semantics.

use std::sync::Arc;

use super::{input, opt_tensor, tensor, Op};
use crate::nn::plan::{Kind, Layer};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::ops::matmul::matmul_shape;
use crate::{Error, Result};

/// Gemm: α·op(A)·op(B) + β·C. `transB` uses a strided view of B (the GEMM reads strides, no copy).
#[derive(Clone, Debug)]
struct Gemm {
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
}

/// MatMul with NumPy semantics (the core's [`crate::Tensor::matmul`]): vectors are promoted, leading (batch) dimensions
/// broadcast.
#[derive(Clone, Debug)]
struct MatMul;

pub(super) fn gemm(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Gemm {
        alpha: a.float("alpha", 1.0)?,
        beta: a.float("beta", 1.0)?,
        trans_a: a.int("transA", 0)? != 0,
        trans_b: a.int("transB", 0)? != 0,
    }))
}

pub(super) fn matmul(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(MatMul))
}

impl Op for Gemm {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let (a, b) = (input(info, ins, 0)?.shape(), input(info, ins, 1)?.shape());
        let (&[r, c], &[p, q]) = (a, b) else {
            return Err(info.malformed(format!("Gemm of shapes {a:?} and {b:?}")));
        };
        let (m, k) = if self.trans_a { (c, r) } else { (r, c) };
        let (k2, n) = if self.trans_b { (q, p) } else { (p, q) };
        if k != k2 {
            return Err(Error::ShapeMismatch { op: "onnx Gemm", expected: a.to_vec(), got: b.to_vec() });
        }
        Cost::one(Meta::float(vec![m, n]))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (a, b, c) = (tensor(info, ins, 0)?, tensor(info, ins, 1)?, opt_tensor(ins, 2)?);
        let a = if self.trans_a { a.t()? } else { a };
        // The usual linear layer (no scaling, a bias per column): one product whose chains start at the bias.
        if let Some(c) = c.as_ref().filter(|c| self.alpha == 1.0 && self.beta == 1.0 && c.rank() == 1) {
            return Ok(vec![Value::F(a.matmul_bias(&b, c, self.trans_b)?)]);
        }
        let mut y = if self.trans_b { a.matmul_transposed(&b)? } else { a.matmul(&b)? };
        if self.alpha != 1.0 {
            y = y.mul_scalar(self.alpha);
        }
        let y = match c {
            Some(c) if self.beta == 1.0 => y.add(&c)?,
            Some(c) => y.add(&c.mul_scalar(self.beta))?,
            None => y,
        };
        Ok(vec![Value::F(y)])
    }
}

impl Op for MatMul {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let (a, b) = (input(info, ins, 0)?.shape(), input(info, ins, 1)?.shape());
        Cost::one(Meta::float(matmul_shape(a, b)?))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        Ok(vec![Value::F(tensor(info, ins, 0)?.matmul(&tensor(info, ins, 1)?)?)])
    }

    /// With an Add after it, the fuser's product-and-bias step ([`Fused::MatMulBias`](crate::nn::plan::Fused)).
    fn kind(&self) -> Kind {
        Kind::MatMul
    }

    fn describe(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Layer> {
        match ins {
            [None, Some(w)] => Ok(Layer::MatMul { weight: w.to_tensor()? }),
            _ => Err(info.malformed("planned as a fused MatMul with its first input carried")),
        }
    }
}
