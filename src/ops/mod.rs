//! Operations: a closed [`Op`] enum recording how a tensor was made, and a thin backward dispatcher.
//!
//! Each op family lives in its own file with its forward and backward side by side. Adding a variant fails to
//! compile until it names its inputs and its backward.
//!
//! A map of the kernel house, from the ops down to the vector kernels:
//! - `elementwise` (binary, broadcast), `unary`, `reduce`, `shape`, `index`, `loss`: plain loops over `ndarray`, split across threads above
//!   `PAR_THRESHOLD` elements; the flat elementwise loops and the transcendental activations (erf, GELU) run on
//!   `vmath`: branch-free functions and slice loops the compiler vectorises, on AVX2 when the CPU has it;
//! - `norm`: layer normalisation, fused (statistics, output and backward one pass per row); `batch_norm`: batch
//!   normalisation, fused (a statistics pass per channel, a normalise-and-affine pass; backward the same two);
//! - `matmul`: products on `simd::gemm_nn` or the `gemm` crate, NumPy's broadcasting `matmul`; `einsum`: lowered
//!   onto sums, permutes and products; `pool/`: max and average pooling, 2×2 windows on `simd::pool`,
//!   any other window on separable per-plane passes;
//! - `conv/`: the convolution — `forward.rs`, `backward.rs`, `sparse.rs` (the fused pooling's sparse backward),
//!   `unfold.rs` (im2col, col2im, product, transpose with their fallbacks) and `plan.rs` (the planners of the
//!   direct kernels: each `plan` returns `None` where they do not run, and the caller unfolds);
//! - `simd/`: the hand-written AVX2/AVX-512 kernels by family — `gemm.rs`, `conv.rs` (the direct tiles the
//!   planners drive), `layout.rs`, `pool.rs`, `rows.rs` — each written once over `isa.rs`'s `Isa` trait and
//!   dispatched at run time on `simd::level()` (the CPU, capped by `ARMOURY_SIMD`). Without the vector
//!   instruction sets, or off x86-64, every entry returns `false` or no plan, and the callers' portable paths run;
//! - `warm`: keeps rayon's workers spinning between the ops of a pass (`record` and each op's backward poke it on
//!   large values), so that a parallel op does not wait for a sleeping worker to wake.

pub(crate) mod batch_norm;
pub(crate) mod conv;
pub(crate) mod einsum;
pub(crate) mod elementwise;
pub(crate) mod index;
mod linear;
pub(crate) mod loss;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod reduce;
pub(crate) mod shape;
pub(crate) mod simd;
pub(crate) mod unary;
pub(crate) mod vmath;
pub(crate) mod warm;

use ndarray::ArrayD;

use crate::tensor::{grad_enabled, Array, Role, Tensor};
use crate::Result;

pub use conv::Conv2dParams;
pub use loss::Reduction;
pub use matmul::measured_peak_gflops;
pub use pool::Pool2dParams;
pub use unary::UnaryKind;

/// A vector of `len` values that `write` fills in place, with no zero-fill first: a fresh output of tens of MB
/// (a ResNet's 56² maps) zero-filled costs a pass over memory, with its pages faulted in, as long as the op that
/// then overwrites it.
///
/// # Safety
///
/// `write` must write every element of the slice it is given (through `MaybeUninit::write` or a raw pointer).
pub(crate) unsafe fn written(len: usize, write: impl FnOnce(&mut [std::mem::MaybeUninit<f32>])) -> Vec<f32> {
    let mut v = Vec::with_capacity(len);
    write(&mut v.spare_capacity_mut()[..len]);
    // SAFETY: the caller's `write` initialised all `len` elements.
    unsafe { v.set_len(len) };
    v
}

/// `f`'s value, run after a block of NaNs of each length in `lens` is allocated and freed, so that the allocator
/// hands those blocks back to `f`'s allocations of those lengths: an output [`written`] gives with an element left
/// unwritten then shows a NaN (blocks under the allocator's threshold for fresh mappings, 128 KB, come back
/// dirty; larger ones come back as zeroed pages).
#[cfg(test)]
pub(crate) fn poisoned<T>(lens: &[usize], f: impl FnOnce() -> T) -> T {
    let blocks: Vec<Vec<f32>> = lens.iter().map(|&n| vec![f32::NAN; n]).collect();
    drop(std::hint::black_box(blocks));
    f()
}

/// A buffer shared by parallel jobs that touch disjoint positions of it: an output [`written`] gives (written
/// only), or scratch the jobs read and write.
#[derive(Clone, Copy)]
pub(crate) struct Slots(*mut f32, usize);

// SAFETY: the jobs touch disjoint positions of one live buffer (each use says how), and nothing else reads it
// until they are done.
unsafe impl Send for Slots {}
unsafe impl Sync for Slots {}

impl Slots {
    /// The slots of `out`.
    pub(crate) fn new(out: &mut [std::mem::MaybeUninit<f32>]) -> Slots {
        Slots(out.as_mut_ptr().cast::<f32>(), out.len())
    }

    /// The slots of `len` floats from `ptr`, initialised or not (a `Vec`'s spare capacity).
    pub(crate) fn raw(ptr: *mut f32, len: usize) -> Slots {
        Slots(ptr, len)
    }

    /// The buffer's first position, for kernels that write it through the pointer.
    pub(crate) fn ptr(&self) -> *mut f32 {
        self.0
    }

    /// Writes `v` at position `i`.
    ///
    /// # Safety
    ///
    /// `i` lies within the buffer, and no other thread touches it.
    pub(crate) unsafe fn write(&self, i: usize, v: f32) {
        debug_assert!(i < self.1);
        unsafe { self.0.add(i).write(v) };
    }

    /// Reads position `i`.
    ///
    /// # Safety
    ///
    /// As [`Slots::write`], and the position was written.
    pub(crate) unsafe fn read(&self, i: usize) -> f32 {
        debug_assert!(i < self.1);
        unsafe { self.0.add(i).read() }
    }

    /// `len` initialised values from `at`.
    ///
    /// # Safety
    ///
    /// They were written, and no other thread touches them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, at: usize, len: usize) -> &mut [f32] {
        assert!(at + len <= self.1, "Slots: range");
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }

    /// Zeroes `len` values from `at` (initialising them).
    ///
    /// # Safety
    ///
    /// No other thread touches them.
    pub(crate) unsafe fn zero(&self, at: usize, len: usize) {
        assert!(at + len <= self.1, "Slots: range");
        unsafe { std::ptr::write_bytes(self.0.add(at), 0, len) };
    }
}

/// The kernel path of this process: `avx512`, `avx2` or `portable` (the CPU's best, capped by `ARMOURY_SIMD`);
/// `avx512-direct` or `avx2-direct` when `ARMOURY_NO_WINOGRAD` keeps 3×3 convolutions off Winograd's transforms,
/// whose rounding differs.
pub fn simd_level_name() -> &'static str {
    let direct = !conv::winograd_enabled();
    match (simd::level(), direct) {
        (simd::Level::Avx512, false) => "avx512",
        (simd::Level::Avx512, true) => "avx512-direct",
        (simd::Level::Avx2, false) => "avx2",
        (simd::Level::Avx2, true) => "avx2-direct",
        (simd::Level::Portable, _) => "portable",
    }
}

/// How a tracked tensor was computed: the op, its inputs and whatever its backward needs.
pub(crate) enum Op {
    Binary(elementwise::BinaryKind, Tensor, Tensor),
    /// max(a + b, 0), same shapes; the backward masks by the output.
    AddRelu(Tensor, Tensor),
    Unary(UnaryKind, Tensor),
    MatMul(Tensor, Tensor),
    /// `a·b + bias` as one product (`Tensor::matmul_bias`): the bias a vector of `b`'s columns.
    MatMulBias(Tensor, Tensor, Tensor),
    /// The exact GELU of `z`, then `· w + b` as one product (`Tensor::gelu_matmul_bias`): `y` the GELU's output
    /// (the product's left operand), `w` the right operand as multiplied.
    GeluMatMulBias {
        z: Tensor,
        y: Array,
        w: Tensor,
        b: Tensor,
    },
    Sum {
        x: Tensor,
        axes: Vec<usize>,
        keepdim: bool,
    },
    MaxAlong {
        x: Tensor,
        axis: usize,
        keepdim: bool,
        index: Vec<usize>,
    },
    Reshape(Tensor),
    Permute(Tensor, Vec<usize>),
    BroadcastTo(Tensor),
    Narrow {
        x: Tensor,
        axis: usize,
        start: usize,
    },
    Pad {
        x: Tensor,
        pads: Vec<(usize, usize)>,
    },
    Concat {
        xs: Vec<Tensor>,
        axis: usize,
    },
    IndexSelect {
        x: Tensor,
        axis: usize,
        index: Vec<usize>,
    },
    Gather {
        x: Tensor,
        index: ndarray::Array2<usize>,
    },
    Where {
        mask: ArrayD<bool>,
        a: Tensor,
        b: Tensor,
    },
    /// `act`: the output is the convolution clamped (fused: the ReLU `[0, ∞)`, ReLU6 `[0, 6]`; the backward masks
    /// where the output is not strictly inside first). `pool`: the output is the ReLU's, max-pooled over 2×2
    /// windows of stride 2 (fused), with each window's flat arg-max in its plane. `res`: a residual added to the
    /// convolution before the clamp (fused; the output's shape, never with `pool`).
    Conv2d {
        x: Tensor,
        w: Tensor,
        b: Option<Tensor>,
        p: Conv2dParams,
        act: Option<conv::Clamp>,
        pool: Option<Vec<u32>>,
        res: Option<Tensor>,
    },
    /// The backward finds each window's arg-max again from the input and the output.
    MaxPool2d {
        x: Tensor,
        p: Pool2dParams,
    },
    AvgPool2d {
        x: Tensor,
        p: Pool2dParams,
    },
    LayerNorm(Box<norm::LayerNormSaved>),
    BatchNorm(Box<batch_norm::BatchNormSaved>),
    /// Softmax along the last axis; the backward reads the output.
    Softmax(Tensor),
}

impl Op {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::Binary(k, ..) => k.name(),
            Op::AddRelu(..) => "add_relu",
            Op::Unary(k, _) => k.name(),
            Op::MatMul(..) => "matmul",
            Op::MatMulBias(..) => "matmul_bias",
            Op::GeluMatMulBias { .. } => "gelu_matmul_bias",
            Op::Sum { .. } => "sum",
            Op::MaxAlong { .. } => "max",
            Op::Reshape(_) => "reshape",
            Op::Permute(..) => "permute",
            Op::BroadcastTo(_) => "broadcast_to",
            Op::Narrow { .. } => "narrow",
            Op::Pad { .. } => "pad",
            Op::Concat { .. } => "concat",
            Op::IndexSelect { .. } => "index_select",
            Op::Gather { .. } => "gather",
            Op::Where { .. } => "where",
            Op::Conv2d { pool: Some(_), .. } => "conv2d_relu_max_pool2",
            Op::Conv2d { res: Some(_), act: None, .. } => "conv2d_add",
            Op::Conv2d { res: Some(_), .. } => "conv2d_add_relu",
            Op::Conv2d { act: None, .. } => "conv2d",
            Op::Conv2d { act: Some(conv::Clamp::RELU), .. } => "conv2d_relu",
            Op::Conv2d { act: Some(_), .. } => "conv2d_clamp",
            Op::MaxPool2d { .. } => "max_pool2d",
            Op::AvgPool2d { .. } => "avg_pool2d",
            Op::LayerNorm(_) => "layer_norm",
            Op::BatchNorm(s) if s.relu => "batch_norm_relu",
            Op::BatchNorm(_) => "batch_norm",
            Op::Softmax(_) => "softmax",
        }
    }

    /// A narrow's input, axis and start: the backward (`autograd::run`) adds its gradient into its slice of the
    /// input's in place and never asks [`Op::backward`] for it; `None` for any other op.
    pub(crate) fn narrowed(&self) -> Option<(&Tensor, usize, usize)> {
        match self {
            Op::Narrow { x, axis, start } => Some((x, *axis, *start)),
            _ => None,
        }
    }

    /// The tensors this op read, in the order `backward` returns their gradients.
    pub(crate) fn inputs(&self) -> Vec<&Tensor> {
        match self {
            Op::Binary(_, a, b) | Op::AddRelu(a, b) | Op::MatMul(a, b) | Op::Where { a, b, .. } => vec![a, b],
            Op::MatMulBias(a, b, bias) => vec![a, b, bias],
            Op::GeluMatMulBias { z, w, b, .. } => vec![z, w, b],
            Op::Unary(_, x)
            | Op::Sum { x, .. }
            | Op::MaxAlong { x, .. }
            | Op::Reshape(x)
            | Op::Permute(x, _)
            | Op::BroadcastTo(x)
            | Op::Narrow { x, .. }
            | Op::Pad { x, .. }
            | Op::IndexSelect { x, .. }
            | Op::Gather { x, .. }
            | Op::MaxPool2d { x, .. }
            | Op::AvgPool2d { x, .. }
            | Op::Softmax(x) => vec![x],
            Op::Concat { xs, .. } => xs.iter().collect(),
            Op::Conv2d { x, w, b, res, .. } => [x, w].into_iter().chain(b).chain(res).collect(),
            Op::LayerNorm(s) => std::iter::once(&s.x).chain(&s.scale).chain(&s.bias).collect(),
            Op::BatchNorm(s) => vec![&s.x, &s.scale, &s.bias],
        }
    }

    /// Gradients of the inputs given the output's gradient `g` (given up: the shape ops pass it on without a
    /// copy); only inputs with `need[i]` are computed.
    pub(crate) fn backward(&self, out: &Array, g: ArrayD<f32>, need: &[bool]) -> Result<Vec<Option<ArrayD<f32>>>> {
        match self {
            Op::Reshape(x) => Ok(vec![Some(shape::reshape_backward(x.shape(), g))]),
            Op::Permute(_, perm) => Ok(vec![Some(shape::permute_backward(perm, g))]),
            Op::BroadcastTo(x) => Ok(vec![Some(shape::sum_to_shape(g, x.shape()))]),
            Op::Binary(elementwise::BinaryKind::Add, a, b) => Ok(elementwise::add_backward(a, b, g, need)),
            Op::AddRelu(..) => Ok(elementwise::add_relu_backward(out, g, need)),
            Op::Conv2d { x, w, b, p, act, pool: None, res: Some(_) } => {
                conv::conv2d_add_backward(x, w, b.is_some(), p, g, act.map(|c| (c, out)), need)
            }
            _ => self.backward_borrowed(out, &g, need),
        }
    }

    /// [`Op::backward`] of the ops that only read the output's gradient.
    fn backward_borrowed(&self, out: &Array, g: &ArrayD<f32>, need: &[bool]) -> Result<Vec<Option<ArrayD<f32>>>> {
        match self {
            Op::Binary(k, a, b) => Ok(elementwise::binary_backward(*k, a, b, g, need)),
            Op::AddRelu(..) | Op::Conv2d { res: Some(_), .. } => self.backward(out, g.clone(), need),
            Op::Unary(k, x) => Ok(vec![Some(unary::unary_backward(*k, x.value(), out, g))]),
            Op::MatMul(a, b) => matmul::matmul_backward(a, b, g, need),
            Op::MatMulBias(a, b, bias) => {
                let mut grads = matmul::matmul_backward(a, b, g, &need[..2])?;
                grads.push(need[2].then(|| shape::sum_to_shape(g.clone(), bias.shape())));
                Ok(grads)
            }
            Op::GeluMatMulBias { z, y, w, b } => Ok(linear::gelu_matmul_bias_backward((z, y), w, b, g, need)),
            Op::Sum { x, axes, keepdim } => Ok(vec![Some(reduce::sum_backward(x.shape(), axes, *keepdim, g))]),
            Op::MaxAlong { x, axis, keepdim, index } => {
                Ok(vec![Some(reduce::max_backward(x.shape(), *axis, *keepdim, index, g))])
            }
            // The shape ops keep the gradient they are given.
            Op::Reshape(_) | Op::Permute(..) | Op::BroadcastTo(_) => self.backward(out, g.clone(), need),
            Op::Narrow { .. } => unreachable!("a narrow's gradient is added into its input's by the backward itself"),
            Op::Pad { x, pads } => Ok(vec![Some(shape::pad_backward(x.shape(), pads, g))]),
            Op::Concat { xs, axis } => Ok(shape::concat_backward(xs, *axis, g, need)),
            Op::IndexSelect { x, axis, index } => {
                Ok(vec![Some(index::index_select_backward(x.shape(), *axis, index, g))])
            }
            Op::Gather { x, index } => Ok(vec![Some(index::gather_backward(x.shape(), index, g))]),
            Op::Where { mask, a, b } => Ok(index::where_backward(mask, a, b, g, need)),
            Op::Conv2d { x, w, b, p, act, pool: None, .. } => {
                conv::conv2d_backward(x, w, b.is_some(), p, g, act.map(|c| (c, out)), need)
            }
            Op::Conv2d { x, w, b, p, pool: Some(argmax), .. } => {
                conv::conv2d_pool_backward(x, w, b.is_some(), p, g, out, argmax, need)
            }
            Op::MaxPool2d { x, p } => Ok(vec![Some(pool::max_pool2d_backward(x, p, out, g))]),
            Op::AvgPool2d { x, p } => Ok(vec![Some(pool::avg_pool2d_backward(x.shape(), p, g))]),
            Op::LayerNorm(s) => Ok(norm::layer_norm_backward(s, g, need)),
            Op::BatchNorm(s) => Ok(batch_norm::batch_norm_backward(s, out, g, need)),
            Op::Softmax(_) => Ok(vec![Some(loss::softmax_backward(out, g))]),
        }
    }
}

/// Wraps a computed value: records `op` when gradients are enabled and some input is tracked, else a constant.
pub(crate) fn record(value: impl Into<Array>, op: Op) -> Tensor {
    let value = value.into();
    warm::poke(value.len());
    if recorded(&op) {
        Tensor::from_node(value, Role::Computed, Some(op))
    } else {
        Tensor::new(value)
    }
}

/// [`record`] of a value kept across calls, the node sharing the memo slot `slot` with the value's earlier nodes
/// ([`Tensor::from_node_sharing`]).
pub(crate) fn record_sharing(value: Array, op: Op, slot: crate::tensor::MemoSlot) -> Tensor {
    if recorded(&op) {
        Tensor::from_node_sharing(value, Role::Computed, Some(op), slot)
    } else {
        Tensor::from_node_sharing(value, Role::Constant, None, slot)
    }
}

/// Whether an op's result is tracked: gradients on, and a tracked input.
fn recorded(op: &Op) -> bool {
    grad_enabled() && op.inputs().iter().any(|t| t.is_tracked())
}

/// Above this many elements, elementwise kernels split across rayon's threads.
pub(crate) const PAR_THRESHOLD: usize = 1 << 15;
