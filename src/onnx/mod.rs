//! ONNX import: load an image classifier exported from PyTorch (or any ONNX producer) into the autodiff core,
//! then attack, evaluate, defend or fine-tune it like a native model.
//!
//! [`OnnxModel::load`] reads the protobuf file (no `protoc` involved: the messages are in [`proto`]), checks every
//! node against the operators Armoury implements, folds constant shape arithmetic, fuses Conv → Relu (→ 2×2
//! MaxPool) into one op as the native layers run them, and returns a [`Module`] whose forward pass runs Armoury's
//! own differentiable ops. Float initialisers become [`Param`]s named as in the file —
//! a PyTorch export keeps its `state_dict` names (`conv1.weight`, …), so safetensors files load and save unchanged;
//! BatchNormalization running statistics are buffers; integer initialisers are constants.
//!
//! Supported operators (opsets 11–21, with the attribute forms of older opsets where they differ): Conv (strides,
//! pads, `auto_pad`, dilations, group), Gemm (transA/B, alpha, beta), MatMul, Add, Sub, Mul, Div, Neg, Relu,
//! LeakyRelu, PRelu, Sigmoid, Tanh, Clip, Softmax, LogSoftmax, Exp, Log, Sqrt, Pow (constant scalar exponent),
//! MaxPool, AveragePool (`count_include_pad`), GlobalAveragePool, GlobalMaxPool, BatchNormalization (inference),
//! Flatten, Reshape, Transpose, Concat, Squeeze, Unsqueeze, Gather (constant indices), Slice, Pad (constant, reflect,
//! edge), ReduceMean, ReduceSum, Dropout and Identity (no-ops), Constant, Shape and Cast. Anything else — an
//! operator, an attribute or an attribute value — is an [`Error::UnsupportedOnnx`] naming the node, the operator
//! and the opset; a malformed file is an [`Error::BadFile`].
//!
//! The graph always runs in inference mode: Dropout is the identity and BatchNormalization uses its running
//! statistics, also when a training loop calls `forward_t(x, true)`; fine-tuning updates the weights.
//!
//! ```no_run
//! use armoury::onnx::OnnxModel;
//! use armoury::Classifier;
//! let model = OnnxModel::load("cnn.onnx")?;
//! let clf = model.classifier((0.0, 1.0))?; // shape [1, 28, 28] and 10 classes read from the model
//! let x = armoury::Tensor::zeros(&[1, 1, 28, 28]);
//! let (_loss, grad) = clf.loss_gradient(&x, &[3])?;
//! assert_eq!(grad.shape(), x.shape());
//! # Ok::<(), armoury::Error>(())
//! ```

mod attrs;
mod compile;
mod exec;
mod ints;
mod layers;
pub mod proto;
mod value;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prost::Message;

use self::attrs::NodeInfo;
use self::compile::{compile, input_role, Fused, InputRole, Kind};
use self::proto::{DimensionValue, ModelProto, ValueInfoProto};
use self::value::{decode_tensor, Value};
pub use self::value::{float_tensor, int_tensor};
use crate::classifier::ModuleClassifier;
use crate::nn::{Module, Param};
use crate::ops::UnaryKind;
use crate::tensor::{no_grad, Tensor};
use crate::{Error, Result};

/// One node of the graph, ready to run.
#[derive(Clone)]
struct Step {
    info: NodeInfo,
    kind: Kind,
    inputs: Vec<Option<usize>>,
    outputs: Vec<usize>,
    /// Slots whose last reader is this step: freed after it runs.
    free: Vec<usize>,
    /// For a Conv with a Relu (and a pooling) fused in by [`fuse`]: the original steps, run instead when a
    /// value the fused op skips is tapped.
    unfused: Vec<Step>,
}

/// Where a slot's value comes from before the first node runs.
enum Source {
    Param(usize),
    Const(Value),
}

struct Graph {
    opset: i64,
    input_name: String,
    input_dims: Vec<Option<usize>>,
    output_dims: Vec<Option<usize>>,
    params: Vec<(String, Param)>,
    sources: Vec<(usize, Source)>,
    slots: usize,
    input_slot: usize,
    output_slot: usize,
    steps: Vec<Step>,
    /// The values [`Module::forward_taps`] can return: the input, then every node output computed at run time
    /// (constant-folded ones excluded), in execution order, with their slots.
    taps: Vec<(String, usize)>,
}

/// An imported ONNX graph: a [`Module`] (differentiable, with named parameters) and, with input bounds, a
/// [`crate::Classifier`]. Clones share the graph and the parameters.
#[derive(Clone)]
pub struct OnnxModel(Arc<Graph>);

impl std::fmt::Debug for OnnxModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = &self.0;
        f.debug_struct("OnnxModel")
            .field("opset", &g.opset)
            .field("input", &(&g.input_name, &g.input_dims))
            .field("output", &g.output_dims)
            .field("nodes", &g.steps.len())
            .field("params", &g.params.len())
            .finish()
    }
}

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

impl OnnxModel {
    /// Reads an ONNX model file.
    pub fn load(path: impl AsRef<Path>) -> Result<OnnxModel> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        OnnxModel::parse(&bytes).map_err(|e| match e {
            Error::BadFile { msg, .. } => Error::bad_file(path, msg),
            e => e,
        })
    }

    /// Reads an ONNX model from its serialised bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<OnnxModel> {
        OnnxModel::parse(bytes)
    }

    /// Builds a model from a decoded [`proto::ModelProto`] (e.g. one written by a test).
    pub fn from_proto(model: &ModelProto) -> Result<OnnxModel> {
        build(model).map(|g| OnnxModel(Arc::new(g)))
    }

    fn parse(bytes: &[u8]) -> Result<OnnxModel> {
        let model = ModelProto::decode(bytes)
            .map_err(|e| Error::bad_file("<onnx model>", format!("not a valid ONNX protobuf: {e}")))?;
        OnnxModel::from_proto(&model)
    }

    /// The default-domain opset the model was exported with.
    pub fn opset(&self) -> i64 {
        self.0.opset
    }

    /// The name of the graph's input.
    pub fn input_name(&self) -> &str {
        &self.0.input_name
    }

    /// The input's dimensions as declared in the file (`None` for symbolic ones such as the batch).
    pub fn input_dims(&self) -> &[Option<usize>] {
        &self.0.input_dims
    }

    /// The output's dimensions as declared in the file (`None` for symbolic ones).
    pub fn output_dims(&self) -> &[Option<usize>] {
        &self.0.output_dims
    }

    /// How many nodes run per forward pass (after constant folding).
    pub fn num_nodes(&self) -> usize {
        self.0.steps.len()
    }

    /// The graph as a [`crate::Classifier`] with the given input bounds; the input shape (C, H, W) and the class
    /// count come from the model (the class count from one dummy forward pass if the file leaves it symbolic).
    pub fn classifier(&self, bounds: (f32, f32)) -> Result<ModuleClassifier> {
        let g = &self.0;
        let shape: Option<Vec<usize>> = g.input_dims.iter().skip(1).copied().collect();
        let shape = match shape {
            Some(s) if g.input_dims.len() >= 2 => s,
            _ => {
                return Err(Error::invalid(
                    "OnnxModel::classifier",
                    format!("the model's input shape {:?} is not fixed after the batch axis", g.input_dims),
                ))
            }
        };
        let classes = match g.output_dims.as_slice() {
            [_, Some(c)] => *c,
            _ => {
                let mut s = vec![1];
                s.extend_from_slice(&shape);
                let z = no_grad(|| self.forward_t(&Tensor::zeros(&s), false))?;
                match z.shape() {
                    [1, c] => *c,
                    other => {
                        return Err(Error::invalid(
                            "OnnxModel::classifier",
                            format!("the model's output has shape {other:?} for one input, expected [1, classes]"),
                        ))
                    }
                }
            }
        };
        ModuleClassifier::new(Arc::new(self.clone()) as Arc<dyn Module>, &shape, classes, bounds)
    }

    fn check_input(&self, x: &Tensor) -> Result<()> {
        let want = &self.0.input_dims;
        if want.is_empty() {
            return Ok(());
        }
        if x.rank() != want.len() {
            return Err(Error::RankMismatch {
                op: "onnx input",
                expected: want.len(),
                got: x.rank(),
                shape: x.shape().to_vec(),
            });
        }
        let ok = want.iter().zip(x.shape()).skip(1).all(|(w, &d)| !matches!(w, Some(w) if *w != d));
        if !ok {
            let expected = want.iter().zip(x.shape()).map(|(w, &d)| w.unwrap_or(d)).collect();
            return Err(Error::ShapeMismatch { op: "onnx input", expected, got: x.shape().to_vec() });
        }
        Ok(())
    }

    /// Runs the graph; the values of the slots in `taps` are kept as they are computed (integer values become
    /// constant float tensors).
    fn run(&self, x: &Tensor, taps: &[usize]) -> Result<(Tensor, Vec<Tensor>)> {
        self.check_input(x)?;
        let g = &self.0;
        let mut kept: Vec<Option<Tensor>> = vec![None; taps.len()];
        let mut keep = |slot: usize, v: &Value| -> Result<()> {
            for (k, _) in taps.iter().enumerate().filter(|(_, &t)| t == slot) {
                kept[k] = Some(v.to_tensor()?);
            }
            Ok(())
        };
        let mut slots: Vec<Option<Value>> = vec![None; g.slots];
        for (slot, src) in &g.sources {
            slots[*slot] = Some(match src {
                Source::Param(i) => Value::F(g.params[*i].1.tensor()),
                Source::Const(v) => v.clone(),
            });
        }
        let input = Value::F(x.clone());
        keep(g.input_slot, &input)?;
        slots[g.input_slot] = Some(input);
        for step in &g.steps {
            let ins: Vec<Option<&Value>> = step.inputs.iter().map(|i| i.and_then(|i| slots[i].as_ref())).collect();
            let skipped = step.unfused.iter().take(step.unfused.len().saturating_sub(1));
            let outs = if skipped.flat_map(|s| &s.outputs).any(|o| taps.contains(o)) {
                exec_unfused(step, &ins, taps, &mut keep)?
            } else {
                exec::exec(&step.kind, &step.info, &ins)?
            };
            for (&slot, v) in step.outputs.iter().zip(outs) {
                keep(slot, &v)?;
                slots[slot] = Some(v);
            }
            for &slot in &step.free {
                slots[slot] = None;
            }
        }
        match slots[g.output_slot].take() {
            Some(v) => {
                let kept = kept
                    .into_iter()
                    .map(|t| t.ok_or_else(|| Error::invalid("onnx", "a tapped value was not computed")));
                Ok((v.to_tensor()?, kept.collect::<Result<Vec<_>>>()?))
            }
            None => Err(Error::invalid("onnx", "the graph output was not computed")),
        }
    }
}

/// Runs a fused step as the steps it replaced, keeping the tapped values the fused op skips: the Conv alone when
/// its own output is tapped, else the Conv with its Relu fused and the pooling on its own (the same values: a fused
/// op computes exactly what the separate ones do). Returns the fused step's outputs.
fn exec_unfused(
    step: &Step,
    ins: &[Option<&Value>],
    taps: &[usize],
    keep: &mut impl FnMut(usize, &Value) -> Result<()>,
) -> Result<Vec<Value>> {
    let (Some(conv), Kind::Conv { window, group, .. }) = (step.unfused.first(), &step.kind) else {
        return exec::exec(&step.kind, &step.info, ins);
    };
    let conv_tapped = conv.outputs.iter().any(|o| taps.contains(o));
    let then = if conv_tapped { Fused::Nothing } else { Fused::Relu };
    let kind = Kind::Conv { window: window.clone(), group: *group, then };
    let mut h = exec::exec(&kind, &conv.info, ins)?;
    let from = if conv_tapped { 1 } else { 2 };
    let mut prev = &step.unfused[from - 1];
    for s in step.unfused.iter().skip(from) {
        let (Some(&slot), Some(v)) = (prev.outputs.first(), h.first()) else {
            return Err(Error::invalid("onnx", format!("node '{}' computed no output", prev.info.name)));
        };
        keep(slot, v)?;
        h = exec::exec(&s.kind, &s.info, &[Some(v)])?;
        prev = s;
    }
    Ok(h)
}

impl Module for OnnxModel {
    /// Always inference mode (see the module docs).
    fn mode_independent(&self) -> bool {
        true
    }

    /// Runs the graph (always in inference mode: see the module docs).
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        Ok(self.run(x, &[])?.0)
    }

    /// The graph's input, then the output of every node that runs (a name as in the file, e.g. PyTorch's
    /// `/conv1/Conv_output_0`), in execution order; constant-folded values (shape arithmetic) are not taps.
    fn tap_names(&self) -> Vec<String> {
        self.0.taps.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Any value of [`Module::tap_names`]; a Conv → Relu (→ MaxPool) fused at load time runs unfused in the
    /// passes that tap a value inside it.
    fn forward_taps(&self, x: &Tensor, _train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        let slots = names
            .iter()
            .map(|name| {
                self.0
                    .taps
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|&(_, s)| s)
                    .ok_or_else(|| crate::nn::unknown_layer("OnnxModel::forward_taps", name, &self.tap_names()))
            })
            .collect::<Result<Vec<usize>>>()?;
        self.run(x, &slots)
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        for (name, p) in &self.0.params {
            f(&format!("{prefix}{name}"), p);
        }
    }
}

fn malformed(msg: impl Into<String>) -> Error {
    Error::bad_file(PathBuf::from("<onnx model>"), msg)
}

/// Folds a Relu, and a 2×2 max pooling after it, into the Conv step before them where the intermediate values are
/// read by nothing else and are not the graph's output: one op with the same values and gradients
/// ([`Tensor::conv2d_relu_max_pool2`]), as the native layers run.
fn fuse(steps: &mut Vec<Step>, output_slot: usize) {
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
        let Kind::Conv { window, group, .. } = &step.kind else {
            out.push(step);
            continue;
        };
        let (window, group) = (window.clone(), *group);
        let relu = |n: &Step| matches!(n.kind, Kind::Unary(UnaryKind::Relu)) && sole_input(step.outputs[0], n);
        let Some(relu) = rest.next_if(relu) else {
            out.push(step);
            continue;
        };
        let pool = |n: &Step| matches!(&n.kind, Kind::MaxPool(w) if w.is_max_pool2()) && sole_input(relu.outputs[0], n);
        let pool = rest.next_if(pool);
        let then = if pool.is_some() { Fused::ReluMaxPool2 } else { Fused::Relu };
        let mut unfused = vec![step.clone(), relu];
        unfused.extend(pool);
        step.kind = Kind::Conv { window, group, then };
        step.outputs = unfused.last().map(|s| s.outputs.clone()).unwrap_or_default();
        step.unfused = unfused;
        out.push(step);
    }
    *steps = out;
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
fn initialiser_roles(graph: &proto::GraphProto) -> HashMap<&str, InputRole> {
    let mut role: HashMap<&str, InputRole> = HashMap::new();
    for node in &graph.node {
        for (i, name) in node.input.iter().enumerate() {
            let r = input_role(&node.op_type, i);
            let e = role.entry(name.as_str()).or_insert(r);
            if r == InputRole::Data || (r == InputRole::Buffer && *e == InputRole::Constant) {
                *e = r;
            }
        }
    }
    role
}

/// Decodes the initialisers into parameters, buffers and constants, each given a slot.
fn load_initialisers(graph: &proto::GraphProto) -> Result<Initialisers> {
    let role = initialiser_roles(graph);
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
    opset: i64,
    names: &mut HashMap<String, usize>,
    consts: &mut HashMap<usize, Value>,
) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    for node in &graph.node {
        let info = NodeInfo::new(node, opset);
        let kind = compile(node, &info)?;
        let produced = if matches!(kind, Kind::Identity { mask: true }) { 2 } else { 1 };
        if node.output.iter().skip(produced).any(|o| !o.is_empty()) || node.output.is_empty() {
            return Err(info.unsupported(format!("{} outputs", node.output.len())));
        }
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
        let outputs: Vec<usize> = node
            .output
            .iter()
            .filter(|o| !o.is_empty())
            .map(|o| {
                let slot = names.len();
                names.insert(o.clone(), slot);
                slot
            })
            .collect();
        let foldable = inputs.iter().flatten().all(|s| consts.contains_key(s));
        if foldable {
            let ins: Vec<Option<&Value>> = inputs.iter().map(|i| i.and_then(|i| consts.get(&i))).collect();
            let outs = exec::exec(&kind, &info, &ins)?;
            let done: Vec<(usize, Value)> = outputs.iter().copied().zip(outs).collect();
            consts.extend(done);
        } else {
            steps.push(Step { info, kind, inputs, outputs, free: Vec::new(), unfused: Vec::new() });
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

/// Decodes the graph: initialisers into parameters and constants, nodes into steps, constants folded.
fn build(model: &ModelProto) -> Result<Graph> {
    let opset = model
        .opset_import
        .iter()
        .filter(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .max()
        .ok_or_else(|| malformed("no opset_import for the default ONNX domain"))?;
    let graph = model.graph.as_ref().ok_or_else(|| malformed("the model has no graph"))?;

    let Initialisers { mut names, mut consts, params, param_slots } = load_initialisers(graph)?;
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

    let mut steps = compile_nodes(graph, opset, &mut names, &mut consts)?;
    let output_slot =
        *names.get(&output.name).ok_or_else(|| malformed(format!("output '{}' is never computed", output.name)))?;
    if output_slot != input_slot && consts.contains_key(&output_slot) {
        return Err(malformed("the output does not depend on the input"));
    }

    fuse(&mut steps, output_slot);
    let taps = tap_list(&names, &steps, &input.name, input_slot);
    let sources = schedule(&mut steps, output_slot, param_slots, consts);
    Ok(Graph {
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
    })
}
