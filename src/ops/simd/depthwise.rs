//! The depthwise-convolution kernels (`groups == channels`), one channel plane at a time, vectorised along the
//! output row — a bandwidth-bound loop of `kh·kw` multiply-adds per output vector, where the per-group product
//! would be a one-row GEMM. The caller (`ops::conv::depthwise`) prepares the planes so that every load is a plain
//! vector move:
//! - the image plane zero-padded and split into `sw` column phases (phase `q`, column `m` holds padded column
//!   `sw·m + q`), so a tap of a strided convolution reads contiguous columns; rows have room for a whole vector
//!   past the last output;
//! - the output gradient with zero columns on both sides and a zero tail, so the input gradient (the transposed
//!   convolution) reads whole vectors wherever a tap falls.
//!
//! - [`forward`]: an output row from the bias, each element one multiply-add chain over the taps in row-major
//!   order, with the ReLU as it is stored;
//! - [`input_grad`]: a row of the image gradient, each element a chain over the channel's outputs, then the taps
//!   that reach it, in order; with a column stride of 2 the even and the odd columns are two vectors, interleaved
//!   as they are stored;
//! - [`weight_grad`]: a row of taps, accumulated over the output positions in two interleaved sets of vectors and
//!   summed lane by lane in order.
//!
//! All are specialised for the kernel width (1–7) and the column stride (1 or 2); x86-64 only, the caller keeps
//! scalar loops in the same order for the portable level.

use super::isa::{clamp, Avx2, Avx512, Isa};
use super::Level;

/// One output plane of a depthwise convolution: `out[oy·wo + ox] = bias + Σᵢⱼ w[i·kw + j] ·
/// src[(j % sw)·ps + (sh·oy + i)·rs + ox + j / sw]`, clamped (the fused ReLU or ReLU6) when `clamp` says.
pub(crate) struct Forward {
    pub(crate) src: *const f32,
    pub(crate) rs: usize,
    pub(crate) ps: usize,
    pub(crate) sh: usize,
    pub(crate) kh: usize,
    pub(crate) w: *const f32,
    pub(crate) bias: f32,
    /// The output clamped to `[lo, hi]` (`[0, ∞)`: the ReLU), or not.
    pub(crate) clamp: Option<[f32; 2]>,
    pub(crate) out: *mut f32,
    pub(crate) ho: usize,
    pub(crate) wo: usize,
}

/// One plane of a depthwise convolution's input gradient `dx[h, wd]` (overwritten) from the gradients of the `mult`
/// output channels it feeds (`g`, plane `r` at `r·gps`, rows `grs` apart, column `ox` at `ml + ox`, zero outside
/// the outputs) and their weights (`w`, `kh·kw` each, in the same order).
pub(crate) struct InputGrad {
    pub(crate) g: *const f32,
    pub(crate) gps: usize,
    pub(crate) grs: usize,
    pub(crate) ml: usize,
    pub(crate) mult: usize,
    pub(crate) w: *const f32,
    pub(crate) kh: usize,
    pub(crate) sh: usize,
    pub(crate) ph: usize,
    pub(crate) pw: usize,
    pub(crate) ho: usize,
    pub(crate) dx: *mut f32,
    pub(crate) h: usize,
    pub(crate) wd: usize,
}

/// One channel's weight gradient from one image, added into `dw[kh·kw]`: `Σ g[oy·grs + ox] · src[…]` over the
/// output positions, `src` laid out as in [`Forward`] and `g` zero from column `wo` to the next whole vector.
pub(crate) struct WeightGrad {
    pub(crate) src: *const f32,
    pub(crate) rs: usize,
    pub(crate) ps: usize,
    pub(crate) sh: usize,
    pub(crate) kh: usize,
    pub(crate) g: *const f32,
    pub(crate) grs: usize,
    pub(crate) ho: usize,
    pub(crate) wo: usize,
    pub(crate) dw: *mut f32,
}

/// `$body::<Isa, KW, SW>(t)` for the level's instruction set, the kernel width `kw ≤ 7` and column stride `sw ≤ 2`.
macro_rules! kernel_dispatch {
    ($body:ident, $desc:ty, $level:expr, $t:expr, $kw:expr, $sw:expr) => {{
        #[target_feature(enable = "avx512f")]
        unsafe fn wide<const KW: usize, const SW: usize>(t: &$desc) {
            $body::<Avx512, KW, SW>(t)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow<const KW: usize, const SW: usize>(t: &$desc) {
            $body::<Avx2, KW, SW>(t)
        }
        let (level, t) = ($level, $t);
        let _flush = $crate::ops::simd::isa::FlushSubnormals::on();
        macro_rules! go {
            ($k:literal, $s:literal) => {
                match level {
                    Level::Avx512 => wide::<$k, $s>(t),
                    Level::Avx2 => narrow::<$k, $s>(t),
                    Level::Portable => unreachable!("callers check the level first"),
                }
            };
        }
        match ($kw, $sw) {
            (1, 1) => go!(1, 1),
            (2, 1) => go!(2, 1),
            (3, 1) => go!(3, 1),
            (4, 1) => go!(4, 1),
            (5, 1) => go!(5, 1),
            (6, 1) => go!(6, 1),
            (7, 1) => go!(7, 1),
            (1, 2) => go!(1, 2),
            (2, 2) => go!(2, 2),
            (3, 2) => go!(3, 2),
            (4, 2) => go!(4, 2),
            (5, 2) => go!(5, 2),
            (6, 2) => go!(6, 2),
            (7, 2) => go!(7, 2),
            _ => unreachable!("the planner admits kernel widths 1–7 and column strides 1–2"),
        }
    }};
}

/// [`Forward`] on `level` (not `Portable`) for a kernel `kw` wide at column stride `sw`.
pub(crate) unsafe fn forward(level: Level, t: &Forward, kw: usize, sw: usize) {
    kernel_dispatch!(forward_body, Forward, level, t, kw, sw)
}

/// [`InputGrad`] on `level` (not `Portable`).
pub(crate) unsafe fn input_grad(level: Level, t: &InputGrad, kw: usize, sw: usize) {
    kernel_dispatch!(input_grad_body, InputGrad, level, t, kw, sw)
}

/// [`WeightGrad`] on `level` (not `Portable`).
pub(crate) unsafe fn weight_grad(level: Level, t: &WeightGrad, kw: usize, sw: usize) {
    kernel_dispatch!(weight_grad_body, WeightGrad, level, t, kw, sw)
}

/// Where tap `j` of a row reads, relative to output column 0 of the first phase.
#[inline(always)]
fn tap_offsets<const KW: usize, const SW: usize>(ps: usize) -> [usize; KW] {
    let mut off = [0usize; KW];
    for (j, o) in off.iter_mut().enumerate() {
        *o = (j % SW) * ps + j / SW;
    }
    off
}

/// Vectors per block of a row: four independent chains hide the multiply-add latency.
const BLOCK: usize = 4;

#[inline(always)]
unsafe fn forward_body<S: Isa, const KW: usize, const SW: usize>(t: &Forward) {
    let off = tap_offsets::<KW, SW>(t.ps);
    let l = S::LANES;
    for oy in 0..t.ho {
        let mut m = 0;
        while m < t.wo {
            match (t.wo - m).div_ceil(l).min(BLOCK) {
                4 => forward_block::<S, KW, 4>(t, &off, oy, m),
                3 => forward_block::<S, KW, 3>(t, &off, oy, m),
                2 => forward_block::<S, KW, 2>(t, &off, oy, m),
                _ => forward_block::<S, KW, 1>(t, &off, oy, m),
            }
            m += BLOCK * l;
        }
    }
}

/// `V` vectors of output row `oy` from column `m`.
#[inline(always)]
unsafe fn forward_block<S: Isa, const KW: usize, const V: usize>(t: &Forward, off: &[usize; KW], oy: usize, m: usize) {
    let l = S::LANES;
    let mut acc = [S::splat(t.bias); V];
    for i in 0..t.kh {
        let row = t.src.add((t.sh * oy + i) * t.rs + m);
        let wrow = t.w.add(i * KW);
        for (j, &o) in off.iter().enumerate() {
            let wv = S::splat(*wrow.add(j));
            for (v, a) in acc.iter_mut().enumerate() {
                *a = S::fmadd(wv, S::loadu(row.add(o + v * l)), *a);
            }
        }
    }
    let orow = t.out.add(oy * t.wo + m);
    let bounds = t.clamp.map(|b| b.map(|v| S::splat(v)));
    for (v, &a) in acc.iter().enumerate() {
        let a = clamp::<S>(a, bounds);
        let at = m + v * l;
        if at + l <= t.wo {
            S::storeu(orow.add(v * l), a);
        } else {
            S::store(S::lanes(0, (t.wo - at) as isize), orow.add(v * l), a);
        }
    }
}

#[inline(always)]
unsafe fn input_grad_body<S: Isa, const KW: usize, const SW: usize>(t: &InputGrad) {
    // Output column `x = SW·m + q` (phase `q`) takes tap `j` when `q + pw − j` is a multiple of `SW`, from the
    // output gradient's column `m + (q + pw − j) / SW`: each tap feeds one phase, at a fixed shift.
    let mut phase = [0usize; KW];
    let mut shift = [0isize; KW];
    for j in 0..KW {
        let t0 = t.pw as isize - j as isize;
        phase[j] = t0.rem_euclid(SW as isize) as usize;
        shift[j] = (phase[j] as isize + t0) / SW as isize;
    }
    let step = SW * S::LANES;
    for y in 0..t.h {
        let mut x = 0;
        while x < t.wd {
            if t.wd - x > step {
                input_grad_block::<S, KW, SW, 2>(t, &phase, &shift, y, x);
                x += 2 * step;
            } else {
                input_grad_block::<S, KW, SW, 1>(t, &phase, &shift, y, x);
                x += step;
            }
        }
    }
}

/// `U` units of `SW` vectors (one per column phase) of image-gradient row `y` from column `x` (a multiple of `SW`).
#[inline(always)]
unsafe fn input_grad_block<S: Isa, const KW: usize, const SW: usize, const U: usize>(
    t: &InputGrad,
    phase: &[usize; KW],
    shift: &[isize; KW],
    y: usize,
    x: usize,
) {
    let l = S::LANES;
    let mut acc = [[S::zero(); SW]; U];
    let m0 = (t.ml + x / SW) as isize;
    for r in 0..t.mult {
        let plane = t.g.add(r * t.gps);
        let wr = t.w.add(r * t.kh * KW);
        for i in 0..t.kh {
            let tr = (y + t.ph) as isize - i as isize;
            if tr < 0 || !(tr as usize).is_multiple_of(t.sh) || tr as usize / t.sh >= t.ho {
                continue;
            }
            let row = plane.add(tr as usize / t.sh * t.grs).offset(m0);
            for j in 0..KW {
                let wv = S::splat(*wr.add(i * KW + j));
                let src = row.offset(shift[j]);
                for (u, a) in acc.iter_mut().enumerate() {
                    a[phase[j]] = S::fmadd(wv, S::loadu(src.add(u * l)), a[phase[j]]);
                }
            }
        }
    }
    let drow = t.dx.add(y * t.wd);
    for (u, a) in acc.iter().enumerate() {
        let at = x + u * SW * l;
        if SW == 1 {
            store_clamped::<S>(drow, at, t.wd, a[0]);
        } else {
            let (lo, hi) = S::interleave(a[0], a[1]);
            store_clamped::<S>(drow, at, t.wd, lo);
            store_clamped::<S>(drow, at + l, t.wd, hi);
        }
    }
}

/// Stores the lanes of `v` that fall before column `end` of `row`, from column `at`.
#[inline(always)]
unsafe fn store_clamped<S: Isa>(row: *mut f32, at: usize, end: usize, v: S::V) {
    if at + S::LANES <= end {
        S::storeu(row.add(at), v);
    } else if at < end {
        S::store(S::lanes(0, (end - at) as isize), row.add(at), v);
    }
}

#[inline(always)]
unsafe fn weight_grad_body<S: Isa, const KW: usize, const SW: usize>(t: &WeightGrad) {
    let off = tap_offsets::<KW, SW>(t.ps);
    let l = S::LANES;
    let tail = S::lanes(0, (t.wo % l) as isize);
    let full = t.wo / l;
    for i in 0..t.kh {
        // Two sets of accumulators, alternate vectors: twice the independent chains.
        let mut acc = [[S::zero(); KW]; 2];
        let mut n = 0usize;
        for oy in 0..t.ho {
            let g = t.g.add(oy * t.grs);
            let row = t.src.add((t.sh * oy + i) * t.rs);
            for v in 0..t.wo.div_ceil(l) {
                let gv = S::loadu(g.add(v * l));
                let set = &mut acc[n & 1];
                n += 1;
                for (j, &o) in off.iter().enumerate() {
                    let mut xv = S::loadu(row.add(o + v * l));
                    if v == full {
                        // Past the last output the gradient is zero, but the image may not be finite there.
                        xv = S::keep(tail, xv);
                    }
                    set[j] = S::fmadd(gv, xv, set[j]);
                }
            }
        }
        for (j, (&a, &b)) in acc[0].iter().zip(&acc[1]).enumerate() {
            let mut lanes = [0.0f32; 16];
            S::storeu(lanes.as_mut_ptr(), S::add(a, b));
            *t.dw.add(i * KW + j) += lanes[..l].iter().sum::<f32>();
        }
    }
}
