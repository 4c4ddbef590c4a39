//! Identity, and Dropout in inference (output 0 is input 0; a requested mask output is all ones).

use std::sync::Arc;

use super::{data_then_constants, input, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::{Ints, Value};
use crate::Result;

#[derive(Clone, Debug)]
struct Identity {
    /// Dropout's mask output is requested.
    mask: bool,
}

pub(super) fn identity(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Identity { mask: false }))
}

pub(super) fn dropout(a: &Attrs) -> Result<Arc<dyn Op>> {
    a.ignore("ratio");
    a.ignore("seed");
    if a.int("is_test", 1)? == 0 && a.info.opset < 7 {
        return Err(a.info.unsupported("is_test = 0 (training-mode dropout)"));
    }
    Ok(Arc::new(Identity { mask: a.node.output.get(1).is_some_and(|o| !o.is_empty()) }))
}

impl Op for Identity {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let v = input(info, ins, 0)?.clone();
        let shape = v.shape().to_vec();
        let mut outputs = vec![v];
        if self.mask {
            outputs.push(Meta::Shape { shape, int: true });
        }
        Ok(Cost { outputs, scratch: 0 })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let v = input(info, ins, 0)?.clone();
        if !self.mask {
            return Ok(vec![v]);
        }
        let n = crate::limits::checked_numel("onnx Dropout mask", v.shape())?;
        let mask = Value::I(Ints { shape: v.shape().to_vec(), data: vec![1; n] });
        Ok(vec![v, mask])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }

    fn outputs(&self) -> usize {
        if self.mask {
            2
        } else {
            1
        }
    }
}
