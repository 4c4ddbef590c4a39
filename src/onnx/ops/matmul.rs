//! Gemm (transA/B, alpha, beta) and MatMul with NumPy semantics.

use std::sync::Arc;

use super::{input, opt_tensor, tensor, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::ops::elementwise::broadcast_shape;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Gemm: α·op(A)·op(B) + β·C. `transB` uses a strided view of B (the GEMM reads strides, no copy).
#[derive(Clone, Debug)]
struct Gemm {
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
}

/// MatMul with NumPy semantics: vectors are promoted, leading (batch) dimensions broadcast.
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
        let b = if self.trans_b { b.t()? } else { b };
        let mut y = a.matmul(&b)?;
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
        let (mut a2, mut b2) = (a.to_vec(), b.to_vec());
        if a.len() == 1 {
            a2.insert(0, 1);
        }
        if b.len() == 1 {
            b2.push(1);
        }
        if a2.len() < 2 || b2.len() < 2 || a2[a2.len() - 1] != b2[b2.len() - 2] {
            return Err(info.malformed(format!("MatMul of shapes {a:?} and {b:?}")));
        }
        let lead = broadcast_shape(&a2[..a2.len() - 2], &b2[..b2.len() - 2]).ok_or_else(|| Error::Broadcast {
            op: "onnx MatMul",
            lhs: a.to_vec(),
            rhs: b.to_vec(),
        })?;
        let mut shape = lead;
        if a.len() > 1 {
            shape.push(a2[a2.len() - 2]);
        }
        if b.len() > 1 {
            shape.push(b2[b2.len() - 1]);
        }
        Cost::one(Meta::float(shape))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        Ok(vec![Value::F(numpy_matmul(&tensor(info, ins, 0)?, &tensor(info, ins, 1)?)?)])
    }
}

/// MatMul with NumPy semantics on the core's 2-D and batched matmul.
fn numpy_matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (va, vb) = (a.rank() == 1, b.rank() == 1);
    let a = if va { a.unsqueeze(0)? } else { a.clone() };
    let b = if vb { b.unsqueeze(1)? } else { b.clone() };
    if a.rank() < 2 || b.rank() < 2 {
        return Err(Error::RankMismatch { op: "onnx MatMul", expected: 2, got: a.rank().min(b.rank()), shape: vec![] });
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    let mut y = if ra == 2 && rb == 2 {
        a.matmul(&b)?
    } else if rb == 2 {
        let lead = a.shape()[..ra - 2].to_vec();
        let p: usize = lead.iter().product();
        let mut shape = lead;
        shape.extend([m, n]);
        a.reshape(&[p * m, k])?.matmul(&b)?.reshape(&shape)?
    } else {
        let (la, lb) = (&a.shape()[..ra - 2], &b.shape()[..rb - 2]);
        let lead = broadcast_shape(la, lb).ok_or_else(|| Error::Broadcast {
            op: "onnx MatMul",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        })?;
        let p: usize = lead.iter().product();
        let full = |t: &Tensor, r: usize, c: usize| -> Result<Tensor> {
            let mut s = lead.clone();
            s.extend([r, c]);
            let t = if t.shape() == s.as_slice() { t.clone() } else { t.broadcast_to(&s)? };
            t.reshape(&[p, r, c])
        };
        let mut shape = lead.clone();
        shape.extend([m, n]);
        full(&a, m, k)?.matmul(&full(&b, b.shape()[rb - 2], n)?)?.reshape(&shape)?
    };
    if vb {
        y = y.squeeze(y.rank() - 1)?;
    }
    if va {
        y = y.squeeze(y.rank() - if vb { 1 } else { 2 })?;
    }
    Ok(y)
}
