//! The importer's side of the one fuser ([`crate::nn::plan`]): the steps, in order, are planned like a
//! `Sequential`'s children — each node says what it is ([`Op::kind`]), and the output of a step is
//! [`Output::Open`] when it is the step's only output, read by the next step alone (as its data input: the first,
//! or either operand of an Add) and not the graph's output, and [`Output::Twice`] when the step after that reads
//! it too, as the other operand of a product with the next step's output (`x·σ(x)`). A planned step of several
//! nodes becomes one step running a [`Planned`] op, which describes its nodes from their inputs ([`Op::describe`])
//! and runs [`Fused::run`]: BatchNorm folded into the Conv before it, Conv + Relu (+ 2×2 MaxPool), Conv + Add (+
//! Relu), Conv + Sigmoid + Mul (SiLU in the convolution's store), Add + Relu, Sigmoid + Mul (SiLU),
//! Div + Erf + Add + Mul + Mul (the exact GELU as PyTorch exports it) — the
//! kernels a native network of the same layers runs. A pass that taps a value inside a fused step plans its nodes
//! again with that value [`Output::Tapped`] ([`run_tapped`]).

use std::any::Any;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::attrs::NodeInfo;
use super::meta::{Cost, Meta};
use super::ops::{self, Op};
use super::value::Value;
use super::Step;
use crate::nn::plan::{self, Fused, Fusion, Kind, Layer, Output};
use crate::Result;

/// One node of a fused step: its op, where its inputs sit among the step's, which of them is the data the step
/// carries from the node before (`None` among the step's inputs, except for the first node), which read the output
/// of an earlier node of the step other than the one before (`inner`: input position and node; `None` among the
/// step's inputs too), and its output slot.
#[derive(Debug)]
struct Member {
    info: NodeInfo,
    op: Arc<dyn Op>,
    inputs: Range<usize>,
    data: usize,
    inner: Vec<(usize, usize)>,
    output: usize,
}

/// The op of a fused step: its nodes, run as the plan says, and what the plan saw of each node's output
/// (`outputs`, so that a pass tapping inside it plans its nodes again with the same outputs, those tapped aside).
#[derive(Debug)]
pub(super) struct Planned {
    fused: Fused,
    members: Vec<Member>,
    outputs: Vec<Output>,
}

impl Planned {
    /// Member `k` as the planner's [`Layer`], from the step's inputs (its data input left out) and the outputs of
    /// earlier members it reads (`done`, by member); `None` where it reads a value inside the step that `done` does
    /// not hold (a SiLU's Mul, both of whose operands the step computes: the step's kind says what it does).
    fn describe(&self, k: usize, ins: &[Option<&Value>], done: &[Option<&Value>]) -> Result<Option<Layer>> {
        let m = &self.members[k];
        if m.inner.iter().any(|&(_, from)| done.get(from).copied().flatten().is_none()) {
            return Ok(None);
        }
        m.op.describe(&m.info, &self.inputs(k, ins, None, done)).map(Some)
    }

    /// Member `k`'s inputs, its data input replaced by `data` and those it reads from earlier members by their
    /// outputs in `done` (by member; `None` where not there).
    fn inputs<'a, A>(
        &self,
        k: usize,
        ins: &[Option<&'a A>],
        data: Option<&'a A>,
        done: &[Option<&'a A>],
    ) -> Vec<Option<&'a A>> {
        let m = &self.members[k];
        let mut own: Vec<Option<&A>> = ins.get(m.inputs.clone()).unwrap_or_default().to_vec();
        if let Some(d) = own.get_mut(m.data) {
            *d = data;
        }
        for &(at, from) in &m.inner {
            if let Some(slot) = own.get_mut(at) {
                *slot = done.get(from).copied().flatten();
            }
        }
        own
    }

    /// Runs members `layers` as the fused step `fused` on the data `x`, given the outputs of earlier members
    /// computed so far (`done`).
    fn run_fused(
        &self,
        fused: Fused,
        layers: Range<usize>,
        x: &Value,
        ins: &[Option<&Value>],
        done: &[Option<&Value>],
    ) -> Result<Value> {
        let mut described = Vec::with_capacity(layers.len());
        for k in layers {
            described.extend(self.describe(k, ins, done)?);
        }
        Ok(Value::F(fused.run(&x.to_tensor()?, &described)?))
    }

    /// The first member's data input.
    fn data<'a>(&self, info: &NodeInfo, ins: &[Option<&'a Value>]) -> Result<&'a Value> {
        let m = &self.members[0];
        ops::input(info, ins, m.inputs.start + m.data)
    }
}

impl Op for Planned {
    /// The last node's output, with every node's scratch and the largest value it skips counted as held (the
    /// fused kernels hold less).
    fn infer(&self, _: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let mut metas: Vec<Option<Meta>> = Vec::with_capacity(self.members.len());
        let (mut scratch, mut skipped) = (0, 0);
        for (k, m) in self.members.iter().enumerate() {
            let cost = {
                let done: Vec<Option<&Meta>> = metas.iter().map(Option::as_ref).collect();
                let chain = done.last().copied().flatten();
                let data = if k == 0 { ins.get(m.inputs.start + m.data).copied().flatten() } else { chain };
                ops::infer(&*m.op, &m.info, &self.inputs(k, ins, data, &done))?
            };
            scratch += cost.scratch;
            if k + 1 < self.members.len() {
                skipped = skipped.max(cost.outputs.iter().map(Meta::bytes).sum::<u128>());
            }
            metas.push(cost.outputs.into_iter().next());
        }
        let out = metas.pop().flatten().ok_or_else(|| super::malformed("a fused step computes no output"))?;
        Ok(Cost { outputs: vec![out], scratch: scratch + skipped })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        Ok(vec![self.run_fused(self.fused, 0..self.members.len(), self.data(info, ins)?, ins, &[])?])
    }
}

/// Plans `steps` and replaces every planned run of several nodes by one step running them as a [`Planned`] op;
/// `unfused` keeps the steps it replaced (their outputs stay taps). A step whose data — its first input, or either
/// operand of a sum or product — does not come from the graph's input (`input_slot`) is not a layer (a product of
/// parameters, which the load-time checks size on its own) and is not planned as one.
pub(super) fn fuse(steps: &mut Vec<Step>, output_slot: usize, input_slot: usize) {
    let mut from_input = std::collections::HashSet::from([input_slot]);
    for s in steps.iter() {
        if s.inputs.iter().flatten().any(|slot| from_input.contains(slot)) {
            from_input.extend(s.outputs.iter().copied());
        }
    }
    let mut readers: HashMap<usize, usize> = HashMap::new();
    for s in steps.iter() {
        for &slot in s.inputs.iter().flatten() {
            *readers.entry(slot).or_default() += 1;
        }
    }
    // Where step i + 1 reads step i's output as its data input, when nothing else needs that output.
    let link = |i: usize| -> Option<usize> {
        let (s, next) = (&steps[i], steps.get(i + 1)?);
        let &[out] = s.outputs.as_slice() else { return None };
        if out == output_slot || readers.get(&out) != Some(&1) {
            return None;
        }
        let at = next.inputs.iter().position(|&slot| slot == Some(out))?;
        carries_at(next.op.kind(), at).then_some(at)
    };
    let once: Vec<Option<usize>> = (0..steps.len()).map(link).collect();
    // Where step i + 1 reads step i's output as its data input and step i + 2 reads it beside step i + 1's output
    // (linked to it): x·σ(x), when nothing else needs that output.
    let twice = |i: usize| -> Option<usize> {
        let (s, next, then) = (&steps[i], steps.get(i + 1)?, steps.get(i + 2)?);
        let &[out] = s.outputs.as_slice() else { return None };
        let carried = once[i + 1]?;
        if out == output_slot || readers.get(&out) != Some(&2) || next.inputs.len() != 1 {
            return None;
        }
        let other = then.inputs.iter().enumerate().any(|(j, &slot)| j != carried && slot == Some(out));
        (next.inputs[0] == Some(out) && other).then_some(0)
    };
    let links: Vec<Option<(usize, Output)>> = (0..steps.len())
        .map(|i| match once[i] {
            Some(at) => Some((at, Output::Open)),
            None => twice(i).map(|at| (at, Output::Twice)),
        })
        .collect();
    let carries = |s: &Step| {
        let kind = s.op.kind();
        s.inputs
            .iter()
            .enumerate()
            .any(|(at, slot)| carries_at(kind, at) && slot.is_some_and(|x| from_input.contains(&x)))
    };
    let kinds: Vec<Kind> = steps.iter().map(|s| if carries(s) { s.op.kind() } else { Kind::Opaque }).collect();
    let outputs: Vec<Output> = links.iter().map(|l| l.map_or(Output::Kept, |(_, o)| o)).collect();
    let mut rest = std::mem::take(steps).into_iter();
    for p in plan::plan(&kinds, &outputs, false) {
        let nodes: Vec<Step> = rest.by_ref().take(p.len).collect();
        if p.fused == Fused::Single {
            steps.extend(nodes);
            continue;
        }
        let (mut inputs, mut members) = (Vec::new(), Vec::with_capacity(nodes.len()));
        for (k, s) in nodes.iter().enumerate() {
            let data = if k == 0 { 0 } else { links[p.start + k - 1].expect("the plan runs only through links").0 };
            // Inputs that are the outputs of earlier nodes of the step, other than the data.
            let inner: Vec<(usize, usize)> = (0..s.inputs.len())
                .filter(|&j| k > 0 && j != data)
                .filter_map(|j| {
                    let slot = s.inputs[j]?;
                    Some((j, nodes[..k].iter().position(|n| n.outputs == [slot])?))
                })
                .collect();
            let start = inputs.len();
            inputs.extend(s.inputs.iter().enumerate().map(|(j, &slot)| {
                let internal = k > 0 && j == data || inner.iter().any(|&(at, _)| at == j);
                if internal {
                    None
                } else {
                    slot
                }
            }));
            let output = s.outputs.first().copied().expect("a linked step has one output");
            let (info, op, inputs) = (s.info.clone(), s.op.clone(), start..inputs.len());
            members.push(Member { info, op, inputs, data, inner, output });
        }
        let (first, last) = (&nodes[0], &nodes[nodes.len() - 1]);
        let outputs = outputs[p.layers()].to_vec();
        steps.push(Step {
            info: first.info.clone(),
            op: Arc::new(Planned { fused: p.fused, members, outputs }),
            inputs,
            outputs: last.outputs.clone(),
            free: Vec::new(),
            unfused: nodes,
        });
    }
}

/// Whether input `at` of a step of `kind` is data a fused step may carry: the first input, or either operand of a
/// sum or a product (`Add(bias, x·W)`, as PyTorch exports a linear layer on more than two axes).
fn carries_at(kind: Kind, at: usize) -> bool {
    at == 0 || matches!(kind, Kind::Add | Kind::Mul)
}

fn planned(step: &Step) -> Option<&Planned> {
    (&*step.op as &dyn Any).downcast_ref::<Planned>()
}

/// The step by the names of its nodes, as the plan runs it.
pub(super) fn fusion(step: &Step) -> Fusion {
    match planned(step) {
        Some(p) => Fusion { fused: p.fused, layers: p.members.iter().map(|m| m.info.name.clone()).collect() },
        None => Fusion { fused: Fused::Single, layers: vec![step.info.name.clone()] },
    }
}

/// The step's operator types, joined by `+` for a fused step (`Conv+BatchNormalization+Relu`), as
/// [`crate::profile`] names it.
pub(super) fn label(step: &Step) -> String {
    match planned(step) {
        Some(p) => p.members.iter().map(|m| m.info.op.as_str()).collect::<Vec<_>>().join("+"),
        None => step.info.op.clone(),
    }
}

/// Whether a pass tapping `taps` must plan `step` again: a value inside it is tapped.
pub(super) fn tapped_inside(step: &Step, taps: &[usize]) -> bool {
    planned(step).is_some_and(|p| p.members.iter().rev().skip(1).any(|m| taps.contains(&m.output)))
}

/// Runs a fused step with the values in `taps` that it would skip handed out ([`Output::Tapped`]: the plan ends
/// a step at each, and a tapped BatchNorm runs itself); `keep` receives each. Returns the step's outputs.
pub(super) fn run_tapped(
    step: &Step,
    ins: &[Option<&Value>],
    taps: &[usize],
    keep: &mut impl FnMut(usize, &Value) -> Result<()>,
) -> Result<Vec<Value>> {
    let Some(p) = planned(step) else {
        return step.op.run(&step.info, ins);
    };
    let n = p.members.len();
    let kinds: Vec<Kind> = p.members.iter().map(|m| m.op.kind()).collect();
    let outputs: Vec<Output> = (0..n)
        .map(|k| match k {
            _ if taps.contains(&p.members[k].output) => Output::Tapped,
            _ if k + 1 == n => Output::Kept,
            _ => p.outputs.get(k).copied().unwrap_or(Output::Kept),
        })
        .collect();
    // The outputs handed out so far, by member: a later member may read one beside its data (x·σ(x)).
    let mut done: Vec<Option<Value>> = vec![None; n];
    let mut h = p.data(&step.info, ins)?.clone();
    for s in plan::plan(&kinds, &outputs, false) {
        let before: Vec<Option<&Value>> = done.iter().map(Option::as_ref).collect();
        h = match s.fused {
            Fused::Single => {
                let m = &p.members[s.start];
                let outs = m.op.run(&m.info, &p.inputs(s.start, ins, Some(&h), &before))?;
                outs.into_iter().next().ok_or_else(|| m.info.malformed("computed no output"))?
            }
            fused => p.run_fused(fused, s.layers(), &h, ins, &before)?,
        };
        if s.last() + 1 < n {
            keep(p.members[s.last()].output, &h)?;
            done[s.last()] = Some(h.clone());
        }
    }
    Ok(vec![h])
}
