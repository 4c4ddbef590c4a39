//! The importer's fusion, kept apart so that a shared planner can replace it: a Relu, and a 2×2 max pooling after
//! it, folded into the Conv step before them where the intermediate values are read by nothing else and are not
//! the graph's output — one op with the same values and gradients ([`crate::Tensor::conv2d_relu_max_pool2`]), as
//! the native layers run. A pass that taps a value inside a fused step runs it unfused ([`run_unfused`]).

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use super::ops::conv::{Conv, Fused};
use super::ops::pool::MaxPool;
use super::ops::unary::Unary;
use super::ops::Op;
use super::value::Value;
use super::Step;
use crate::ops::UnaryKind;
use crate::{Error, Result};

fn downcast<T: 'static>(op: &dyn Op) -> Option<&T> {
    (op as &dyn Any).downcast_ref::<T>()
}

/// Fuses Conv → Relu (→ 2×2 MaxPool) runs; `unfused` keeps the steps a fused one replaced.
pub(super) fn fuse(steps: &mut Vec<Step>, output_slot: usize) {
    let mut readers: HashMap<usize, usize> = HashMap::new();
    for s in steps.iter() {
        for &slot in s.inputs.iter().flatten() {
            *readers.entry(slot).or_default() += 1;
        }
    }
    let sole_input = |slot: usize, next: &Step| {
        slot != output_slot && readers.get(&slot) == Some(&1) && next.inputs.first() == Some(&Some(slot))
    };
    let mut out = Vec::with_capacity(steps.len());
    let mut rest = std::mem::take(steps).into_iter().peekable();
    while let Some(mut step) = rest.next() {
        let Some(conv) = downcast::<Conv>(&*step.op).cloned() else {
            out.push(step);
            continue;
        };
        let is_relu = |n: &Step| matches!(downcast::<Unary>(&*n.op), Some(Unary(UnaryKind::Relu)));
        let Some(relu) = rest.next_if(|n| is_relu(n) && sole_input(step.outputs[0], n)) else {
            out.push(step);
            continue;
        };
        let is_pool2 = |n: &Step| downcast::<MaxPool>(&*n.op).is_some_and(|p| p.0.is_max_pool2());
        let pool = rest.next_if(|n| is_pool2(n) && sole_input(relu.outputs[0], n));
        let then = if pool.is_some() { Fused::ReluMaxPool2 } else { Fused::Relu };
        let mut unfused = vec![step.clone(), relu];
        unfused.extend(pool);
        step.op = Arc::new(Conv { then, ..conv });
        step.outputs = unfused.last().map(|s| s.outputs.clone()).unwrap_or_default();
        step.unfused = unfused;
        out.push(step);
    }
    *steps = out;
}

/// Runs a fused step as the steps it replaced, keeping the tapped values the fused op skips: the Conv alone when
/// its own output is tapped, else the Conv with its Relu fused and the pooling on its own (the same values: a fused
/// op computes exactly what the separate ones do). Returns the fused step's outputs.
pub(super) fn run_unfused(
    step: &Step,
    ins: &[Option<&Value>],
    taps: &[usize],
    keep: &mut impl FnMut(usize, &Value) -> Result<()>,
) -> Result<Vec<Value>> {
    let (Some(first), Some(conv)) = (step.unfused.first(), downcast::<Conv>(&*step.op)) else {
        return step.op.run(&step.info, ins);
    };
    let conv_tapped = first.outputs.iter().any(|o| taps.contains(o));
    let then = if conv_tapped { Fused::Nothing } else { Fused::Relu };
    let mut h = Conv { then, ..conv.clone() }.run(&first.info, ins)?;
    let from = if conv_tapped { 1 } else { 2 };
    let mut prev = &step.unfused[from - 1];
    for s in step.unfused.iter().skip(from) {
        let (Some(&slot), Some(v)) = (prev.outputs.first(), h.first()) else {
            return Err(Error::invalid("onnx", format!("node '{}' computed no output", prev.info.name)));
        };
        keep(slot, v)?;
        h = s.op.run(&s.info, &[Some(v)])?;
        prev = s;
    }
    Ok(h)
}

/// Whether a pass tapping `taps` must run `step` unfused: a value it skips is tapped.
pub(super) fn needs_unfused(step: &Step, taps: &[usize]) -> bool {
    let skipped = step.unfused.iter().take(step.unfused.len().saturating_sub(1));
    skipped.flat_map(|s| &s.outputs).any(|o| taps.contains(o))
}
