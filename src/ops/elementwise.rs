//! Elementwise ops with NumPy broadcasting, and the unary functions, each beside its derivative.

use ndarray::{ArrayD, IxDyn, Zip};
use rayon::prelude::*;

use super::shape::sum_to_shape;
use super::{record, Op, PAR_THRESHOLD};
use crate::tensor::{Array, Tensor};
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
}

impl BinaryKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BinaryKind::Add => "add",
            BinaryKind::Sub => "sub",
            BinaryKind::Mul => "mul",
            BinaryKind::Div => "div",
            BinaryKind::Maximum => "maximum",
            BinaryKind::Minimum => "minimum",
        }
    }

    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryKind::Add => a + b,
            BinaryKind::Sub => a - b,
            BinaryKind::Mul => a * b,
            BinaryKind::Div => a / b,
            BinaryKind::Maximum => a.max(b),
            BinaryKind::Minimum => a.min(b),
        }
    }
}

/// A unary function, with its constant parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryKind {
    /// −x; derivative −1.
    Neg,
    /// a·x + b; derivative a.
    Affine(f32, f32),
    /// x^p; derivative p·x^(p−1).
    Powf(f32),
    /// eˣ; derivative eˣ.
    Exp,
    /// ln x; derivative 1/x.
    Log,
    /// √x; derivative 1/(2√x).
    Sqrt,
    /// |x|; derivative sign(x) (0 at 0).
    Abs,
    /// sign(x); derivative 0.
    Sign,
    /// min(max(x, lo), hi); derivative 1 on [lo, hi], else 0 (PyTorch's convention at the edges).
    Clamp(f32, f32),
    /// max(x, 0); derivative 1 for x > 0, else 0.
    Relu,
    /// x for x > 0, else s·x; derivative 1 or s.
    LeakyRelu(f32),
    /// 1/(1+e⁻ˣ); derivative σ(1−σ).
    Sigmoid,
    /// tanh x; derivative 1 − tanh².
    Tanh,
    /// ln(1+eˣ), computed stably; derivative σ(x).
    Softplus,
    /// atanh x; derivative 1/(1−x²).
    Atanh,
}

impl UnaryKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            UnaryKind::Neg => "neg",
            UnaryKind::Affine(..) => "affine",
            UnaryKind::Powf(_) => "powf",
            UnaryKind::Exp => "exp",
            UnaryKind::Log => "log",
            UnaryKind::Sqrt => "sqrt",
            UnaryKind::Abs => "abs",
            UnaryKind::Sign => "sign",
            UnaryKind::Clamp(..) => "clamp",
            UnaryKind::Relu => "relu",
            UnaryKind::LeakyRelu(_) => "leaky_relu",
            UnaryKind::Sigmoid => "sigmoid",
            UnaryKind::Tanh => "tanh",
            UnaryKind::Softplus => "softplus",
            UnaryKind::Atanh => "atanh",
        }
    }

    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            UnaryKind::Neg => -x,
            UnaryKind::Affine(a, b) => a * x + b,
            UnaryKind::Powf(p) => x.powf(p),
            UnaryKind::Exp => x.exp(),
            UnaryKind::Log => x.ln(),
            UnaryKind::Sqrt => x.sqrt(),
            UnaryKind::Abs => x.abs(),
            UnaryKind::Sign => sign(x),
            UnaryKind::Clamp(lo, hi) => x.max(lo).min(hi),
            UnaryKind::Relu => x.max(0.0),
            UnaryKind::LeakyRelu(s) => {
                if x > 0.0 {
                    x
                } else {
                    s * x
                }
            }
            UnaryKind::Sigmoid => sigmoid(x),
            UnaryKind::Tanh => x.tanh(),
            UnaryKind::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
            UnaryKind::Atanh => x.atanh(),
        }
    }

    /// d out / d x at input `x` with output `y`.
    #[inline]
    fn derivative(self, x: f32, y: f32) -> f32 {
        match self {
            UnaryKind::Neg => -1.0,
            UnaryKind::Affine(a, _) => a,
            UnaryKind::Powf(p) => p * x.powf(p - 1.0),
            UnaryKind::Exp => y,
            UnaryKind::Log => 1.0 / x,
            UnaryKind::Sqrt => 0.5 / y,
            UnaryKind::Abs => sign(x),
            UnaryKind::Sign => 0.0,
            UnaryKind::Clamp(lo, hi) => f32::from(x >= lo && x <= hi),
            UnaryKind::Relu => f32::from(x > 0.0),
            UnaryKind::LeakyRelu(s) => {
                if x > 0.0 {
                    1.0
                } else {
                    s
                }
            }
            UnaryKind::Sigmoid => y * (1.0 - y),
            UnaryKind::Tanh => 1.0 - y * y,
            UnaryKind::Softplus => sigmoid(x),
            UnaryKind::Atanh => 1.0 / (1.0 - x * x),
        }
    }
}

/// sign with sign(0) = 0 (NumPy's convention; `f32::signum` gives ±1 at ±0).
#[inline]
pub(crate) fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

#[inline]
pub(crate) fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Elements per task of the flat elementwise loops: each task is a plain slice loop that LLVM vectorises (a
/// rayon `map(..).collect()` pushes one element at a time and does not).
const FLAT_CHUNK: usize = 1 << 14;

/// `out[i] = f(a[i])` over equal-length slices, in parallel when long.
fn flat1(a: &[f32], f: impl Fn(f32) -> f32 + Sync + Send) -> Vec<f32> {
    let mut out = vec![0.0f32; a.len()];
    let body = |(o, a): (&mut [f32], &[f32])| o.iter_mut().zip(a).for_each(|(o, &a)| *o = f(a));
    if a.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(FLAT_CHUNK).zip(a.par_chunks(FLAT_CHUNK)).for_each(body);
    } else {
        body((&mut out, a));
    }
    out
}

/// `f` applied to every element, split across threads when the array is large (elementwise, so deterministic).
pub(crate) fn map(x: &Array, f: impl Fn(f32) -> f32 + Sync + Send) -> ArrayD<f32> {
    if let Some(s) = x.as_slice() {
        return ArrayD::from_shape_vec(x.raw_dim(), flat1(s, f)).expect("same length");
    }
    if x.len() >= PAR_THRESHOLD {
        Zip::from(x).par_map_collect(|&v| f(v))
    } else {
        x.map(|&v| f(v))
    }
}

/// The broadcast shape of two shapes (NumPy rules), or `None`.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

fn binary(kind: BinaryKind, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let value = if a.shape() == b.shape() {
        zip2(a.value(), b.value(), |x, y| kind.apply(x, y))
    } else {
        let shape = broadcast_shape(a.shape(), b.shape()).ok_or_else(|| Error::Broadcast {
            op: kind.name(),
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        })?;
        let av = a.value().broadcast(IxDyn(&shape)).expect("broadcast shape computed above");
        let bv = b.value().broadcast(IxDyn(&shape)).expect("broadcast shape computed above");
        if shape.iter().product::<usize>() >= PAR_THRESHOLD {
            Zip::from(&av).and(&bv).par_map_collect(|&x, &y| kind.apply(x, y))
        } else {
            Zip::from(&av).and(&bv).map_collect(|&x, &y| kind.apply(x, y))
        }
    };
    Ok(record(value, Op::Binary(kind, a.clone(), b.clone())))
}

fn zip2(a: &Array, b: &Array, f: impl Fn(f32, f32) -> f32 + Sync + Send) -> ArrayD<f32> {
    if let (Some(sa), Some(sb)) = (a.as_slice(), b.as_slice()) {
        let mut out = vec![0.0f32; sa.len()];
        let body = |((o, a), b): ((&mut [f32], &[f32]), &[f32])| {
            o.iter_mut().zip(a).zip(b).for_each(|((o, &a), &b)| *o = f(a, b));
        };
        if sa.len() >= PAR_THRESHOLD {
            out.par_chunks_mut(FLAT_CHUNK).zip(sa.par_chunks(FLAT_CHUNK)).zip(sb.par_chunks(FLAT_CHUNK)).for_each(body);
        } else {
            body(((&mut out, sa), sb));
        }
        return ArrayD::from_shape_vec(a.raw_dim(), out).expect("same length");
    }
    if a.len() >= PAR_THRESHOLD {
        Zip::from(a).and(b).par_map_collect(|&x, &y| f(x, y))
    } else {
        Zip::from(a).and(b).map_collect(|&x, &y| f(x, y))
    }
}

/// `f(g, a, b)` over the output gradient's shape, with `a` and `b` broadcast to it.
fn zip_grad(g: &ArrayD<f32>, a: &Array, b: &Array, f: impl Fn(f32, f32, f32) -> f32 + Sync + Send) -> ArrayD<f32> {
    let av = a.broadcast(g.raw_dim()).expect("inputs broadcast to the output");
    let bv = b.broadcast(g.raw_dim()).expect("inputs broadcast to the output");
    if g.len() >= PAR_THRESHOLD {
        Zip::from(g).and(&av).and(&bv).par_map_collect(|&g, &x, &y| f(g, x, y))
    } else {
        Zip::from(g).and(&av).and(&bv).map_collect(|&g, &x, &y| f(g, x, y))
    }
}

pub(crate) fn binary_backward(
    kind: BinaryKind,
    a: &Tensor,
    b: &Tensor,
    g: &ArrayD<f32>,
    need: &[bool],
) -> Vec<Option<ArrayD<f32>>> {
    let (av, bv) = (a.value(), b.value());
    let ga = need[0].then(|| {
        let full = match kind {
            BinaryKind::Add => g.clone(),
            BinaryKind::Sub => g.clone(),
            BinaryKind::Mul => zip_grad(g, av, bv, |g, _, y| g * y),
            BinaryKind::Div => zip_grad(g, av, bv, |g, _, y| g / y),
            BinaryKind::Maximum => zip_grad(g, av, bv, tie_share),
            BinaryKind::Minimum => zip_grad(g, av, bv, |g, x, y| tie_share(g, y, x)),
        };
        sum_to_shape(full, a.shape())
    });
    let gb = need[1].then(|| {
        let full = match kind {
            BinaryKind::Add => g.clone(),
            BinaryKind::Sub => g.mapv(|v| -v),
            BinaryKind::Mul => zip_grad(g, av, bv, |g, x, _| g * x),
            BinaryKind::Div => zip_grad(g, av, bv, |g, x, y| -g * x / (y * y)),
            BinaryKind::Maximum => zip_grad(g, av, bv, |g, x, y| tie_share(g, y, x)),
            BinaryKind::Minimum => zip_grad(g, av, bv, tie_share),
        };
        sum_to_shape(full, b.shape())
    });
    vec![ga, gb]
}

/// The share of `g` that goes to the winner `x` of a max against `y`: all of it, none, or half on a tie (PyTorch).
#[inline]
fn tie_share(g: f32, x: f32, y: f32) -> f32 {
    if x > y {
        g
    } else if x == y {
        0.5 * g
    } else {
        0.0
    }
}

pub(crate) fn unary(kind: UnaryKind, x: &Tensor) -> Tensor {
    // ReLU gets its own monomorphised loop (the `match` inside `apply` keeps the generic loop from vectorising);
    // same expression, same bits.
    let value = match kind {
        UnaryKind::Relu => map(x.value(), |v| v.max(0.0)),
        _ => map(x.value(), move |v| kind.apply(v)),
    };
    record(value, Op::Unary(kind, x.clone()))
}

/// `f` over three equal-length slices, split across threads when long (elementwise, so deterministic).
fn zip_slices(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32 + Sync + Send) -> Vec<f32> {
    let mut out = vec![0.0f32; a.len()];
    type Chunks<'a> = (((&'a mut [f32], &'a [f32]), &'a [f32]), &'a [f32]);
    let body = |(((o, a), b), c): Chunks| {
        for (((o, &a), &b), &c) in o.iter_mut().zip(a).zip(b).zip(c) {
            *o = f(a, b, c);
        }
    };
    if a.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(FLAT_CHUNK)
            .zip(a.par_chunks(FLAT_CHUNK))
            .zip(b.par_chunks(FLAT_CHUNK))
            .zip(c.par_chunks(FLAT_CHUNK))
            .for_each(body);
    } else {
        body((((&mut out, a), b), c));
    }
    out
}

pub(crate) fn unary_backward(kind: UnaryKind, x: &Array, y: &Array, g: &ArrayD<f32>) -> ArrayD<f32> {
    if let (Some(gs), Some(xs), Some(ys)) = (g.as_slice(), x.as_slice(), y.as_slice()) {
        // All three in standard layout: one flat pass, collected without zero-filling first.
        let v = match kind {
            UnaryKind::Relu => zip_slices(gs, xs, ys, |g, x, _| g * f32::from(x > 0.0)),
            _ => zip_slices(gs, xs, ys, |g, x, y| g * kind.derivative(x, y)),
        };
        return ArrayD::from_shape_vec(g.raw_dim(), v).expect("same length");
    }
    if g.len() >= PAR_THRESHOLD {
        Zip::from(g).and(x).and(y).par_map_collect(|&g, &x, &y| g * kind.derivative(x, y))
    } else {
        Zip::from(g).and(x).and(y).map_collect(|&g, &x, &y| g * kind.derivative(x, y))
    }
}

/// Elementwise arithmetic and functions on tensors.
impl Tensor {
    /// a + b with broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Add, self, other)
    }
    /// a − b with broadcasting.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Sub, self, other)
    }
    /// a · b (elementwise) with broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Mul, self, other)
    }
    /// a / b with broadcasting; ∂/∂b = −a/b².
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Div, self, other)
    }
    /// Elementwise maximum; on ties the gradient is split evenly (as PyTorch).
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Maximum, self, other)
    }
    /// Elementwise minimum; on ties the gradient is split evenly (as PyTorch).
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Minimum, self, other)
    }
    /// Applies a [`UnaryKind`].
    pub fn unary(&self, kind: UnaryKind) -> Tensor {
        unary(kind, self)
    }
    /// −x.
    pub fn neg(&self) -> Tensor {
        unary(UnaryKind::Neg, self)
    }
    /// x + s.
    pub fn add_scalar(&self, s: f32) -> Tensor {
        unary(UnaryKind::Affine(1.0, s), self)
    }
    /// x · s.
    pub fn mul_scalar(&self, s: f32) -> Tensor {
        unary(UnaryKind::Affine(s, 0.0), self)
    }
    /// a·x + b.
    pub fn affine(&self, a: f32, b: f32) -> Tensor {
        unary(UnaryKind::Affine(a, b), self)
    }
    /// x^p.
    pub fn powf(&self, p: f32) -> Tensor {
        unary(UnaryKind::Powf(p), self)
    }
    /// eˣ.
    pub fn exp(&self) -> Tensor {
        unary(UnaryKind::Exp, self)
    }
    /// ln x.
    pub fn log(&self) -> Tensor {
        unary(UnaryKind::Log, self)
    }
    /// √x.
    pub fn sqrt(&self) -> Tensor {
        unary(UnaryKind::Sqrt, self)
    }
    /// |x|.
    pub fn abs(&self) -> Tensor {
        unary(UnaryKind::Abs, self)
    }
    /// sign(x), with sign(0) = 0; its gradient is zero.
    pub fn sign(&self) -> Tensor {
        unary(UnaryKind::Sign, self)
    }
    /// Clamps to `[lo, hi]`.
    pub fn clamp(&self, lo: f32, hi: f32) -> Tensor {
        unary(UnaryKind::Clamp(lo, hi), self)
    }
    /// max(x, 0).
    pub fn relu(&self) -> Tensor {
        unary(UnaryKind::Relu, self)
    }
    /// x for x > 0, else slope·x.
    pub fn leaky_relu(&self, slope: f32) -> Tensor {
        unary(UnaryKind::LeakyRelu(slope), self)
    }
    /// The logistic sigmoid.
    pub fn sigmoid(&self) -> Tensor {
        unary(UnaryKind::Sigmoid, self)
    }
    /// tanh.
    pub fn tanh(&self) -> Tensor {
        unary(UnaryKind::Tanh, self)
    }
    /// ln(1 + eˣ), stable for large |x|.
    pub fn softplus(&self) -> Tensor {
        unary(UnaryKind::Softplus, self)
    }
    /// atanh.
    pub fn atanh(&self) -> Tensor {
        unary(UnaryKind::Atanh, self)
    }
}
