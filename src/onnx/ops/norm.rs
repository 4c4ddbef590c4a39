//! BatchNormalization, in inference (running statistics), and LayerNormalization (opset 17).

use std::sync::Arc;

use super::{axis, input, opt_tensor, tensor, InputRole, Op};
use crate::nn::plan::{Kind, Layer};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::ops::batch_norm::batch_norm_running;
use crate::ops::elementwise::broadcast_shape;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// BatchNormalization in inference: y = (x − mean)·a + B with a = scale/√(var + ε) per channel; the scale and B
/// stay differentiable, mean and var are running statistics (buffers).
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
        // The core's one-pass op with the running statistics given, (x − mean)·a + B with a = scale/√(var + ε),
        // as the layer runs in evaluation mode; the scale and B get gradients, the statistics none.
        Ok(vec![Value::F(batch_norm_running(x, (scale, bias), (mean, var), self.eps, false)?)])
    }

    fn kind(&self) -> Kind {
        Kind::BatchNorm
    }

    fn describe(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Layer> {
        Ok(Layer::BatchNorm {
            weight: tensor(info, ins, 1)?,
            bias: tensor(info, ins, 2)?,
            running_mean: tensor(info, ins, 3)?,
            running_var: tensor(info, ins, 4)?,
            eps: self.eps,
        })
    }

    fn input_role(&self, i: usize) -> InputRole {
        if matches!(i, 3 | 4) {
            InputRole::Buffer
        } else {
            InputRole::Data
        }
    }
}

/// LayerNormalization: the core's fused [`Tensor::layer_norm`] over the axes from `axis` on, times Scale, plus B
/// (optional; both may broadcast to the normalised axes). The optional outputs Mean and InvStdDev (the input's shape
/// with the normalised axes as 1s) are computed, when asked for, as compositions of the core's ops, so that
/// gradients flow through them too. Statistics are computed in f32: `stash_type` must be 1 (float).
#[derive(Clone, Debug)]
struct LayerNorm {
    axis: i64,
    eps: f32,
    /// Whether the node asks for Mean and InvStdDev (outputs 1 and 2).
    mean: bool,
    inv_std: bool,
}

pub(super) fn layer_norm(a: &Attrs) -> Result<Arc<dyn Op>> {
    let stash = a.int("stash_type", 1)?;
    if stash != 1 {
        return Err(a.info.unsupported(format!("stash_type = {stash} (statistics are computed in float32)")));
    }
    let asked = |i: usize| a.node.output.get(i).is_some_and(|o| !o.is_empty());
    Ok(Arc::new(LayerNorm {
        axis: a.int("axis", -1)?,
        eps: a.float("epsilon", 1e-5)?,
        mean: asked(1),
        inv_std: asked(2),
    }))
}

impl LayerNorm {
    /// The shape rule: the first normalised axis, and the output shapes (Y, then Mean and InvStdDev if asked for).
    fn shapes<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<(usize, Vec<Vec<usize>>)> {
        let x = input(info, ins, 0)?.shape();
        let ax = axis(info, self.axis, x.len())?;
        for i in [1, 2] {
            if let Some(p) = ins.get(i).copied().flatten() {
                if broadcast_shape(&x[ax..], p.shape()).as_deref() != Some(&x[ax..]) {
                    let what = if i == 1 { "Scale" } else { "B" };
                    return Err(info.malformed(format!(
                        "{what} of shape {:?} does not broadcast to the normalised axes {:?}",
                        p.shape(),
                        &x[ax..]
                    )));
                }
            }
        }
        let stats: Vec<usize> = x.iter().enumerate().map(|(i, &d)| if i < ax { d } else { 1 }).collect();
        let mut out = vec![x.to_vec()];
        out.extend([self.mean, self.inv_std].iter().filter(|&&w| w).map(|_| stats.clone()));
        Ok((ax, out))
    }
}

impl Op for LayerNorm {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let (_, shapes) = self.shapes(info, ins)?;
        Ok(Cost { outputs: shapes.into_iter().map(Meta::float).collect(), scratch: 0 })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (ax, _) = self.shapes(info, ins)?;
        let (x, scale, bias) = (tensor(info, ins, 0)?, opt_tensor(ins, 1)?, opt_tensor(ins, 2)?);
        let mut outs = vec![Value::F(x.layer_norm(ax, self.eps, scale.as_ref(), bias.as_ref())?)];
        if self.mean || self.inv_std {
            let axes: Vec<usize> = (ax..x.rank()).collect();
            let mean = x.mean(&axes, true)?;
            if self.inv_std {
                let var = x.sub(&mean)?.powf(2.0).mean(&axes, true)?;
                let inv_std = var.add_scalar(self.eps).powf(-0.5);
                outs.extend(self.mean.then(|| Value::F(mean)));
                outs.push(Value::F(inv_std));
            } else {
                outs.push(Value::F(mean));
            }
        }
        Ok(outs)
    }

    fn outputs(&self) -> usize {
        3
    }
}
