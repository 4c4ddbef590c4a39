//! Softmax and LogSoftmax; the legacy form (opset < 13) works on the input flattened to 2-D at `axis`.

use std::sync::Arc;

use super::{axis, input, tensor, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::Result;

#[derive(Clone, Debug)]
struct Softmax {
    axis: i64,
    log: bool,
    /// Opset < 13: flatten from `axis` into 2-D first.
    legacy: bool,
}

fn parse(a: &Attrs, log: bool) -> Result<Arc<dyn Op>> {
    let legacy = a.info.opset < 13;
    Ok(Arc::new(Softmax { axis: a.int("axis", if legacy { 1 } else { -1 })?, log, legacy }))
}

pub(super) fn softmax(a: &Attrs) -> Result<Arc<dyn Op>> {
    parse(a, false)
}

pub(super) fn log_softmax(a: &Attrs) -> Result<Arc<dyn Op>> {
    parse(a, true)
}

impl Op for Softmax {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(Meta::float(input(info, ins, 0)?.shape().to_vec()))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor(info, ins, 0)?;
        let f = |t: &crate::Tensor, ax: usize| if self.log { t.log_softmax(ax) } else { t.softmax(ax) };
        let ax = axis(info, self.axis, x.rank())?;
        let y = if !self.legacy || ax + 1 == x.rank() {
            f(&x, ax)?
        } else {
            let (lo, hi) = x.shape().split_at(ax);
            f(&x.reshape(&[lo.iter().product(), hi.iter().product()])?, 1)?.reshape(x.shape())?
        };
        Ok(vec![Value::F(y)])
    }
}
