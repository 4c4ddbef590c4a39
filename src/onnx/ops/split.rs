//! Split: the input cut along an axis into consecutive pieces, one per output — sizes from the `split` attribute
//! (opset < 13) or input (13+); without them equal parts, or at opset 18+ with `num_outputs` parts of ⌈d/n⌉ and a
//! smaller last one.

use std::sync::Arc;

use super::{axis, data_then_constants, input, opt_ints, tensor, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::Result;

#[derive(Clone, Debug)]
struct Split {
    axis: i64,
    /// The `split` attribute (opset < 13).
    sizes: Option<Vec<i64>>,
    /// `num_outputs` was given (opset 18+): ⌈d/n⌉-sized parts.
    ceil_parts: bool,
    outputs: usize,
}

pub(super) fn split(a: &Attrs) -> Result<Arc<dyn Op>> {
    let sizes = if a.info.opset < 13 { a.ints("split")? } else { None };
    let num_outputs = if a.info.opset >= 18 { a.opt_int("num_outputs")? } else { None };
    let outputs = a.node.output.len();
    if num_outputs.is_some_and(|n| n != outputs as i64) {
        return Err(a.info.malformed(format!("num_outputs = {num_outputs:?} for {outputs} outputs")));
    }
    Ok(Arc::new(Split { axis: a.int("axis", 0)?, sizes, ceil_parts: num_outputs.is_some(), outputs }))
}

impl Split {
    /// The shape rule: the axis and the size of each piece along it.
    fn sizes<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<(usize, Vec<usize>)> {
        let shape = input(info, ins, 0)?.shape();
        let ax = axis(info, self.axis, shape.len())?;
        let (d, n) = (shape[ax], self.outputs);
        let sizes: Vec<i64> = match (&self.sizes, opt_ints(info, ins, 1)?) {
            (Some(s), _) => s.clone(),
            (None, Some(s)) => s,
            (None, None) if self.ceil_parts => {
                let part = d.div_ceil(n.max(1));
                (0..n).map(|i| d.saturating_sub(i * part).min(part) as i64).collect()
            }
            (None, None) if d % n.max(1) == 0 => vec![(d / n.max(1)) as i64; n],
            (None, None) => {
                return Err(info.malformed(format!("axis {ax} of size {d} does not split into {n} equal parts")))
            }
        };
        let total = sizes.iter().try_fold(0i64, |acc, &s| if s < 0 { None } else { acc.checked_add(s) });
        if sizes.len() != n || total != Some(d as i64) {
            return Err(info.malformed(format!(
                "split sizes {sizes:?} for {n} outputs along axis {ax} of size {d} (shape {shape:?})"
            )));
        }
        Ok((ax, sizes.into_iter().map(|s| s as usize).collect()))
    }
}

impl Op for Split {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let (ax, sizes) = self.sizes(info, ins)?;
        let shape = input(info, ins, 0)?.shape();
        let outputs = sizes
            .iter()
            .map(|&s| {
                let mut piece = shape.to_vec();
                piece[ax] = s;
                Meta::float(piece)
            })
            .collect();
        Ok(Cost { outputs, scratch: 0 })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (ax, sizes) = self.sizes(info, ins)?;
        Ok(tensor(info, ins, 0)?.split(ax, &sizes)?.into_iter().map(Value::F).collect())
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }

    fn outputs(&self) -> usize {
        self.outputs
    }
}
