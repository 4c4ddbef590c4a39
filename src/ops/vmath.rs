//! Branch-free `f32` functions the compiler vectorises (eˣ, erf, the logistic sigmoid, GELU in both forms), and the
//! slice loops that run them on 512-bit or 256-bit vectors when the CPU has them.
//!
//! A libm call per element (`f32::exp`) keeps a loop scalar. These functions are plain arithmetic, bit
//! manipulation and selects, so LLVM turns a loop over a slice into vector code. Their polynomials and range
//! reductions are fused multiply-adds (`mul_add`, one rounding): the AVX2 and AVX-512 loops run them as `vfmadd`
//! (a third fewer instructions than a multiply and an add: SiLU 24% and GELU 43% faster), and because a fused
//! multiply-add is exactly rounded by definition, the portable level's library call (`fmaf`) gives the same bits —
//! every function gives the same bits on every kernel path (tested below). The price is the portable level's
//! speed on x86 (a call per multiply-add: SiLU about 12× slower there); it is a verification level, and other
//! targets (AArch64) have the instruction. LLVM never contracts a plain multiply and add on its own.

use std::f32::consts::{FRAC_1_SQRT_2, LOG2_E};
use std::mem::MaybeUninit;

/// ln 2 in two parts: `LN2_HI` has 11 significant bits, so `n·LN2_HI` is exact for |n| < 2¹³ (Cody–Waite).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5·2²³: adding it to |v| < 2²² rounds `v` to an integer held in the low bits of the significand.
const ROUND: f32 = 12_582_912.0;

/// Below this, eˣ is flushed to 0: e^−87.33 ≈ 1.1832e-38 is still normal (the smallest normal `f32` is
/// 1.1755e-38, e^−87.3365), so no argument the function keeps yields a subnormal, even rounded.
const FLUSH_BELOW: f32 = -87.33;

/// eˣ, within 1e-7 relative of the true value (9e-8 measured against mpmath over [−87.33, 88.7]); 0 below
/// [`FLUSH_BELOW`] and +∞ above about 88.72; NaN stays NaN.
///
/// Never subnormal, by design: `f32::exp` goes on into the subnormal range down to −103.3, and an arithmetic unit
/// that meets a subnormal operand or result takes a micro-code assist of ~100 cycles per element. A σ or SiLU
/// there (a far negative pre-activation, common in a deep randomly initialised or badly scaled network) fed
/// subnormals to the convolutions after it and made them 20–70× slower: EfficientNet-B0's projection convs ran at
/// 3% of peak. The flushed values are below 1.2e-38, where the absolute error is all that f32 arithmetic keeps
/// anyway (onnxruntime's logistic clamps its argument to ±18 outright).
///
/// x = n·ln 2 + r with n = round(x/ln 2) and |r| ≤ ln 2 / 2; eʳ is its Taylor polynomial to r⁷ (truncation below
/// 0.347⁸/8! < 6e-9 relative) and 2ⁿ is built in the exponent bits, as 2^⌊n/2⌋·2^(n−⌊n/2⌋) so that both factors stay
/// normal down to n = −126.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let (p, n) = exp_parts(x.clamp(FLUSH_BELOW, 89.0));
    let half = n >> 1;
    flushed(x, p * two_to(half) * two_to(n - half))
}

/// `v`, or 0 where `x` lies below [`FLUSH_BELOW`] (a select, so loops stay branch-free).
#[inline(always)]
fn flushed(x: f32, v: f32) -> f32 {
    if x < FLUSH_BELOW {
        0.0
    } else {
        v
    }
}

/// eˣ = p·2ⁿ for x in [[`FLUSH_BELOW`], 89]: n = round(x/ln 2) and p = eʳ, r = x − n·ln 2.
#[inline(always)]
fn exp_parts(x: f32) -> (f32, i32) {
    let t = x.mul_add(LOG2_E, ROUND);
    let n = t - ROUND;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p: f32 = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    (p, t.to_bits() as i32 - ROUND.to_bits() as i32)
}

/// 2ᵏ for −126 ≤ k ≤ 127, built in the exponent bits.
#[inline(always)]
fn two_to(k: i32) -> f32 {
    f32::from_bits(((k + 127) << 23) as u32)
}

/// eˣ for |x| ≤ −[`FLUSH_BELOW`] (the caller clamps): 2ⁿ is one normal factor there (|n| ≤ 126), so no split.
#[inline(always)]
fn exp_within(x: f32) -> f32 {
    let (p, n) = exp_parts(x);
    p * two_to(n)
}

/// eˣ for x ≤ −[`FLUSH_BELOW`] — in practice x ≤ 0 — as [`exp`] (the same bits: 0 below [`FLUSH_BELOW`], NaN for
/// NaN) with 2ⁿ in one factor, which needs no split there (|n| ≤ 126): the exponentials of erfc's fit and of the
/// normal density, three instructions fewer than [`exp`].
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    flushed(x, exp_within(x.max(FLUSH_BELOW)))
}

/// e⁻ˣ with the argument clamped to ±87.33 (one normal power of two, [`exp_within`]): σ's and SiLU's exponential,
/// finite on both sides, the caller flushing below −87.33.
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    exp_within((-x).clamp(FLUSH_BELOW, -FLUSH_BELOW))
}

/// The logistic sigmoid 1/(1 + e⁻ˣ), within 2.4e-7 relative of the true value wherever it is a normal `f32`
/// (measured against f64 below; about two ulps), 0 below −87.33 (never subnormal, see [`exp`]) and 1 at the far
/// right, NaN for NaN. e⁻ˣ keeps its relative accuracy for either sign of x, and so do 1 + e⁻ˣ and its reciprocal,
/// so no select on the sign is needed.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    flushed(x, 1.0 / (1.0 + exp_neg(x)))
}

/// SiLU (swish) x·σ(x) (Elfwing et al., 2018; Ramachandran et al., 2017), within 3e-7 relative of the true value;
/// 0 below −87.33 as σ (never subnormal). Written x/(1 + e⁻ˣ): one division, no sign select (e⁻ˣ keeps its
/// relative accuracy for either sign, and so does the sum with 1), about half the instructions of x·σ(x).
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    flushed(x, x / (1.0 + exp_neg(x)))
}

/// d SiLU/dx = σ(x)·(1 + x·(1 − σ(x))), with e = e⁻ˣ, σ = 1/(1 + e) and 1 − σ = e·σ (no `1 − σ`, which cancels
/// where σ is close to 1); 0 below −87.33.
#[inline(always)]
pub(crate) fn silu_derivative(x: f32) -> f32 {
    let e = exp_neg(x);
    let s = 1.0 / (1.0 + e);
    flushed(x, s * x.mul_add(e * s, 1.0))
}

/// Below this |x|, erf is its Maclaurin series; from it on, 1 − erfc with erfc from Numerical Recipes' fit.
const SERIES_CUT: f32 = 1.0;
/// Terms of the series: the first one left out is x²³/(11!·23)·2/√π < 1e-9 at |x| = 1.
const SERIES_TERMS: usize = 12;

/// The series' coefficients in x²: erf(x) = x·(2/√π)·Σₙ (−1)ⁿ x²ⁿ / (n!·(2n+1)), less 1 in the first coefficient
/// (so that erf(x) = x + x·P(x²) keeps the final addition exact to half an ulp, as fdlibm's `erff` does).
const SERIES: [f32; SERIES_TERMS] = {
    let mut c = [0.0f32; SERIES_TERMS];
    let two_over_sqrt_pi = std::f64::consts::FRAC_2_SQRT_PI;
    let mut fact = 1.0f64;
    let mut n = 0;
    while n < SERIES_TERMS {
        if n > 0 {
            fact *= n as f64;
        }
        let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
        c[n] = (sign * two_over_sqrt_pi / (fact * (2 * n + 1) as f64)) as f32;
        n += 1;
    }
    c[0] = (two_over_sqrt_pi - 1.0) as f32;
    c
};

/// erf(x) − x for |x| < [`SERIES_CUT`] (larger x gives garbage, selected away by the callers).
#[inline(always)]
fn erf_series_less_x(x: f32) -> f32 {
    let y = x * x;
    let mut p = SERIES[SERIES_TERMS - 1];
    for &c in SERIES[..SERIES_TERMS - 1].iter().rev() {
        p = p.mul_add(y, c);
    }
    x * p
}

/// erfc(z) for z ≥ [`SERIES_CUT`] (also fine for z ≥ 0): Numerical Recipes' `erfcc` (Press et al., *Numerical
/// Recipes*, 2nd ed., §6.2), t·exp(−z² + P(t)) with t = 1/(1 + z/2) — relative error below 1.2e-7 for every z ≥ 0.
#[inline(always)]
fn erfc_fit(z: f32) -> f32 {
    const P: [f32; 10] = [
        -1.265_512_2,
        1.000_023_7,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_204,
        1.488_515_9,
        -0.822_152_25,
        0.170_872_77,
    ];
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = P[9];
    for &c in P[..9].iter().rev() {
        p = p.mul_add(t, c);
    }
    t * exp_nonpositive(-z * z + p)
}

/// The error function erf(x) = (2/√π)∫₀ˣ e^(−t²) dt, within 8e-8 absolute of the true value over the whole real
/// line (measured against mpmath on a 1e-4 grid over [−6, 6] and on tiny |x|; about one ulp of 1), odd, NaN for
/// NaN.
///
/// |x| < 1: its Maclaurin series to x²³ (12 terms, written `x + x·P(x²)`); beyond: 1 − erfc(|x|) with erfc
/// from Numerical Recipes' Chebyshev fit ([`erfc_fit`], relative error < 1.2e-7), with the sign of x. Both branches
/// are computed and one is selected, so the loop has no branch.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let a = x.abs();
    let near = x + erf_series_less_x(x);
    let far = (1.0 - erfc_fit(a)).copysign(x);
    if a < SERIES_CUT {
        near
    } else {
        far
    }
}

/// The standard normal distribution function Φ(x) = ½·erfc(−x/√2), written through erfc(|x|/√2) on both sides so
/// that the left tail keeps its relative accuracy (½·(1 + erf) cancels there). Near 0, Φ is close to ½ and needs
/// no relative accuracy of erf (which is what `erf`'s series is for), so the fit alone serves everywhere: 1.7e-7
/// absolute (6e-8 with the series below |u| = 1, which cost GELU a third of its time), 5e-7 relative down to
/// x = −2 (tested).
#[inline(always)]
fn normal_cdf(x: f32) -> f32 {
    let u = x.abs() * FRAC_1_SQRT_2;
    let erfc = erfc_fit(u);
    let half = 0.5 * erfc;
    if x < 0.0 {
        half
    } else {
        1.0 - half
    }
}

/// 1/√(2π).
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
/// √(2/π).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of GELU's tanh approximation.
const GELU_CUBIC: f32 = 0.044_715;

/// GELU, exact form: x·Φ(x) = ½·x·(1 + erf(x/√2)) (Hendrycks & Gimpel, 2016).
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    x * normal_cdf(x)
}

/// d GELU/dx = Φ(x) + x·φ(x), with φ(x) = e^(−x²/2)/√(2π).
#[inline(always)]
pub(crate) fn gelu_derivative(x: f32) -> f32 {
    normal_cdf(x) + x * FRAC_1_SQRT_2PI * exp_nonpositive(-0.5 * x * x)
}

/// d GELU/dx from x and y = GELU(x): Φ(x) = y/x (½ at 0), so one exponential (φ) where [`gelu_derivative`]
/// evaluates Φ again (two branches and two exponentials: the backward ran 15× slower than the forward). y = x·Φ(x)
/// is one rounding from x·Φ, so y/x is Φ to two ulps; where Φ underflows (x < −13) y/x is 0, as is x·φ(x) there.
#[inline(always)]
pub(crate) fn gelu_derivative_from(x: f32, y: f32) -> f32 {
    let cdf = if x == 0.0 { 0.5 } else { y / x };
    cdf + x * FRAC_1_SQRT_2PI * exp_nonpositive(-0.5 * x * x)
}

/// GELU, tanh approximation: ½·x·(1 + tanh(u)) with u = √(2/π)·(x + 0.044715·x³), computed as x·σ(2u) (the
/// same function: 1 + tanh u = 2σ(2u)).
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    x * sigmoid(2.0 * u)
}

/// d/dx of [`gelu_tanh`]: with s = σ(2u), s + x·2s(1 − s)·u′ and u′ = √(2/π)·(1 + 3·0.044715·x²). With
/// e = e^(−2u), s = 1/(1 + e) and 1 − s = e·s, which keeps its relative accuracy where s is close to 1 (`1.0 - s`
/// would not); e is capped at 10³⁰ so that e·s stays finite far to the left, where the term is 0 anyway.
#[inline(always)]
pub(crate) fn gelu_tanh_derivative(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    let e = exp(-2.0 * u).min(1e30);
    let s = 1.0 / (1.0 + e);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
    s + x * 2.0 * s * (e * s) * du
}

/// d erf/dx = (2/√π)·e^(−x²).
#[inline(always)]
pub(crate) fn erf_derivative(x: f32) -> f32 {
    std::f32::consts::FRAC_2_SQRT_PI * exp_nonpositive(-x * x)
}

/// Σ f(a[i], b[i]) over two equal-length slices with 16 independent accumulators (vectorised), summed in a
/// fixed order.
#[inline]
pub(crate) fn lane_sum(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (ca, cb) in ca.zip(cb) {
        for ((acc, &a), &b) in acc.iter_mut().zip(ca).zip(cb) {
            *acc += f(a, b);
        }
    }
    for ((acc, &a), &b) in acc.iter_mut().zip(ta).zip(tb) {
        *acc += f(a, b);
    }
    // A fixed pairwise tree over the accumulators.
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0]
}

/// The largest value of `a` as `f32::max` folds it (a NaN is never the maximum; `−∞` for an empty slice), with 16
/// independent lanes (vectorised) reduced at the end: `max` is exact, so any order gives the same value.
#[inline]
pub(crate) fn lane_max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = a.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (acc, &v) in acc.iter_mut().zip(c) {
            *acc = acc.max(v);
        }
    }
    for (acc, &v) in acc.iter_mut().zip(tail) {
        *acc = acc.max(v);
    }
    acc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

/// `out[i] = f(a[i])` over equal-length slices, on 512-bit vectors with AVX-512 and 256-bit with AVX2 (as the
/// kernel level, `ARMOURY_SIMD`, allows). Same bits either way.
#[inline]
pub(crate) fn map_into(a: &[f32], out: &mut [MaybeUninit<f32>], f: &impl Fn(f32) -> f32) {
    assert_eq!(a.len(), out.len(), "map_into: equal lengths");
    #[cfg(target_arch = "x86_64")]
    match super::simd::level() {
        // SAFETY: the level says the CPU has the instruction set.
        Level::Avx512 => return unsafe { map_avx512(a, out, f) },
        Level::Avx2 => return unsafe { map_avx2(a, out, f) },
        Level::Portable => {}
    }
    map_plain(a, out, f)
}

/// `v[i] = f(v[i])` in place, on the vector levels as [`map_into`]: the same bits as `map_into` with the same `f`
/// (the fused activations of [`crate::ops::conv`] apply theirs to an output just written, in cache).
#[inline]
pub(crate) fn map_in_place(v: &mut [f32], f: &impl Fn(f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    match super::simd::level() {
        // SAFETY: the level says the CPU has the instruction set.
        Level::Avx512 => return unsafe { in_place_avx512(v, f) },
        Level::Avx2 => return unsafe { in_place_avx2(v, f) },
        Level::Portable => {}
    }
    in_place_plain(v, f)
}

/// SiLU in place ([`map_in_place`] of [`silu`]): the bits of [`crate::Tensor::silu`] on the same values.
pub(crate) fn silu_in_place(v: &mut [f32]) {
    map_in_place(v, &silu)
}

/// `out[i] = f(a[i], b[i], c[i])` over equal-length slices, as [`map_into`].
#[inline]
pub(crate) fn zip3_into(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    out: &mut [MaybeUninit<f32>],
    f: &impl Fn(f32, f32, f32) -> f32,
) {
    assert!(a.len() == out.len() && b.len() == out.len() && c.len() == out.len(), "zip3_into: equal lengths");
    #[cfg(target_arch = "x86_64")]
    match super::simd::level() {
        // SAFETY: the level says the CPU has the instruction set.
        Level::Avx512 => return unsafe { zip3_avx512(a, b, c, out, f) },
        Level::Avx2 => return unsafe { zip3_avx2(a, b, c, out, f) },
        Level::Portable => {}
    }
    zip3_plain(a, b, c, out, f)
}

/// `v[i] = f(v[i], b[i], c[i])` in place, as [`zip3_into`] with `v` as its first operand: the same bits (an
/// elementwise backward applied to a gradient just computed, in cache).
#[inline]
pub(crate) fn zip3_in_place(v: &mut [f32], b: &[f32], c: &[f32], f: &impl Fn(f32, f32, f32) -> f32) {
    assert!(b.len() == v.len() && c.len() == v.len(), "zip3_in_place: equal lengths");
    #[cfg(target_arch = "x86_64")]
    match super::simd::level() {
        // SAFETY: the level says the CPU has the instruction set.
        Level::Avx512 => return unsafe { zip3_in_place_avx512(v, b, c, f) },
        Level::Avx2 => return unsafe { zip3_in_place_avx2(v, b, c, f) },
        Level::Portable => {}
    }
    zip3_in_place_plain(v, b, c, f)
}

#[inline(always)]
fn zip3_in_place_plain(v: &mut [f32], b: &[f32], c: &[f32], f: &impl Fn(f32, f32, f32) -> f32) {
    for ((v, &b), &c) in v.iter_mut().zip(b).zip(c) {
        *v = f(*v, b, c);
    }
}

#[inline(always)]
fn map_plain(a: &[f32], out: &mut [MaybeUninit<f32>], f: &impl Fn(f32) -> f32) {
    for (o, &a) in out.iter_mut().zip(a) {
        o.write(f(a));
    }
}

#[inline(always)]
fn in_place_plain(v: &mut [f32], f: &impl Fn(f32) -> f32) {
    for x in v {
        *x = f(*x);
    }
}

#[inline(always)]
fn zip3_plain(a: &[f32], b: &[f32], c: &[f32], out: &mut [MaybeUninit<f32>], f: &impl Fn(f32, f32, f32) -> f32) {
    for (((o, &a), &b), &c) in out.iter_mut().zip(a).zip(b).zip(c) {
        o.write(f(a, b, c));
    }
}

/// Whether the slice loops may run on AVX2 (at least): the CPU has it and the kernel level is not capped to
/// portable.
#[cfg(target_arch = "x86_64")]
pub(crate) fn wide() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| super::simd::accelerated() && std::arch::is_x86_feature_detected!("avx2"))
}

#[cfg(target_arch = "x86_64")]
use super::simd::Level;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_avx2<F: Fn(f32) -> f32>(a: &[f32], out: &mut [MaybeUninit<f32>], f: &F) {
    map_plain(a, out, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn map_avx512<F: Fn(f32) -> f32>(a: &[f32], out: &mut [MaybeUninit<f32>], f: &F) {
    map_plain(a, out, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn in_place_avx2<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
    in_place_plain(v, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn in_place_avx512<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
    in_place_plain(v, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn zip3_avx2<F: Fn(f32, f32, f32) -> f32>(a: &[f32], b: &[f32], c: &[f32], out: &mut [MaybeUninit<f32>], f: &F) {
    zip3_plain(a, b, c, out, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn zip3_avx512<F: Fn(f32, f32, f32) -> f32>(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    out: &mut [MaybeUninit<f32>],
    f: &F,
) {
    zip3_plain(a, b, c, out, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn zip3_in_place_avx2<F: Fn(f32, f32, f32) -> f32>(v: &mut [f32], b: &[f32], c: &[f32], f: &F) {
    zip3_in_place_plain(v, b, c, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn zip3_in_place_avx512<F: Fn(f32, f32, f32) -> f32>(v: &mut [f32], b: &[f32], c: &[f32], f: &F) {
    zip3_in_place_plain(v, b, c, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64 by its Maclaurin series (for |x| < 2.5, to ~1e-16 relative).
    fn erf_series64(x: f64) -> f64 {
        let (mut term, mut sum, mut n) = (x, x, 0.0);
        while term.abs() > 1e-18 * sum.abs().max(1e-300) {
            n += 1.0;
            term *= -x * x / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    }

    /// erfc in f64 for x ≥ 2.5, to ~1e-15 relative, by its continued fraction
    /// erfc(x) = e^(−x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …)))).
    fn erfc_fraction64(x: f64) -> f64 {
        let mut k = x;
        for j in (1..80).rev() {
            k = x + (j as f64 / 2.0) / k;
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / k
    }

    fn erf64(x: f64) -> f64 {
        if x.abs() < 2.5 {
            erf_series64(x)
        } else {
            (1.0 - erfc_fraction64(x.abs())).copysign(x)
        }
    }

    /// erfc(x) for x ≥ 0, in f64.
    fn erfc64(x: f64) -> f64 {
        if x < 2.5 {
            1.0 - erf_series64(x)
        } else {
            erfc_fraction64(x)
        }
    }

    fn grid() -> Vec<f32> {
        let mut xs: Vec<f32> = (-60_000..=60_000).map(|i| i as f32 * 1e-4).collect();
        xs.extend((0..300).map(|i| 10f32.powf(-30.0 + i as f32 * 0.1)));
        xs.extend([-1e30, 1e30, 1e-40, -0.0, 0.999_999_9, 1.0, 1.000_000_1]);
        xs
    }

    #[test]
    fn erf_is_accurate_over_the_real_line() {
        let mut worst = (0.0f64, 0.0f32);
        for x in grid() {
            let err = (erf(x) as f64 - erf64(x as f64)).abs();
            if err > worst.0 {
                worst = (err, x);
            }
            assert_eq!(erf(-x), -erf(x), "erf is odd at {x}");
        }
        assert!(worst.0 <= 1e-7, "erf: max abs error {:e} at {}", worst.0, worst.1);
        // Tiny arguments keep their relative accuracy (erf x ≈ 2x/√π).
        for x in [1e-30f32, 1e-10, 1e-5] {
            let want = erf64(x as f64);
            assert!(((erf(x) as f64 - want) / want).abs() < 2e-7, "erf({x})");
        }
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
    }

    #[test]
    fn exp_is_accurate_and_saturates() {
        for i in -1_000_000..=887_000 {
            let x = i as f32 * 1e-4;
            let want = (x as f64).exp();
            assert!(!exp(x).is_subnormal(), "exp({x}) is subnormal");
            if x < FLUSH_BELOW {
                assert_eq!(exp(x), 0.0, "exp({x}) below the flush");
                continue;
            }
            let rel = (exp(x) as f64 - want).abs() / want;
            assert!(rel <= 1.2e-7, "exp({x}): relative error {rel:e}");
        }
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
    }

    /// Φ against ½·erfc(|x|/√2) in f64: the one fit on both sides, with no series near 0, is within 1.7e-7
    /// absolute everywhere (the series branch gave 6e-8) and 5e-7 relative down to x = −2 (the same with the series);
    /// beyond, the relative error grows as the tail's exponent x²/2 loses its last bits (2.2e-6 at x = −5, the
    /// same with the series).
    #[test]
    fn normal_cdf_is_accurate_on_both_sides() {
        let (mut abs, mut rel, mut tail) = (0.0f64, 0.0f64, 0.0f64);
        for i in -130_000..=130_000 {
            let x = i as f32 * 1e-4;
            let half = 0.5 * erfc64((x as f64).abs() / std::f64::consts::SQRT_2);
            let want = if x < 0.0 { half } else { 1.0 - half };
            let err = (normal_cdf(x) as f64 - want).abs();
            abs = abs.max(err);
            if x >= -2.0 {
                rel = rel.max(err / want);
            } else if x >= -5.0 {
                tail = tail.max(err / want);
            }
        }
        assert!(abs <= 2e-7 && rel <= 6e-7 && tail <= 3e-6, "Φ: abs {abs:e}, relative {rel:e}, tail {tail:e}");
    }

    /// GELU against x·Φ(x) in f64 (absolute error, and relative in the left tail where Φ is tiny), its tanh form
    /// against the formula in f64, and both derivatives against central differences in f64.
    #[test]
    fn gelu_forms_and_derivatives() {
        // Tiny, zero and far-tail arguments of the backward's form: Φ(0) = ½, and 0 far to the left.
        assert_eq!(gelu_derivative_from(0.0, 0.0), 0.5);
        assert!((gelu_derivative_from(1e-30, gelu(1e-30)) - 0.5).abs() < 1e-6);
        assert_eq!(gelu_derivative_from(-40.0, gelu(-40.0)), 0.0);
        assert_eq!(gelu_derivative_from(40.0, gelu(40.0)), 1.0);
        // Φ through erfc on both sides: ½·(1 + erf) would cancel in the left tail.
        let phi = |x: f64| {
            let half = 0.5 * erfc64(x.abs() / std::f64::consts::SQRT_2);
            if x < 0.0 {
                half
            } else {
                1.0 - half
            }
        };
        let tanh_form =
            |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
        for i in -1200..=1200 {
            let x = i as f32 * 0.01;
            let xd = x as f64;
            let want = xd * phi(xd);
            assert!((gelu(x) as f64 - want).abs() <= 2e-7 * (1.0 + xd.abs()), "gelu({x})");
            if (-6.0..-3.0).contains(&x) {
                assert!(((gelu(x) as f64 - want) / want).abs() < 1e-5, "gelu({x}) relative");
            }
            assert!((gelu_tanh(x) as f64 - tanh_form(xd)).abs() <= 3e-7 * (1.0 + xd.abs()), "gelu_tanh({x})");
            let h = 1e-6;
            let d_exact = ((xd + h) * phi(xd + h) - (xd - h) * phi(xd - h)) / (2.0 * h);
            assert!((gelu_derivative(x) as f64 - d_exact).abs() < 1e-6, "gelu'({x})");
            // The backward's form, from the forward's output.
            assert!((gelu_derivative_from(x, gelu(x)) as f64 - d_exact).abs() < 1e-6, "gelu'({x}) from y");
            let d_tanh = (tanh_form(xd + h) - tanh_form(xd - h)) / (2.0 * h);
            assert!((gelu_tanh_derivative(x) as f64 - d_tanh).abs() < 1e-6, "gelu_tanh'({x})");
            let d_erf = (erf64(xd + h) - erf64(xd - h)) / (2.0 * h);
            assert!((erf_derivative(x) as f64 - d_erf).abs() < 1e-6, "erf'({x})");
        }
    }

    /// σ and SiLU against f64 in relative error over [−110, 110] (flushed to 0 where σ would be subnormal, never
    /// subnormal), SiLU's derivative against central differences in f64.
    #[test]
    fn sigmoid_and_silu_are_accurate() {
        let sigmoid64 = |x: f64| 1.0 / (1.0 + (-x).exp());
        let (mut worst_s, mut worst_silu) = (0.0f64, 0.0f64);
        for i in -1_100_000..=1_100_000 {
            let x = i as f32 * 1e-4;
            let (want, xd) = (sigmoid64(x as f64), x as f64);
            for v in [sigmoid(x), silu(x), silu_derivative(x)] {
                assert!(!v.is_subnormal(), "σ, SiLU or SiLU' at {x}: subnormal {v:e}");
            }
            if x < FLUSH_BELOW {
                assert_eq!(sigmoid(x), 0.0, "σ({x}) below the flush");
                continue;
            }
            worst_s = worst_s.max((sigmoid(x) as f64 - want).abs() / want);
            if x != 0.0 {
                worst_silu = worst_silu.max((silu(x) as f64 - xd * want).abs() / (xd * want).abs());
            }
            if i % 97 == 0 && x.abs() < 30.0 {
                let h = 1e-6;
                let d = ((xd + h) * sigmoid64(xd + h) - (xd - h) * sigmoid64(xd - h)) / (2.0 * h);
                assert!((silu_derivative(x) as f64 - d).abs() <= 1e-6 * (1.0 + d.abs()), "silu'({x})");
            }
        }
        assert!(worst_s <= 2.4e-7, "σ: max relative error {worst_s:e}");
        assert!(worst_silu <= 3e-7, "SiLU: max relative error {worst_silu:e}");
        assert_eq!((sigmoid(200.0), sigmoid(-200.0), sigmoid(0.0)), (1.0, 0.0, 0.5));
        assert!(sigmoid(f32::NAN).is_nan() && silu(f32::NAN).is_nan());
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.037).collect();
        // SAFETY: `map_into` writes every element.
        let wide = unsafe {
            crate::ops::written(xs.len(), |o| map_into(&xs, o, &|x| sigmoid(x) + silu(x) + silu_derivative(x)))
        };
        for (w, &x) in wide.iter().zip(&xs) {
            assert_eq!(w.to_bits(), (sigmoid(x) + silu(x) + silu_derivative(x)).to_bits(), "vector loop at {x}");
        }
    }

    /// The vector loops give the bits of the scalar ones.
    #[test]
    fn vector_loops_match_scalar_bits() {
        let xs = grid();
        // SAFETY: `map_into` and `zip3_into` write every element.
        let wide = unsafe {
            crate::ops::written(xs.len(), |o| map_into(&xs, o, &|x| gelu(x) + erf(x) + gelu_tanh(x) + exp(x * 1e-3)))
        };
        for (w, &x) in wide.iter().zip(&xs) {
            let one = gelu(x) + erf(x) + gelu_tanh(x) + exp(x * 1e-3);
            assert_eq!(w.to_bits(), one.to_bits(), "at {x}");
        }
        let wide3 = unsafe {
            crate::ops::written(xs.len(), |o| {
                zip3_into(&xs, &wide, &xs, o, &|a, b, c| a * gelu_derivative(b) - erf_derivative(c))
            })
        };
        for ((w, &a), &b) in wide3.iter().zip(&xs).zip(&wide) {
            assert_eq!(w.to_bits(), (a * gelu_derivative(b) - erf_derivative(a)).to_bits());
        }
    }
}
