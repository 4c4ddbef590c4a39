//! The instruction sets the kernels are written over: the [`Isa`] trait (vectors of `f32` and `u32`, lane masks,
//! masked moves), its two implementations [`Avx512`] (16 lanes, mask registers) and [`Avx2`] (8 lanes, masks as
//! vectors), and the macros that compile one generic kernel body per instruction set behind a
//! `#[target_feature]` entry point and pick the one [`Level`](super::Level) names at run time.
//!
//! A kernel family (`gemm`, `conv`, `layout`, `pool`, `rows`) writes its bodies once, as `body::<S: Isa>`, and
//! exposes them through [`entry_points!`] (one body, any signature) or [`tile_dispatch!`] (register-tile bodies
//! specialised for their row and vector counts; `rows` matches its vector count the same way). Everything here
//! is x86-64 only; other targets never reach the kernels (their level is always `Portable`).

use std::arch::x86_64::*;

/// The vector operations the kernels are written in, for one instruction set. Every method is inlined into
/// a `#[target_feature]` entry point below, where the intrinsics it calls are available.
pub(super) trait Isa {
    /// Lanes of `f32`.
    type V: Copy;
    /// Lanes of `u32`/`i32`.
    type I: Copy;
    /// A set of lanes.
    type M: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// `a·b + c`, rounded once.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn loadu(p: *const f32) -> Self::V;
    unsafe fn storeu(p: *mut f32, v: Self::V);
    /// Lanes `lo..hi`, clamped to the vector.
    unsafe fn lanes(lo: isize, hi: isize) -> Self::M;
    unsafe fn and(a: Self::M, b: Self::M) -> Self::M;
    unsafe fn or(a: Self::M, b: Self::M) -> Self::M;
    unsafe fn is_empty(m: Self::M) -> bool;
    /// Loads the lanes in `m` (the others are zero and never touch memory).
    unsafe fn load(m: Self::M, p: *const f32) -> Self::V;
    /// Stores the lanes in `m` (the others never touch memory).
    unsafe fn store(m: Self::M, p: *mut f32, v: Self::V);
    /// Lanes not in `m`.
    unsafe fn not(m: Self::M) -> Self::M;
    /// `a` in the lanes of `m`, zero elsewhere.
    unsafe fn keep(m: Self::M, a: Self::V) -> Self::V;
    /// The inverse of [`Isa::deinterleave`]: `a0 b0 a1 b1 …` as two vectors.
    unsafe fn interleave(a: Self::V, b: Self::V) -> (Self::V, Self::V);
    /// The even and the odd elements of the `2·LANES` elements `lo, hi`.
    unsafe fn deinterleave(lo: Self::V, hi: Self::V) -> (Self::V, Self::V);
    /// Lanes where `a == b` (ordered).
    unsafe fn eq(a: Self::V, b: Self::V) -> Self::M;
    /// Lanes where `a` or `b` is NaN.
    unsafe fn unordered(a: Self::V, b: Self::V) -> Self::M;
    /// `0, 2, 4, …`.
    unsafe fn evens() -> Self::I;
    unsafe fn splat_i(x: i32) -> Self::I;
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    /// `yes` in the lanes of `m`, `no` elsewhere.
    unsafe fn select_i(m: Self::M, yes: Self::I, no: Self::I) -> Self::I;
    unsafe fn store_i(m: Self::M, p: *mut u32, v: Self::I);
    /// Loads the lanes in `m` (the others are zero and never touch memory).
    unsafe fn load_i(m: Self::M, p: *const u32) -> Self::I;
    /// Lanes where `a == b`.
    unsafe fn eq_i(a: Self::I, b: Self::I) -> Self::M;
    /// Lanes where `a > b` (ordered).
    unsafe fn gt(a: Self::V, b: Self::V) -> Self::M;
    /// The upper and lower halves of `a` exchanged.
    unsafe fn swap_halves(a: Self::V) -> Self::V;
    unsafe fn swap_halves_i(a: Self::I) -> Self::I;
    unsafe fn min_i(a: Self::I, b: Self::I) -> Self::I;
    /// Stores the lower half of `a` (`LANES / 2` elements, unmasked).
    unsafe fn store_half(p: *mut f32, a: Self::V);
    unsafe fn store_half_i(p: *mut u32, a: Self::I);
    /// The lower half of the lanes loaded from `lo`, the upper half from `hi` (`LANES / 2` elements each).
    unsafe fn load_halves(lo: *const f32, hi: *const f32) -> Self::V;
}

/// AVX-512F: 16 lanes, lane masks in a `u16`.
pub(super) struct Avx512;

/// AVX2 with FMA: 8 lanes; a lane set is a vector of all-ones/zero lanes and its bits.
pub(super) struct Avx2;

/// A lane set for [`Avx2`]: the vector form for masked moves and the bit form for quick tests.
#[derive(Clone, Copy)]
pub(super) struct Lanes8 {
    v: __m256i,
    bits: u8,
}

/// Bits `lo..hi` of `width`, clamped.
#[inline(always)]
fn bit_range(lo: isize, hi: isize, width: isize) -> u32 {
    let (lo, hi) = (lo.clamp(0, width), hi.clamp(0, width));
    if hi <= lo {
        0
    } else {
        (((1u64 << (hi - lo)) - 1) << lo) as u32
    }
}

impl Isa for Avx512 {
    type V = __m512;
    type I = __m512i;
    type M = u16;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        _mm512_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn loadu(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn storeu(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn lanes(lo: isize, hi: isize) -> u16 {
        bit_range(lo, hi, 16) as u16
    }
    #[inline(always)]
    unsafe fn and(a: u16, b: u16) -> u16 {
        a & b
    }
    #[inline(always)]
    unsafe fn or(a: u16, b: u16) -> u16 {
        a | b
    }
    #[inline(always)]
    unsafe fn is_empty(m: u16) -> bool {
        m == 0
    }
    #[inline(always)]
    unsafe fn load(m: u16, p: *const f32) -> __m512 {
        _mm512_maskz_loadu_ps(m, p)
    }
    #[inline(always)]
    unsafe fn store(m: u16, p: *mut f32, v: __m512) {
        _mm512_mask_storeu_ps(p, m, v)
    }
    #[inline(always)]
    unsafe fn not(m: u16) -> u16 {
        !m
    }
    #[inline(always)]
    unsafe fn keep(m: u16, a: __m512) -> __m512 {
        _mm512_maskz_mov_ps(m, a)
    }
    #[inline(always)]
    unsafe fn interleave(a: __m512, b: __m512) -> (__m512, __m512) {
        let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        let hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
        (_mm512_permutex2var_ps(a, lo, b), _mm512_permutex2var_ps(a, hi, b))
    }
    #[inline(always)]
    unsafe fn deinterleave(lo: __m512, hi: __m512) -> (__m512, __m512) {
        let even = Self::evens();
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        (_mm512_permutex2var_ps(lo, even, hi), _mm512_permutex2var_ps(lo, odd, hi))
    }
    #[inline(always)]
    unsafe fn eq(a: __m512, b: __m512) -> u16 {
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn unordered(a: __m512, b: __m512) -> u16 {
        _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, b)
    }
    #[inline(always)]
    unsafe fn evens() -> __m512i {
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
    }
    #[inline(always)]
    unsafe fn splat_i(x: i32) -> __m512i {
        _mm512_set1_epi32(x)
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn select_i(m: u16, yes: __m512i, no: __m512i) -> __m512i {
        _mm512_mask_mov_epi32(no, m, yes)
    }
    #[inline(always)]
    unsafe fn store_i(m: u16, p: *mut u32, v: __m512i) {
        _mm512_mask_storeu_epi32(p.cast(), m, v)
    }
    #[inline(always)]
    unsafe fn load_i(m: u16, p: *const u32) -> __m512i {
        _mm512_maskz_loadu_epi32(m, p.cast())
    }
    #[inline(always)]
    unsafe fn eq_i(a: __m512i, b: __m512i) -> u16 {
        _mm512_cmpeq_epi32_mask(a, b)
    }
    #[inline(always)]
    unsafe fn gt(a: __m512, b: __m512) -> u16 {
        _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn swap_halves(a: __m512) -> __m512 {
        _mm512_shuffle_f32x4::<0b01_00_11_10>(a, a)
    }
    #[inline(always)]
    unsafe fn swap_halves_i(a: __m512i) -> __m512i {
        _mm512_shuffle_i32x4::<0b01_00_11_10>(a, a)
    }
    #[inline(always)]
    unsafe fn min_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_min_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn store_half(p: *mut f32, a: __m512) {
        _mm256_storeu_ps(p, _mm512_castps512_ps256(a))
    }
    #[inline(always)]
    unsafe fn store_half_i(p: *mut u32, a: __m512i) {
        _mm256_storeu_si256(p.cast(), _mm512_castsi512_si256(a))
    }
    #[inline(always)]
    unsafe fn load_halves(lo: *const f32, hi: *const f32) -> __m512 {
        // `insertf64x4` rather than `insertf32x8`, which needs AVX-512DQ: the same bits moved.
        let lower = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(lo)));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lower, _mm256_castps_pd(_mm256_loadu_ps(hi))))
    }
}

impl Avx2 {
    #[inline(always)]
    unsafe fn from_vector(v: __m256i) -> Lanes8 {
        Lanes8 { v, bits: _mm256_movemask_ps(_mm256_castsi256_ps(v)) as u8 }
    }
}

impl Isa for Avx2 {
    type V = __m256;
    type I = __m256i;
    type M = Lanes8;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        _mm256_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn loadu(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn storeu(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn lanes(lo: isize, hi: isize) -> Lanes8 {
        let (lo, hi) = (lo.clamp(0, 8) as i32, hi.clamp(0, 8) as i32);
        let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let v = _mm256_and_si256(
            _mm256_cmpgt_epi32(iota, _mm256_set1_epi32(lo - 1)),
            _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), iota),
        );
        Lanes8 { v, bits: bit_range(lo as isize, hi as isize, 8) as u8 }
    }
    #[inline(always)]
    unsafe fn and(a: Lanes8, b: Lanes8) -> Lanes8 {
        Lanes8 { v: _mm256_and_si256(a.v, b.v), bits: a.bits & b.bits }
    }
    #[inline(always)]
    unsafe fn or(a: Lanes8, b: Lanes8) -> Lanes8 {
        Lanes8 { v: _mm256_or_si256(a.v, b.v), bits: a.bits | b.bits }
    }
    #[inline(always)]
    unsafe fn is_empty(m: Lanes8) -> bool {
        m.bits == 0
    }
    #[inline(always)]
    unsafe fn load(m: Lanes8, p: *const f32) -> __m256 {
        // A plain load when every lane is wanted (the common case): cheaper than the masked move.
        match m.bits {
            0xFF => _mm256_loadu_ps(p),
            0 => _mm256_setzero_ps(),
            _ => _mm256_maskload_ps(p, m.v),
        }
    }
    #[inline(always)]
    unsafe fn store(m: Lanes8, p: *mut f32, v: __m256) {
        match m.bits {
            0xFF => _mm256_storeu_ps(p, v),
            0 => {}
            _ => _mm256_maskstore_ps(p, m.v, v),
        }
    }
    #[inline(always)]
    unsafe fn not(m: Lanes8) -> Lanes8 {
        Lanes8 { v: _mm256_xor_si256(m.v, _mm256_set1_epi32(-1)), bits: !m.bits }
    }
    #[inline(always)]
    unsafe fn keep(m: Lanes8, a: __m256) -> __m256 {
        _mm256_and_ps(_mm256_castsi256_ps(m.v), a)
    }
    #[inline(always)]
    unsafe fn interleave(a: __m256, b: __m256) -> (__m256, __m256) {
        let (lo, hi) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
        (_mm256_permute2f128_ps::<0x20>(lo, hi), _mm256_permute2f128_ps::<0x31>(lo, hi))
    }
    #[inline(always)]
    unsafe fn deinterleave(lo: __m256, hi: __m256) -> (__m256, __m256) {
        // Within each 128-bit half: lo's pair then hi's pair; then the 64-bit quarters put back in order.
        let even = _mm256_shuffle_ps::<0b10_00_10_00>(lo, hi);
        let odd = _mm256_shuffle_ps::<0b11_01_11_01>(lo, hi);
        (
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(even))),
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(odd))),
        )
    }
    #[inline(always)]
    unsafe fn eq(a: __m256, b: __m256) -> Lanes8 {
        Self::from_vector(_mm256_castps_si256(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, b)))
    }
    #[inline(always)]
    unsafe fn unordered(a: __m256, b: __m256) -> Lanes8 {
        Self::from_vector(_mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(a, b)))
    }
    #[inline(always)]
    unsafe fn evens() -> __m256i {
        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)
    }
    #[inline(always)]
    unsafe fn splat_i(x: i32) -> __m256i {
        _mm256_set1_epi32(x)
    }
    #[inline(always)]
    unsafe fn add_i(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn select_i(m: Lanes8, yes: __m256i, no: __m256i) -> __m256i {
        _mm256_blendv_epi8(no, yes, m.v)
    }
    #[inline(always)]
    unsafe fn store_i(m: Lanes8, p: *mut u32, v: __m256i) {
        match m.bits {
            0xFF => _mm256_storeu_si256(p.cast(), v),
            0 => {}
            _ => _mm256_maskstore_epi32(p.cast(), m.v, v),
        }
    }
    #[inline(always)]
    unsafe fn load_i(m: Lanes8, p: *const u32) -> __m256i {
        match m.bits {
            0xFF => _mm256_loadu_si256(p.cast()),
            0 => _mm256_setzero_si256(),
            _ => _mm256_maskload_epi32(p.cast(), m.v),
        }
    }
    #[inline(always)]
    unsafe fn eq_i(a: __m256i, b: __m256i) -> Lanes8 {
        Self::from_vector(_mm256_cmpeq_epi32(a, b))
    }
    #[inline(always)]
    unsafe fn gt(a: __m256, b: __m256) -> Lanes8 {
        Self::from_vector(_mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(a, b)))
    }
    #[inline(always)]
    unsafe fn swap_halves(a: __m256) -> __m256 {
        _mm256_permute2f128_ps::<1>(a, a)
    }
    #[inline(always)]
    unsafe fn swap_halves_i(a: __m256i) -> __m256i {
        _mm256_permute2x128_si256::<1>(a, a)
    }
    #[inline(always)]
    unsafe fn min_i(a: __m256i, b: __m256i) -> __m256i {
        _mm256_min_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn store_half(p: *mut f32, a: __m256) {
        _mm_storeu_ps(p, _mm256_castps256_ps128(a))
    }
    #[inline(always)]
    unsafe fn store_half_i(p: *mut u32, a: __m256i) {
        _mm_storeu_si128(p.cast(), _mm256_castsi256_si128(a))
    }
    #[inline(always)]
    unsafe fn load_halves(lo: *const f32, hi: *const f32) -> __m256 {
        _mm256_loadu2_m128(hi, lo)
    }
}

/// Flush-to-zero and denormals-are-zero (MXCSR bits 15 and 6) while a kernel runs, the caller's setting restored
/// when it is dropped: subnormal operands read as 0 and subnormal results are written as 0.
///
/// An x86 core takes a micro-code assist of ~100 cycles for every vector operation that meets a subnormal, so a
/// product with many near-zero terms crawls: a 1×1 convolution of EfficientNet-B0 after a squeeze-excitation gate
/// (channels scaled by σ ≈ 1e-37 under random weights) ran 12–25× slower than the same shape on ordinary values,
/// and the input gradient (an output gradient with subnormal entries) as much. PyTorch and onnxruntime offer the
/// mode as an option (`torch.set_flush_denormal`, `session.set_denormal_as_zero`). The values lost are below
/// 1.2e-38 in magnitude, a relative change of at most 2⁻²³ to any sum that also holds a normal term. The mode is
/// set on the thread that runs the kernel (rayon's workers included: every entry point takes its own guard) and
/// only for the kernel's duration, so code around it, the user's included, sees IEEE arithmetic; the kernels'
/// results stay bit-identical for every thread count and batch size. The portable path (`gemm` crate, scalar
/// loops) keeps IEEE subnormals; the paths agree to 1.2e-38.
///
/// Rust assumes the default floating-point environment around compiled code, which is why the change is confined
/// to the intrinsic kernels: they compute on run-time values only (nothing to fold at compile time), and the
/// guard restores the register before returning.
///
/// Reading the register (`stmxcsr`) waits for every floating-point operation in flight, since it reports their
/// exception flags: taken per register tile, it drained the pipeline between tiles and cost a single-thread
/// `198 × 768 × 3072` product a tenth of its time (perf: three quarters of the loop around the tiles on the
/// instruction after it). So a guard taken while another is alive on the thread touches no register (a
/// thread-local flag says the mode is on), and the loops that call tile kernels by the thousand take one guard
/// around the loop. An enclosing guard is only ever taken around work that runs on its own thread to the end
/// (never around a rayon join or parallel iterator, where the thread could run someone else's task meanwhile).
pub(crate) struct FlushSubnormals(Option<u32>);

/// MXCSR's flush-to-zero (15) and denormals-are-zero (6) bits.
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

thread_local! {
    /// Whether a [`FlushSubnormals`] guard is alive on this thread (the mode is on).
    static FLUSHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl FlushSubnormals {
    /// Sets the mode (a no-op, not even a register read, inside another guard on this thread).
    #[inline(always)]
    pub(crate) fn on() -> FlushSubnormals {
        if FLUSHING.get() {
            return FlushSubnormals(None);
        }
        let mut csr = 0u32;
        // SAFETY: `stmxcsr` stores the 32-bit control register to the valid, aligned `csr`; `ldmxcsr` loads a value
        // that differs from the current one only in the flush bits (no exception unmasked, reserved bits as read).
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
            if csr & FTZ_DAZ != FTZ_DAZ {
                let set = csr | FTZ_DAZ;
                std::arch::asm!("ldmxcsr [{}]", in(reg) &set, options(nostack, readonly, preserves_flags));
            }
        }
        FLUSHING.set(true);
        FlushSubnormals(Some(csr))
    }
}

impl Drop for FlushSubnormals {
    #[inline(always)]
    fn drop(&mut self) {
        let Some(csr) = self.0 else { return };
        if csr & FTZ_DAZ != FTZ_DAZ {
            // SAFETY: restores the value `on` read.
            unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly, preserves_flags)) };
        }
        FLUSHING.set(false);
    }
}

/// The mode as it is outside the kernels (flush-to-zero and denormals-are-zero off) while the guard lives, inside a
/// [`FlushSubnormals`] guard: for elementwise work a kernel's job does on its results in cache that must give the
/// bits of the same work done after the kernel, in a pass of its own. Restores the guard's mode when dropped.
pub(crate) struct PlainFloats(Option<u32>);

impl PlainFloats {
    pub(crate) fn on() -> PlainFloats {
        if !FLUSHING.get() {
            return PlainFloats(None);
        }
        let mut csr = 0u32;
        // SAFETY: as in `FlushSubnormals::on`: the control register read, then loaded with the flush bits cleared.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
            let plain = csr & !FTZ_DAZ;
            std::arch::asm!("ldmxcsr [{}]", in(reg) &plain, options(nostack, readonly, preserves_flags));
        }
        FLUSHING.set(false);
        PlainFloats(Some(csr))
    }
}

impl Drop for PlainFloats {
    fn drop(&mut self) {
        let Some(csr) = self.0 else { return };
        // SAFETY: restores the value `on` read.
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly, preserves_flags)) };
        FLUSHING.set(true);
    }
}

/// Entry points: each kernel compiled once per instruction set, with that set's features enabled, under the
/// attributes (docs) written before it. The invoking module imports `Level`, `Avx2` and `Avx512`.
macro_rules! entry_points {
    ($($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $body:ident;)*) => {
        $(
            $(#[$meta])*
            pub(crate) unsafe fn $name(level: Level, $($arg: $ty),*) $(-> $ret)? {
                #[target_feature(enable = "avx512f")]
                unsafe fn wide($($arg: $ty),*) $(-> $ret)? { $body::<Avx512>($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn narrow($($arg: $ty),*) $(-> $ret)? { $body::<Avx2>($($arg),*) }
                let _flush = $crate::ops::simd::isa::FlushSubnormals::on();
                match level {
                    Level::Avx512 => wide($($arg),*),
                    Level::Avx2 => narrow($($arg),*),
                    Level::Portable => unreachable!("callers check the level first"),
                }
            }
        )*
    };
}
pub(crate) use entry_points;

/// `f::<r, v, flag>(t)` for the runtime `r` and `v` among the listed values.
macro_rules! tile_match {
    ($f:ident, $fl:literal, $t:ident, $r:ident, $v:ident, [$($rr:literal)*], $vs:tt) => {
        match $r { $( $rr => tile_match!(@vecs $f, $fl, $t, $v, $rr, $vs), )* _ => unreachable!("tile rows ≤ 6") }
    };
    (@vecs $f:ident, $fl:literal, $t:ident, $v:ident, $rr:literal, [$($vv:literal)*]) => {
        match $v { $( $vv => $f::<$rr, $vv, $fl>($t), )* _ => unreachable!("tile vectors ≤ 4 (AVX-512) or 2 (AVX2)") }
    };
}
pub(crate) use tile_match;

/// Runs `$body::<Isa, R, V, FLAG>(t)` for the level's instruction set, specialised for `r` rows, `v` vectors
/// and the flag (a partial vector present or not). The invoking module imports `Level`, `Avx2`, `Avx512` and
/// `tile_match`.
macro_rules! tile_dispatch {
    ($body:ident, $tile:ty, $level:expr, $t:expr, $r:expr, $v:expr, $flag:expr) => {{
        #[target_feature(enable = "avx512f")]
        unsafe fn wide<const R: usize, const V: usize, const F: bool>(t: &$tile) {
            $body::<Avx512, R, V, F>(t)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow<const R: usize, const V: usize, const F: bool>(t: &$tile) {
            $body::<Avx2, R, V, F>(t)
        }
        let (t, r, v) = ($t, $r, $v);
        let _flush = $crate::ops::simd::isa::FlushSubnormals::on();
        match ($level, $flag) {
            (Level::Avx512, false) => tile_match!(wide, false, t, r, v, [1 2 3 4 5 6], [1 2 3 4]),
            (Level::Avx512, true) => tile_match!(wide, true, t, r, v, [1 2 3 4 5 6], [1 2 3 4]),
            (Level::Avx2, false) => tile_match!(narrow, false, t, r, v, [1 2 3 4 5 6], [1 2]),
            (Level::Avx2, true) => tile_match!(narrow, true, t, r, v, [1 2 3 4 5 6], [1 2]),
            (Level::Portable, _) => unreachable!("callers check the level first"),
        }
    }};
}
pub(crate) use tile_dispatch;

/// `a` clamped to `[lo, hi]` (`max` first: a NaN becomes `lo`, as the scalar `f32::max`), or `a` itself: the
/// activation a convolution fuses into its store (`[0, ∞)` is the ReLU, bit for bit).
#[inline(always)]
pub(super) unsafe fn clamp<S: Isa>(a: S::V, bounds: Option<[S::V; 2]>) -> S::V {
    match bounds {
        Some([lo, hi]) => S::min(S::max(a, lo), hi),
        None => a,
    }
}

/// Vector `v` of a tile row: the last one masked to `last` with `TAIL`, the others plain moves (a function, not
/// a closure: it must inline into the entry point for the intrinsics to).
#[inline(always)]
pub(super) unsafe fn ld<S: Isa, const V: usize, const TAIL: bool>(last: S::M, p: *const f32, v: usize) -> S::V {
    if TAIL && v + 1 == V {
        S::load(last, p)
    } else {
        S::loadu(p)
    }
}

/// The `R × V` register tile of `c` at `c` (rows `rsc` apart), the last vector masked to `last` with `TAIL`.
#[inline(always)]
pub(super) unsafe fn load_tile<S: Isa, const R: usize, const V: usize, const TAIL: bool>(
    last: S::M,
    c: *const f32,
    rsc: isize,
) -> [[S::V; V]; R] {
    let mut acc = [[S::zero(); V]; R];
    for (r, row) in acc.iter_mut().enumerate() {
        for (v, a) in row.iter_mut().enumerate() {
            *a = ld::<S, V, TAIL>(last, c.offset(r as isize * rsc).add(S::LANES * v), v);
        }
    }
    acc
}

/// Stores a register tile where [`load_tile`] reads it.
#[inline(always)]
pub(super) unsafe fn store_tile<S: Isa, const R: usize, const V: usize, const TAIL: bool>(
    last: S::M,
    c: *mut f32,
    rsc: isize,
    acc: &[[S::V; V]; R],
) {
    store_tile_clamped::<S, R, V, TAIL>(last, c, rsc, acc, None)
}

/// [`store_tile`], each vector clamped to `bounds` (`[lo, hi]` splatted) on its way out when given.
#[inline(always)]
pub(super) unsafe fn store_tile_clamped<S: Isa, const R: usize, const V: usize, const TAIL: bool>(
    last: S::M,
    c: *mut f32,
    rsc: isize,
    acc: &[[S::V; V]; R],
    bounds: Option<[S::V; 2]>,
) {
    for (r, row) in acc.iter().enumerate() {
        for (v, &a) in row.iter().enumerate() {
            let a = clamp::<S>(a, bounds);
            let p = c.offset(r as isize * rsc).add(S::LANES * v);
            if TAIL && v + 1 == V {
                S::store(last, p, a)
            } else {
                S::storeu(p, a)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{FlushSubnormals, FTZ_DAZ};

    fn mxcsr() -> u32 {
        let mut csr = 0u32;
        // SAFETY: stores the control register to a valid, aligned u32.
        unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags)) };
        csr
    }

    /// A guard sets the mode and restores the caller's register; a guard taken inside another on the same thread
    /// neither reads nor writes the register, and its end leaves the mode on for the outer one; after the outer
    /// one the next guard sets the mode again. Another thread's first guard is its own.
    #[test]
    fn a_nested_guard_leaves_the_mode_to_the_outer_one() {
        let before = mxcsr();
        assert_eq!(before & FTZ_DAZ, 0, "Rust starts with IEEE subnormals");
        {
            let outer = FlushSubnormals::on();
            assert!(outer.0 == Some(before));
            assert_eq!(mxcsr() & FTZ_DAZ, FTZ_DAZ);
            let other = std::thread::spawn(|| FlushSubnormals::on().0.is_some()).join().unwrap();
            assert!(other, "another thread's guard is its own");
            {
                let inner = FlushSubnormals::on();
                assert!(inner.0.is_none());
                assert_eq!(mxcsr() & FTZ_DAZ, FTZ_DAZ);
            }
            assert_eq!(mxcsr() & FTZ_DAZ, FTZ_DAZ, "the inner guard's end keeps the mode");
            let again = FlushSubnormals::on();
            assert!(again.0.is_none(), "still inside the outer guard");
        }
        assert_eq!(mxcsr(), before);
        let next = FlushSubnormals::on();
        assert!(next.0.is_some());
        assert_eq!(mxcsr() & FTZ_DAZ, FTZ_DAZ);
        drop(next);
        assert_eq!(mxcsr(), before);
    }
}
