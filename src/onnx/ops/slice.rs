//! Slice: starts, ends and axes as attributes before opset 10, as inputs (with steps) after; any steps, unit-step
//! ranges are views.

use std::sync::Arc;

use super::{axis, data_then_constants, input, ints, like, opt_ints, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::ints as int_ops;
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::{Ints, Value};
use crate::Result;

/// The attribute form (opset < 10): starts, ends and optional axes.
type SliceAttrs = (Vec<i64>, Vec<i64>, Option<Vec<i64>>);

#[derive(Clone, Debug)]
struct Slice {
    attrs: Option<SliceAttrs>,
}

pub(super) fn slice(a: &Attrs) -> Result<Arc<dyn Op>> {
    let attrs = match (a.ints("starts")?, a.ints("ends")?) {
        (Some(s), Some(e)) => Some((s, e, a.ints("axes")?)),
        (None, None) => None,
        _ => return Err(a.info.malformed("Slice needs both starts and ends")),
    };
    Ok(Arc::new(Slice { attrs }))
}

/// One axis of a slice: the axis, the first index, how many indices and the step.
struct Cut {
    axis: usize,
    first: usize,
    count: usize,
    step: i64,
}

/// The first index and the number of indices a slice picks along an axis of size `d` (ONNX clamping rules), in
/// closed form: an axis of an empty tensor may be declared huge, and listing its indices would never end.
fn slice_range(d: usize, start: i64, end: i64, step: i64) -> (usize, usize) {
    if d == 0 {
        return (0, 0);
    }
    let d = d as i128;
    let norm = |v: i64| if v < 0 { i128::from(v) + d } else { i128::from(v) };
    let (s, e, step) = (norm(start), norm(end), i128::from(step));
    let (first, span) = if step > 0 {
        let (s, e) = (s.clamp(0, d), e.clamp(0, d));
        (s, e - s)
    } else {
        let (s, e) = (s.clamp(0, d - 1), e.clamp(-1, d - 1));
        (s, s - e)
    };
    let count = if span > 0 { (span + step.abs() - 1) / step.abs() } else { 0 };
    (first as usize, count as usize)
}

impl Cut {
    fn indices(&self) -> Vec<usize> {
        (0..self.count as i128).map(|k| (self.first as i128 + k * i128::from(self.step)) as usize).collect()
    }
}

impl Slice {
    /// The cuts, in order, and the output shape.
    fn plan<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<(Vec<Cut>, Vec<usize>)> {
        let (starts, ends, axes, steps) = match &self.attrs {
            Some((s, e, a)) => (s.clone(), e.clone(), a.clone(), None),
            None => (ints(info, ins, 1)?, ints(info, ins, 2)?, opt_ints(info, ins, 3)?, opt_ints(info, ins, 4)?),
        };
        let mut shape = input(info, ins, 0)?.shape().to_vec();
        let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(info.malformed("starts, ends, axes and steps differ in length"));
        }
        let mut cuts = Vec::with_capacity(starts.len());
        for i in 0..starts.len() {
            let ax = axis(info, axes[i], shape.len())?;
            if steps[i] == 0 {
                return Err(info.malformed("slice step 0"));
            }
            let (first, count) = slice_range(shape[ax], starts[i], ends[i], steps[i]);
            shape[ax] = count;
            cuts.push(Cut { axis: ax, first, count, step: steps[i] });
        }
        Ok((cuts, shape))
    }
}

impl Op for Slice {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(like(input(info, ins, 0)?, self.plan(info, ins)?.1))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let mut out = input(info, ins, 0)?.clone();
        for c in self.plan(info, ins)?.0 {
            // A unit step is a view; so is any slice of an empty tensor (its values do not matter, only the shape).
            let view = c.step == 1 || out.numel() == 0;
            out = match &out {
                Value::F(t) if view => {
                    Value::F(t.narrow(c.axis, if c.step == 1 && c.count > 0 { c.first } else { 0 }, c.count)?)
                }
                Value::F(t) => Value::F(t.index_select(c.axis, &c.indices())?),
                Value::I(x) if x.data.is_empty() => {
                    let mut shape = x.shape.clone();
                    shape[c.axis] = c.count;
                    Value::I(Ints { shape, data: Vec::new() })
                }
                Value::I(x) => Value::I(int_ops::select(x, c.axis, &c.indices())?),
            };
        }
        Ok(vec![out])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }
}
