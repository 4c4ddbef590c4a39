//! Kernels that move values between layouts: unfolding an image into the im2col matrix ([`im2col`]) and adding it
//! back ([`col2im`]) for a convolution group's geometry ([`Unfold`]), and the 8×8-block transpose
//! ([`transpose`]), optionally masked by a ReLU's output. A column stride of 1 makes every (tap, output row) a
//! contiguous run, moved with masked vector loads and stores that also zero (im2col) or skip (col2im) the padding.
//!
//! Dispatch: each function checks the level and the sizes (`false` sends the caller to its scalar loop) and calls
//! the body compiled for the level's instruction set (`entry_points!`; col2im picks a different body per
//! instruction set, and the transpose is AVX2 on both).

use super::{accelerated, level, Level};

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

impl Unfold {
    /// Whether the output size is the one the input, kernel, padding, row stride and dilation give (with a column
    /// stride of 1).
    fn is_consistent(&self) -> bool {
        let span = |k: usize, d: usize| d * (k - 1) + 1;
        (self.h + 2 * self.ph).checked_sub(span(self.kh, self.dh)).map(|r| r / self.sh + 1) == Some(self.ho)
            && (self.w + 2 * self.pw).checked_sub(span(self.kw, self.dw)).map(|r| r + 1) == Some(self.wo)
    }
}

/// `col[K, Ho·Wo]` from the `cg` planes starting at `img` (a column stride of 1 makes every (tap, output row) a
/// contiguous run, copied with masked vector moves that also zero the padding). `false`: no vector kernels, do
/// nothing.
pub(crate) fn im2col(img: &[f32], u: &Unfold, col: &mut [f32]) -> bool {
    let level = level();
    if level == Level::Portable {
        return false;
    }
    assert!(img.len() >= u.cg * u.h * u.w && col.len() >= u.cg * u.kh * u.kw * u.ho * u.wo, "im2col: sizes");
    debug_assert!(u.is_consistent(), "im2col: geometry");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the level's instructions are present; every access is inside the slices checked above (masked
    // lanes never touch memory).
    unsafe {
        x86::im2col(level, img, u, col);
    }
    true
}

/// Adds `col[K, Ho·Wo]` back into the `cg` planes starting at `img` (the adjoint of [`im2col`]): for each image
/// row the kernel columns' shifted runs are summed in registers and the row is written once. `false`: no vector
/// kernels.
pub(crate) fn col2im(col: &[f32], u: &Unfold, img: &mut [f32]) -> bool {
    let level = level();
    if level == Level::Portable {
        return false;
    }
    assert!(img.len() >= u.cg * u.h * u.w && col.len() >= u.cg * u.kh * u.kw * u.ho * u.wo, "col2im: sizes");
    debug_assert!(u.is_consistent(), "col2im: geometry");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `im2col`.
    unsafe {
        x86::col2im(level, col, u, img);
    }
    true
}

/// `dst[c, r] = src[r, c]` for a row-major `rows × cols` source, zero where `y` (same layout) is not positive when
/// given, in 8×8 blocks transposed in registers (AVX2, which every AVX-512 CPU has). `false` (nothing written)
/// without the vector kernels or when `rows` or `cols` is not a multiple of 8.
pub(crate) fn transpose(src: &[f32], y: Option<&[f32]>, rows: usize, cols: usize, dst: &mut [f32]) -> bool {
    let n = rows * cols;
    if !accelerated()
        || !rows.is_multiple_of(8)
        || !cols.is_multiple_of(8)
        || src.len() < n
        || dst.len() < n
        || y.is_some_and(|y| y.len() < n)
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX2 is present (both levels have it) and every block lies inside the slices checked above.
    unsafe {
        x86::transpose8(src, y, rows, cols, dst);
    }
    true
}

/// `dst[k·ds + i] = src[i·ss + k]` for `i < rows`, `k < cols` (a strided block transposed), in 8×8 register
/// blocks.
///
/// # Safety
/// The CPU has AVX2 (both vector levels do) and the offsets named are inside the buffers.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn transpose_strided(src: *const f32, ss: usize, dst: *mut f32, ds: usize, rows: usize, cols: usize) {
    x86::transpose_strided(src, ss, dst, ds, rows, cols)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::isa::{entry_points, Avx2, Avx512, Isa};
    use super::super::Level;
    use super::Unfold;

    entry_points! {
        fn im2col(img: &[f32], u: &Unfold, col: &mut [f32]) = im2col_body;
    }

    /// The adjoint of im2col. With AVX-512 each image row gathers its taps' shifted runs under lane masks (free
    /// there) and is written once; with AVX2, where masked moves cost more than plain ones, each tap's runs are
    /// added into the image rows with full vectors, masking only a run's last partial vector.
    pub(super) unsafe fn col2im(level: Level, col: &[f32], u: &Unfold, img: &mut [f32]) {
        #[target_feature(enable = "avx512f")]
        unsafe fn wide(col: &[f32], u: &Unfold, img: &mut [f32]) {
            col2im_body::<Avx512>(col, u, img)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow(col: &[f32], u: &Unfold, img: &mut [f32]) {
            col2im_scatter::<Avx2>(col, u, img)
        }
        let _flush = super::super::isa::FlushSubnormals::on();
        match level {
            Level::Avx512 => wide(col, u, img),
            Level::Avx2 => narrow(col, u, img),
            Level::Portable => unreachable!("callers check the level first"),
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose8(src: &[f32], y: Option<&[f32]>, rows: usize, cols: usize, dst: &mut [f32]) {
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        for r0 in (0..rows).step_by(8) {
            for c0 in (0..cols).step_by(8) {
                // Plain loops, not `array::from_fn`: its closure would not inline the intrinsics.
                let mut r = [_mm256_setzero_ps(); 8];
                for (i, v) in r.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(s.add((r0 + i) * cols + c0));
                }
                if let Some(y) = y {
                    for (i, v) in r.iter_mut().enumerate() {
                        let yv = _mm256_loadu_ps(y.as_ptr().add((r0 + i) * cols + c0));
                        *v = _mm256_and_ps(*v, _mm256_cmp_ps::<_CMP_GT_OQ>(yv, _mm256_setzero_ps()));
                    }
                }
                for (k, v) in transposed(&r).iter().enumerate() {
                    _mm256_storeu_ps(d.add((c0 + k) * rows + r0), *v);
                }
            }
        }
    }

    /// `dst[k·ds + i] = src[i·ss + k]` for `i < rows`, `k < cols`: 8×8 blocks in registers, those on the edges
    /// with masked moves.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose_strided(
        src: *const f32,
        ss: usize,
        dst: *mut f32,
        ds: usize,
        rows: usize,
        cols: usize,
    ) {
        let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let first = |n: usize| _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), iota);
        for r0 in (0..rows).step_by(8) {
            let rn = (rows - r0).min(8);
            for c0 in (0..cols).step_by(8) {
                let cn = (cols - c0).min(8);
                let mut r = [_mm256_setzero_ps(); 8];
                if cn == 8 {
                    for (i, v) in r.iter_mut().enumerate().take(rn) {
                        *v = _mm256_loadu_ps(src.add((r0 + i) * ss + c0));
                    }
                } else {
                    let m = first(cn);
                    for (i, v) in r.iter_mut().enumerate().take(rn) {
                        *v = _mm256_maskload_ps(src.add((r0 + i) * ss + c0), m);
                    }
                }
                let t = transposed(&r);
                if rn == 8 {
                    for (k, v) in t.iter().enumerate().take(cn) {
                        _mm256_storeu_ps(dst.add((c0 + k) * ds + r0), *v);
                    }
                } else {
                    let m = first(rn);
                    for (k, v) in t.iter().enumerate().take(cn) {
                        _mm256_maskstore_ps(dst.add((c0 + k) * ds + r0), m, *v);
                    }
                }
            }
        }
    }

    /// The 8×8 block `r` (row `i` in `r[i]`) transposed: element `k` of the returned `[i]` is `r[k]`'s `i`.
    #[inline(always)]
    unsafe fn transposed(r: &[__m256; 8]) -> [__m256; 8] {
        let mut t = [_mm256_setzero_ps(); 8];
        for (q, pair) in t.chunks_exact_mut(2).enumerate() {
            let (a, b) = (r[2 * q], r[2 * q + 1]);
            pair[0] = _mm256_unpacklo_ps(a, b);
            pair[1] = _mm256_unpackhi_ps(a, b);
        }
        // tt[4q + j]: pairs (t[4q], t[4q + 2]) and (t[4q + 1], t[4q + 3]), low and high halves of each lane.
        let tt = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        let mut out = [_mm256_setzero_ps(); 8];
        for k in 0..4 {
            out[k] = _mm256_permute2f128_ps::<0x20>(tt[k], tt[k + 4]);
            out[k + 4] = _mm256_permute2f128_ps::<0x31>(tt[k], tt[k + 4]);
        }
        out
    }

    #[inline(always)]
    unsafe fn im2col_body<S: Isa>(img: &[f32], u: &Unfold, col: &mut [f32]) {
        let (l, hw_out) = (S::LANES, u.ho * u.wo);
        let chunks = u.wo.div_ceil(l);
        // Per kernel column and vector-wide chunk of an output row: the lanes to store, and the lanes whose input
        // column lies inside the row (the rest are padding zeros). They do not depend on the row.
        let mut masks = Vec::with_capacity(u.kw * chunks);
        for kj in 0..u.kw {
            let off = (kj * u.dw) as isize - u.pw as isize;
            for ch in 0..chunks {
                let o = (ch * l) as isize;
                let store = S::lanes(0, u.wo as isize - o);
                masks.push((store, S::and(S::lanes(-(o + off), u.w as isize - (o + off)), store)));
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
                    for oh in (0..lo).chain(hi..u.ho) {
                        for (ch, &(store, _)) in m.iter().enumerate() {
                            S::store(store, dst.add(oh * u.wo + l * ch), S::zero());
                        }
                    }
                    // Lane i of chunk ch reads input column l·ch + i + off of the row.
                    let mut row =
                        plane.wrapping_offset((lo * u.sh) as isize * u.w as isize + first * u.w as isize + off);
                    let mut run = dst.add(lo * u.wo);
                    let step = (u.sh * u.w) as isize;
                    if let [(store, load)] = *m {
                        for _ in lo..hi {
                            S::store(store, run, S::load(load, row));
                            row = row.wrapping_offset(step);
                            run = run.add(u.wo);
                        }
                    } else {
                        for _ in lo..hi {
                            for (ch, &(store, load)) in m.iter().enumerate() {
                                S::store(store, run.add(l * ch), S::load(load, row.wrapping_add(l * ch)));
                            }
                            row = row.wrapping_offset(step);
                            run = run.add(u.wo);
                        }
                    }
                    dst = dst.add(hw_out);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn col2im_body<S: Isa>(col: &[f32], u: &Unfold, img: &mut [f32]) {
        let (l, hw_out) = (S::LANES, u.ho * u.wo);
        let chunks = u.w.div_ceil(l);
        // Per kernel column and vector-wide chunk of an image row: the lanes that receive an output column of
        // the tap (image column x + i takes output column x + i − off).
        let mut masks = Vec::with_capacity(u.kw * chunks);
        for kj in 0..u.kw {
            let off = (kj * u.dw) as isize - u.pw as isize;
            for ch in 0..chunks {
                let x = (ch * l) as isize;
                masks.push(S::lanes(off - x, u.wo as isize + off - x));
            }
        }
        let (src, dst) = (col.as_ptr(), img.as_mut_ptr());
        for c in 0..u.cg {
            let plane = dst.add(c * u.h * u.w);
            // Each image row gathers every (ki, kj) tap that reaches it in registers and is written once.
            for ih in 0..u.h {
                let row = plane.add(ih * u.w);
                for ch in 0..chunks {
                    let x = (ch * l) as isize;
                    let mut acc = S::zero();
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
                            acc = S::add(acc, S::load(masks[kj * chunks + ch], run));
                        }
                    }
                    if any {
                        let m = S::lanes(0, u.w as isize - x);
                        let cur = S::load(m, row.offset(x));
                        S::store(m, row.offset(x), S::add(cur, acc));
                    }
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn col2im_scatter<S: Isa>(col: &[f32], u: &Unfold, img: &mut [f32]) {
        let (l, hw_out) = (S::LANES, u.ho * u.wo);
        let (src, dst) = (col.as_ptr(), img.as_mut_ptr());
        for c in 0..u.cg {
            let plane = dst.add(c * u.h * u.w);
            for ki in 0..u.kh {
                // Output rows whose image row oh·sh + ki·dh − ph lies inside the plane: lo..hi.
                let first = (ki * u.dh) as isize - u.ph as isize;
                let lo = if first >= 0 { 0 } else { (-first as usize).div_ceil(u.sh) }.min(u.ho);
                let hi = if first >= u.h as isize { 0 } else { (u.h as isize - first) as usize }.div_ceil(u.sh);
                let hi = hi.clamp(lo, u.ho);
                for kj in 0..u.kw {
                    // Output columns whose image column ow + off lies inside the row: from..to.
                    let off = (kj * u.dw) as isize - u.pw as isize;
                    let from = if off >= 0 { 0 } else { (-off) as usize }.min(u.wo);
                    let to = ((u.w as isize - off).max(0) as usize).clamp(from, u.wo);
                    let tap = src.add(((c * u.kh + ki) * u.kw + kj) * hw_out);
                    for oh in lo..hi {
                        let run = tap.add(oh * u.wo);
                        let row = plane.wrapping_offset(((oh * u.sh) as isize + first) * u.w as isize + off);
                        let mut ow = from;
                        while ow + l <= to {
                            let p = row.add(ow);
                            S::storeu(p, S::add(S::loadu(p), S::loadu(run.add(ow))));
                            ow += l;
                        }
                        if ow < to {
                            let (m, p) = (S::lanes(0, (to - ow) as isize), row.add(ow));
                            S::store(m, p, S::add(S::load(m, p), S::load(m, run.add(ow))));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::transpose;

    /// The 8×8-block transpose, with and without the ReLU mask, against the index definition.
    #[test]
    fn transpose_matches_definition() {
        let (rows, cols) = (16, 40);
        let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let y: Vec<f32> = (0..rows * cols).map(|i| if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        for mask in [None, Some(&y[..])] {
            let mut dst = vec![0.0; rows * cols];
            if !transpose(&src, mask, rows, cols, &mut dst) {
                return;
            }
            for r in 0..rows {
                for c in 0..cols {
                    let want = if mask.is_some() && (r * cols + c) % 3 == 0 { 0.0 } else { src[r * cols + c] };
                    assert_eq!(dst[c * rows + r], want, "{r},{c}");
                }
            }
        }
        assert!(!transpose(&src, None, 12, 40, &mut vec![0.0; 480]), "12 rows are not a multiple of 8");
    }
}
