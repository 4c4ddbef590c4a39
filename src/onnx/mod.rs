//! ONNX import: load an image classifier exported from PyTorch (or any ONNX producer) into the autodiff core,
//! then attack, evaluate, defend or fine-tune it like a native model.
//!
//! [`OnnxModel::load`] reads the protobuf file (no `protoc` involved: the messages are in [`proto`]), checks every
//! node against the operators Armoury implements, folds constants, plans the nodes with the same fuser as a
//! native [`crate::Sequential`] ([`crate::nn::plan`]: BatchNorm folded into the Conv before it, Conv + Relu (+ 2×2
//! MaxPool), Add + Relu; [`OnnxModel::plan`] shows it), so the kernels are those of the same network built
//! natively, and returns a [`Module`] whose forward pass runs Armoury's own differentiable ops. Float
//! initialisers become [`Param`]s named as in the file —
//! a PyTorch export keeps its `state_dict` names (`conv1.weight`, …), so safetensors files load and save unchanged;
//! BatchNormalization running statistics are buffers; integer initialisers are constants.
//!
//! Supported operators (opsets 11–21, with the attribute forms of older opsets where they differ): Conv (strides,
//! pads, `auto_pad`, dilations, group), Gemm (transA/B, alpha, beta), MatMul, Einsum (no diagonals), Add, Sub, Mul,
//! Div, Neg, Relu, LeakyRelu, PRelu, Sigmoid, Tanh, Erf, Gelu (`approximate`), HardSigmoid, HardSwish, Clip,
//! Softmax, LogSoftmax (any axis; the 2-D form before opset 13), Exp, Log, Sqrt, Pow (constant scalar exponent),
//! MaxPool, AveragePool (`count_include_pad`), GlobalAveragePool, GlobalMaxPool, BatchNormalization (inference),
//! LayerNormalization (with its Mean and InvStdDev outputs), Flatten, Reshape, Transpose, Concat, Split (sizes as
//! attribute, input or `num_outputs`), Squeeze, Unsqueeze, Gather (constant indices), Slice, Pad (constant,
//! reflect, edge), ReduceMean, ReduceSum, Dropout and Identity (no-ops), Constant, Shape and Cast; and the
//! shape-path operators ConstantOfShape, Equal, Expand, Mod (`fmod`), Range, Where, Not and ScatterND (reduction
//! `none`), of which Expand, Where, ScatterND and Mod (of floats) are differentiable where they sit on the data
//! path. Anything else — an operator, an attribute or an attribute value — is an [`Error::UnsupportedOnnx`] naming
//! the node, the operator and the opset; a malformed file is an [`Error::BadFile`].
//!
//! The graph always runs in inference mode: Dropout is the identity and BatchNormalization uses its running
//! statistics, also when a training loop calls `forward_t(x, true)`; fine-tuning updates the weights.
//!
//! # Layout
//!
//! An operator lives in one place: its family's file under `src/onnx/ops/` (`conv.rs`, `pool.rs`, `matmul.rs`,
//! `einsum.rs`, `binary.rs`, `unary.rs`, `norm.rs`, `softmax.rs`, `reshape.rs`, `concat.rs`, `split.rs`,
//! `gather.rs`, `slice.rs`, `pad.rs`, `reduce.rs`, `constant.rs`, `identity.rs`, `logic.rs`) holds its attribute
//! parsing, the role of each input, its shape rule and its execution, as one type implementing the `Op` trait
//! (`ops/mod.rs`); the `OPS` table there maps each ONNX operator name to its parser. A shape rule is a method generic over `Arg`, so the one function serves
//! shape inference at load (on `Meta`: shapes, or values for shape arithmetic) and execution (on the values).
//! Around the operators: `attrs.rs` reads attributes (an attribute nobody reads is an error), `value.rs` and
//! `ints.rs` hold the values (f32 tensors and i64 shape arithmetic), `meta.rs` what is known before computing,
//! `build.rs` loads, folds and schedules, `fuse.rs` plans the steps with the fuser (an `Op` says what it is to the
//! planner with `kind` and `describe`) and `mod.rs` runs the graph.
//!
//! # Folding
//!
//! Nodes whose inputs are all constants are computed once at load. What the input's shape decides — the
//! `Shape → Gather → Concat → Reshape` arithmetic, masks from Equal/Not/Where, ConstantOfShape, Range — is folded
//! per input shape: the first forward pass on a new shape walks the graph with shape inference (the same walk that
//! estimates memory at load), computes every node whose inputs are then known, and keeps those values for that
//! shape ([`OnnxModel::num_nodes_for`] counts what still runs); the last eight shapes are kept, as the batch size
//! varies (full chunks and a remainder). A shape for which the walk fails folds nothing, and every node runs and
//! is checked as it runs.
//!
//! # Adding an operator
//!
//! 1. In its family's file in `src/onnx/ops/` (a new file, declared with `mod` in `ops/mod.rs`, for a new
//!    family): a struct with the parsed attributes; a `fn name(a: &Attrs) -> Result<Arc<dyn Op>>` that reads every
//!    attribute it understands (`a.int`, `a.ints`, `a.float`, …; `a.ignore` for harmless ones) and rejects
//!    unsupported values with `a.info.unsupported(..)`; and `impl Op`: `infer` (output shapes and scratch bytes;
//!    every check that needs no data), `run` (the core's differentiable [`Tensor`] ops, so attacks get gradients;
//!    [`Value::I`] for integer shape arithmetic), `input_role` when an input is a shape, axis or bound
//!    (`data_then_constants`) or a buffer, and `outputs` when it has more than one. Put the shape rule in one
//!    method generic over `Arg` and call it from both `infer` and `run`.
//! 2. One entry `("OnnxName", file::name)` in `OPS` in `src/onnx/ops/mod.rs`.
//! 3. A test in `tests/onnx/ops*.rs`: a graph written with `tests/onnx/build.rs` (`Graph::new(opset, dims)`,
//!    `.node(node(..))`), its outputs checked against values worked out by hand or by an independent computation,
//!    at each opset where the operator's form differs; `check` in `tests/onnx/ops.rs` compares the forward pass
//!    and checks autodiff against central finite differences for the input and every trainable initialiser.
//!    Shape arithmetic is checked through the op it feeds (e.g. a `Reshape` whose target it computes).
//!
//! The list of supported operators above and in docs/architecture.md names it too.
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
mod build;
mod fuse;
mod ints;
mod meta;
mod ops;
pub mod proto;
mod value;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use prost::Message;

use self::attrs::NodeInfo;
use self::build::Folded;
use self::meta::{Arg, Meta};
use self::ops::Op;
use self::proto::ModelProto;
use self::value::Value;
pub use self::value::{float_tensor, int_tensor};
use crate::classifier::ModuleClassifier;
use crate::nn::{Module, Param};
use crate::tensor::{no_grad, Tensor};
use crate::{Error, Result};

/// One node of the graph, ready to run.
#[derive(Clone)]
struct Step {
    info: NodeInfo,
    op: Arc<dyn Op>,
    inputs: Vec<Option<usize>>,
    outputs: Vec<usize>,
    /// Slots whose last reader is this step: freed after it runs.
    free: Vec<usize>,
    /// For a step the fuser made of several nodes ([`fuse`]): those nodes, whose outputs stay taps.
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
    /// The memory budget every forward pass is checked against, node by node, before the node runs.
    max_memory: u64,
    /// What shape inference found at load, when the input shape is fixed after the batch axis.
    estimate: Option<MemoryEstimate>,
    /// The steps folded for each input shape seen, the most recent last (at most [`FOLDS_KEPT`]).
    folds: Mutex<Vec<(Vec<usize>, Arc<Folded>)>>,
}

/// How many input shapes keep their folded constants (a classifier runs full chunks and one remainder).
const FOLDS_KEPT: usize = 8;

/// How an ONNX model is loaded: the memory budget its execution must fit and the batch size it is checked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Bytes a forward pass may hold at once (the values alive plus what a node allocates); default
    /// [`crate::limits::max_memory`].
    pub max_memory: u64,
    /// The batch size shape inference checks at load when the file leaves the batch dimension symbolic (default
    /// [`crate::classifier::CHUNK`], the pieces a classifier runs a batch in). Larger batches are still checked
    /// node by node when they run.
    pub batch_size: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { max_memory: crate::limits::max_memory(), batch_size: crate::classifier::CHUNK }
    }
}

/// The memory a forward pass of an imported model needs for one batch size, from shape inference at load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// The batch size.
    pub batch_size: usize,
    /// The most a forward pass holds at once, in bytes: values alive plus the running node's outputs and scratch.
    pub peak_bytes: u128,
    /// The node at that peak.
    pub peak_node: String,
    /// Every intermediate value together, in bytes: what a pass that records a graph for gradients keeps.
    pub graph_bytes: u128,
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

impl OnnxModel {
    /// Reads an ONNX model file with the default [`LoadOptions`].
    pub fn load(path: impl AsRef<Path>) -> Result<OnnxModel> {
        OnnxModel::load_with(path, LoadOptions::default())
    }

    /// Reads an ONNX model file; every intermediate value for `options.batch_size` must fit
    /// `options.max_memory` ([`Error::ResourceLimit`] naming the node otherwise), and so must constant folding.
    pub fn load_with(path: impl AsRef<Path>, options: LoadOptions) -> Result<OnnxModel> {
        let path = path.as_ref();
        let len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
        crate::limits::check_bytes(|| format!("reading {}", path.display()), len.into(), options.max_memory)?;
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        OnnxModel::parse(&bytes, options).map_err(|e| match e {
            Error::BadFile { msg, .. } => Error::bad_file(path, msg),
            e => e,
        })
    }

    /// Reads an ONNX model from its serialised bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<OnnxModel> {
        OnnxModel::parse(bytes, LoadOptions::default())
    }

    /// [`OnnxModel::from_bytes`] with explicit [`LoadOptions`].
    pub fn from_bytes_with(bytes: &[u8], options: LoadOptions) -> Result<OnnxModel> {
        OnnxModel::parse(bytes, options)
    }

    /// Builds a model from a decoded [`proto::ModelProto`] (e.g. one written by a test).
    pub fn from_proto(model: &ModelProto) -> Result<OnnxModel> {
        OnnxModel::from_proto_with(model, LoadOptions::default())
    }

    /// [`OnnxModel::from_proto`] with explicit [`LoadOptions`].
    pub fn from_proto_with(model: &ModelProto, options: LoadOptions) -> Result<OnnxModel> {
        build::build(model, options).map(|g| OnnxModel(Arc::new(g)))
    }

    fn parse(bytes: &[u8], options: LoadOptions) -> Result<OnnxModel> {
        let model = ModelProto::decode(bytes)
            .map_err(|e| Error::bad_file("<onnx model>", format!("not a valid ONNX protobuf: {e}")))?;
        OnnxModel::from_proto_with(&model, options)
    }

    /// What shape inference found at load for [`LoadOptions::batch_size`]; `None` when the file leaves a
    /// dimension after the batch axis symbolic or the graph's shapes only work out for other batch sizes (every
    /// node is still checked before it runs).
    pub fn memory_estimate(&self) -> Option<&MemoryEstimate> {
        self.0.estimate.as_ref()
    }

    /// The memory budget forward passes are checked against.
    pub fn max_memory(&self) -> u64 {
        self.0.max_memory
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

    /// How many steps run per forward pass (after folding the constants of the file; a fused step counts once).
    pub fn num_nodes(&self) -> usize {
        self.0.steps.len()
    }

    /// How many nodes run per forward pass on an input of `input_shape`, after folding what that shape decides
    /// (shape arithmetic, masks, constants of a computed shape).
    pub fn num_nodes_for(&self, input_shape: &[usize]) -> usize {
        self.folded(input_shape).folded.iter().filter(|&&f| !f).count()
    }

    /// The steps folded for an input of `shape`, worked out on first use and kept for [`FOLDS_KEPT`] shapes.
    /// When shape inference fails for this shape (a shape the graph refuses, or a shape input computed from the
    /// data), nothing is folded: every node runs and is checked as it runs.
    fn folded(&self, shape: &[usize]) -> Arc<Folded> {
        let g = &self.0;
        let mut folds = g.folds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = folds.iter().position(|(s, _)| s == shape) {
            let hit = folds.remove(i);
            folds.push(hit.clone());
            return hit.1;
        }
        let walked = g.walk(shape.to_vec(), g.max_memory).map(|(f, _)| f);
        let f = Arc::new(walked.unwrap_or_else(|_| Folded::none(g.steps.len())));
        if folds.len() >= FOLDS_KEPT {
            folds.remove(0);
        }
        folds.push((shape.to_vec(), f.clone()));
        f
    }

    /// The fuser's plan ([`crate::nn::plan`]) for a pass that taps nothing: every step that runs, by the names of
    /// its nodes (a node without a name by its first output: `<output NAME>`), and how it runs them. A pass that
    /// taps a value inside a fused step runs that step as the plan with the value tapped says.
    pub fn plan(&self) -> Vec<crate::nn::plan::Fusion> {
        self.0.steps.iter().map(fuse::fusion).collect()
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
            [_, Some(c)] => {
                crate::limits::check_classes("OnnxModel::classifier: the declared output dimension", *c)?;
                *c
            }
            _ => {
                let mut s = vec![1];
                s.extend_from_slice(&shape);
                let bytes = crate::limits::f32_bytes("OnnxModel::classifier: the input", &s)?;
                crate::limits::check_bytes(
                    || format!("OnnxModel::classifier: an input of {s:?}"),
                    bytes,
                    g.max_memory,
                )?;
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
        let mut budget = RunBudget::new(g, x);
        let folded = self.folded(x.shape());
        for (slot, v) in &folded.values {
            keep(*slot, v)?;
            budget.add(*slot, v);
            slots[*slot] = Some(v.clone());
        }
        for (step, &skip) in g.steps.iter().zip(&folded.folded) {
            if !skip {
                let ins: Vec<Option<&Value>> = step.inputs.iter().map(|i| i.and_then(|i| slots[i].as_ref())).collect();
                let inferred = budget.check(step, &ins)?;
                let outs = crate::profile::time(
                    crate::profile::Phase::Forward,
                    || (fuse::label(step), ins.first().copied().flatten().map_or(Vec::new(), |v| v.shape().to_vec())),
                    |outs: &Result<Vec<Value>>| {
                        outs.as_ref().ok().and_then(|o| o.first()).map_or(Vec::new(), |v| v.shape().to_vec())
                    },
                    || {
                        if fuse::tapped_inside(step, taps) {
                            fuse::run_tapped(step, &ins, taps, &mut keep)
                        } else {
                            step.op.run(&step.info, &ins)
                        }
                    },
                )?;
                debug_assert!(
                    outs.iter().map(Value::shape).eq(inferred.iter().map(Vec::as_slice)),
                    "node '{}': shape inference said {inferred:?}",
                    step.info.name
                );
                for (&slot, v) in step.outputs.iter().zip(outs) {
                    keep(slot, &v)?;
                    budget.add(slot, &v);
                    slots[slot] = Some(v);
                }
            }
            for &slot in &step.free {
                slots[slot] = None;
                budget.free(slot);
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

/// The memory a forward pass holds, checked before every node against the model's budget: the values alive, or,
/// when a graph is being recorded for gradients, every value computed so far (the graph keeps them).
struct RunBudget {
    sizes: Vec<u128>,
    live: u128,
    recorded: u128,
    recording: bool,
    batch: usize,
    limit: u64,
}

impl RunBudget {
    fn new(g: &Graph, x: &Tensor) -> RunBudget {
        let mut sizes = vec![0; g.slots];
        let bytes = x.numel() as u128 * 4;
        sizes[g.input_slot] = bytes;
        let batch = x.shape().first().copied().unwrap_or(1);
        let recording = crate::tensor::grad_enabled();
        RunBudget { sizes, live: bytes, recorded: bytes, recording, batch, limit: g.max_memory }
    }

    /// Checks `step` on these inputs; returns the output shapes inferred.
    fn check(&self, step: &Step, ins: &[Option<&Value>]) -> Result<Vec<Vec<usize>>> {
        let metas: Vec<Option<Meta>> = ins.iter().map(|v| v.map(|v| Meta::Known(v.clone()))).collect();
        let refs: Vec<Option<&Meta>> = metas.iter().map(Option::as_ref).collect();
        let cost = ops::infer(&*step.op, &step.info, &refs)?;
        let held = if self.recording { self.recorded } else { self.live };
        let when = format!("a forward pass of batch {}{}", self.batch, if self.recording { " (recorded)" } else { "" });
        check_node(&step.info, &when, cost.bytes(), held, self.limit)?;
        Ok(cost.outputs.iter().map(|m| m.shape().to_vec()).collect())
    }

    fn add(&mut self, slot: usize, v: &Value) {
        let b = v.numel() as u128 * if v.is_int() { 8 } else { 4 };
        self.sizes[slot] = b;
        self.live += b;
        self.recorded += b;
    }

    fn free(&mut self, slot: usize) {
        self.live = self.live.saturating_sub(std::mem::take(&mut self.sizes[slot]));
    }
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

    /// Any value of [`Module::tap_names`]; a fused step ends at a tapped value inside it (and a tapped
    /// BatchNorm output runs the BatchNorm itself), as in a native [`crate::Sequential`].
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

/// Refuses a node that needs `bytes` while `held` bytes are alive, beyond `limit`.
fn check_node(info: &NodeInfo, when: &str, bytes: u128, held: u128, limit: u64) -> Result<()> {
    let needed = bytes.saturating_add(held);
    crate::limits::check_bytes(
        || {
            format!(
                "onnx node '{}' ({}) in {when}: its outputs and scratch take {bytes} bytes, with {held} bytes of \
                 values alive",
                info.name, info.op
            )
        },
        needed,
        limit,
    )
}

fn malformed(msg: impl Into<String>) -> Error {
    Error::bad_file(PathBuf::from("<onnx model>"), msg)
}
