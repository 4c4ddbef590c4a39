//! Translating a `NodeProto` into a [`Kind`]: the operator with its attributes parsed and checked, once, at load.

use super::attrs::{Attrs, NodeInfo};
use super::proto::NodeProto;
use super::value::Value;
use crate::ops::UnaryKind;
use crate::Result;

/// How `auto_pad` places the padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AutoPad {
    /// Explicit `pads`.
    NotSet,
    /// Output size ⌈in/stride⌉, the extra padding at the end.
    SameUpper,
    /// Output size ⌈in/stride⌉, the extra padding at the start.
    SameLower,
    /// No padding.
    Valid,
}

/// The window of a 2-D convolution or pooling.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    /// The kernel size, when given as an attribute (pooling always; Conv optionally).
    pub(crate) kernel: Option<[usize; 2]>,
    pub(crate) strides: [usize; 2],
    /// top, left, bottom, right (ONNX order: begins then ends).
    pub(crate) pads: [usize; 4],
    pub(crate) dilations: [usize; 2],
    pub(crate) auto_pad: AutoPad,
    pub(crate) ceil_mode: bool,
}

impl Window {
    /// The padding (top, left, bottom, right) for an input of `size` and a kernel `k`.
    pub(crate) fn padding(&self, size: [usize; 2], k: [usize; 2]) -> [usize; 4] {
        let mut p = self.pads;
        if matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower) {
            for i in 0..2 {
                let out = size[i].div_ceil(self.strides[i]);
                let span = k[i].saturating_sub(1).saturating_mul(self.dilations[i]).saturating_add(1);
                let total =
                    (out.max(1) - 1).saturating_mul(self.strides[i]).saturating_add(span).saturating_sub(size[i]);
                let small = total / 2;
                let (begin, end) =
                    if self.auto_pad == AutoPad::SameUpper { (small, total - small) } else { (total - small, small) };
                p[i] = begin;
                p[i + 2] = end;
            }
        } else if self.auto_pad == AutoPad::Valid {
            p = [0; 4];
        }
        p
    }
}

/// What a Conv step computes after the convolution itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fused {
    Nothing,
    /// A Relu.
    Relu,
    /// A Relu, then MaxPool over 2×2 windows of stride 2 (no padding, floor).
    ReluMaxPool2,
}

impl Window {
    /// Whether this pooling window is exactly 2×2 with stride 2, no padding and floor rounding (what
    /// [`crate::Tensor::conv2d_relu_max_pool2`] pools).
    pub(crate) fn is_max_pool2(&self) -> bool {
        self.kernel == Some([2, 2])
            && self.strides == [2, 2]
            && self.pads == [0; 4]
            && self.dilations == [1, 1]
            && matches!(self.auto_pad, AutoPad::NotSet | AutoPad::Valid)
            && !self.ceil_mode
    }
}

/// A binary elementwise operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bin {
    Add,
    Sub,
    Mul,
    Div,
}

/// Non-constant padding modes of `Pad`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PadMode {
    Constant,
    Reflect,
    Edge,
}

/// The attribute form of Slice (opset < 10): starts, ends and optional axes.
pub(crate) type SliceAttrs = (Vec<i64>, Vec<i64>, Option<Vec<i64>>);

/// An operator with its attributes.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    /// Identity, and Dropout in inference (output 0 is input 0; a requested mask output is all ones).
    Identity {
        mask: bool,
    },
    Binary(Bin),
    Unary(UnaryKind),
    PRelu,
    /// Clip: bounds from the attributes (opset < 11) or from inputs 1 and 2.
    Clip {
        min: Option<f32>,
        max: Option<f32>,
    },
    Pow,
    /// Softmax or LogSoftmax; `legacy` (opset < 13) flattens from `axis` into 2-D first.
    Softmax {
        axis: i64,
        log: bool,
        legacy: bool,
    },
    /// Conv, with the Relu (and 2×2 max pooling) after it fused in by [`fuse`] where nothing else reads the
    /// intermediate values.
    Conv {
        window: Window,
        group: usize,
        then: Fused,
    },
    Gemm {
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
    },
    MatMul,
    MaxPool(Window),
    AvgPool {
        window: Window,
        count_include_pad: bool,
    },
    GlobalAvgPool,
    GlobalMaxPool,
    BatchNorm {
        eps: f32,
    },
    Flatten {
        axis: i64,
    },
    Reshape {
        allowzero: bool,
    },
    Transpose {
        perm: Option<Vec<i64>>,
    },
    Concat {
        axis: i64,
    },
    Squeeze {
        axes: Option<Vec<i64>>,
    },
    Unsqueeze {
        axes: Option<Vec<i64>>,
    },
    Gather {
        axis: i64,
    },
    /// Slice; the attribute form (opset < 10) carries starts, ends and axes.
    Slice {
        attrs: Option<SliceAttrs>,
    },
    /// Pad; the attribute form (opset < 11) carries pads and value.
    Pad {
        mode: PadMode,
        attrs: Option<(Vec<i64>, f32)>,
    },
    /// ReduceMean / ReduceSum; `axes` from the attribute form, else input 1.
    Reduce {
        mean: bool,
        axes: Option<Vec<i64>>,
        keepdims: bool,
        noop_with_empty_axes: bool,
    },
    Constant(Value),
    Shape {
        start: i64,
        end: Option<i64>,
    },
    Cast {
        to: i32,
    },
}

/// What a node does with one of its inputs, which decides what an initialiser feeding it becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InputRole {
    /// Differentiable data: a float initialiser here is a trainable parameter.
    Data,
    /// Running statistics (BatchNormalization mean and variance): a buffer.
    Buffer,
    /// A shape, axis, bound or exponent: read as a constant.
    Constant,
}

/// The role of input `i` of an operator.
pub(crate) fn input_role(op: &str, i: usize) -> InputRole {
    match (op, i) {
        ("BatchNormalization", 3 | 4) => InputRole::Buffer,
        (_, 0) => InputRole::Data,
        ("Reshape" | "Squeeze" | "Unsqueeze" | "Gather" | "Slice" | "Pad" | "ReduceMean" | "ReduceSum", _)
        | ("Clip" | "Pow" | "Dropout" | "Expand", _) => InputRole::Constant,
        _ => InputRole::Data,
    }
}

fn window(info: &NodeInfo, a: &Attrs, pooling: bool) -> Result<Window> {
    let two = |name: &str, v: Option<Vec<i64>>, default: usize, len: usize| -> Result<Vec<usize>> {
        match v {
            None => Ok(vec![default; len]),
            Some(v) if v.len() == len && v.iter().all(|&x| x >= 0) => Ok(v.iter().map(|&x| x as usize).collect()),
            Some(v) => Err(info.unsupported(format!("{name} = {v:?} (only 2-D windows are supported)"))),
        }
    };
    let kernel = match a.ints("kernel_shape")? {
        Some(k) => {
            let k = two("kernel_shape", Some(k), 1, 2)?;
            if k.contains(&0) {
                return Err(info.malformed("zero kernel size"));
            }
            Some([k[0], k[1]])
        }
        None if pooling => return Err(info.malformed("kernel_shape is required")),
        None => None,
    };
    let strides = two("strides", a.ints("strides")?, 1, 2)?;
    let pads = two("pads", a.ints("pads")?, 0, 4)?;
    let dilations = two("dilations", a.ints("dilations")?, 1, 2)?;
    if strides.contains(&0) || dilations.contains(&0) {
        return Err(info.malformed("zero stride or dilation"));
    }
    // Bounds that no real model comes near keep a corrupt file from asking for absurd allocations.
    const LIMIT: usize = 1 << 16;
    if strides.iter().chain(&pads).chain(&dilations).chain(kernel.iter().flatten()).any(|&v| v > LIMIT) {
        return Err(info.malformed(format!(
            "kernel {kernel:?}, strides {strides:?}, pads {pads:?} or dilations {dilations:?} out of range"
        )));
    }
    if let (true, Some(k)) = (pooling, kernel) {
        if pads[0] >= k[0] || pads[2] >= k[0] || pads[1] >= k[1] || pads[3] >= k[1] {
            return Err(info.malformed(format!("pads {pads:?} must be smaller than the kernel {k:?}")));
        }
    }
    if pooling && dilations != [1, 1] {
        return Err(info.unsupported(format!("dilations = {dilations:?} in pooling")));
    }
    let auto_pad = match a.string("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" | "" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => return Err(info.unsupported(format!("auto_pad = {other}"))),
    };
    let ceil_mode = if pooling { a.int("ceil_mode", 0)? != 0 } else { false };
    Ok(Window {
        kernel,
        strides: [strides[0], strides[1]],
        pads: [pads[0], pads[1], pads[2], pads[3]],
        dilations: [dilations[0], dilations[1]],
        auto_pad,
        ceil_mode,
    })
}

/// Parses a node's operator and attributes; unknown operators and attributes are errors.
pub(crate) fn compile(node: &NodeProto, info: &NodeInfo) -> Result<Kind> {
    if !(node.domain.is_empty() || node.domain == "ai.onnx") {
        return Err(info.unsupported(format!("operator domain '{}'", node.domain)));
    }
    let a = Attrs::new(info, node);
    let opset = info.opset;
    let unary = |k: UnaryKind| Ok(Kind::Unary(k));
    let kind = match node.op_type.as_str() {
        "Identity" => Ok(Kind::Identity { mask: false }),
        "Dropout" => dropout(node, info, &a, opset),
        "Add" => Ok(Kind::Binary(Bin::Add)),
        "Sub" => Ok(Kind::Binary(Bin::Sub)),
        "Mul" => Ok(Kind::Binary(Bin::Mul)),
        "Div" => Ok(Kind::Binary(Bin::Div)),
        "Neg" => unary(UnaryKind::Neg),
        "Relu" => unary(UnaryKind::Relu),
        "Sigmoid" => unary(UnaryKind::Sigmoid),
        "Tanh" => unary(UnaryKind::Tanh),
        "Exp" => unary(UnaryKind::Exp),
        "Log" => unary(UnaryKind::Log),
        "Sqrt" => unary(UnaryKind::Sqrt),
        "LeakyRelu" => unary(UnaryKind::LeakyRelu(a.float("alpha", 0.01)?)),
        "PRelu" => Ok(Kind::PRelu),
        "Pow" => Ok(Kind::Pow),
        "Clip" => Ok(Kind::Clip { min: a.opt_float("min")?, max: a.opt_float("max")? }),
        "Softmax" | "LogSoftmax" => {
            let legacy = opset < 13;
            Ok(Kind::Softmax {
                axis: a.int("axis", if legacy { 1 } else { -1 })?,
                log: node.op_type != "Softmax",
                legacy,
            })
        }
        "Conv" => {
            let group = a.int("group", 1)?;
            if group < 1 {
                return Err(info.malformed(format!("group = {group}")));
            }
            Ok(Kind::Conv { window: window(info, &a, false)?, group: group as usize, then: Fused::Nothing })
        }
        "Gemm" => Ok(Kind::Gemm {
            alpha: a.float("alpha", 1.0)?,
            beta: a.float("beta", 1.0)?,
            trans_a: a.int("transA", 0)? != 0,
            trans_b: a.int("transB", 0)? != 0,
        }),
        "MatMul" => Ok(Kind::MatMul),
        "MaxPool" => max_pool(node, info, &a),
        "AveragePool" => {
            let count_include_pad = a.int("count_include_pad", 0)? != 0;
            Ok(Kind::AvgPool { window: window(info, &a, true)?, count_include_pad })
        }
        "GlobalAveragePool" => Ok(Kind::GlobalAvgPool),
        "GlobalMaxPool" => Ok(Kind::GlobalMaxPool),
        "BatchNormalization" => batch_norm(node, info, &a),
        "Flatten" => Ok(Kind::Flatten { axis: a.int("axis", 1)? }),
        "Reshape" => Ok(Kind::Reshape { allowzero: a.int("allowzero", 0)? != 0 }),
        "Transpose" => Ok(Kind::Transpose { perm: a.ints("perm")? }),
        "Concat" => Ok(Kind::Concat { axis: a.opt_int("axis")?.ok_or_else(|| info.malformed("axis is required"))? }),
        "Squeeze" => Ok(Kind::Squeeze { axes: a.ints("axes")? }),
        "Unsqueeze" => Ok(Kind::Unsqueeze { axes: a.ints("axes")? }),
        "Gather" => Ok(Kind::Gather { axis: a.int("axis", 0)? }),
        "Slice" => slice(info, &a),
        "Pad" => pad(info, &a),
        "ReduceMean" | "ReduceSum" => Ok(Kind::Reduce {
            mean: node.op_type == "ReduceMean",
            axes: a.ints("axes")?,
            keepdims: a.int("keepdims", 1)? != 0,
            noop_with_empty_axes: a.int("noop_with_empty_axes", 0)? != 0,
        }),
        "Constant" => constant(info, &a),
        "Shape" => Ok(Kind::Shape { start: a.int("start", 0)?, end: a.opt_int("end")? }),
        "Cast" => {
            a.ignore("saturate");
            Ok(Kind::Cast { to: a.opt_int("to")?.ok_or_else(|| info.malformed("Cast needs 'to'"))? as i32 })
        }
        other => Err(info.unsupported(format!("operator {other}"))),
    }?;
    a.finish()?;
    Ok(kind)
}

/// The `dropout` node: its attributes checked.
fn dropout(node: &NodeProto, info: &NodeInfo, a: &Attrs, opset: i64) -> Result<Kind> {
    a.ignore("ratio");
    a.ignore("seed");
    if a.int("is_test", 1)? == 0 && opset < 7 {
        return Err(info.unsupported("is_test = 0 (training-mode dropout)"));
    }
    Ok(Kind::Identity { mask: node.output.get(1).is_some_and(|o| !o.is_empty()) })
}

/// The `max_pool` node: its attributes checked.
fn max_pool(node: &NodeProto, info: &NodeInfo, a: &Attrs) -> Result<Kind> {
    a.ignore("storage_order");
    if node.output.len() > 1 && node.output.get(1).is_some_and(|o| !o.is_empty()) {
        return Err(info.unsupported("the Indices output of MaxPool"));
    }
    Ok(Kind::MaxPool(window(info, a, true)?))
}

/// The `batch_norm` node: its attributes checked.
fn batch_norm(node: &NodeProto, info: &NodeInfo, a: &Attrs) -> Result<Kind> {
    a.ignore("momentum");
    a.ignore("spatial");
    a.ignore("is_test");
    if a.int("training_mode", 0)? != 0 {
        return Err(info.unsupported("training_mode = 1 (BatchNormalization is imported for inference)"));
    }
    if node.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(info.unsupported("the running-statistics outputs of BatchNormalization"));
    }
    Ok(Kind::BatchNorm { eps: a.float("epsilon", 1e-5)? })
}

/// The `slice` node: its attributes checked.
fn slice(info: &NodeInfo, a: &Attrs) -> Result<Kind> {
    let attrs = match (a.ints("starts")?, a.ints("ends")?) {
        (Some(s), Some(e)) => Some((s, e, a.ints("axes")?)),
        (None, None) => None,
        _ => return Err(info.malformed("Slice needs both starts and ends")),
    };
    Ok(Kind::Slice { attrs })
}

/// The `pad` node: its attributes checked.
fn pad(info: &NodeInfo, a: &Attrs) -> Result<Kind> {
    let mode = match a.string("mode", "constant")?.as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        other => return Err(info.unsupported(format!("mode = {other}"))),
    };
    let pads = a.ints("pads")?.or(a.ints("paddings")?);
    let attrs = pads.map(|p| -> Result<_> { Ok((p, a.float("value", 0.0)?)) }).transpose()?;
    Ok(Kind::Pad { mode, attrs })
}

fn constant(info: &NodeInfo, a: &Attrs) -> Result<Kind> {
    use super::value::Ints;
    use crate::Tensor;
    let v = if let Some(t) = a.tensor("value")? {
        t
    } else if let Some(f) = a.opt_float("value_float")? {
        Value::F(Tensor::scalar(f))
    } else if let Some(fs) = a.floats("value_floats")? {
        let n = fs.len();
        Value::F(Tensor::from_vec(fs, &[n])?)
    } else if let Some(i) = a.opt_int("value_int")? {
        Value::I(Ints::scalar(i))
    } else if let Some(is) = a.ints("value_ints")? {
        Value::I(Ints::vector(is))
    } else if a.has("sparse_value") || a.has("value_string") || a.has("value_strings") {
        return Err(info.unsupported("a sparse or string Constant"));
    } else {
        return Err(info.malformed("Constant without a value"));
    };
    Ok(Kind::Constant(v))
}
