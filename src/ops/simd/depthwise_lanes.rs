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
//!
//! That kernel loads one pixel vector per multiply-add (load-bound, ~40% of the multiply-add rate). For 3-, 5- and
//! 7-wide kernels the forward and the stride-1 input gradient run whole rows instead ([`rows`]): a kernel row's
//! input vectors are loaded once into registers and feed every tap and output of a block of 8 (AVX2: 4) pixels —
//! the same multiply-adds in the same order. ConvNeXt-T's 7×7 over 96@56: 1.13 → 0.80 ms forward, 1.36 → 0.84
//! input gradient; EfficientNet-B0's 5×5 over 672@14: 0.43 → 0.27 forward.

use super::isa::{clamp, entry_points, Avx2, Avx512, Isa};
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

entry_points! {
    /// [`Taps`] on `level` (not `Portable`).
    ///
    /// # Safety
    /// Every read `src[base + offₖ..]` and `w[wₖ·L..]`, every write `out[at..]` (a whole vector) and `start` (unless
    /// null) lie in their buffers; `taps` and `pixels` hold `ntaps` and `count` entries; the level's instructions
    /// are available.
    fn taps(t: &Taps) = taps_body;
    /// [`Rows`] on `level` (not `Portable`), for a geometry [`rows_apply`] takes.
    ///
    /// # Safety
    /// Every read and write the formula names lies in its buffer (with `js = −L`, reads reach `(KW − 1)·L` before
    /// a pixel's base); `w` holds `kh·kw` vectors; `start` (unless null) one; the level's instructions are
    /// available.
    fn rows(t: &Rows) = rows_dispatch;
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

/// Whole output rows of one channel block, `R` pixels of a row at a time, each input pixel vector of a kernel row
/// loaded once into a register and used by every tap and output that reads it (the [`taps`] kernel loads one per
/// multiply-add: load-bound). Output pixel `(r, x)` for `r < rows`, `x < wo` is `out[r·ors + x·ocs..] = clamp(start
/// + Σ_{i<kh, j<KW} w[(i·wr + j·wc)·L..] · src[r·rs + x·SW·L + i·is + j·js])`, the taps row-major (the plane
/// kernels' order, so the same bits), where the forward has `js = L` and the input gradient (`FLIP`, column stride
/// 1 over the output gradient) `js = −L`. The input gradient of a strided convolution runs one class of pixels at a
/// time: the pixels whose taps have one parity, two apart in the output (`ocs = 2·L`), each reading every other
/// tap of the weight (`wc = 2`).
pub(crate) struct Rows {
    pub(crate) src: *const f32,
    pub(crate) rs: isize,
    pub(crate) is: isize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) sw: usize,
    pub(crate) flip: bool,
    pub(crate) w: *const f32,
    pub(crate) wr: usize,
    pub(crate) wc: usize,
    pub(crate) start: *const f32,
    pub(crate) clamp: Option<[f32; 2]>,
    pub(crate) rows: usize,
    pub(crate) wo: usize,
    pub(crate) out: *mut f32,
    pub(crate) ors: usize,
    pub(crate) ocs: usize,
}

/// Whether [`rows`] takes a kernel `kw` wide with column stride `sw` (`flip`: the input gradient).
pub(crate) fn rows_apply(kw: usize, sw: usize, flip: bool) -> bool {
    if flip {
        sw == 1 && matches!(kw, 1..=5 | 7)
    } else {
        matches!(kw, 3 | 5 | 7) && sw <= 2
    }
}

#[inline(always)]
unsafe fn rows_dispatch<S: Isa>(t: &Rows) {
    match (t.kw, t.sw, t.flip) {
        (3, 1, false) => rows_body::<S, 3, 1, false>(t),
        (5, 1, false) => rows_body::<S, 5, 1, false>(t),
        (7, 1, false) => rows_body::<S, 7, 1, false>(t),
        (3, 2, false) => rows_body::<S, 3, 2, false>(t),
        (5, 2, false) => rows_body::<S, 5, 2, false>(t),
        (7, 2, false) => rows_body::<S, 7, 2, false>(t),
        (1, 1, true) => rows_body::<S, 1, 1, true>(t),
        (2, 1, true) => rows_body::<S, 2, 1, true>(t),
        (3, 1, true) => rows_body::<S, 3, 1, true>(t),
        (4, 1, true) => rows_body::<S, 4, 1, true>(t),
        (5, 1, true) => rows_body::<S, 5, 1, true>(t),
        (7, 1, true) => rows_body::<S, 7, 1, true>(t),
        _ => unreachable!("callers check `rows_apply`"),
    }
}

/// Input vectors one kernel row of a block reads, at most: 8 outputs at stride 2 of a 7-wide kernel.
const ROW_INPUTS: usize = 8 * 2 + 6;

#[inline(always)]
unsafe fn rows_body<S: Isa, const KW: usize, const SW: usize, const FLIP: bool>(t: &Rows) {
    let start = if t.start.is_null() { S::zero() } else { S::loadu(t.start) };
    let bounds = t.clamp.map(|b| b.map(|v| S::splat(v)));
    // Eight accumulators and up to 22 inputs fill AVX-512's 32 registers; AVX2 has 16, so four.
    let wide = S::LANES == 16;
    for r in 0..t.rows {
        let mut x = 0;
        while x < t.wo {
            let (src, out) = (t.src.offset(r as isize * t.rs), t.out.add(r * t.ors + x * t.ocs));
            x += match t.wo - x {
                left if left >= 8 && wide => row_block::<S, KW, SW, FLIP, 8>(t, src, x, out, start, bounds),
                left if left >= 4 => row_block::<S, KW, SW, FLIP, 4>(t, src, x, out, start, bounds),
                left if left >= 2 => row_block::<S, KW, SW, FLIP, 2>(t, src, x, out, start, bounds),
                _ => row_block::<S, KW, SW, FLIP, 1>(t, src, x, out, start, bounds),
            };
        }
    }
}

/// Outputs `x..x + R` of the row whose first pixel's base is `src`; returns `R`.
#[inline(always)]
unsafe fn row_block<S: Isa, const KW: usize, const SW: usize, const FLIP: bool, const R: usize>(
    t: &Rows,
    src: *const f32,
    x: usize,
    out: *mut f32,
    start: S::V,
    bounds: Option<[S::V; 2]>,
) -> usize {
    let l = S::LANES as isize;
    let n = (R - 1) * SW + KW;
    // Input `k` of a kernel row is column `k` from the leftmost read: `o·SW + j` forward, `o + (KW − 1) − j` flipped.
    let first = (x * SW) as isize * l - if FLIP { (KW - 1) as isize * l } else { 0 };
    let mut acc = [start; R];
    for i in 0..t.kh {
        let row = src.offset(first + i as isize * t.is);
        let mut xs = [S::zero(); ROW_INPUTS];
        for (k, v) in xs.iter_mut().enumerate().take(n) {
            *v = S::loadu(row.offset(k as isize * l));
        }
        for j in 0..KW {
            let wv = S::loadu(t.w.add((i * t.wr + j * t.wc) * S::LANES));
            for (o, a) in acc.iter_mut().enumerate() {
                let k = if FLIP { o + KW - 1 - j } else { o * SW + j };
                *a = S::fmadd(wv, xs[k], *a);
            }
        }
    }
    for (o, &a) in acc.iter().enumerate() {
        S::storeu(out.add(o * t.ocs), clamp::<S>(a, bounds));
    }
    R
}
