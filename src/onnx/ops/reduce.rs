//! ReduceMean and ReduceSum: axes as an attribute before opset 18 (13 for ReduceSum), as input 1 after;
//! `keepdims`, `noop_with_empty_axes`.

use std::sync::Arc;

use super::{axes, data_then_constants, input, opt_ints, tensor, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::Result;

#[derive(Clone, Debug)]
struct Reduce {
    mean: bool,
    axes: Option<Vec<i64>>,
    keepdims: bool,
    noop_with_empty_axes: bool,
}

fn parse(a: &Attrs, mean: bool) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Reduce {
        mean,
        axes: a.ints("axes")?,
        keepdims: a.int("keepdims", 1)? != 0,
        noop_with_empty_axes: a.int("noop_with_empty_axes", 0)? != 0,
    }))
}

pub(super) fn reduce_mean(a: &Attrs) -> Result<Arc<dyn Op>> {
    parse(a, true)
}

pub(super) fn reduce_sum(a: &Attrs) -> Result<Arc<dyn Op>> {
    parse(a, false)
}

impl Reduce {
    /// The axes reduced (sorted, distinct; all when none are given) and the output shape; `None` for the
    /// identity (no axes with `noop_with_empty_axes`).
    fn plan<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Option<(Vec<usize>, Vec<usize>)>> {
        let s = input(info, ins, 0)?.shape();
        let given = match &self.axes {
            Some(a) => a.clone(),
            None => opt_ints(info, ins, 1)?.unwrap_or_default(),
        };
        if given.is_empty() && self.noop_with_empty_axes {
            return Ok(None);
        }
        let mut ax = axes(info, &given, s.len())?;
        ax.sort_unstable();
        ax.dedup();
        if ax.is_empty() {
            ax = (0..s.len()).collect();
        }
        let shape = (0..s.len())
            .filter_map(|i| match (ax.contains(&i), self.keepdims) {
                (false, _) => Some(s[i]),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        Ok(Some((ax, shape)))
    }
}

impl Op for Reduce {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let shape = match self.plan(info, ins)? {
            Some((_, shape)) => shape,
            None => input(info, ins, 0)?.shape().to_vec(),
        };
        Cost::one(Meta::float(shape))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let t = tensor(info, ins, 0)?;
        let y = match self.plan(info, ins)? {
            None => t,
            Some((ax, _)) if self.mean => t.mean(&ax, self.keepdims)?,
            Some((ax, _)) => t.sum(&ax, self.keepdims)?,
        };
        Ok(vec![Value::F(y)])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }
}
