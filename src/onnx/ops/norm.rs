//! BatchNormalization, in inference (running statistics).

use std::sync::Arc;

use super::{input, tensor, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// BatchNormalization in inference: y = x·a + (B − mean·a) with a = scale/√(var + ε) per channel; the scale
/// and B stay differentiable, mean and var are running statistics (buffers).
#[derive(Clone, Debug)]
struct BatchNorm {
    eps: f32,
}

pub(super) fn batch_norm(a: &Attrs) -> Result<Arc<dyn Op>> {
    a.ignore("momentum");
    a.ignore("spatial");
    a.ignore("is_test");
    if a.int("training_mode", 0)? != 0 {
        return Err(a.info.unsupported("training_mode = 1 (BatchNormalization is imported for inference)"));
    }
    if a.node.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(a.info.unsupported("the running-statistics outputs of BatchNormalization"));
    }
    Ok(Arc::new(BatchNorm { eps: a.float("epsilon", 1e-5)? }))
}

impl Op for BatchNorm {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(Meta::float(input(info, ins, 0)?.shape().to_vec()))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let t: Vec<Tensor> = (0..5).map(|i| tensor(info, ins, i)).collect::<Result<_>>()?;
        let (x, scale, bias, mean, var) = (&t[0], &t[1], &t[2], &t[3], &t[4]);
        if x.rank() < 2 {
            return Err(info.malformed(format!("input of rank {}", x.rank())));
        }
        let c = x.shape()[1];
        for t in [scale, bias, mean, var] {
            if t.shape() != [c] {
                return Err(Error::ShapeMismatch {
                    op: "onnx BatchNormalization",
                    expected: vec![c],
                    got: t.shape().to_vec(),
                });
            }
        }
        let mut bshape = vec![1; x.rank()];
        bshape[1] = c;
        let a = scale.mul(&var.add_scalar(self.eps).powf(-0.5))?;
        let shift = bias.sub(&mean.mul(&a)?)?;
        Ok(vec![Value::F(x.mul(&a.reshape(&bshape)?)?.add(&shift.reshape(&bshape)?)?)])
    }

    fn input_role(&self, i: usize) -> InputRole {
        if matches!(i, 3 | 4) {
            InputRole::Buffer
        } else {
            InputRole::Data
        }
    }
}
