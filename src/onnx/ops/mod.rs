//! The ONNX operators, one file per family. Each file holds, for its operators, the parsing of the node's
//! attributes (`parse`), the role of each input ([`Op::input_role`]), the shape rule ([`Op::infer`]) and the
//! execution on the core's differentiable ops ([`Op::run`]). A shape rule is written once, generic over
//! [`Arg`], and called by both `infer` and `run`. [`OPS`] maps every ONNX operator name to its parser.

mod binary;
mod concat;
pub(crate) mod constant;
pub(crate) mod conv;
mod einsum;
mod gather;
mod identity;
mod logic;
mod matmul;
mod norm;
mod pad;
pub(crate) mod pool;
mod reduce;
mod reshape;
mod slice;
mod softmax;
mod split;
pub(crate) mod unary;
pub(crate) mod window;

use std::any::Any;
use std::sync::Arc;

use super::attrs::{Attrs, NodeInfo};
use super::meta::{Arg, Cost, Meta};
use super::proto::NodeProto;
use super::value::{Ints, Value};
use crate::nn::plan::{Kind, Layer};
use crate::tensor::Tensor;
use crate::Result;

/// An operator with its attributes parsed and checked.
pub(crate) trait Op: Any + std::fmt::Debug + Send + Sync {
    /// The outputs' shapes (or values, for shape arithmetic on known inputs) and the scratch bytes the node
    /// allocates, from what is known about its inputs; every check that does not need the data happens here.
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost>;
    /// Computes the outputs, in order.
    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>>;
    /// What the node does with input `i`, which decides what an initialiser feeding it becomes.
    fn input_role(&self, i: usize) -> InputRole {
        let _ = i;
        InputRole::Data
    }
    /// How many outputs the node computes.
    fn outputs(&self) -> usize {
        1
    }
    /// What the fuser ([`crate::nn::plan`]) sees of this node at load: [`Kind::Opaque`] unless it is a layer the
    /// planner fuses (then [`Op::describe`] must describe it).
    fn kind(&self) -> Kind {
        Kind::Opaque
    }
    /// The node as the planner's [`Layer`], from its inputs other than the data input a fused step carries (which
    /// is `None` in `ins`, since the step computes it without handing it out): weights, statistics, a residual's
    /// other operand.
    fn describe(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Layer> {
        let _ = ins;
        Err(info.malformed("planned as a fused layer but describes none"))
    }
}

/// Reads a node (its attributes through [`Attrs`], which fails on any attribute left unread) into an [`Op`].
type Parse = fn(&Attrs) -> Result<Arc<dyn Op>>;

/// Every supported ONNX operator (default domain), by name.
const OPS: &[(&str, Parse)] = &[
    ("Identity", identity::identity),
    ("Dropout", identity::dropout),
    ("Constant", constant::constant),
    ("Shape", constant::shape),
    ("Cast", constant::cast),
    ("ConstantOfShape", constant::constant_of_shape),
    ("Range", constant::range),
    ("Add", binary::add),
    ("Sub", binary::sub),
    ("Mul", binary::mul),
    ("Div", binary::div),
    ("Mod", binary::modulo),
    ("Equal", logic::equal),
    ("Not", logic::not),
    ("Where", logic::where_),
    ("Neg", unary::neg),
    ("Relu", unary::relu),
    ("Sigmoid", unary::sigmoid),
    ("Tanh", unary::tanh),
    ("Exp", unary::exp),
    ("Log", unary::log),
    ("Sqrt", unary::sqrt),
    ("Erf", unary::erf),
    ("Gelu", unary::gelu),
    ("HardSigmoid", unary::hard_sigmoid),
    ("HardSwish", unary::hard_swish),
    ("LeakyRelu", unary::leaky_relu),
    ("PRelu", unary::prelu),
    ("Clip", unary::clip),
    ("Pow", unary::pow),
    ("Softmax", softmax::softmax),
    ("LogSoftmax", softmax::log_softmax),
    ("Conv", conv::conv),
    ("Gemm", matmul::gemm),
    ("MatMul", matmul::matmul),
    ("MaxPool", pool::max_pool),
    ("AveragePool", pool::avg_pool),
    ("GlobalAveragePool", pool::global_avg_pool),
    ("GlobalMaxPool", pool::global_max_pool),
    ("BatchNormalization", norm::batch_norm),
    ("LayerNormalization", norm::layer_norm),
    ("Flatten", reshape::flatten),
    ("Reshape", reshape::reshape),
    ("Transpose", reshape::transpose),
    ("Squeeze", reshape::squeeze),
    ("Unsqueeze", reshape::unsqueeze),
    ("Expand", reshape::expand),
    ("Concat", concat::concat),
    ("Gather", gather::gather),
    ("ScatterND", gather::scatter_nd),
    ("Slice", slice::slice),
    ("Split", split::split),
    ("Einsum", einsum::einsum),
    ("Pad", pad::pad),
    ("ReduceMean", reduce::reduce_mean),
    ("ReduceSum", reduce::reduce_sum),
];

/// Parses a node's operator and attributes; unknown operators and attributes are errors.
pub(crate) fn compile(node: &NodeProto, info: &NodeInfo) -> Result<Arc<dyn Op>> {
    if !(node.domain.is_empty() || node.domain == "ai.onnx") {
        return Err(info.unsupported(format!("operator domain '{}'", node.domain)));
    }
    let Some((_, parse)) = OPS.iter().find(|(name, _)| *name == node.op_type) else {
        return Err(info.unsupported(format!("operator {}", node.op_type)));
    };
    let a = Attrs::new(info, node);
    let op = parse(&a)?;
    a.finish()?;
    if node.output.iter().skip(op.outputs()).any(|o| !o.is_empty()) || node.output.is_empty() {
        return Err(info.unsupported(format!("{} outputs", node.output.len())));
    }
    Ok(op)
}

/// The shapes (and, for shape arithmetic, values) `op` computes from `ins`; every output shape is checked to be a
/// valid array shape ([`crate::limits::checked_numel`]).
pub(crate) fn infer(op: &dyn Op, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
    let cost = op.infer(info, ins)?;
    for m in &cost.outputs {
        crate::limits::checked_numel(&format!("onnx node '{}' ({})", info.name, info.op), m.shape())?;
    }
    Ok(cost)
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

/// The role of every input but the first of an op whose other inputs are shapes, axes or bounds.
pub(crate) fn data_then_constants(i: usize) -> InputRole {
    if i == 0 {
        InputRole::Data
    } else {
        InputRole::Constant
    }
}

/// Normalises an ONNX axis (negative counts from the end) for a rank-`rank` tensor.
pub(crate) fn axis(info: &NodeInfo, a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let v = if a < 0 { a + r } else { a };
    // A scalar has no axis: `r.max(1)` here once let axis 0 index an empty shape.
    if v < 0 || v >= r {
        return Err(info.malformed(format!("axis {a} out of range for rank {rank}")));
    }
    Ok(v as usize)
}

/// [`axis`] for each of `axes`.
pub(crate) fn axes(info: &NodeInfo, axes: &[i64], rank: usize) -> Result<Vec<usize>> {
    axes.iter().map(|&a| axis(info, a, rank)).collect()
}

/// Input `i`, which must be present.
pub(crate) fn input<'a, A>(info: &NodeInfo, ins: &[Option<&'a A>], i: usize) -> Result<&'a A> {
    ins.get(i).copied().flatten().ok_or_else(|| info.malformed(format!("input {i} is missing")))
}

/// Input `i` as integers, if present (`Gather` indices, `Reshape` shapes, axes, pads, …): an error when it is
/// computed from the data.
pub(crate) fn opt_ints<A: Arg>(info: &NodeInfo, ins: &[Option<&A>], i: usize) -> Result<Option<Vec<i64>>> {
    match ins.get(i).copied().flatten().map(Arg::known) {
        None => Ok(None),
        Some(Some(Value::F(t))) if t.is_tracked() => Err(info.unsupported(format!("input {i} computed from the data"))),
        Some(Some(v)) => Ok(Some(v.to_ints().data)),
        Some(None) => Err(info.unsupported(format!("input {i} (a shape or axes) computed from the data"))),
    }
}

/// [`opt_ints`] for an input that must be present.
pub(crate) fn ints<A: Arg>(info: &NodeInfo, ins: &[Option<&A>], i: usize) -> Result<Vec<i64>> {
    opt_ints(info, ins, i)?.ok_or_else(|| info.malformed(format!("input {i} is missing")))
}

/// A scalar constant input (Clip bounds, Pad value, Pow exponent).
pub(crate) fn opt_scalar(info: &NodeInfo, ins: &[Option<&Value>], i: usize) -> Result<Option<f32>> {
    match ins.get(i).copied().flatten() {
        None => Ok(None),
        Some(Value::F(t)) if t.is_tracked() => Err(info.unsupported(format!("input {i} computed from the data"))),
        Some(v) if v.shape().iter().all(|&d| d == 1) => Ok(v.floats().first().copied()),
        Some(v) => Err(info.unsupported(format!("input {i} of shape {:?} (a scalar is expected)", v.shape()))),
    }
}

/// Input `i` as a float tensor (integers become an untracked constant).
pub(crate) fn tensor(info: &NodeInfo, ins: &[Option<&Value>], i: usize) -> Result<Tensor> {
    input(info, ins, i)?.to_tensor()
}

/// Input `i` as a float tensor, if present.
pub(crate) fn opt_tensor(ins: &[Option<&Value>], i: usize) -> Result<Option<Tensor>> {
    ins.get(i).copied().flatten().map(Value::to_tensor).transpose()
}

/// The product of some dimensions, an error when it overflows (the whole shape is checked elsewhere; a part of a
/// shape with a zero elsewhere can still overflow).
pub(crate) fn checked_product(info: &NodeInfo, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| info.malformed(format!("dimensions {dims:?} overflow")))
}

/// A value with the same data in a new shape.
pub(crate) fn reshape_value(v: &Value, shape: &[usize]) -> Result<Value> {
    match v {
        Value::F(t) => Ok(Value::F(t.reshape(shape)?)),
        Value::I(i) => {
            if crate::limits::checked_numel("onnx Reshape", shape)? != i.data.len() {
                return Err(crate::Error::ShapeMismatch {
                    op: "onnx Reshape",
                    expected: shape.to_vec(),
                    got: i.shape.clone(),
                });
            }
            Ok(Value::I(Ints { shape: shape.to_vec(), data: i.data.clone() }))
        }
    }
}

/// An output of `shape` with the kind (integer or float) of `like`.
pub(crate) fn like<A: Arg>(like: &A, shape: Vec<usize>) -> Meta {
    Meta::Shape { shape, int: like.is_int() }
}
