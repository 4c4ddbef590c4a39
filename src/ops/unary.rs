//! Unary elementwise functions ([`UnaryKind`]): their values and derivatives, the monomorphised loops of the
//! common ones (forward and backward, one flat pass each), and the [`Tensor`] methods that apply them.

use std::mem::MaybeUninit;

use ndarray::ArrayD;
use rayon::prelude::*;

use super::elementwise::{map, FLAT_CHUNK};
use super::shape::standard;
use super::{record, vmath, Op, PAR_THRESHOLD};
use crate::tensor::{Array, Tensor};

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
    /// 1/(1+e⁻ˣ) (within 2.4e-7 relative, see `vmath::sigmoid`); derivative σ(1−σ).
    Sigmoid,
    /// SiLU (swish) x·σ(x); derivative σ(x)·(1 + x·(1 − σ(x))).
    Silu,
    /// tanh x; derivative 1 − tanh².
    Tanh,
    /// ln(1+eˣ), computed stably; derivative σ(x).
    Softplus,
    /// atanh x; derivative 1/(1−x²).
    Atanh,
    /// The error function erf x (within 1e-7 absolute everywhere; see `vmath::erf`); derivative (2/√π)·e^(−x²).
    Erf,
    /// GELU, exact: x·Φ(x) = ½·x·(1 + erf(x/√2)); derivative Φ(x) + x·φ(x).
    Gelu,
    /// GELU, tanh approximation: ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (PyTorch's `approximate="tanh"`);
    /// derivative in `vmath::gelu_tanh_derivative`.
    GeluTanh,
    /// clamp(α·x + β, 0, 1); derivative α where 0 < α·x + β < 1, else 0 (PyTorch's `hardsigmoid` at its kinks).
    HardSigmoid(f32, f32),
    /// x·clamp(x + 3, 0, 6)/6; derivative 0 for x ≤ −3, x/3 + ½ for −3 < x < 3, 1 for x ≥ 3 (PyTorch's
    /// `hardswish` at its kinks).
    HardSwish,
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
            UnaryKind::Silu => "silu",
            UnaryKind::Tanh => "tanh",
            UnaryKind::Softplus => "softplus",
            UnaryKind::Atanh => "atanh",
            UnaryKind::Erf => "erf",
            UnaryKind::Gelu => "gelu",
            UnaryKind::GeluTanh => "gelu_tanh",
            UnaryKind::HardSigmoid(..) => "hard_sigmoid",
            UnaryKind::HardSwish => "hard_swish",
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
            UnaryKind::Sigmoid => vmath::sigmoid(x),
            UnaryKind::Silu => vmath::silu(x),
            UnaryKind::Tanh => x.tanh(),
            UnaryKind::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
            UnaryKind::Atanh => x.atanh(),
            UnaryKind::Erf => vmath::erf(x),
            UnaryKind::Gelu => vmath::gelu(x),
            UnaryKind::GeluTanh => vmath::gelu_tanh(x),
            UnaryKind::HardSigmoid(a, b) => hard_sigmoid(a, b, x),
            UnaryKind::HardSwish => hard_swish(x),
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
            UnaryKind::Silu => vmath::silu_derivative(x),
            UnaryKind::Tanh => 1.0 - y * y,
            UnaryKind::Softplus => vmath::sigmoid(x),
            UnaryKind::Atanh => 1.0 / (1.0 - x * x),
            UnaryKind::Erf => vmath::erf_derivative(x),
            UnaryKind::Gelu => vmath::gelu_derivative(x),
            UnaryKind::GeluTanh => vmath::gelu_tanh_derivative(x),
            UnaryKind::HardSigmoid(a, b) => hard_sigmoid_derivative(a, b, x),
            UnaryKind::HardSwish => hard_swish_derivative(x),
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

/// clamp(α·x + β, 0, 1).
#[inline(always)]
fn hard_sigmoid(alpha: f32, beta: f32, x: f32) -> f32 {
    (alpha * x + beta).clamp(0.0, 1.0)
}

/// α inside the ramp (0 < α·x + β < 1, open at both ends as PyTorch's `hardsigmoid_backward`), else 0.
#[inline(always)]
fn hard_sigmoid_derivative(alpha: f32, beta: f32, x: f32) -> f32 {
    let v = alpha * x + beta;
    if v > 0.0 && v < 1.0 {
        alpha
    } else {
        0.0
    }
}

/// x·clamp(x + 3, 0, 6)/6, in PyTorch's order of operations.
#[inline(always)]
fn hard_swish(x: f32) -> f32 {
    x * (x + 3.0).clamp(0.0, 6.0) / 6.0
}

/// 0 up to −3, x/3 + ½ strictly between −3 and 3, 1 from 3 on (the kinks as PyTorch's `hardswish_backward`).
#[inline(always)]
fn hard_swish_derivative(x: f32) -> f32 {
    if x <= -3.0 {
        0.0
    } else if x < 3.0 {
        x / 3.0 + 0.5
    } else {
        1.0
    }
}

pub(crate) fn unary(kind: UnaryKind, x: &Tensor) -> Tensor {
    // The common kinds get their own monomorphised loops (the `match` inside `apply` keeps the generic loop from
    // vectorising; Clip — ReLU6 — was a fifth of MobileNetV2's forward); same expressions, same bits.
    let value = match kind {
        UnaryKind::Relu => map(x.value(), |v| v.max(0.0)),
        UnaryKind::Sigmoid => map(x.value(), vmath::sigmoid),
        UnaryKind::Silu => map(x.value(), vmath::silu),
        UnaryKind::Erf => map(x.value(), vmath::erf),
        UnaryKind::Gelu => map(x.value(), vmath::gelu),
        UnaryKind::GeluTanh => map(x.value(), vmath::gelu_tanh),
        UnaryKind::HardSigmoid(a, b) => map(x.value(), move |v| hard_sigmoid(a, b, v)),
        UnaryKind::HardSwish => map(x.value(), hard_swish),
        UnaryKind::Clamp(lo, hi) => map(x.value(), move |v| v.max(lo).min(hi)),
        UnaryKind::Affine(a, b) => map(x.value(), move |v| a * v + b),
        UnaryKind::Neg => map(x.value(), |v| -v),
        UnaryKind::Abs => map(x.value(), f32::abs),
        _ => map(x.value(), move |v| kind.apply(v)),
    };
    record(value, Op::Unary(kind, x.clone()))
}

/// `f` over three equal-length slices, split across threads when long (elementwise, so deterministic).
fn zip_slices(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32 + Sync + Send) -> Vec<f32> {
    type Chunks<'a> = (((&'a mut [MaybeUninit<f32>], &'a [f32]), &'a [f32]), &'a [f32]);
    let body = |(((o, a), b), c): Chunks| vmath::zip3_into(a, b, c, o, &f);
    // SAFETY: `zip3_into` writes every element of each chunk, and the chunks cover the output.
    unsafe {
        super::written(a.len(), |out| {
            if a.len() >= PAR_THRESHOLD {
                out.par_chunks_mut(FLAT_CHUNK)
                    .zip(a.par_chunks(FLAT_CHUNK))
                    .zip(b.par_chunks(FLAT_CHUNK))
                    .zip(c.par_chunks(FLAT_CHUNK))
                    .for_each(body);
            } else {
                body((((out, a), b), c));
            }
        })
    }
}

pub(crate) fn unary_backward(kind: UnaryKind, x: &Array, y: &Array, g: &ArrayD<f32>) -> ArrayD<f32> {
    // One flat pass over the three (one shape: the op's input, output and output gradient) in row-major order, a
    // permuted operand copied by tiles first, collected without zero-filling first.
    let (gs, xs, ys) = (standard(g), standard(x), standard(y));
    let (gs, xs, ys) = (&gs[..], &xs[..], &ys[..]);
    let v = match kind {
        UnaryKind::Relu => zip_slices(gs, xs, ys, |g, x, _| g * f32::from(x > 0.0)),
        UnaryKind::Sigmoid => zip_slices(gs, xs, ys, |g, _, y| g * (y * (1.0 - y))),
        UnaryKind::Silu => zip_slices(gs, xs, ys, |g, x, _| g * vmath::silu_derivative(x)),
        UnaryKind::Erf => zip_slices(gs, xs, ys, |g, x, _| g * vmath::erf_derivative(x)),
        UnaryKind::Gelu => zip_slices(gs, xs, ys, |g, x, y| g * vmath::gelu_derivative_from(x, y)),
        UnaryKind::GeluTanh => zip_slices(gs, xs, ys, |g, x, _| g * vmath::gelu_tanh_derivative(x)),
        UnaryKind::HardSigmoid(a, b) => zip_slices(gs, xs, ys, |g, x, _| g * hard_sigmoid_derivative(a, b, x)),
        UnaryKind::HardSwish => zip_slices(gs, xs, ys, |g, x, _| g * hard_swish_derivative(x)),
        UnaryKind::Clamp(lo, hi) => zip_slices(gs, xs, ys, move |g, x, _| g * f32::from(x >= lo && x <= hi)),
        UnaryKind::Affine(a, _) => zip_slices(gs, xs, ys, move |g, _, _| g * a),
        _ => zip_slices(gs, xs, ys, |g, x, y| g * kind.derivative(x, y)),
    };
    ArrayD::from_shape_vec(g.raw_dim(), v).expect("one gradient per input")
}

/// Unary functions on tensors.
impl Tensor {
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
    /// SiLU (swish): x·σ(x), as one vectorised pass.
    pub fn silu(&self) -> Tensor {
        unary(UnaryKind::Silu, self)
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
    /// The error function (within 1e-7 absolute of the true value on the whole real line).
    pub fn erf(&self) -> Tensor {
        unary(UnaryKind::Erf, self)
    }
    /// GELU: x·Φ(x) exactly (`approximate = false`), or its tanh approximation (`approximate = true`), as
    /// PyTorch's `gelu(x, approximate="none" | "tanh")`.
    pub fn gelu(&self, approximate: bool) -> Tensor {
        unary(if approximate { UnaryKind::GeluTanh } else { UnaryKind::Gelu }, self)
    }
    /// clamp(α·x + β, 0, 1) (ONNX's HardSigmoid; PyTorch's `hardsigmoid` is α = 1/6, β = ½).
    pub fn hard_sigmoid(&self, alpha: f32, beta: f32) -> Tensor {
        unary(UnaryKind::HardSigmoid(alpha, beta), self)
    }
    /// x·clamp(x + 3, 0, 6)/6 (PyTorch's `hardswish`, ONNX's HardSwish).
    pub fn hard_swish(&self) -> Tensor {
        unary(UnaryKind::HardSwish, self)
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Zip;

    use super::*;

    /// The monomorphised unary loops give the bits of the generic `apply`/`derivative`, forward and backward,
    /// on values around every kink (and NaN, ±∞), on arrays long enough to split across threads.
    #[test]
    fn unary_fast_paths_match_the_generic_kinds() {
        let kinds = [
            UnaryKind::Relu,
            UnaryKind::Clamp(0.0, 6.0),
            UnaryKind::Clamp(-1.0, f32::INFINITY),
            UnaryKind::Affine(0.5, -0.25),
            UnaryKind::Neg,
            UnaryKind::Abs,
            UnaryKind::HardSwish,
            UnaryKind::HardSigmoid(0.2, 0.5),
        ];
        let special = [0.0, -0.0, 6.0, -1.0, 3.0, -3.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-30];
        let mut v = Tensor::uniform(&[3, 40_000], -8.0, 8.0, 7).to_array();
        for (i, x) in v.iter_mut().enumerate().filter(|(i, _)| i % 97 == 0) {
            *x = special[(i / 97) % special.len()];
        }
        let g = Tensor::uniform(&[3, 40_000], -1.0, 1.0, 8).to_array();
        let bits = |a: &ArrayD<f32>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for kind in kinds {
            let y = unary(kind, &Tensor::new(v.clone())).to_array();
            assert_eq!(bits(&y), bits(&v.mapv(|x| kind.apply(x))), "{kind:?} forward");
            let dx = unary_backward(kind, &v.clone().into_shared(), &y.clone().into_shared(), &g);
            let want = Zip::from(&g).and(&v).and(&y).map_collect(|&g, &x, &y| g * kind.derivative(x, y));
            assert_eq!(bits(&dx), bits(&want), "{kind:?} backward");
        }
    }
}
