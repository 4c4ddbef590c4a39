//! The one fuser. A layer says what it is ([`Module::describe`](super::Module::describe) returns a [`Layer`]);
//! [`plan`] turns a run of layers into [`Step`]s, fusing the patterns that have one kernel; [`Fused::run`] runs a
//! fused step from the layers' descriptions. A native [`Sequential`](super::Sequential) plans over its children,
//! an imported ONNX graph ([`crate::onnx::OnnxModel`]) over its steps in order: the same network runs the same
//! kernels whichever front end built it.
//!
//! The rules (tinygrad's scheduler works the same way: a value read elsewhere is realised, and fusion stops
//! there):
//! - a step runs *through* the output of layer `i` (computes the next layer without handing that output out)
//!   only when the front end says it is [`Output::Open`]: read by layer `i + 1` alone and asked for by nobody (no
//!   tap, not the result) — so a tapped value is always handed out, and a tap inside a would-be fused step makes
//!   the step run unfused there;
//! - a BatchNorm folds into the convolution before it only in evaluation mode (in training it normalises with the
//!   batch's statistics, which no weights can hold), and not when its own output is tapped (the tap is then the
//!   BatchNorm's own value);
//! - a fused step computes what its layers compute one after another, to rounding (bit for bit for the fused
//!   ReLU and pooling), with gradients reaching the same parameters (folded weights are built from the
//!   parameters on the graph).
//!
//! # Adding a fused step (a new kernel)
//! 1. If the pattern needs a layer the planner cannot see yet, add a [`Layer`] variant and its [`Kind`]: the native
//!    layer returns it from `describe`, and the ONNX op from `Op::kind` (at load) and `Op::describe` (from the
//!    node's input values at run time), in its family's file in `src/onnx/ops/`.
//! 2. Add a [`Fused`] variant naming the pattern, match it in [`plan`] (every output the step runs through must be
//!    [`Output::Open`]; ask `train` where evaluation mode matters), and run it in [`Fused::run`] with one kernel call.
//! 3. Test it on both front ends (tests/fuser.rs): the plan contains the step, its values and input gradients equal
//!    the layer-by-layer ones within rounding, a tap inside it and training mode (where it matters) run unfused.

use std::ops::Range;

use crate::ops::elementwise::BinaryKind;
use crate::ops::{Conv2dParams, Pool2dParams};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// What a layer is, as the planner sees it: the layers it can fuse, with the values a fused kernel needs (built
/// from the layer's parameters, so gradients reach them), and [`Layer::Opaque`] for everything else. A
/// description must compute what the layer's evaluation-mode forward computes.
#[derive(Clone)]
#[non_exhaustive]
pub enum Layer {
    /// `conv2d(x, weight, bias, params)` ([`crate::nn::Conv2d`], ONNX `Conv` with symmetric padding).
    Conv {
        /// [O, C/groups, kh, kw].
        weight: Tensor,
        /// [O].
        bias: Option<Tensor>,
        /// Stride, padding, dilation, groups.
        params: Conv2dParams,
    },
    /// `x·weightᵀ + bias` ([`crate::nn::Linear`]).
    Linear {
        /// [out, in].
        weight: Tensor,
        /// [out].
        bias: Option<Tensor>,
    },
    /// Batch normalisation over axis 1; in evaluation mode the per-channel affine map
    /// `(x − running_mean)/√(running_var + eps)·weight + bias` ([`crate::nn::BatchNorm`], ONNX
    /// `BatchNormalization`).
    BatchNorm {
        /// γ [C].
        weight: Tensor,
        /// β [C].
        bias: Tensor,
        /// [C].
        running_mean: Tensor,
        /// [C].
        running_var: Tensor,
        /// Added to the variance.
        eps: f32,
    },
    /// max(x, 0).
    Relu,
    /// Max pooling with this window.
    MaxPool(Pool2dParams),
    /// The logistic sigmoid ([`crate::nn::Sigmoid`], ONNX `Sigmoid`).
    Sigmoid,
    /// SiLU `x·σ(x)` ([`crate::nn::SiLU`]).
    Silu,
    /// `x · other` (broadcast as NumPy), `other` a second value of the graph (ONNX `Mul`): after a sigmoid of that
    /// same value, the SiLU `x·σ(x)` that EfficientNet's exporters write as two nodes.
    Mul {
        /// The other operand.
        other: Tensor,
    },
    /// `x + other` (broadcast as NumPy), `other` a second value of the graph: a residual connection (ONNX `Add`).
    Add {
        /// The other operand.
        other: Tensor,
    },
    /// `x / other` (broadcast as NumPy), `other` a second value of the graph (ONNX `Div`): with the erf after it,
    /// the start of the exact GELU that PyTorch's exporter writes as five nodes.
    Div {
        /// The divisor.
        other: Tensor,
    },
    /// The error function (ONNX `Erf`).
    Erf,
    /// `x · weight` (NumPy's `matmul`), `weight` a second value of the graph (ONNX `MatMul`): with a bias added
    /// after it, a transformer's linear layer, exported as two nodes.
    MatMul {
        /// The right-hand operand.
        weight: Tensor,
    },
    /// `x` clamped to `[lo, hi]` (ONNX `Clip` with constant bounds, an infinite one where it has none): after a
    /// convolution, the ReLU6 of MobileNets.
    Clip {
        /// The lower bound.
        lo: f32,
        /// The upper bound.
        hi: f32,
    },
    /// Anything else: it runs on its own, through its own forward.
    Opaque,
}

/// What kind of layer a [`Layer`] is, without its values: what [`plan`] decides on (an importer knows it at load,
/// before any value exists).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// [`Layer::Conv`].
    Conv,
    /// [`Layer::Linear`].
    Linear,
    /// [`Layer::BatchNorm`].
    BatchNorm,
    /// [`Layer::Relu`].
    Relu,
    /// [`Layer::MaxPool`] with its window.
    MaxPool(Pool2dParams),
    /// [`Layer::Sigmoid`].
    Sigmoid,
    /// [`Layer::Silu`].
    Silu,
    /// [`Layer::Mul`].
    Mul,
    /// [`Layer::Add`].
    Add,
    /// [`Layer::Div`].
    Div,
    /// [`Layer::Erf`].
    Erf,
    /// [`Layer::MatMul`].
    MatMul,
    /// [`Layer::Clip`].
    Clip,
    /// [`Layer::Opaque`].
    Opaque,
}

impl Layer {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Layer::Conv { .. } => Kind::Conv,
            Layer::Linear { .. } => Kind::Linear,
            Layer::BatchNorm { .. } => Kind::BatchNorm,
            Layer::Relu => Kind::Relu,
            Layer::MaxPool(p) => Kind::MaxPool(*p),
            Layer::Sigmoid => Kind::Sigmoid,
            Layer::Silu => Kind::Silu,
            Layer::Mul { .. } => Kind::Mul,
            Layer::Add { .. } => Kind::Add,
            Layer::Div { .. } => Kind::Div,
            Layer::Erf => Kind::Erf,
            Layer::MatMul { .. } => Kind::MatMul,
            Layer::Clip { .. } => Kind::Clip,
            Layer::Opaque => Kind::Opaque,
        }
    }
}

/// How a [`Step`] runs its layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fused {
    /// One layer on its own, through its own forward (a module's `forward_t`, a node's op).
    Single,
    /// A convolution, with the BatchNorm after it folded into its weights and bias (`bn`, evaluation mode only:
    /// W' = W·scale per output channel, b' = b·scale + shift), then a ReLU (`relu`), then a 2×2 max pooling of
    /// stride 2 (`pool`, after a ReLU only): one [`Tensor::conv2d`], [`Tensor::conv2d_relu`] or
    /// [`Tensor::conv2d_relu_max_pool2`].
    Conv {
        /// A BatchNorm folded in.
        bn: bool,
        /// A ReLU fused.
        relu: bool,
        /// A 2×2 max pooling fused after the ReLU.
        pool: bool,
    },
    /// A convolution, with the BatchNorm after it folded in as for [`Fused::Conv`] (`bn`), then a Clip: one
    /// [`Tensor::conv2d_clamp`] (ReLU6 with no pass of its own over the output; the gradient passes strictly
    /// inside the bounds, as PyTorch's ReLU6 — the Clip alone also passes it at a bound).
    ConvClip {
        /// A BatchNorm folded in.
        bn: bool,
    },
    /// A convolution, with the BatchNorm after it folded in as for [`Fused::Conv`] (`bn`), then a sum with another
    /// value (a residual connection), then a ReLU (`relu`): one [`Tensor::conv2d_add`] or
    /// [`Tensor::conv2d_add_relu`] — the sum made as the convolution stores its output, not in a pass of its own
    /// (onnxruntime's Conv with its `Sum` input). The same values and gradients as the layers.
    ConvAdd {
        /// A BatchNorm folded in.
        bn: bool,
        /// A ReLU after the sum.
        relu: bool,
    },
    /// An evaluation-mode BatchNorm that no convolution takes (a pre-activation network's, after a concatenation
    /// or a residual add) and the ReLU after it: one pass over the activations each way, the same values and
    /// gradients as the two layers.
    BatchNormRelu,
    /// A residual add and the ReLU after it: one [`Tensor::add_relu`].
    AddRelu,
    /// A matrix product and the bias added after it (a vector as long as the product's rows, a constant): one
    /// product whose multiply-add chains start at the bias, with no pass of its own over the output (a
    /// transformer's linear layers as PyTorch exports them; ONNX `Gemm` does the same with its `C`). Rounded as
    /// one chain from the bias, so within rounding of the two ops, not bit for bit. Any other operands run as the
    /// two ops.
    MatMulBias,
    /// A convolution, with the BatchNorm after it folded in as for [`Fused::Conv`] (`bn`), then a SiLU — a
    /// [`Layer::Silu`], or a sigmoid and the product of its input with it (EfficientNet's Conv → Sigmoid → Mul, the
    /// convolution's output [`Output::Twice`]): one [`Tensor::conv2d_silu`], the SiLU applied to each image's
    /// output while it is in cache. The layers described are the convolution, the BatchNorm and the SiLU or the
    /// sigmoid (an imported graph's Mul reads two values inside the step, so it is not described: the plan says
    /// what it computes). The bits of the layers.
    ConvSilu {
        /// A BatchNorm folded in.
        bn: bool,
    },
    /// A sigmoid and the product of its input with it, `x·σ(x)`: one [`Tensor::silu`]. (A product with any other
    /// value — a squeeze-and-excitation gate — runs as the two ops.)
    Silu,
    /// `x / √2 → erf → + 1 → · x → · ½`, the exact GELU as PyTorch exports it (opset < 20): one
    /// [`Tensor::gelu`]. With other constants, or a product with another value, it runs as the five ops.
    Gelu,
    /// [`Fused::Gelu`] and the [`Fused::MatMulBias`] that alone reads its output (a transformer's or ConvNeXt's
    /// MLP): one [`Tensor::gelu_matmul_bias`], whose backward applies the GELU's derivative to the product's input
    /// gradient in cache as the product makes it. The bits of the two steps; what does not fit runs as they would.
    GeluMatMulBias,
}

/// One step of a plan: the layers `start..start + len` of the run, computed as `fused` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The first layer.
    pub start: usize,
    /// How many layers.
    pub len: usize,
    /// How they run.
    pub fused: Fused,
}

impl Step {
    /// The layers it runs.
    pub fn layers(&self) -> Range<usize> {
        self.start..self.start + self.len
    }

    /// The last layer it runs: the one whose output it produces.
    pub fn last(&self) -> usize {
        self.start + self.len - 1
    }
}

/// One step of a model's plan by the names of its layers (a [`Sequential`](super::Sequential)'s children, an ONNX
/// graph's nodes): what [`Sequential::plan`](super::Sequential::plan) and [`crate::onnx::OnnxModel::plan`] show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fusion {
    /// How the layers run.
    pub fused: Fused,
    /// Their names, in order.
    pub layers: Vec<String>,
}

/// What the rest of a computation needs of one layer's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Read by the next layer alone and asked for by nobody: a step may run through it without handing it out.
    Open,
    /// Read by the next two layers alone — the first as its data, the second as its other operand (`x·σ(x)`) — and
    /// asked for by nobody: a step may run through both ([`Fused::ConvSilu`]); any other step ends on it, as on
    /// [`Output::Kept`].
    Twice,
    /// Read elsewhere too, or the result: a step must end on it and hand it out.
    Kept,
    /// Asked for by a tap: a step must end on it, and a BatchNorm's tapped output is computed by the BatchNorm
    /// itself (not folded), so it is exactly what the BatchNorm makes of the convolution's output.
    Tapped,
}

/// The 2×2 max pooling of stride 2 (no padding, floor) that [`Tensor::conv2d_relu_max_pool2`] fuses.
fn is_max_pool2(kind: Kind) -> bool {
    kind == Kind::MaxPool(Pool2dParams::square(2))
}

/// Splits the run of layers `kinds`, layer `i + 1` reading the output of layer `i`, into steps, in order, covering
/// every layer once. `outputs[i]` says what else needs the output of layer `i` (missing entries are
/// [`Output::Kept`]); `train`: training mode (no BatchNorm folds).
pub fn plan(kinds: &[Kind], outputs: &[Output], train: bool) -> Vec<Step> {
    let at = |i: usize| kinds.get(i).copied().unwrap_or(Kind::Opaque);
    let out = |i: usize| outputs.get(i).copied().unwrap_or(Output::Kept);
    let open = |i: usize| out(i) == Output::Open;
    let mut steps = Vec::with_capacity(kinds.len());
    let mut i = 0;
    while i < kinds.len() {
        let (len, fused) = match at(i) {
            Kind::Conv => {
                let mut j = i + 1;
                let bn = !train && open(i) && at(j) == Kind::BatchNorm && out(j) != Output::Tapped;
                j += usize::from(bn);
                if out(j - 1) == Output::Twice && at(j) == Kind::Sigmoid && open(j) && at(j + 1) == Kind::Mul {
                    // x·σ(x) of the convolution's output, in its store.
                    (j + 2 - i, Fused::ConvSilu { bn })
                } else if open(j - 1) && at(j) == Kind::Silu {
                    (j + 1 - i, Fused::ConvSilu { bn })
                } else if open(j - 1) && at(j) == Kind::Add {
                    // A residual connection's sum (and its ReLU) in the convolution's store.
                    let relu = open(j) && at(j + 1) == Kind::Relu;
                    (j + 1 + usize::from(relu) - i, Fused::ConvAdd { bn, relu })
                } else {
                    let relu = open(j - 1) && at(j) == Kind::Relu;
                    j += usize::from(relu);
                    let pool = relu && open(j - 1) && is_max_pool2(at(j));
                    j += usize::from(pool);
                    let clip = !relu && open(j - 1) && at(j) == Kind::Clip;
                    j += usize::from(clip);
                    match (bn, relu, pool) {
                        _ if clip => (j - i, Fused::ConvClip { bn }),
                        // A convolution alone: its own forward is the same op.
                        (false, false, false) => (1, Fused::Single),
                        _ => (j - i, Fused::Conv { bn, relu, pool }),
                    }
                }
            }
            Kind::BatchNorm if !train && open(i) && at(i + 1) == Kind::Relu => (2, Fused::BatchNormRelu),
            Kind::Add if open(i) && at(i + 1) == Kind::Relu => (2, Fused::AddRelu),
            Kind::MatMul if open(i) && at(i + 1) == Kind::Add => (2, Fused::MatMulBias),
            Kind::Sigmoid if open(i) && at(i + 1) == Kind::Mul => (2, Fused::Silu),
            Kind::Div
                if (i..i + 4).all(open)
                    && [Kind::Erf, Kind::Add, Kind::Mul, Kind::Mul] == [at(i + 1), at(i + 2), at(i + 3), at(i + 4)] =>
            {
                if (i + 4..i + 6).all(open) && at(i + 5) == Kind::MatMul && at(i + 6) == Kind::Add {
                    (7, Fused::GeluMatMulBias)
                } else {
                    (5, Fused::Gelu)
                }
            }
            _ => (1, Fused::Single),
        };
        steps.push(Step { start: i, len, fused });
        i += len;
    }
    steps
}

/// The error for descriptions that do not fit the step planned for them (a front end's mistake, not a user's).
fn mismatch(fused: Fused) -> Error {
    Error::invalid("nn::plan", format!("the layers described do not fit the planned step {fused:?}"))
}

/// Folds the evaluation-mode BatchNorm `bn` into a layer whose output channels are the rows of `weight` (the
/// first axis): `scale = weight_bn/√(running_var + eps)`, `shift = bias_bn − running_mean·scale`, then
/// `W' = W·scale` per row and `b' = b·scale + shift`.
fn fold(weight: &Tensor, bias: Option<&Tensor>, bn: &Layer) -> Result<(Tensor, Tensor)> {
    let (rows, b) = fold_scale(weight, bias, bn)?;
    Ok((weight.mul(&rows)?, b))
}

/// [`fold`]'s per-row scale of the weight (shaped `[O, 1, …]`) and its folded bias.
fn fold_scale(weight: &Tensor, bias: Option<&Tensor>, bn: &Layer) -> Result<(Tensor, Tensor)> {
    let Layer::BatchNorm { weight: gamma, bias: beta, running_mean, running_var, eps } = bn else {
        return Err(mismatch(Fused::Conv { bn: true, relu: false, pool: false }));
    };
    let o = weight.shape().first().copied().unwrap_or(0);
    for t in [gamma, beta, running_mean, running_var] {
        if t.shape() != [o] {
            return Err(Error::ShapeMismatch { op: "batch_norm", expected: vec![o], got: t.shape().to_vec() });
        }
    }
    let scale = running_var.add_scalar(*eps).powf(-0.5).mul(gamma)?;
    let shift = beta.sub(&running_mean.mul(&scale)?)?;
    let mut rows = vec![1; weight.rank()];
    rows[0] = o;
    let b = match bias {
        Some(b) => b.mul(&scale)?.add(&shift)?,
        None => shift,
    };
    Ok((scale.reshape(&rows)?, b))
}

/// The folded weight's value of a fold through tracked tensors, kept with the weight ([`folded`]): the tensors it
/// was made from (their ids and ε) and the memo slot its nodes share.
struct TrackedFold {
    ids: Vec<u64>,
    value: crate::tensor::Array,
    slot: crate::tensor::MemoSlot,
}

/// A convolution's weight and bias, with the BatchNorm `bn` folded in when there is one. When no gradient can
/// flow through them (all constants, or gradients off), the fold is kept with the weight tensor and reused while
/// the same bias and BatchNorm tensors come with it ([`Tensor::memo`]): an imported network's every forward folded
/// every weight again (ResNet-50: 100 MB read and written), and the folded weight's own kept layouts (the flipped
/// weight of the input gradient) were made again with it.
fn folded(weight: &Tensor, bias: &Option<Tensor>, bn: Option<&Layer>) -> Result<(Tensor, Option<Tensor>)> {
    let Some(norm) = bn else {
        return Ok((weight.clone(), bias.clone()));
    };
    let Layer::BatchNorm { weight: gamma, bias: beta, running_mean, running_var, eps } = norm else {
        return Err(mismatch(Fused::Conv { bn: true, relu: false, pool: false }));
    };
    let others = [bias.as_ref(), Some(gamma), Some(beta), Some(running_mean), Some(running_var)];
    let constant =
        !crate::tensor::grad_enabled() || !weight.is_tracked() && others.iter().flatten().all(|t| !t.is_tracked());
    // Identified by the other tensors' ids and ε (ids are never reused); the key's top bit keeps it apart from the
    // flipped-weight keys (the group count), the next one a tracked fold from a constant one.
    let ids: Vec<u64> =
        others.iter().map(|t| t.map_or(0, |t| t.id().as_u64())).chain([u64::from(eps.to_bits())]).collect();
    let hash = ids.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &v| (h ^ v).wrapping_mul(0x0100_0000_01b3));
    if !constant {
        // The gradient flows through the fold, so each call makes its nodes afresh — the scale and bias (one value
        // per channel), and the folded weight's node over the value kept with the weight from the first call
        // (an attack's every pass folded every weight again, and flipped each for the input gradient again: 100 ms
        // of a CIFAR ResNet-18's PGD-7 step). The nodes share one memo slot, so the flipped weight is made once.
        let (rows, b) = fold_scale(weight, bias.as_ref(), norm)?;
        let key = hash | 3 << 62;
        let kept = weight.memo(key, |_| {
            let value = crate::ops::elementwise::binary_values(BinaryKind::Mul, weight.value(), rows.value())
                .ok_or_else(|| Error::invalid("nn::plan", "a BatchNorm scale that does not fit the weight"))?;
            Ok::<_, Error>(TrackedFold { ids: ids.clone(), value: value.into_shared(), slot: Default::default() })
        })?;
        if kept.ids != ids {
            // Another fold under the same hash: not kept.
            return Ok((weight.mul(&rows)?, Some(b)));
        }
        let op = crate::ops::Op::Binary(BinaryKind::Mul, weight.clone(), rows);
        return Ok((crate::ops::record_sharing(kept.value.clone(), op, kept.slot.clone()), Some(b)));
    }
    let key = hash | 1 << 63;
    let kept = weight.memo(key, |_| fold(weight, bias.as_ref(), norm).map(|wb| (ids.clone(), wb)))?;
    if kept.0 != ids {
        // Another fold under the same hash: not kept.
        let (w, b) = fold(weight, bias.as_ref(), norm)?;
        return Ok((w, Some(b)));
    }
    let (w, b) = kept.1.clone();
    Ok((w, Some(b)))
}

impl Fused {
    /// Runs a fused step on its input `x`, given the descriptions of its layers in order (as many as the step
    /// has). [`Fused::Single`] is not run here: the front end runs the layer through its own forward.
    pub fn run(self, x: &Tensor, layers: &[Layer]) -> Result<Tensor> {
        match (self, layers) {
            (Fused::Conv { bn, relu, pool }, [Layer::Conv { weight, bias, params }, rest @ ..]) => {
                let (w, b) = folded(weight, bias, rest.first().filter(|_| bn))?;
                match (relu, pool) {
                    (true, true) => x.conv2d_relu_max_pool2(&w, b.as_ref(), *params),
                    (true, false) => x.conv2d_relu(&w, b.as_ref(), *params),
                    (false, _) => x.conv2d(&w, b.as_ref(), *params),
                }
            }
            (Fused::ConvClip { bn }, [Layer::Conv { weight, bias, params }, rest @ .., Layer::Clip { lo, hi }]) => {
                let (w, b) = folded(weight, bias, rest.first().filter(|_| bn))?;
                if lo <= hi {
                    x.conv2d_clamp(&w, b.as_ref(), *params, *lo, *hi)
                } else {
                    // Not an interval (or a NaN bound): the clamp's own rule, as the Clip alone would run.
                    Ok(x.conv2d(&w, b.as_ref(), *params)?.clamp(*lo, *hi))
                }
            }
            (Fused::ConvSilu { bn }, [Layer::Conv { weight, bias, params }, rest @ ..]) => {
                let (w, b) = folded(weight, bias, rest.first().filter(|_| bn))?;
                match rest.get(usize::from(bn)..).unwrap_or_default() {
                    [Layer::Sigmoid | Layer::Silu] => x.conv2d_silu(&w, b.as_ref(), *params),
                    _ => Err(mismatch(self)),
                }
            }
            (Fused::ConvAdd { bn, relu }, [Layer::Conv { weight, bias, params }, rest @ ..]) => {
                let (w, b) = folded(weight, bias, rest.first().filter(|_| bn))?;
                match (rest.get(usize::from(bn)..).unwrap_or_default(), relu) {
                    ([Layer::Add { other }], false) => x.conv2d_add(&w, b.as_ref(), *params, other),
                    ([Layer::Add { other }, Layer::Relu], true) => x.conv2d_add_relu(&w, b.as_ref(), *params, other),
                    _ => Err(mismatch(self)),
                }
            }
            (
                Fused::BatchNormRelu,
                [Layer::BatchNorm { weight, bias, running_mean, running_var, eps }, Layer::Relu],
            ) => {
                let stats = (running_mean, running_var);
                crate::ops::batch_norm::batch_norm_running(x, (weight, bias), stats, *eps, true)
            }
            (Fused::AddRelu, [Layer::Add { other }, Layer::Relu]) => x.add_relu(other),
            (Fused::MatMulBias, [Layer::MatMul { weight }, Layer::Add { other }]) => {
                x.matmul_bias(weight, other, false)
            }
            // The same value on both sides (one tensor, so one node of the graph): the SiLU.
            (Fused::Silu, [Layer::Sigmoid, Layer::Mul { other }]) if other.id() == x.id() => Ok(x.silu()),
            (Fused::Silu, [Layer::Sigmoid, Layer::Mul { other }]) => x.sigmoid().mul(other),
            (Fused::Gelu, [div, erf, add, mul, half]) => gelu(x, [div, erf, add, mul, half]),
            (Fused::GeluMatMulBias, [div, erf, add, mul, half, Layer::MatMul { weight }, Layer::Add { other }]) => {
                if exact_gelu(x, [div, erf, add, mul, half]) {
                    return x.gelu_matmul_bias(weight, other, false);
                }
                gelu(x, [div, erf, add, mul, half])?.matmul_bias(weight, other, false)
            }
            _ => Err(mismatch(self)),
        }
    }
}

/// The divisor, the added one and the two factors of a [`Fused::Gelu`]'s five layers (`x / d → erf → + one → · m
/// → · half`), or `None` when they are other layers.
fn gelu_operands([div, erf, add, mul, half]: [&Layer; 5]) -> Option<[&Tensor; 4]> {
    match (div, erf, add, mul, half) {
        (
            Layer::Div { other: d },
            Layer::Erf,
            Layer::Add { other: one },
            Layer::Mul { other: m },
            Layer::Mul { other: h },
        ) => Some([d, one, m, h]),
        _ => None,
    }
}

/// Whether the five layers of a [`Fused::Gelu`] on `x` are the exact GELU as PyTorch exports it: `x / √2 → erf → +
/// 1 → · x → · ½` with constants only (a tracked divisor or coefficient keeps the five ops, so it gets its
/// gradient).
fn exact_gelu(x: &Tensor, layers: [&Layer; 5]) -> bool {
    let scalar = |t: &Tensor, want: f32| !t.is_tracked() && t.numel() == 1 && t.to_vec()[0] == want;
    gelu_operands(layers).is_some_and(|[d, one, m, half]| {
        m.id() == x.id() && scalar(d, std::f32::consts::SQRT_2) && scalar(one, 1.0) && scalar(half, 0.5)
    })
}

/// A [`Fused::Gelu`] step on `x`: one [`Tensor::gelu`] where [`exact_gelu`], else the five ops.
fn gelu(x: &Tensor, layers: [&Layer; 5]) -> Result<Tensor> {
    if exact_gelu(x, layers) {
        return Ok(x.gelu(false));
    }
    let [d, one, m, half] = gelu_operands(layers).ok_or_else(|| mismatch(Fused::Gelu))?;
    x.div(d)?.erf().add(one)?.mul(m)?.mul(half)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of `kinds` with the outputs listed in `kept` and `tapped` not open (the last is the result).
    fn steps(kinds: &[Kind], kept: &[usize], tapped: &[usize], train: bool) -> Vec<(usize, usize, Fused)> {
        let outputs: Vec<Output> = (0..kinds.len())
            .map(|i| match i {
                _ if tapped.contains(&i) => Output::Tapped,
                _ if kept.contains(&i) || i + 1 == kinds.len() => Output::Kept,
                _ => Output::Open,
            })
            .collect();
        plan(kinds, &outputs, train).into_iter().map(|s| (s.start, s.len, s.fused)).collect()
    }

    const POOL2: Kind = Kind::MaxPool(Pool2dParams {
        kernel: (2, 2),
        stride: (2, 2),
        padding: (0, 0),
        ceil_mode: false,
        count_include_pad: true,
    });
    const ALONE: Fused = Fused::Single;

    fn conv(bn: bool, relu: bool, pool: bool) -> Fused {
        Fused::Conv { bn, relu, pool }
    }

    /// A product and the Add after it fuse, and a BatchNorm no convolution takes with its ReLU (evaluation mode
    /// only); neither when the first output is read elsewhere or tapped.
    #[test]
    fn products_with_their_bias_and_batchnorms_with_their_relu() {
        let k = [Kind::MatMul, Kind::Add, Kind::BatchNorm, Kind::Relu, Kind::MatMul, Kind::Mul];
        let want = vec![(0, 2, Fused::MatMulBias), (2, 2, Fused::BatchNormRelu), (4, 1, ALONE), (5, 1, ALONE)];
        assert_eq!(steps(&k, &[], &[], false), want);
        let train = steps(&k, &[], &[], true);
        assert_eq!(train[..3], [(0, 2, Fused::MatMulBias), (2, 1, ALONE), (3, 1, ALONE)]);
        assert_eq!(steps(&k, &[0, 2], &[], false)[..4], [(0, 1, ALONE), (1, 1, ALONE), (2, 1, ALONE), (3, 1, ALONE)]);
        assert_eq!(steps(&k, &[], &[0, 2], false)[..4], [(0, 1, ALONE), (1, 1, ALONE), (2, 1, ALONE), (3, 1, ALONE)]);
    }

    #[test]
    fn conv_batchnorm_clip_is_one_clamped_conv() {
        let k = [Kind::Conv, Kind::BatchNorm, Kind::Clip, Kind::Conv, Kind::Clip, Kind::Clip];
        let want = vec![(0, 3, Fused::ConvClip { bn: true }), (3, 2, Fused::ConvClip { bn: false }), (5, 1, ALONE)];
        assert_eq!(steps(&k, &[], &[], false), want);
        // Training: no fold, and the Clip after a BatchNorm runs alone; a conv output read elsewhere or tapped
        // ends the step.
        let train = steps(&k, &[], &[], true);
        assert_eq!(train[..3], [(0, 1, ALONE), (1, 1, ALONE), (2, 1, ALONE)]);
        assert_eq!(train[3], (3, 2, Fused::ConvClip { bn: false }));
        assert_eq!(steps(&k, &[3], &[], false)[1..3], [(3, 1, ALONE), (4, 1, ALONE)]);
        assert_eq!(steps(&k, &[], &[3], false)[1..3], [(3, 1, ALONE), (4, 1, ALONE)]);
        // A ReLU wins over a Clip after it (the Clip then runs alone).
        let k = [Kind::Conv, Kind::Relu, Kind::Clip];
        assert_eq!(steps(&k, &[], &[], false), vec![(0, 2, conv(false, true, false)), (2, 1, ALONE)]);
    }

    #[test]
    fn conv_batchnorm_relu_pool_is_one_step_in_evaluation_mode() {
        let k = [Kind::Conv, Kind::BatchNorm, Kind::Relu, POOL2, Kind::Opaque];
        assert_eq!(steps(&k, &[], &[], false), vec![(0, 4, conv(true, true, true)), (4, 1, ALONE)]);
        // Training: the BatchNorm runs on its own, and so do the ReLU and pooling after it (no kernel fuses them).
        let each: Vec<_> = (0..5).map(|i| (i, 1, ALONE)).collect();
        assert_eq!(steps(&k, &[], &[], true), each);
        // A BatchNorm output read elsewhere: folded, and handed out.
        assert_eq!(steps(&k, &[1], &[], false)[0], (0, 2, conv(true, false, false)));
        // A tapped BatchNorm output is the BatchNorm's own.
        assert_eq!(steps(&k, &[], &[1], false)[..2], [(0, 1, ALONE), (1, 1, ALONE)]);
        // A convolution output read elsewhere or tapped: nothing folds into it.
        assert_eq!(steps(&k, &[0], &[], false)[0], (0, 1, ALONE));
        assert_eq!(steps(&k, &[], &[0], false)[0], (0, 1, ALONE));
        // A tapped ReLU output: the pooling runs on its own.
        assert_eq!(steps(&k, &[], &[2], false)[..2], [(0, 3, conv(true, true, false)), (3, 1, ALONE)]);
    }

    #[test]
    fn relu_and_pool_fuse_in_training_and_only_the_two_by_two_pool() {
        assert_eq!(POOL2, Kind::MaxPool(Pool2dParams::square(2)));
        let k = [Kind::Conv, Kind::Relu, POOL2];
        assert_eq!(steps(&k, &[], &[], true), vec![(0, 3, conv(false, true, true))]);
        let k = [Kind::Conv, Kind::Relu, Kind::MaxPool(Pool2dParams::square(3))];
        assert_eq!(steps(&k, &[], &[], false)[0], (0, 2, conv(false, true, false)));
        // A pooling straight after the convolution has no kernel.
        assert_eq!(steps(&[Kind::Conv, POOL2], &[], &[], false), vec![(0, 1, ALONE), (1, 1, ALONE)]);
        let k = [Kind::Add, Kind::Relu, Kind::Linear, Kind::Relu];
        assert_eq!(steps(&k, &[], &[], false), vec![(0, 2, Fused::AddRelu), (2, 1, ALONE), (3, 1, ALONE)]);
        assert_eq!(steps(&k, &[0], &[], false)[0], (0, 1, ALONE), "the sum read elsewhere");
    }

    /// A convolution (its BatchNorm folded), the residual sum after it and the ReLU after that: one step, with or
    /// without the ReLU; not where the convolution's output or the BatchNorm's is read elsewhere or tapped, nor in
    /// training (the BatchNorm is not folded); a sum read elsewhere keeps its ReLU apart. Run, the step gives the
    /// layers' bits.
    #[test]
    fn a_residual_sum_goes_into_the_convolution() {
        let k = [Kind::Conv, Kind::BatchNorm, Kind::Add, Kind::Relu, Kind::Conv];
        let add = |bn, relu| Fused::ConvAdd { bn, relu };
        assert_eq!(steps(&k, &[], &[], false), vec![(0, 4, add(true, true)), (4, 1, ALONE)]);
        assert_eq!(steps(&k, &[2], &[], false)[..2], [(0, 3, add(true, false)), (3, 1, ALONE)]);
        assert_eq!(steps(&k, &[1], &[], false)[..2], [(0, 2, conv(true, false, false)), (2, 2, Fused::AddRelu)]);
        assert_eq!(steps(&k, &[0], &[], false)[..2], [(0, 1, ALONE), (1, 1, ALONE)]);
        assert_eq!(steps(&k, &[], &[1], false)[..3], [(0, 1, ALONE), (1, 1, ALONE), (2, 2, Fused::AddRelu)]);
        assert_eq!(steps(&k, &[], &[], true)[..3], [(0, 1, ALONE), (1, 1, ALONE), (2, 2, Fused::AddRelu)]);
        assert_eq!(steps(&[Kind::Conv, Kind::Add], &[], &[], true), vec![(0, 2, add(false, false))]);
        let x = Tensor::uniform(&[2, 3, 5, 5], -1.0, 1.0, 1);
        let (weight, bias) = (Tensor::uniform(&[4, 3, 3, 3], -0.5, 0.5, 2), Some(Tensor::uniform(&[4], -0.2, 0.2, 3)));
        let params = Conv2dParams::default();
        let other = Tensor::uniform(&[2, 4, 3, 3], -1.0, 1.0, 4);
        let conv = Layer::Conv { weight: weight.clone(), bias: bias.clone(), params };
        let layers = [conv, Layer::Add { other: other.clone() }, Layer::Relu];
        let got = add(false, true).run(&x, &layers).unwrap();
        let want = x.conv2d(&weight, bias.as_ref(), params).unwrap().add(&other).unwrap().relu();
        assert_eq!(got.to_vec(), want.to_vec());
        assert!(add(false, true).run(&x, &layers[..2]).is_err(), "layers that do not fit the step");
    }

    #[test]
    fn sigmoid_times_its_input_is_one_silu() {
        let k = [Kind::Conv, Kind::Sigmoid, Kind::Mul, Kind::Sigmoid, Kind::Mul];
        assert_eq!(steps(&k, &[0], &[], false), vec![(0, 1, ALONE), (1, 2, Fused::Silu), (3, 2, Fused::Silu)]);
        assert_eq!(steps(&k, &[0], &[3], false)[2..], [(3, 1, ALONE), (4, 1, ALONE)], "a tapped sigmoid");
        let x = Tensor::uniform(&[2, 3], -4.0, 4.0, 1);
        let silu = Fused::Silu.run(&x, &[Layer::Sigmoid, Layer::Mul { other: x.clone() }]).unwrap();
        assert_eq!(silu.to_vec(), x.silu().to_vec());
        // A gate by another value: the two ops.
        let g = Tensor::uniform(&[2, 3], -1.0, 1.0, 2);
        let gated = Fused::Silu.run(&g, &[Layer::Sigmoid, Layer::Mul { other: x.clone() }]).unwrap();
        assert_eq!(gated.to_vec(), g.sigmoid().mul(&x).unwrap().to_vec());
    }

    /// A convolution whose output the next two layers alone read (`Twice`), a sigmoid of it and the product: one
    /// step, its BatchNorm folded in evaluation mode; a native SiLU after a convolution the same. Not where the
    /// convolution's output is read by others (`Kept`) or the sigmoid's is, nor where `Twice` is not followed by a
    /// sigmoid and a product (it ends the step as `Kept` would). Run, the step gives `conv2d(…).silu()`'s bits.
    #[test]
    fn a_silu_goes_into_the_convolution() {
        use Output::{Kept, Open, Twice};
        let silu = |bn| Fused::ConvSilu { bn };
        let planned = |k: &[Kind], o: &[Output], train| -> Vec<(usize, usize, Fused)> {
            plan(k, o, train).into_iter().map(|s| (s.start, s.len, s.fused)).collect()
        };
        let k = [Kind::Conv, Kind::Sigmoid, Kind::Mul, Kind::Conv];
        assert_eq!(planned(&k, &[Twice, Open, Open, Kept], false), [(0, 3, silu(false)), (3, 1, ALONE)]);
        assert_eq!(planned(&k, &[Twice, Open, Open, Kept], true)[0], (0, 3, silu(false)), "no fold to refuse");
        assert_eq!(planned(&k, &[Kept, Open, Open, Kept], false)[..2], [(0, 1, ALONE), (1, 2, Fused::Silu)]);
        assert_eq!(planned(&k, &[Twice, Kept, Open, Kept], false)[..2], [(0, 1, ALONE), (1, 1, ALONE)]);
        assert_eq!(planned(&k, &[Open, Open, Open, Kept], false)[..2], [(0, 1, ALONE), (1, 2, Fused::Silu)]);
        let k = [Kind::Conv, Kind::BatchNorm, Kind::Sigmoid, Kind::Mul];
        assert_eq!(planned(&k, &[Open, Twice, Open, Kept], false), [(0, 4, silu(true))]);
        assert_eq!(planned(&k, &[Open, Twice, Open, Kept], true)[..2], [(0, 1, ALONE), (1, 1, ALONE)]);
        let k = [Kind::Conv, Kind::Relu];
        assert_eq!(planned(&k, &[Twice, Kept], false), [(0, 1, ALONE), (1, 1, ALONE)], "Twice is not open");
        let k = [Kind::Conv, Kind::BatchNorm, Kind::Silu, Kind::Silu];
        assert_eq!(steps(&k, &[], &[], false), [(0, 3, silu(true)), (3, 1, ALONE)]);
        assert_eq!(steps(&k, &[], &[], true)[..3], [(0, 1, ALONE), (1, 1, ALONE), (2, 1, ALONE)]);
        assert_eq!(steps(&k, &[], &[1], false)[..2], [(0, 1, ALONE), (1, 1, ALONE)], "a tapped BatchNorm");
        let x = Tensor::uniform(&[2, 3, 5, 5], -1.0, 1.0, 1);
        let (weight, bias) = (Tensor::uniform(&[4, 3, 3, 3], -0.5, 0.5, 2), Some(Tensor::uniform(&[4], -0.2, 0.2, 3)));
        let params = Conv2dParams::default();
        let want = x.conv2d(&weight, bias.as_ref(), params).unwrap().silu().to_vec();
        let conv = Layer::Conv { weight, bias, params };
        for last in [Layer::Sigmoid, Layer::Silu] {
            assert_eq!(silu(false).run(&x, &[conv.clone(), last]).unwrap().to_vec(), want);
        }
        assert!(silu(false).run(&x, &[conv.clone(), Layer::Relu]).is_err(), "layers that do not fit the step");
    }

    /// The fold of constant tensors is made once and kept with the weight: the same tensors again give the same
    /// folded tensors (not a copy); another BatchNorm or a bias gives its own fold, equal to a fresh one; a
    /// tracked weight's fold is a new node each call (its gradient flows through the fold) over the value kept.
    #[test]
    fn constant_folds_are_kept_with_the_weight() {
        let t = |shape: &[usize], seed| Tensor::uniform(shape, 0.5, 1.5, seed);
        let weight = t(&[3, 2, 1, 1], 1);
        let bn = |seed| Layer::BatchNorm {
            weight: t(&[3], seed),
            bias: t(&[3], seed + 1),
            running_mean: t(&[3], seed + 2),
            running_var: t(&[3], seed + 3),
            eps: 1e-5,
        };
        let (one, two) = (bn(10), bn(20));
        let bits = |x: &Tensor| x.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let (w1, b1) = folded(&weight, &None, Some(&one)).unwrap();
        let (again, _) = folded(&weight, &None, Some(&one)).unwrap();
        assert_eq!(w1.id(), again.id(), "kept");
        let (fresh_w, fresh_b) = fold(&weight, None, &one).unwrap();
        assert_eq!((bits(&w1), bits(b1.as_ref().unwrap())), (bits(&fresh_w), bits(&fresh_b)));
        let (w2, _) = folded(&weight, &None, Some(&two)).unwrap();
        assert_ne!(w2.id(), w1.id());
        assert_eq!(bits(&w2), bits(&fold(&weight, None, &two).unwrap().0));
        let bias = Some(t(&[3], 30));
        let (_, bb) = folded(&weight, &bias, Some(&two)).unwrap();
        assert_eq!(bits(bb.as_ref().unwrap()), bits(&fold(&weight, bias.as_ref(), &two).unwrap().1));
        // A tracked weight: nodes made afresh each call, over the value kept from the first and sharing one memo
        // slot; the gradient flows through every one of them as through a fresh fold.
        let tracked = weight.variable();
        let (a, _) = folded(&tracked, &None, Some(&one)).unwrap();
        let (b, _) = folded(&tracked, &None, Some(&one)).unwrap();
        assert!(a.is_tracked() && b.is_tracked() && a.id() != b.id());
        assert_eq!(bits(&a), bits(&fold(&weight, None, &one).unwrap().0));
        assert!(std::ptr::eq(a.value().as_ptr(), b.value().as_ptr()), "the value is kept");
        let first = a.derived(7, |v| v.iter().map(|x| x * 2.0).collect());
        let again = b.derived(7, |_| unreachable!("made once, found through the shared slot"));
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        let c = t(&[3, 2, 1, 1], 40);
        let grad = |w: &Tensor| w.mul(&c).unwrap().sum_all().grad_wrt(&[&tracked]).unwrap().remove(0).to_vec();
        let (fresh, _) = fold(&tracked, None, &one).unwrap();
        assert_eq!(grad(&a), grad(&fresh));
        assert_eq!(grad(&b), grad(&fresh));
        // Another BatchNorm: its own fold.
        let (d, _) = folded(&tracked, &None, Some(&two)).unwrap();
        assert_eq!(bits(&d), bits(&fold(&weight, None, &two).unwrap().0));
    }
}
