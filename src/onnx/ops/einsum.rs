//! Einsum: the core's [`Tensor::einsum`] (batched products, permutes and sums, so it has gradients), with its shape
//! rule; an equation the core does not support (a diagonal) is an unsupported-operator error naming the node.

use std::sync::Arc;

use super::{input, tensor, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::ops::einsum::einsum_shape;
use crate::tensor::Tensor;
use crate::{Error, Result};

#[derive(Clone, Debug)]
struct Einsum {
    equation: String,
}

pub(super) fn einsum(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Einsum { equation: a.string("equation", "")? }))
}

/// The core's complaint about an equation, as this node's.
fn node_error(info: &NodeInfo, e: Error) -> Error {
    match e {
        Error::InvalidArgument { op: "einsum", msg } => info.unsupported(format!("Einsum {msg}")),
        other => other,
    }
}

impl Op for Einsum {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let shapes = (0..ins.len()).map(|i| Ok(input(info, ins, i)?.shape())).collect::<Result<Vec<_>>>()?;
        Cost::one(Meta::float(einsum_shape(&self.equation, &shapes).map_err(|e| node_error(info, e))?))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let ts = (0..ins.len()).map(|i| tensor(info, ins, i)).collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = ts.iter().collect();
        Ok(vec![Value::F(Tensor::einsum(&self.equation, &refs).map_err(|e| node_error(info, e))?)])
    }
}
