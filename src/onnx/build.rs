//! Loading: an ONNX graph proto becomes a [`Graph`] ready to run — initialisers decoded, nodes compiled and
//! constant-folded within the memory budget, planned by the fuser, slots scheduled and freed after
//! their last reader, and the memory a forward pass needs estimated by shape inference.

use std::collections::HashMap;

use std::sync::Arc;

use super::attrs::NodeInfo;
use super::meta::{Arg, Meta};
use super::ops::{self, InputRole, Op};
use super::proto::{self, DimensionValue, ModelProto, ValueInfoProto};
use super::value::{decode_tensor, Value};
use super::{check_node, fuse, malformed, Graph, LoadOptions, MemoryEstimate, Source, Step};
use crate::nn::Param;
use crate::{Error, Result};

/// A node parsed: who it is and its operator.
type Compiled = (NodeInfo, Arc<dyn Op>);

fn dims(v: &ValueInfoProto) -> Vec<Option<usize>> {
    let Some(shape) = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).and_then(|t| t.shape.as_ref()) else {
        return Vec::new();
    };
    shape
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(DimensionValue::DimValue(n)) if *n > 0 => Some(*n as usize),
            _ => None,
        })
        .collect()
}

/// The initialisers as decoded: slot names, folded constants, trainable parameters and their slots.
struct Initialisers {
    /// Every named value's slot, initialisers first.
    names: HashMap<String, usize>,
    /// Constant values by slot.
    consts: HashMap<usize, Value>,
    /// Parameters and buffers, by initialiser name.
    params: Vec<(String, Param)>,
    /// (slot, index into `params`) for every parameter.
    param_slots: Vec<(usize, usize)>,
}

/// What each initialiser feeds decides what it becomes: data, buffer or constant.
fn initialiser_roles<'a>(graph: &'a proto::GraphProto, compiled: &[Compiled]) -> HashMap<&'a str, InputRole> {
    let mut role: HashMap<&str, InputRole> = HashMap::new();
    for (node, (_, op)) in graph.node.iter().zip(compiled) {
        for (i, name) in node.input.iter().enumerate() {
            let r = op.input_role(i);
            let e = role.entry(name.as_str()).or_insert(r);
            if r == InputRole::Data || (r == InputRole::Buffer && *e == InputRole::Constant) {
                *e = r;
            }
        }
    }
    role
}

/// Decodes the initialisers into parameters, buffers and constants, each given a slot.
fn load_initialisers(graph: &proto::GraphProto, compiled: &[Compiled]) -> Result<Initialisers> {
    let role = initialiser_roles(graph, compiled);
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut consts: HashMap<usize, Value> = HashMap::new();
    let mut params = Vec::new();
    let mut param_slots = Vec::new();
    for t in &graph.initializer {
        if t.name.is_empty() || names.contains_key(&t.name) {
            return Err(malformed(format!("initialiser with an empty or repeated name '{}'", t.name)));
        }
        let slot = names.len();
        names.insert(t.name.clone(), slot);
        match (decode_tensor(t, &t.name)?, role.get(t.name.as_str())) {
            (Value::F(v), Some(r @ (InputRole::Data | InputRole::Buffer))) => {
                if !v.all_finite() {
                    return Err(malformed(format!("initialiser '{}' holds NaN or infinite values", t.name)));
                }
                let value = v.value().clone();
                let p = if *r == InputRole::Data { Param::new(value) } else { Param::buffer(value) };
                param_slots.push((slot, params.len()));
                params.push((t.name.clone(), p));
            }
            (v, _) => {
                consts.insert(slot, v);
            }
        }
    }
    Ok(Initialisers { names, consts, params, param_slots })
}

/// Compiles the nodes into steps, giving each output a slot and folding those whose inputs are all constant.
fn compile_nodes(
    graph: &proto::GraphProto,
    compiled: Vec<Compiled>,
    names: &mut HashMap<String, usize>,
    consts: &mut HashMap<usize, Value>,
    max_memory: u64,
) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    for (node, (info, op)) in graph.node.iter().zip(compiled) {
        let mut inputs = Vec::with_capacity(node.input.len());
        for name in &node.input {
            if name.is_empty() {
                inputs.push(None);
                continue;
            }
            let slot = names.get(name).ok_or_else(|| {
                info.malformed(format!(
                    "input '{name}' is neither a graph input, an initialiser nor an earlier node's output"
                ))
            })?;
            inputs.push(Some(*slot));
        }
        let mut outputs = Vec::with_capacity(node.output.len());
        for o in node.output.iter().filter(|o| !o.is_empty()) {
            // A name defined twice would give two values one slot (or an out-of-range slot).
            if names.contains_key(o) {
                return Err(info.malformed(format!("output '{o}' is already defined earlier in the graph")));
            }
            outputs.push(names.len());
            names.insert(o.clone(), names.len());
        }
        let foldable = inputs.iter().flatten().all(|s| consts.contains_key(s));
        if foldable {
            let ins: Vec<Option<&Value>> = inputs.iter().map(|i| i.and_then(|i| consts.get(&i))).collect();
            // Folding allocates too: a small file can ask for a huge constant ([100000,1]·[1,100000]).
            let metas: Vec<Option<Meta>> = ins.iter().map(|v| v.map(|v| Meta::Known(v.clone()))).collect();
            let refs: Vec<Option<&Meta>> = metas.iter().map(Option::as_ref).collect();
            let cost = ops::infer(&*op, &info, &refs)?;
            check_node(&info, "constant folding", cost.bytes(), 0, max_memory)?;
            let outs = op.run(&info, &ins)?;
            let done: Vec<(usize, Value)> = outputs.iter().copied().zip(outs).collect();
            consts.extend(done);
        } else {
            steps.push(Step { info, op, inputs, outputs, free: Vec::new(), unfused: Vec::new() });
        }
    }
    Ok(steps)
}

/// The tappable values: the input, then what the steps (and the steps a fused one stands for) compute.
fn tap_list(
    names: &HashMap<String, usize>,
    steps: &[Step],
    input_name: &str,
    input_slot: usize,
) -> Vec<(String, usize)> {
    let slot_names: HashMap<usize, &str> = names.iter().map(|(n, &s)| (s, n.as_str())).collect();
    let mut taps = vec![(input_name.to_string(), input_slot)];
    for step in steps {
        let parts = if step.unfused.is_empty() { std::slice::from_ref(step) } else { &step.unfused[..] };
        for &slot in parts.iter().flat_map(|s| &s.outputs) {
            if let Some(name) = slot_names.get(&slot) {
                taps.push((name.to_string(), slot));
            }
        }
    }
    taps
}

/// Frees every slot after its last reader; returns the constants and parameters that some step reads.
fn schedule(
    steps: &mut [Step],
    output_slot: usize,
    param_slots: Vec<(usize, usize)>,
    consts: HashMap<usize, Value>,
) -> Vec<(usize, Source)> {
    let mut last: HashMap<usize, usize> = HashMap::new();
    for (i, s) in steps.iter().enumerate() {
        for &slot in s.inputs.iter().flatten() {
            last.insert(slot, i);
        }
    }
    for (&slot, &i) in &last {
        if slot != output_slot {
            steps[i].free.push(slot);
        }
    }
    let mut sources: Vec<(usize, Source)> = param_slots
        .into_iter()
        .filter(|(s, _)| last.contains_key(s) || *s == output_slot)
        .map(|(s, p)| (s, Source::Param(p)))
        .collect();
    sources.extend(consts.into_iter().filter(|(s, _)| last.contains_key(s)).map(|(s, v)| (s, Source::Const(v))));
    sources
}

/// What an input shape decides: the outputs of every step that computes from shapes and constants alone (the
/// `Shape → Gather → Concat → Reshape` arithmetic, masks, `ConstantOfShape`, …), folded to constants.
pub(super) struct Folded {
    /// (slot, value) of every folded step's outputs.
    pub(super) values: Vec<(usize, Value)>,
    /// Per step: whether it is folded (its outputs are in `values`).
    pub(super) folded: Vec<bool>,
}

impl Folded {
    /// Nothing folded: every step runs.
    pub(super) fn none(steps: usize) -> Folded {
        Folded { values: Vec::new(), folded: vec![false; steps] }
    }
}

impl Graph {
    /// Infers every value's shape for an input of `input` and checks each node against `limit`: the values alive
    /// plus what the node allocates. Steps whose inputs are all known (constants and shape arithmetic) are
    /// computed for real, once: their values are the [`Folded`] constants of this input shape.
    pub(super) fn walk(&self, input: Vec<usize>, limit: u64) -> Result<(Folded, MemoryEstimate)> {
        crate::limits::checked_numel("onnx input", &input)?;
        let batch = input.first().copied().unwrap_or(1);
        let mut metas: Vec<Option<Meta>> = vec![None; self.slots];
        for (slot, src) in &self.sources {
            metas[*slot] = Some(match src {
                Source::Param(i) => Meta::Shape { shape: self.params[*i].1.shape(), int: false },
                Source::Const(v) => Meta::Known(v.clone()),
            });
        }
        let first = Meta::Shape { shape: input, int: false };
        let (mut live, mut graph) = (first.bytes(), first.bytes());
        let mut peak = (live, String::from("<input>"));
        metas[self.input_slot] = Some(first);
        let mut folded = Folded::none(self.steps.len());
        let when = format!("a forward pass of batch {batch}");
        for (i, step) in self.steps.iter().enumerate() {
            let refs: Vec<Option<&Meta>> = step.inputs.iter().map(|i| i.and_then(|i| metas[i].as_ref())).collect();
            let cost = ops::infer(&*step.op, &step.info, &refs)?;
            check_node(&step.info, &when, cost.bytes(), live, limit)?;
            if live + cost.bytes() > peak.0 {
                peak = (live + cost.bytes(), step.info.name.clone());
            }
            let known = refs.iter().flatten().all(|m| m.known().is_some());
            let outputs = if known && cost.outputs.iter().any(|m| m.known().is_none()) {
                // Shape arithmetic on known shapes: computed for real (it was checked just above).
                let vals: Vec<Option<&Value>> = refs.iter().map(|m| m.and_then(Arg::known)).collect();
                step.op.run(&step.info, &vals)?.into_iter().map(Meta::Known).collect()
            } else {
                cost.outputs
            };
            if outputs.iter().all(|m| m.known().is_some()) {
                folded.folded[i] = true;
                let values = step.outputs.iter().zip(&outputs).filter_map(|(&s, m)| Some((s, m.known()?.clone())));
                folded.values.extend(values);
            }
            for (&slot, m) in step.outputs.iter().zip(outputs) {
                live += m.bytes();
                graph += m.bytes();
                metas[slot] = Some(m);
            }
            for &slot in &step.free {
                if let Some(m) = metas[slot].take() {
                    live = live.saturating_sub(if self.is_source(slot) { 0 } else { m.bytes() });
                }
            }
        }
        let estimate = MemoryEstimate { batch_size: batch, peak_bytes: peak.0, peak_node: peak.1, graph_bytes: graph };
        Ok((folded, estimate))
    }

    /// [`Graph::walk`] for the batch of [`LoadOptions::batch_size`] (or the file's fixed batch). `None` when an
    /// input dimension after the batch is symbolic (nothing to infer from).
    fn estimate(&self, options: LoadOptions) -> Result<Option<MemoryEstimate>> {
        let dims = &self.input_dims;
        let Some(rest) = dims.get(1..).and_then(|d| d.iter().copied().collect::<Option<Vec<usize>>>()) else {
            return Ok(None);
        };
        // A batch dimension the file fixes is used as it is (it may not even be a batch: a test graph's [4, 2]).
        let batch = dims.first().copied().flatten().unwrap_or(options.batch_size.max(1));
        let mut input = vec![batch];
        input.extend(rest);
        Ok(Some(self.walk(input, options.max_memory)?.1))
    }

    fn is_source(&self, slot: usize) -> bool {
        self.sources.iter().any(|(s, _)| *s == slot)
    }
}

/// Decodes the graph: initialisers into parameters and constants, nodes into steps, constants folded.
pub(super) fn build(model: &ModelProto, options: LoadOptions) -> Result<Graph> {
    let opset = model
        .opset_import
        .iter()
        .filter(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .max()
        .ok_or_else(|| malformed("no opset_import for the default ONNX domain"))?;
    let graph = model.graph.as_ref().ok_or_else(|| malformed("the model has no graph"))?;

    let compiled = graph
        .node
        .iter()
        .map(|node| {
            let info = NodeInfo::new(node, opset);
            ops::compile(node, &info).map(|op| (info, op))
        })
        .collect::<Result<Vec<Compiled>>>()?;
    let Initialisers { mut names, mut consts, params, param_slots } = load_initialisers(graph, &compiled)?;
    let inputs: Vec<&ValueInfoProto> = graph.input.iter().filter(|i| !names.contains_key(&i.name)).collect();
    let [input] = inputs.as_slice() else {
        return Err(Error::UnsupportedOnnx {
            what: format!("a graph with {} data inputs (exactly one image input is supported)", inputs.len()),
            node: graph.name.clone(),
            op: "graph".into(),
            opset,
        });
    };
    let input_slot = names.len();
    names.insert(input.name.clone(), input_slot);
    let output = graph.output.first().ok_or_else(|| malformed("the graph has no output"))?;

    let mut steps = compile_nodes(graph, compiled, &mut names, &mut consts, options.max_memory)?;
    let output_slot =
        *names.get(&output.name).ok_or_else(|| malformed(format!("output '{}' is never computed", output.name)))?;
    if output_slot != input_slot && consts.contains_key(&output_slot) {
        return Err(malformed("the output does not depend on the input"));
    }

    fuse::fuse(&mut steps, output_slot, input_slot);
    let taps = tap_list(&names, &steps, &input.name, input_slot);
    let sources = schedule(&mut steps, output_slot, param_slots, consts);
    let mut g = Graph {
        opset,
        input_name: input.name.clone(),
        input_dims: dims(input),
        output_dims: dims(output),
        params,
        sources,
        slots: names.len(),
        input_slot,
        output_slot,
        steps,
        taps,
        max_memory: options.max_memory,
        estimate: None,
        folds: Default::default(),
    };
    // Over the budget is an error; a graph whose shapes do not work out for the batch size inferred (one that only
    // runs for the batch it was traced with) gets no estimate, and every node is still checked when it runs.
    g.estimate = match g.estimate(options) {
        Ok(e) => e,
        Err(e @ Error::ResourceLimit { .. }) => return Err(e),
        Err(_) => None,
    };
    Ok(g)
}
