//! Hand-written AVX-512 product kernels for the shapes convolutions produce, where the `gemm` crate (AVX2 only on
//! stable Rust) leaves half of a modern core's vector width unused.
//!
//! [`gemm_nn`] computes `c (+)= a·b` when the rows of `b` and `c` are contiguous: a register tile of up to 6 rows of
//! `a` (broadcast) times up to 64 columns of `b` (four 16-lane vectors), over the whole reduction, with no packing —
//! convolution operands (`W·col`, `Wᵀ·dout`) are already in that layout and small enough to stay in L2. Each output
//! element is one fused multiply-add chain over `k` in order, whatever `m`, `n`, the tiling or the thread count, so
//! results are deterministic and a row never depends on the other rows.
//!
//! On CPUs without AVX-512F the functions return `false` and the caller uses the `gemm` crate.

use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

/// Whether the AVX-512 kernels run: the CPU has the AVX-512 foundation instructions and the environment
/// variable `ARMOURY_NO_AVX512` is unset (CI sets it to test the portable path on the same machine). Decided once.
#[inline]
pub(crate) fn has_avx512() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let cpu = std::arch::is_x86_feature_detected!("avx512f");
        #[cfg(not(target_arch = "x86_64"))]
        let cpu = false;
        cpu && std::env::var_os("ARMOURY_NO_AVX512").is_none()
    })
}

/// Column blocks of this many multiply-adds or more are split across threads (when the caller allows it).
const PAR_WORK: usize = 1 << 21;

/// `c = a·b`, or `c += a·b` when `accumulate`, for `b` and `c` with contiguous rows; `a` may have any strides.
/// Returns `false` without touching `c` when the CPU lacks AVX-512F or the layout does not fit.
pub(crate) fn gemm_nn(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    accumulate: bool,
    parallel: bool,
) -> bool {
    let ((m, k), n) = (a.dim(), b.ncols());
    debug_assert!(b.nrows() == k && c.dim() == (m, n));
    if !has_avx512() {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return true;
    }
    if n > 1 && (b.strides()[1] != 1 || c.strides()[1] != 1) {
        return false;
    }
    let ops = Operands {
        a: a.as_ptr(),
        rsa: a.strides()[0],
        csa: a.strides()[1],
        b: b.as_ptr(),
        rsb: b.strides()[0],
        c: c.as_mut_ptr(),
        rsc: c.strides()[0],
        m,
        k,
        accumulate,
    };
    let blocks = n.div_ceil(BLOCK_N);
    let nested = rayon::current_thread_index().is_some();
    if parallel && !nested && blocks > 1 && m * n * k >= PAR_WORK {
        (0..blocks).into_par_iter().for_each(|blk| {
            let j = blk * BLOCK_N;
            // SAFETY: blocks write disjoint column ranges of `c`; the operands outlive this call.
            unsafe { ops.block(j, (n - j).min(BLOCK_N)) }
        });
    } else {
        for blk in 0..blocks {
            let j = blk * BLOCK_N;
            // SAFETY: as above, sequentially.
            unsafe { ops.block(j, (n - j).min(BLOCK_N)) }
        }
    }
    true
}

/// Columns of `b`/`c` per register tile: four 16-lane vectors.
const BLOCK_N: usize = 64;
/// Rows of `a`/`c` per register tile (6 × 4 accumulators + 4 `b` vectors + 1 broadcast fit the 32 registers).
const BLOCK_M: usize = 6;

/// Raw views of the three operands (validated by [`gemm_nn`]).
#[derive(Clone, Copy)]
struct Operands {
    a: *const f32,
    rsa: isize,
    csa: isize,
    b: *const f32,
    rsb: isize,
    c: *mut f32,
    rsc: isize,
    m: usize,
    k: usize,
    accumulate: bool,
}

// SAFETY: the pointers come from views borrowed for the duration of `gemm_nn`; concurrent tasks touch disjoint
// columns of `c` and only read `a` and `b`.
unsafe impl Send for Operands {}
unsafe impl Sync for Operands {}

impl Operands {
    /// All rows of `c` for the `nb ≤ 64` columns starting at `j`.
    unsafe fn block(&self, j: usize, nb: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let nv = nb.div_ceil(16);
            let tail = nb - (nv - 1) * 16;
            let mask: u16 = if tail == 16 { u16::MAX } else { (1u16 << tail) - 1 };
            let mut i = 0;
            while i < self.m {
                let mr = (self.m - i).min(BLOCK_M);
                let t = Tile {
                    k: self.k,
                    a: self.a.offset(i as isize * self.rsa),
                    rsa: self.rsa,
                    csa: self.csa,
                    b: self.b.add(j),
                    rsb: self.rsb,
                    c: self.c.offset(i as isize * self.rsc).add(j),
                    rsc: self.rsc,
                    mask,
                    accumulate: self.accumulate,
                };
                x86::dispatch(&t, mr, nv);
                i += mr;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (j, nb);
            unreachable!("gemm_nn checks for AVX-512 first");
        }
    }
}

/// One register tile: `R ≤ 6` rows by `V ≤ 4` vectors of columns, the last vector masked to `mask`.
#[allow(dead_code)]
struct Tile {
    k: usize,
    a: *const f32,
    rsa: isize,
    csa: isize,
    b: *const f32,
    rsb: isize,
    c: *mut f32,
    rsc: isize,
    mask: u16,
    accumulate: bool,
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Tile;
    use std::arch::x86_64::*;

    /// Runs the tile kernel specialised for `r` rows and `v` vectors.
    pub(super) unsafe fn dispatch(t: &Tile, r: usize, v: usize) {
        macro_rules! go {
            ($($r:literal)*) => {
                match (r, v) {
                    $( ($r, 1) => tile::<$r, 1>(t), ($r, 2) => tile::<$r, 2>(t),
                       ($r, 3) => tile::<$r, 3>(t), ($r, 4) => tile::<$r, 4>(t), )*
                    _ => unreachable!("tile sizes are bounded by BLOCK_M and BLOCK_N"),
                }
            };
        }
        go!(1 2 3 4 5 6)
    }

    /// Lanes `lo..hi` (clamped to 0..16) set.
    #[inline(always)]
    fn lanes(lo: isize, hi: isize) -> u16 {
        let (lo, hi) = (lo.clamp(0, 16), hi.clamp(0, 16));
        if hi <= lo {
            0
        } else {
            ((((1u32 << (hi - lo)) - 1) << lo) & 0xFFFF) as u16
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn im2col(img: &[f32], u: &super::Unfold, col: &mut [f32]) {
        let hw_out = u.ho * u.wo;
        let chunks = u.wo.div_ceil(16);
        // Per kernel column and 16-wide chunk of an output row: the lanes to store, and the lanes whose input
        // column lies inside the row (the rest are padding zeros). They do not depend on the row.
        let mut masks = vec![(0u16, 0u16); u.kw * chunks];
        for kj in 0..u.kw {
            let off = (kj * u.dw) as isize - u.pw as isize;
            for ch in 0..chunks {
                let o = (ch * 16) as isize;
                let store = lanes(0, u.wo as isize - o);
                masks[kj * chunks + ch] = (store, lanes(-(o + off), u.w as isize - (o + off)) & store);
            }
        }
        let (src, mut dst) = (img.as_ptr(), col.as_mut_ptr());
        for c in 0..u.cg {
            let plane = src.add(c * u.h * u.w);
            for ki in 0..u.kh {
                // Output rows whose input row oh·sh + ki·dh − ph lies inside the plane: lo..hi.
                let first = (ki * u.dh) as isize - u.ph as isize;
                let lo = if first >= 0 { 0 } else { (-first as usize).div_ceil(u.sh) }.min(u.ho);
                let hi = if first >= u.h as isize { 0 } else { (u.h as isize - first) as usize }.div_ceil(u.sh);
                let hi = hi.clamp(lo, u.ho);
                for kj in 0..u.kw {
                    let off = (kj * u.dw) as isize - u.pw as isize;
                    let m = &masks[kj * chunks..(kj + 1) * chunks];
                    let zero_rows = |from: usize, to: usize| {
                        for oh in from..to {
                            for (ch, &(store, _)) in m.iter().enumerate() {
                                _mm512_mask_storeu_ps(dst.add(oh * u.wo + 16 * ch), store, _mm512_setzero_ps());
                            }
                        }
                    };
                    zero_rows(0, lo);
                    // Lane l of chunk ch reads input column 16·ch + l + off of the row.
                    let mut row =
                        plane.wrapping_offset((lo * u.sh) as isize * u.w as isize + first * u.w as isize + off);
                    let mut run = dst.add(lo * u.wo);
                    let step = (u.sh * u.w) as isize;
                    if let [(store, load)] = *m {
                        for _ in lo..hi {
                            _mm512_mask_storeu_ps(run, store, _mm512_maskz_loadu_ps(load, row));
                            row = row.wrapping_offset(step);
                            run = run.add(u.wo);
                        }
                    } else {
                        for _ in lo..hi {
                            for (ch, &(store, load)) in m.iter().enumerate() {
                                let v = _mm512_maskz_loadu_ps(load, row.wrapping_add(16 * ch));
                                _mm512_mask_storeu_ps(run.add(16 * ch), store, v);
                            }
                            row = row.wrapping_offset(step);
                            run = run.add(u.wo);
                        }
                    }
                    zero_rows(hi, u.ho);
                    dst = dst.add(hw_out);
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn col2im(col: &[f32], u: &super::Unfold, img: &mut [f32]) {
        let hw_out = u.ho * u.wo;
        let chunks = u.w.div_ceil(16);
        // Per kernel column and 16-wide chunk of an image row: the lanes that receive an output column of the
        // tap (image column x + l takes output column x + l − off), and per chunk the lanes inside the row.
        let mut masks = vec![0u16; u.kw * chunks];
        for kj in 0..u.kw {
            let off = (kj * u.dw) as isize - u.pw as isize;
            for ch in 0..chunks {
                let x = (ch * 16) as isize;
                masks[kj * chunks + ch] = lanes(off - x, u.wo as isize + off - x);
            }
        }
        let (src, dst) = (col.as_ptr(), img.as_mut_ptr());
        for c in 0..u.cg {
            let plane = dst.add(c * u.h * u.w);
            // Each image row gathers every (ki, kj) tap that reaches it in registers and is written once.
            for ih in 0..u.h {
                let row = plane.add(ih * u.w);
                for ch in 0..chunks {
                    let x = (ch * 16) as isize;
                    let mut acc = _mm512_setzero_ps();
                    let mut any = false;
                    for ki in 0..u.kh {
                        // Output row oh with oh·sh + ki·dh − ph = ih, if any.
                        let num = (ih + u.ph) as isize - (ki * u.dh) as isize;
                        if num < 0 || num % u.sh as isize != 0 {
                            continue;
                        }
                        let oh = (num / u.sh as isize) as usize;
                        if oh >= u.ho {
                            continue;
                        }
                        any = true;
                        let taps = src.add((c * u.kh + ki) * u.kw * hw_out + oh * u.wo);
                        for kj in 0..u.kw {
                            let off = (kj * u.dw) as isize - u.pw as isize;
                            let run = taps.add(kj * hw_out).wrapping_offset(x - off);
                            acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(masks[kj * chunks + ch], run));
                        }
                    }
                    if any {
                        let m = lanes(0, u.w as isize - x);
                        let cur = _mm512_maskz_loadu_ps(m, row.offset(x));
                        _mm512_mask_storeu_ps(row.offset(x), m, _mm512_add_ps(cur, acc));
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn max_pool_2x2(plane: &[f32], h: usize, w: usize, out: &mut [f32], idx: &mut [u32]) -> bool {
        let (ho, wo) = (h / 2, w / 2);
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        let lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let p = plane.as_ptr();
        for i in 0..ho {
            let (top, bottom) = (p.add(2 * i * w), p.add((2 * i + 1) * w));
            let mut j0 = 0;
            while j0 < wo {
                let n = (wo - j0).min(16);
                let m_out = lanes(0, n as isize);
                // 2n input columns from 2·j0, in two masked halves of 16.
                let m_lo = lanes(0, (2 * n) as isize);
                let m_hi = lanes(0, 2 * n as isize - 16);
                let t0 = _mm512_maskz_loadu_ps(m_lo, top.add(2 * j0));
                let t1 = _mm512_maskz_loadu_ps(m_hi, top.add(2 * j0).wrapping_add(16));
                let b0 = _mm512_maskz_loadu_ps(m_lo, bottom.add(2 * j0));
                let b1 = _mm512_maskz_loadu_ps(m_hi, bottom.add(2 * j0).wrapping_add(16));
                let a = _mm512_permutex2var_ps(t0, even, t1);
                let b = _mm512_permutex2var_ps(t0, odd, t1);
                let c = _mm512_permutex2var_ps(b0, even, b1);
                let d = _mm512_permutex2var_ps(b0, odd, b1);
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, b) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(c, d);
                if nan & m_out != 0 {
                    return false;
                }
                let m = _mm512_max_ps(_mm512_max_ps(a, b), _mm512_max_ps(c, d));
                // Flat indices of the four window entries; the first entry equal to the maximum wins.
                let base = _mm512_add_epi32(_mm512_set1_epi32((2 * i * w + 2 * j0) as i32), lane2);
                let below = _mm512_set1_epi32(w as i32);
                let one = _mm512_set1_epi32(1);
                let mut at = _mm512_add_epi32(_mm512_add_epi32(base, below), one);
                at = _mm512_mask_mov_epi32(at, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(c, m), _mm512_add_epi32(base, below));
                at = _mm512_mask_mov_epi32(at, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(b, m), _mm512_add_epi32(base, one));
                at = _mm512_mask_mov_epi32(at, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, m), base);
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(i * wo + j0), m_out, m);
                if !idx.is_empty() {
                    _mm512_mask_storeu_epi32(idx.as_mut_ptr().add(i * wo + j0).cast(), m_out, at);
                }
                j0 += 16;
            }
        }
        true
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const V: usize>(t: &Tile) {
        let masks: [u16; V] = std::array::from_fn(|v| if v + 1 == V { t.mask } else { u16::MAX });
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        if t.accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, a) in row.iter_mut().enumerate() {
                    *a = _mm512_maskz_loadu_ps(masks[v], t.c.offset(r as isize * t.rsc).add(16 * v));
                }
            }
        }
        let (mut ap, mut bp) = (t.a, t.b);
        for _ in 0..t.k {
            let bv: [__m512; V] = std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], bp.add(16 * v)));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*ap.offset(r as isize * t.rsa));
                for (a, &b) in row.iter_mut().zip(&bv) {
                    *a = _mm512_fmadd_ps(av, b, *a);
                }
            }
            ap = ap.offset(t.csa);
            bp = bp.offset(t.rsb);
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &a) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(t.c.offset(r as isize * t.rsc).add(16 * v), masks[v], a);
            }
        }
    }
}

/// The geometry of one group's unfolding for [`im2col`]/[`col2im`]: `cg` channels of `h×w`, a `kh×kw` kernel with
/// row stride `sh` (the column stride must be 1), padding and dilation, giving `ho×wo` outputs.
#[derive(Clone, Copy)]
pub(crate) struct Unfold {
    pub cg: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub ho: usize,
    pub wo: usize,
    pub sh: usize,
    pub ph: usize,
    pub pw: usize,
    pub dh: usize,
    pub dw: usize,
}

/// `col[K, Ho·Wo]` from the `cg` planes starting at `img` (a column stride of 1 makes every (tap, output row) a
/// contiguous run, copied with masked 16-lane moves that also zero the padding). `false`: no AVX-512, do nothing.
pub(crate) fn im2col(img: &[f32], u: &Unfold, col: &mut [f32]) -> bool {
    if !has_avx512() {
        return false;
    }
    assert!(img.len() >= u.cg * u.h * u.w && col.len() >= u.cg * u.kh * u.kw * u.ho * u.wo, "im2col: sizes");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present; every access is inside the slices checked above (masked lanes never touch
    // memory).
    unsafe {
        x86::im2col(img, u, col);
    }
    true
}

/// Adds `col[K, Ho·Wo]` back into the `cg` planes starting at `img` (the adjoint of [`im2col`]): for each image
/// row the kernel columns' shifted runs are summed in registers and the row is written once. `false`: no AVX-512.
pub(crate) fn col2im(col: &[f32], u: &Unfold, img: &mut [f32]) -> bool {
    if !has_avx512() {
        return false;
    }
    assert!(img.len() >= u.cg * u.h * u.w && col.len() >= u.cg * u.kh * u.kw * u.ho * u.wo, "col2im: sizes");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `im2col`.
    unsafe {
        x86::col2im(col, u, img);
    }
    true
}

/// 2×2 max pooling with stride 2 of one plane `h×w` (windows inside the plane) into `out[h/2 × w/2]` and the flat
/// arg-max into `idx`: the first maximum of each window in row-major order, as the scalar scan. Planes holding a
/// NaN are left to the caller (`false`), as are CPUs without AVX-512.
/// An empty `idx` asks for the values only.
pub(crate) fn max_pool_2x2(plane: &[f32], h: usize, w: usize, out: &mut [f32], idx: &mut [u32]) -> bool {
    let (ho, wo) = (h / 2, w / 2);
    let idx_ok = idx.is_empty() || idx.len() >= ho * wo;
    if !has_avx512() || plane.len() < h * w || out.len() < ho * wo || !idx_ok || h * w >= 1 << 31 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present and every access stays inside the slices checked above.
    unsafe {
        x86::max_pool_2x2(plane, h, w, out, idx)
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{s, Array2};

    fn reference(a: &Array2<f32>, b: &Array2<f32>, c0: &Array2<f32>, acc: bool) -> Array2<f32> {
        let mut c = if acc { c0.clone() } else { Array2::zeros(c0.raw_dim()) };
        for i in 0..a.nrows() {
            for j in 0..b.ncols() {
                let mut s = c[[i, j]] as f64;
                for p in 0..a.ncols() {
                    s += a[[i, p]] as f64 * b[[p, j]] as f64;
                }
                c[[i, j]] = s as f32;
            }
        }
        c
    }

    fn random(r: usize, c: usize, seed: u64) -> Array2<f32> {
        let t = crate::Tensor::uniform(&[r, c], -1.0, 1.0, seed);
        t.to_array().into_dimensionality().unwrap()
    }

    /// Every tile shape (rows 1–6 × vectors 1–4 with masked tails), accumulating or not, with a transposed `a`,
    /// serial and split across threads — against an f64 triple loop.
    #[test]
    fn matches_reference_products() {
        if !has_avx512() {
            return;
        }
        for &(m, k, n) in &[(1, 1, 1), (5, 3, 17), (6, 25, 64), (7, 40, 65), (13, 400, 130), (32, 400, 64), (3, 0, 9)] {
            for acc in [false, true] {
                for transposed in [false, true] {
                    let a_own = if transposed { random(k, m, 1).reversed_axes() } else { random(m, k, 1) };
                    let b = random(k, n, 2);
                    let c0 = random(m, n, 3);
                    let want = reference(&a_own, &b, &c0, acc);
                    for par in [false, true] {
                        let mut c = c0.clone();
                        assert!(gemm_nn(a_own.view(), b.view(), c.view_mut(), acc, par));
                        for (x, y) in c.iter().zip(&want) {
                            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{m}x{k}x{n} acc {acc}: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }

    /// A row of the product is bit-identical whichever other rows are computed with it.
    #[test]
    fn rows_do_not_depend_on_other_rows() {
        if !has_avx512() {
            return;
        }
        let (a, b) = (random(20, 77, 4), random(77, 70, 5));
        let mut full = Array2::zeros((20, 70));
        assert!(gemm_nn(a.view(), b.view(), full.view_mut(), false, false));
        for (lo, hi) in [(0, 1), (3, 10), (19, 20)] {
            let mut part = Array2::zeros((hi - lo, 70));
            assert!(gemm_nn(a.slice(s![lo..hi, ..]), b.view(), part.view_mut(), false, false));
            assert_eq!(part, full.slice(s![lo..hi, ..]));
        }
    }
}
