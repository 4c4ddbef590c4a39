//! 2-D convolution (cross-correlation, as PyTorch), batch-parallel, with its backward; optionally fused with the
//! ReLU after it, or with the ReLU and a 2×2 max pooling.
//!
//! - [`forward`]: `out[Og, HoWo] = W[Og, K] · col[K, HoWo]` per image and group, `K = Cg·kh·kw`, where `col` is
//!   the unfolded image — read in place by the direct kernels when the column stride is 1, else written by im2col;
//! - [`backward`]: `dcol = Wᵀ · dout` scattered back into the image for ∂L/∂x (tile by tile on the direct kernels,
//!   else by col2im), and `dW = Σₙ dout · colᵀ` for ∂L/∂W — only the gradients whose inputs are tracked;
//! - [`depthwise`]: `groups == channels` as its own plane-by-plane kernel (forward and backward), and
//!   `depthwise_lanes` (x86-64): its forward and input gradient with the channels in the vector lanes, for short
//!   rows and wide kernels;
//! - [`sparse`]: the backward through the fused ReLU and 2×2 max pooling from the windows' arg-max alone;
//! - `plan` (x86-64; `no_plan.rs` elsewhere): the planners of the direct kernels, `None` where they do not run;
//! - [`unfold`]: im2col, col2im, the product and the transpose, on the vector kernels or scalar loops;
//! - [`winograd`]: 3×3 convolutions of stride 1 with 32 channels or more (and their input gradients) by
//!   Winograd's F(4×4, 3×3), a quarter of the multiply-adds (`ARMOURY_NO_WINOGRAD` turns it off).
//!
//! Weight and bias gradients are summed per fixed chunk of images and the chunks added in order, so results do not
//! depend on the thread count. This file holds the parameters, the geometry and the [`Tensor`] methods.

use ndarray::{ArrayView2, ArrayViewMut2};

use super::simd;
use crate::tensor::Tensor;
use crate::{Error, Result};

mod backward;
mod depthwise;
#[cfg(target_arch = "x86_64")]
mod depthwise_lanes;
mod forward;
#[cfg(target_arch = "x86_64")]
mod plan;
#[cfg(not(target_arch = "x86_64"))]
#[path = "no_plan.rs"]
mod plan;
mod pointwise;
mod sparse;
mod unfold;
mod winograd;

pub(crate) use backward::{conv2d_add_backward, conv2d_backward, conv2d_pool_backward};
pub(crate) use winograd::enabled as winograd_enabled;

/// Stride, zero padding, dilation and groups of a convolution (PyTorch's meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Step between output positions (rows, columns).
    pub stride: (usize, usize),
    /// Zeros added on each side (rows, columns).
    pub padding: (usize, usize),
    /// Spacing between kernel taps (rows, columns).
    pub dilation: (usize, usize),
    /// Channel groups: input and output channels split into this many independent convolutions.
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams { stride: (1, 1), padding: (0, 0), dilation: (1, 1), groups: 1 }
    }
}

/// The clamp a convolution applies to its output as it stores it (fused): `[0, ∞)` is the ReLU, `[0, 6]` the
/// ReLU6 that MobileNets export as a Clip. The backward passes the output gradient where the output lies strictly
/// inside the bounds (an infinite bound admits everything on its side), as PyTorch's `threshold_backward` (ReLU)
/// and `hardtanh_backward` (ReLU6) do; the output alone cannot tell the inclusive rule of a plain
/// [`Tensor::clamp`] (PyTorch's `clamp`), which differs only where the convolution's value equals a bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Clamp {
    pub(crate) lo: f32,
    pub(crate) hi: f32,
}

impl Clamp {
    /// max(x, 0).
    pub(crate) const RELU: Clamp = Clamp { lo: 0.0, hi: f32::INFINITY };

    /// `v` clamped (`max` first, so a NaN becomes `lo`, as the kernels' vector `max` does).
    #[inline(always)]
    pub(crate) fn apply(self, v: f32) -> f32 {
        v.max(self.lo).min(self.hi)
    }

    /// Whether the gradient passes where the clamped output is `y`.
    #[inline(always)]
    pub(crate) fn passes(self, y: f32) -> bool {
        // `&` and `|`, not `&&` and `||`: no branch, so a loop over a slice vectorises.
        ((y > self.lo) | (self.lo == f32::NEG_INFINITY)) & ((y < self.hi) | (self.hi == f32::INFINITY))
    }

    /// The bounds as the vector kernels take them.
    pub(crate) fn bounds(this: Option<Clamp>) -> Option<[f32; 2]> {
        this.map(|c| [c.lo, c.hi])
    }
}

/// An activation applied to each stretch of a convolution's output right after its kernel wrote it (an image, a
/// depthwise plane or band: in cache, not in a pass of its own over the output — except after Winograd and the
/// small-map path, which write the whole batch at once and get one pass over it), outside the kernels'
/// flush-to-zero mode: the bits of the activation's own op on the convolution's output ([`Tensor::conv2d_silu`]).
pub(crate) type After = Option<fn(&mut [f32])>;

/// Geometry shared by the forward and backward kernels.
#[derive(Clone, Copy)]
struct Geom {
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    ho: usize,
    wo: usize,
    p: Conv2dParams,
}

impl Geom {
    fn cg(&self) -> usize {
        self.c / self.p.groups
    }
    fn og(&self) -> usize {
        self.o / self.p.groups
    }
    fn k(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    fn hw_out(&self) -> usize {
        self.ho * self.wo
    }
    fn unfold(&self) -> simd::Unfold {
        let p = &self.p;
        simd::Unfold {
            cg: self.cg(),
            h: self.h,
            w: self.w,
            kh: self.kh,
            kw: self.kw,
            ho: self.ho,
            wo: self.wo,
            sh: p.stride.0,
            ph: p.padding.0,
            pw: p.padding.1,
            dh: p.dilation.0,
            dw: p.dilation.1,
        }
    }
    fn is_pointwise(&self) -> bool {
        self.is_one_tap() && self.p.stride == (1, 1)
    }

    /// A 1×1 kernel with no padding, at any stride: every output reads one input pixel, so unfolding is a copy at
    /// most (a subsampling one with a stride: a quarter of the input at stride 2) and one product is the whole
    /// convolution, its input gradient the product scattered back. Neither direct plan takes it: their stride
    /// phases, built for taps, ran ResNet-50's downsampling projections onto 28² and 14² at 36–51% of the peak
    /// forward and 34–38% for the input gradient; the product runs them at 65–78%.
    fn is_one_tap(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.p.padding == (0, 0)
    }
}

/// Images per chunk for weight-gradient partial sums: fixed, so the summation order is too.
const WGRAD_CHUNK: usize = 8;

/// Output size of a convolution or pooling window along one axis, or `None` if the window does not fit.
pub(crate) fn out_size(len: usize, k: usize, stride: usize, pad: usize, dil: usize) -> Option<usize> {
    let span = dil * (k - 1) + 1;
    (len + 2 * pad).checked_sub(span).map(|r| r / stride + 1)
}

fn geometry(x: &[usize], w: &[usize], b: Option<&[usize]>, p: Conv2dParams) -> Result<Geom> {
    let op = "conv2d";
    let [_, c, h, wd] = *x else {
        return Err(Error::RankMismatch { op, expected: 4, got: x.len(), shape: x.to_vec() });
    };
    let [o, cg, kh, kw] = *w else {
        return Err(Error::RankMismatch { op, expected: 4, got: w.len(), shape: w.to_vec() });
    };
    if p.groups == 0
        || p.stride.0 == 0
        || p.stride.1 == 0
        || p.dilation.0 == 0
        || p.dilation.1 == 0
        || kh == 0
        || kw == 0
    {
        return Err(Error::invalid(op, format!("stride, dilation, kernel and groups must be positive: {p:?}")));
    }
    if c == 0 || o == 0 {
        return Err(Error::invalid(op, format!("{c} input and {o} output channels: both must be positive")));
    }
    if c % p.groups != 0 || o % p.groups != 0 || cg * p.groups != c {
        return Err(Error::ShapeMismatch { op, expected: vec![o, c / p.groups.max(1), kh, kw], got: w.to_vec() });
    }
    if let Some(b) = b {
        if b != [o] {
            return Err(Error::ShapeMismatch { op, expected: vec![o], got: b.to_vec() });
        }
    }
    let ho = out_size(h, kh, p.stride.0, p.padding.0, p.dilation.0);
    let wo = out_size(wd, kw, p.stride.1, p.padding.1, p.dilation.1);
    let (Some(ho), Some(wo)) = (ho, wo) else {
        return Err(Error::invalid(op, format!("kernel {kh}x{kw} does not fit input {h}x{wd} with {p:?}")));
    };
    Ok(Geom { c, h, w: wd, o, kh, kw, ho, wo, p })
}

fn mat(s: &[f32], r: usize, c: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((r, c), s).expect("slice length is r·c")
}

fn mat_mut(s: &mut [f32], r: usize, c: usize) -> ArrayViewMut2<'_, f32> {
    ArrayViewMut2::from_shape((r, c), s).expect("slice length is r·c")
}

/// The chunks' partial sums (`len` values each) added chunk after chunk: a fixed order, whatever the threads.
fn sum_in_order(parts: &[Vec<f32>], len: usize) -> Vec<f32> {
    let mut total = vec![0.0f32; len];
    for part in parts {
        total.iter_mut().zip(part).for_each(|(t, v)| *t += v);
    }
    total
}

/// Convolution.
impl Tensor {
    /// 2-D cross-correlation of `self` [N, C, H, W] with `weight` [O, C/groups, kh, kw] plus an optional
    /// `bias` [O]; output [N, O, Ho, Wo] with Ho = ⌊(H + 2p − d(kh−1) − 1)/s⌋ + 1.
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Tensor> {
        forward::conv2d(self, weight, bias, params, None, None)
    }

    /// `relu(conv2d(…))` as one op: the same values and gradients, one pass over the output fewer each way.
    pub fn conv2d_relu(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Tensor> {
        forward::conv2d(self, weight, bias, params, Some(Clamp::RELU), None)
    }

    /// `conv2d(…)` clamped to `[lo, hi]` as one op (ReLU6 is `[0, 6]`, an ONNX Conv → Clip): the values of
    /// `conv2d(…).clamp(lo, hi)` with no pass over the output for the clamp. The gradient passes where the output
    /// lies strictly inside the bounds — PyTorch's ReLU6 (`hardtanh_backward`); [`Tensor::clamp`] also passes it
    /// where the convolution's value equals a bound.
    pub fn conv2d_clamp(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
        lo: f32,
        hi: f32,
    ) -> Result<Tensor> {
        if lo.is_nan() || hi.is_nan() || lo > hi {
            return Err(Error::invalid("conv2d_clamp", format!("the bounds [{lo}, {hi}] are not an interval")));
        }
        forward::conv2d(self, weight, bias, params, Some(Clamp { lo, hi }), None)
    }

    /// `conv2d(…) + residual` as one op (a residual connection): the same values and gradients as the two ops,
    /// with the sum made as the convolution stores its output (or right after, while the output is in cache)
    /// instead of in a pass of its own. A `residual` not of the output's shape is added with broadcasting, as
    /// [`Tensor::add`] does, after the convolution.
    pub fn conv2d_add(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
        residual: &Tensor,
    ) -> Result<Tensor> {
        forward::conv2d(self, weight, bias, params, None, Some(residual))
    }

    /// `relu(conv2d(…) + residual)` as one op (a residual block's end): the values and gradients of
    /// `conv2d(…).add_relu(residual)`, see [`Tensor::conv2d_add`] — where the ReLU blocks the gradient it is +0 (a
    /// selection, as PyTorch's ReLU and [`Tensor::conv2d_relu`] make it), where `add_relu` multiplies by the mask
    /// (−0 for a negative gradient, NaN for an infinite one).
    pub fn conv2d_add_relu(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
        residual: &Tensor,
    ) -> Result<Tensor> {
        forward::conv2d(self, weight, bias, params, Some(Clamp::RELU), Some(residual))
    }

    /// `silu(conv2d(…))` as one op (EfficientNet's Conv → Sigmoid → Mul): the SiLU applied to each image's output
    /// right after the convolution wrote it, while it is in cache (over the whole batch after Winograd and the
    /// small-map path) — the bits of `conv2d(…).silu()`. A pass that records gradients runs the two ops (the SiLU's
    /// gradient needs the convolution's output).
    pub fn conv2d_silu(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Tensor> {
        forward::conv2d_silu(self, weight, bias, params)
    }

    /// `max_pool2d(relu(conv2d(…)), 2×2 windows, stride 2)` as one op: the same values and gradients, with the
    /// convolution's output kept in cache instead of written out and read back each way.
    pub fn conv2d_relu_max_pool2(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
    ) -> Result<Tensor> {
        forward::conv2d_relu_max_pool2(self, weight, bias, params)
    }
}

#[cfg(test)]
mod tests;
