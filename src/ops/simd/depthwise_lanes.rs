//! Depthwise-convolution kernels with the channels in the vector lanes: a block of 16 (AVX-512) or 8 (AVX2)
//! channels side by side, each pixel one vector, each tap one vector of the block's weights — the layout oneDNN's
//! and onnxruntime's depthwise kernels work in (`nChw16c`). Along a row `R` output pixels are independent
//! multiply-add chains, so a small map (EfficientNet's and MobileNet's 14×14 and 7×7) runs at the multiply-add
//! rate, where the plane-by-plane kernels ([`super::depthwise`]) run one latency-bound chain per short row.
//!
//! One kernel serves the forward and the input gradient: each output pixel is a start vector (the bias, or zero)
//! plus a list of taps, each a weight vector times the pixel vector at a fixed offset from the output's base
//! pixel; eight outputs run side by side, across rows where a row is short. The caller
//! (`ops::conv::depthwise_lanes`) copies a band of rows of the block's planes channels-last into a zero-padded
//! scratch, lists the taps and the pixels (each with its base and its place in the output) and copies the results
//! back. It lists the taps in the plane kernels' order — the forward: bias, then the taps row-major; the input
//! gradient: the taps that reach the pixel, row-major — so the two layouts give the same bits.

use super::isa::{clamp, Avx2, Avx512, Isa};
use super::Level;

/// Channels per block on `level` (not `Portable`).
pub(crate) fn lanes(level: Level) -> usize {
    if level == Level::Avx512 {
        16
    } else {
        8
    }
}

/// Output pixels of one channel block, each `out[at] = clamp(start + Σₖ w[wₖ·L..] · src[base + offₖ..])` over the
/// taps `(offₖ, wₖ)` in order (vectors of `L` lanes; offsets and positions in `f32`s), for the pixels
/// `(base, at)`; `start` is the bias vector or, null, zero.
pub(crate) struct Taps {
    pub(crate) src: *const f32,
    pub(crate) taps: *const (isize, usize),
    pub(crate) ntaps: usize,
    pub(crate) w: *const f32,
    pub(crate) start: *const f32,
    pub(crate) clamp: Option<[f32; 2]>,
    pub(crate) pixels: *const (usize, usize),
    pub(crate) count: usize,
    pub(crate) out: *mut f32,
}

/// [`Taps`] on `level` (not `Portable`).
///
/// # Safety
/// Every read `src[base + offₖ..]` and `w[wₖ·L..]`, every write `out[at..]` (a whole vector) and `start` (unless
/// null) lie in their buffers; `taps` and `pixels` hold `ntaps` and `count` entries; the level's instructions are
/// available.
pub(crate) unsafe fn taps(level: Level, t: &Taps) {
    #[target_feature(enable = "avx512f")]
    unsafe fn wide(t: &Taps) {
        taps_body::<Avx512>(t)
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn narrow(t: &Taps) {
        taps_body::<Avx2>(t)
    }
    let _flush = super::isa::FlushSubnormals::on();
    match level {
        Level::Avx512 => wide(t),
        Level::Avx2 => narrow(t),
        Level::Portable => unreachable!("callers check the level first"),
    }
}

/// Independent chains per block of pixels: eight hide the multiply-add latency on two pipes.
const CHAINS: usize = 8;

#[inline(always)]
unsafe fn taps_body<S: Isa>(t: &Taps) {
    let start = if t.start.is_null() { S::zero() } else { S::loadu(t.start) };
    let bounds = t.clamp.map(|b| b.map(|v| S::splat(v)));
    let mut p = 0;
    while p < t.count {
        p += match t.count - p {
            left if left >= CHAINS => pixels::<S, CHAINS>(t, p, start, bounds),
            left if left >= 4 => pixels::<S, 4>(t, p, start, bounds),
            left if left >= 2 => pixels::<S, 2>(t, p, start, bounds),
            _ => pixels::<S, 1>(t, p, start, bounds),
        };
    }
}

/// Pixels `p..p + R`; returns `R`.
#[inline(always)]
unsafe fn pixels<S: Isa, const R: usize>(t: &Taps, p: usize, start: S::V, bounds: Option<[S::V; 2]>) -> usize {
    let l = S::LANES;
    let mut base = [t.src; R];
    for (u, b) in base.iter_mut().enumerate() {
        *b = t.src.add((*t.pixels.add(p + u)).0);
    }
    let mut acc = [start; R];
    for k in 0..t.ntaps {
        let (off, wi) = *t.taps.add(k);
        let wv = S::loadu(t.w.add(wi * l));
        for (a, b) in acc.iter_mut().zip(&base) {
            *a = S::fmadd(wv, S::loadu(b.offset(off)), *a);
        }
    }
    for (u, &a) in acc.iter().enumerate() {
        S::storeu(t.out.add((*t.pixels.add(p + u)).1), clamp::<S>(a, bounds));
    }
    R
}
