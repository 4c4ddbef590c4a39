//! Hand-written vector kernels for the shapes convolutions produce, on AVX-512 or on AVX2 with FMA (chosen at run
//! time), where the `gemm` crate's packing and generic tiles leave much of a core's throughput unused.
//!
//! The kernels are split by family, each file holding its entry points and its bodies:
//! - [`gemm`]: the register-tiled product `c (+)= a·b` ([`gemm_nn`]);
//! - [`packed`]: the same tile with both operands packed (or `b` alone for narrow products), cache-blocked, any
//!   strides ([`gemm_packed`]), for `Linear` layers' forward and `matmul`;
//! - [`conv`]: the convolution tiles read straight from the image (forward with fused ReLU and pooling, weight
//!   gradient, input gradient), driven by the planners in `ops::conv`;
//! - [`depthwise`]: depthwise convolutions plane by plane (forward, input and weight gradients), driven by
//!   `ops::conv::depthwise`;
//! - [`layout`]: im2col, col2im and the 8×8-block transpose;
//! - [`pool`]: 2×2 max pooling, its backward, and the fused ReLU-and-pooling backward's expansion;
//! - [`rows`]: sums of scaled rows, for the sparse backward;
//! - [`winograd`]: the transforms of Winograd's F(4×4, 3×3) on either side of a 3×3 convolution's products.
//!
//! Each body is written once, generic over the instruction set (`isa::Isa`), and compiled for each behind a
//! `#[target_feature]` entry point that [`level`] selects at run time. Every output element is one fused
//! multiply-add chain in a fixed order, whatever the tiling or the thread count, so results are deterministic.
//! Without the instruction sets (or on other CPUs) the entry functions return `false` or no plan is made, and the
//! caller uses the `gemm` crate or its scalar loops.

#[cfg(target_arch = "x86_64")]
pub(crate) mod conv;
#[cfg(target_arch = "x86_64")]
pub(crate) mod depthwise;
#[cfg(target_arch = "x86_64")]
pub(crate) mod depthwise_lanes;
mod gemm;
#[cfg(target_arch = "x86_64")]
mod isa;
mod layout;
mod packed;
mod pool;
mod rows;
pub(crate) mod winograd;

pub(crate) use gemm::{fma_peak, gemm_nn, gemm_nn_clamped, Start};
#[cfg(target_arch = "x86_64")]
pub(crate) use isa::FlushSubnormals;

/// Off x86-64 there is no flush mode to set (the kernels are portable loops with IEEE subnormals): a guard that
/// does nothing, so that the loops taking one around their kernels read the same everywhere.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) struct FlushSubnormals;

#[cfg(not(target_arch = "x86_64"))]
impl FlushSubnormals {
    pub(crate) fn on() -> FlushSubnormals {
        FlushSubnormals
    }
}
#[cfg(target_arch = "x86_64")]
pub(crate) use layout::transpose_strided;
pub(crate) use layout::{col2im, im2col, transpose, Unfold};
pub(crate) use packed::{gemm_packed, gemm_prepacked, gemm_prepacked_then, pack, PackedB, RowsAfter};
pub(crate) use pool::{max_pool_2x2, max_pool_2x2_backward, relu_max_pool_2x2_expand};
pub(crate) use rows::{RowSums, Term};

/// The vector instruction set the kernels use, from most to least capable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// No hand-written kernels: the `gemm` crate and scalar loops.
    Portable,
    /// AVX2 and FMA: 8-lane vectors.
    Avx2,
    /// AVX-512F: 16-lane vectors and lane masks.
    Avx512,
}

/// The instruction set the kernels run on: the best the CPU has, capped by the environment variable
/// `ARMOURY_SIMD` (`avx2` or `portable`; CI sets it to test every path on one machine). Decided once.
#[inline]
pub(crate) fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let cpu = if std::arch::is_x86_feature_detected!("avx512f") {
            Level::Avx512
        } else if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            Level::Avx2
        } else {
            Level::Portable
        };
        #[cfg(not(target_arch = "x86_64"))]
        let cpu = Level::Portable;
        let cap = match std::env::var("ARMOURY_SIMD").as_deref() {
            Ok("portable") | Ok("none") => Level::Portable,
            Ok("avx2") => Level::Avx2,
            _ => Level::Avx512,
        };
        cpu.min(cap)
    })
}

/// Whether the hand-written kernels run (on either instruction set).
#[inline]
pub(crate) fn accelerated() -> bool {
    level() != Level::Portable
}

// Register tiling, shared by the product and the convolution planners (x86-64 only, where the tile kernels are).

/// Column blocks of this many multiply-adds or more are split across threads (when the caller allows it).
#[cfg(target_arch = "x86_64")]
const PAR_WORK: usize = 1 << 21;

/// Rows of `a`/`c` per register tile (AVX-512: 6 × 4 accumulators + 4 `b` vectors + 1 broadcast fit the 32
/// registers; AVX2: 6 × 2 + 2 + 1 fit the 16).
#[cfg(target_arch = "x86_64")]
pub(crate) const BLOCK_M: usize = 6;

/// `m` rows split evenly over the fewest register tiles of at most [`BLOCK_M`] (25 = 5 × 5, not 4 × 6 + 1: a
/// one-row tile has too few independent accumulators to hide the multiply-add latency): each tile's first row
/// and row count.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn tile_rows(m: usize) -> impl Iterator<Item = (usize, usize)> {
    let tiles = m.div_ceil(BLOCK_M);
    let (base, extra) = (m / tiles.max(1), m % tiles.max(1));
    (0..tiles).scan(0, move |next, tile| {
        let (at, mr) = (*next, base + usize::from(tile < extra));
        *next += mr;
        Some((at, mr))
    })
}

/// The bias of the tile of output channels `i..i + mr` (zeros without one).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn tile_bias(bias: Option<&[f32]>, i: usize, mr: usize) -> [f32; BLOCK_M] {
    let mut rows = [0.0f32; BLOCK_M];
    if let Some(b) = bias {
        rows[..mr].copy_from_slice(&b[i..i + mr]);
    }
    rows
}

/// `f` on every job: across threads when `parallel` allows it, there are `work` multiply-adds or more and this
/// is not already a rayon task; else in order on this thread. A job is a kernel's loop over its tiles, run on its
/// thread to the end (no rayon inside): each runs under one [`isa::FlushSubnormals`] guard, so its tiles' own
/// guards touch no register.
#[cfg(target_arch = "x86_64")]
pub(crate) fn run_jobs<J: Send>(jobs: Vec<J>, parallel: bool, work: usize, f: impl Fn(J) + Sync + Send) {
    use rayon::prelude::*;
    let nested = rayon::current_thread_index().is_some();
    let f = |job: J| {
        let _flush = isa::FlushSubnormals::on();
        f(job)
    };
    if parallel && !nested && jobs.len() > 1 && work >= PAR_WORK {
        jobs.into_par_iter().for_each(f);
    } else {
        jobs.into_iter().for_each(f);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use ndarray::Array2;

    /// An `r × c` matrix of uniform values in `[-1, 1)`.
    pub(crate) fn random(r: usize, c: usize, seed: u64) -> Array2<f32> {
        let t = crate::Tensor::uniform(&[r, c], -1.0, 1.0, seed);
        t.to_array().into_dimensionality().unwrap()
    }
}
