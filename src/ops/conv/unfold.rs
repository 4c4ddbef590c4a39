//! The unfolding path of a convolution and what it runs on: im2col and col2im (on the vector kernels when the column
//! stride is 1, else scalar loops that copy whole rows between zero-filled margins), the product (the vector
//! kernel or the `gemm` crate) and the transpose; and the zero-padded image the direct kernels read.
//!
//! Dispatch: each function tries `simd` first (`false`: no vector kernels or a layout they do not take) and falls
//! back to its own loop or to `gemm`.

use std::mem::MaybeUninit;

use ndarray::{ArrayView2, ArrayViewMut2};

use super::{Clamp, Geom};
use crate::ops::matmul::gemm;
use crate::ops::simd::{self, Start};

/// The output columns `lo..hi` of one kernel tap whose input column `ow·stride + off` lies inside `0..w`.
#[inline]
fn valid_cols(off: isize, stride: usize, w: usize, wo: usize) -> (usize, usize) {
    let s = stride as isize;
    let lo = if off >= 0 { 0 } else { ((-off + s - 1) / s) as usize };
    let hi = if (w as isize) <= off { 0 } else { ((w as isize - off + s - 1) / s) as usize };
    let hi = hi.min(wo);
    (lo.min(hi), hi)
}

/// Unfolds the channels `c0..c0+Cg` of one image `[C, H, W]` into `col[K, Ho·Wo]`.
///
/// Each (tap, output row) is a contiguous copy (a strided gather when the stride is not 1) between zero-filled
/// margins, so the hot loop has no per-element bounds test.
pub(super) fn im2col(img: &[f32], g: &Geom, c0: usize, col: &mut [f32]) {
    let (hw_out, (sh, sw), (ph, pw), (dh, dw)) = (g.hw_out(), g.p.stride, g.p.padding, g.p.dilation);
    if sw == 1 && simd::im2col(&img[c0 * g.h * g.w..], &g.unfold(), col) {
        return;
    }
    if (sh, sw, ph, pw, dh, dw) == (1, 1, 0, 0, 1, 1) {
        // The common unpadded, unit-stride case: every row is a plain window copy, nothing to test or zero.
        let planes = img[c0 * g.h * g.w..(c0 + g.cg()) * g.h * g.w].chunks_exact(g.h * g.w);
        let taps = col.chunks_exact_mut(g.kh * g.kw * hw_out);
        for (plane, dst) in planes.zip(taps) {
            for (t, tap) in dst.chunks_exact_mut(hw_out).enumerate() {
                let (ki, kj) = (t / g.kw, t % g.kw);
                for (oh, out_row) in tap.chunks_exact_mut(g.wo).enumerate() {
                    let src = &plane[(oh + ki) * g.w + kj..][..g.wo];
                    for (d, &v) in out_row.iter_mut().zip(src) {
                        *d = v;
                    }
                }
            }
        }
        return;
    }
    let mut row = 0;
    for c in c0..c0 + g.cg() {
        let plane = &img[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let dst = &mut col[row * hw_out..(row + 1) * hw_out];
                row += 1;
                let off = (kj * dw) as isize - pw as isize;
                let (lo, hi) = valid_cols(off, sw, g.w, g.wo);
                for (oh, out_row) in dst.chunks_exact_mut(g.wo).enumerate() {
                    let ih = (oh * sh + ki * dh) as isize - ph as isize;
                    if ih < 0 || ih >= g.h as isize {
                        out_row.fill(0.0);
                        continue;
                    }
                    let src = &plane[ih as usize * g.w..(ih as usize + 1) * g.w];
                    out_row[..lo].fill(0.0);
                    out_row[hi..].fill(0.0);
                    let start = (lo * sw) as isize + off;
                    if sw == 1 {
                        // An inline loop, not `copy_from_slice`: rows are a few floats and a memcpy call per row
                        // costs more than the copy.
                        for (d, &v) in out_row[lo..hi].iter_mut().zip(&src[start as usize..]) {
                            *d = v;
                        }
                    } else {
                        for (d, &v) in out_row[lo..hi].iter_mut().zip(src[start as usize..].iter().step_by(sw)) {
                            *d = v;
                        }
                    }
                }
            }
        }
    }
}

/// Adds `col[K, Ho·Wo]` back into the channels `c0..c0+Cg` of one image gradient (the adjoint of [`im2col`]).
pub(super) fn col2im(col: &[f32], g: &Geom, c0: usize, img: &mut [f32]) {
    let (hw_out, (sh, sw), (ph, pw), (dh, dw)) = (g.hw_out(), g.p.stride, g.p.padding, g.p.dilation);
    if sw == 1 && simd::col2im(col, &g.unfold(), &mut img[c0 * g.h * g.w..]) {
        return;
    }
    let mut row = 0;
    for c in c0..c0 + g.cg() {
        let plane = &mut img[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let src = &col[row * hw_out..(row + 1) * hw_out];
                row += 1;
                let off = (kj * dw) as isize - pw as isize;
                let (lo, hi) = valid_cols(off, sw, g.w, g.wo);
                if lo == hi {
                    continue;
                }
                let start = ((lo * sw) as isize + off) as usize;
                for (oh, src_row) in src.chunks_exact(g.wo).enumerate() {
                    let ih = (oh * sh + ki * dh) as isize - ph as isize;
                    if ih < 0 || ih >= g.h as isize {
                        continue;
                    }
                    let dst = &mut plane[ih as usize * g.w..(ih as usize + 1) * g.w];
                    if sw == 1 {
                        for (d, &v) in dst[start..start + (hi - lo)].iter_mut().zip(&src_row[lo..hi]) {
                            *d += v;
                        }
                    } else {
                        for (d, &v) in dst[start..].iter_mut().step_by(sw).zip(&src_row[lo..hi]) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// `c (+)= a·b` on the vector kernel when the CPU has one, else on the `gemm` crate.
pub(super) fn product(a: ArrayView2<f32>, b: ArrayView2<f32>, c: ArrayViewMut2<f32>, accumulate: bool, par: bool) {
    clamped_product(a, b, c, if accumulate { Start::C } else { Start::Zero }, par, None, None)
}

/// [`product`] with its chains started at `start` (`Start::Rows`: the bias, one value per row of `c`, so `c`
/// needs no bias written first), `residual` (`c`'s shape) added to each result and the sum clamped as it is stored
/// (a residual connection, the fused ReLU or ReLU6; passes over `c` after the `gemm` crate's product, which
/// accumulates onto the bias written into `c`).
pub(super) fn clamped_product(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    start: Start,
    par: bool,
    act: Option<Clamp>,
    residual: Option<ArrayView2<f32>>,
) {
    if !simd::gemm_nn_clamped(a, b, c.view_mut(), start, par, Clamp::bounds(act), residual) {
        if let Start::Rows(bias) = start {
            for (mut row, &v) in c.rows_mut().into_iter().zip(bias) {
                row.fill(v);
            }
        }
        gemm(a, b, c.view_mut(), !matches!(start, Start::Zero), par);
        if let Some(r) = residual {
            c.zip_mut_with(&r, |v, &r| *v += r);
        }
        if let Some(act) = act {
            c.mapv_inplace(|v| act.apply(v));
        }
    }
}

/// `dst[c, r] = src[r, c]` for a row-major `rows × cols` source, masked by the fused ReLU's output `y` (same
/// layout as `src`) when given: 8×8 blocks in vector registers where the kernels allow, else each output row
/// gathers one source column.
pub(super) fn transpose(src: &[f32], y: Option<&[f32]>, rows: usize, cols: usize, dst: &mut [f32]) {
    if simd::transpose(src, y, rows, cols, dst) {
        return;
    }
    for (c, out) in dst[..rows * cols].chunks_exact_mut(rows).enumerate() {
        for (r, d) in out.iter_mut().enumerate() {
            let at = r * cols + c;
            let pass = y.is_none_or(|y| y[at] > 0.0);
            *d = if pass { src[at] } else { 0.0 };
        }
    }
}

/// The unpadded geometry the direct kernel sees: the image zero-padded by `padding` on each side.
pub(super) fn direct_unfold(g: &Geom) -> simd::Unfold {
    let (ph, pw) = g.p.padding;
    simd::Unfold { h: g.h + 2 * ph, w: g.w + 2 * pw, ph: 0, pw: 0, ..g.unfold() }
}

/// `img` zero-padded by the geometry's padding into `pad` (or `img` itself when there is none): the image the
/// direct kernels read, of the size [`direct_unfold`] gives.
pub(super) fn padded<'a>(img: &'a [f32], g: &Geom, pad: &'a mut Vec<f32>) -> &'a [f32] {
    let (ph, pw) = g.p.padding;
    if (ph, pw) == (0, 0) {
        return img;
    }
    let (hp, wp) = (g.h + 2 * ph, g.w + 2 * pw);
    // Every element is written (the margins zeroed, the rows copied), so the buffer is not cleared first.
    pad.resize(g.c * hp * wp, 0.0);
    pad_into(img, g, pad);
    pad
}

/// `img` zero-padded by the geometry's padding into `pad` (`c` planes of the padded size), every element written.
pub(super) fn pad_into(img: &[f32], g: &Geom, pad: &mut [f32]) {
    let (ph, pw) = g.p.padding;
    let (hp, wp) = (g.h + 2 * ph, g.w + 2 * pw);
    debug_assert!(pad.len() == g.c * hp * wp);
    for (dst, plane) in pad.chunks_exact_mut(hp * wp).zip(img.chunks_exact(g.h * g.w)) {
        let (top, rest) = dst.split_at_mut(ph * wp);
        let (rows, bottom) = rest.split_at_mut(g.h * wp);
        top.fill(0.0);
        bottom.fill(0.0);
        for (drow, srow) in rows.chunks_exact_mut(wp).zip(plane.chunks_exact(g.w)) {
            drow[..pw].fill(0.0);
            drow[pw..pw + g.w].copy_from_slice(srow);
            drow[pw + g.w..].fill(0.0);
        }
    }
}

/// `img` zero-padded as [`padded`] pads it, each padded row stored as its even columns, then its odd ones (each
/// half `⌈w/2⌉` long, the odd half ending in a 0 when the padded width is odd), into `pad`: the image a convolution
/// with a column stride of 2 reads on the direct kernels (`plan::DirectConv::plan_phased`).
pub(super) fn phased<'a>(img: &[f32], g: &Geom, pad: &'a mut Vec<f32>) -> &'a [f32] {
    let (ph, pw) = g.p.padding;
    let (hp, wp) = (g.h + 2 * ph, g.w + 2 * pw);
    let half = wp.div_ceil(2);
    pad.resize(g.c * hp * 2 * half, 0.0);
    for (dst, plane) in pad.chunks_exact_mut(hp * 2 * half).zip(img.chunks_exact(g.h * g.w)) {
        for (r, drow) in dst.chunks_exact_mut(2 * half).enumerate() {
            let Some(src) = r.checked_sub(ph).filter(|&i| i < g.h).map(|i| &plane[i * g.w..][..g.w]) else {
                drow.fill(0.0);
                continue;
            };
            // The margins zeroed, then the row's columns into their halves pair by pair (element by element,
            // through a checked lookup each, this was a few per cent of a stride-2 3×3's forward).
            drow.fill(0.0);
            let (even, odd) = drow.split_at_mut(half);
            deinterleave(src, even, odd, pw);
        }
    }
    pad
}

/// `img` zero-padded and split into its four stride phases, the image [`DirectConv::plan_phased`]'s grid reads:
/// each channel [`quarter_len`] floats, four planes of `⌈hp/2⌉` rows of `⌈wp/2⌉` (`hp × wp` the padded size), padded
/// position `(y, x)` in plane `2·(y % 2) + x % 2` at row `y / 2`, column `x / 2`, then [`QUARTER_SLACK`] floats (what
/// the grid's positions past a row's outputs reach); zeros wherever no position lands. The buffer is zeroed when its
/// length changes and otherwise holds the zeros of the last image of the same geometry (the same positions are
/// written), as the callers' per-call scratch does.
///
/// [`DirectConv::plan_phased`]: super::plan::DirectConv::plan_phased
pub(super) fn quartered<'a>(img: &[f32], g: &Geom, pad: &'a mut Vec<f32>) -> &'a [f32] {
    let (ph, pw) = g.p.padding;
    let (half, quarter) = quarter_dims(g);
    let len = g.c * quarter_len(g);
    if pad.len() != len {
        pad.clear();
        pad.resize(len, 0.0);
    }
    for (dst, plane) in pad.chunks_exact_mut(quarter_len(g)).zip(img.chunks_exact(g.h * g.w)) {
        for (y, src) in plane.chunks_exact(g.w).enumerate() {
            // Padded row `y + ph`: its phase's two planes, row `(y + ph) / 2`. Column `x` goes to column phase
            // `(x + pw) % 2`, at `(x + pw) / 2`: the even columns and the odd ones de-interleaved pair by pair.
            let (rp, at) = ((y + ph) % 2, (y + ph) / 2 * half);
            let (p0, p1) = dst[2 * rp * quarter..(2 * rp + 2) * quarter].split_at_mut(quarter);
            deinterleave(src, &mut p0[at..], &mut p1[at..], pw);
        }
    }
    pad
}

/// The inverse of [`quartered`] for a gradient: `dimg[C, H, W]` from the image gradient `pad` laid out in the four
/// stride phases, its margins and slack dropped.
pub(super) fn unquartered(pad: &[f32], g: &Geom, dimg: &mut [MaybeUninit<f32>]) {
    let (ph, pw) = g.p.padding;
    let (half, quarter) = quarter_dims(g);
    for (plane, src) in dimg.chunks_exact_mut(g.h * g.w).zip(pad.chunks_exact(quarter_len(g))) {
        for (y, drow) in plane.chunks_exact_mut(g.w).enumerate() {
            let (rp, at) = ((y + ph) % 2, (y + ph) / 2 * half);
            let (p0, p1) = src[2 * rp * quarter..(2 * rp + 2) * quarter].split_at(quarter);
            interleave(&p0[at..], &p1[at..], pw, drow);
        }
    }
}

/// A phase row's length `⌈wp/2⌉` and a phase plane's `⌈hp/2⌉·⌈wp/2⌉` in [`quartered`]'s layout.
fn quarter_dims(g: &Geom) -> (usize, usize) {
    let (ph, pw) = g.p.padding;
    let half = (g.w + 2 * pw).div_ceil(2);
    (half, (g.h + 2 * ph).div_ceil(2) * half)
}

/// One channel of [`quartered`]'s layout: four phase planes and [`QUARTER_SLACK`].
pub(super) fn quarter_len(g: &Geom) -> usize {
    4 * quarter_dims(g).1 + QUARTER_SLACK
}

/// Floats after each channel of [`quartered`]'s layout: at least what the grid's last vector of positions (whole, up
/// to a vector past the last position) reaches past the channel's last plane with its widest tap, `15 + kw / 2`.
pub(super) const QUARTER_SLACK: usize = 32;

/// The inverse of [`phased`] for a gradient: `dimg[C, H, W]` from the padded image gradient `pad` laid out in stride
/// phases, its margins dropped.
pub(super) fn unphased(pad: &[f32], g: &Geom, dimg: &mut [MaybeUninit<f32>]) {
    let (ph, pw) = g.p.padding;
    let (hp, wp) = (g.h + 2 * ph, g.w + 2 * pw);
    let half = wp.div_ceil(2);
    for (plane, src) in dimg.chunks_exact_mut(g.h * g.w).zip(pad.chunks_exact(hp * 2 * half)) {
        for (drow, srow) in plane.chunks_exact_mut(g.w).zip(src[ph * 2 * half..].chunks_exact(2 * half)) {
            let (even, odd) = srow.split_at(half);
            interleave(even, odd, pw, drow);
        }
    }
}

/// The inverse of [`interleave`]: a row `src` of the image into its padded row's even columns `p0` and odd ones
/// `p1` (each from the row's start), the left padding `pw` skipped and the rest of the halves left as they are.
fn deinterleave(src: &[f32], p0: &mut [f32], p1: &mut [f32], pw: usize) {
    let (even, odd) = if pw.is_multiple_of(2) { (p0, p1) } else { (p1, p0) };
    let w = src.len();
    let even = &mut even[pw / 2..][..w.div_ceil(2)];
    let odd = &mut odd[pw.div_ceil(2)..][..w / 2];
    for ((pair, e), o) in src.chunks_exact(2).zip(even.iter_mut()).zip(odd.iter_mut()) {
        *e = pair[0];
        *o = pair[1];
    }
    if !w.is_multiple_of(2) {
        even[w / 2] = src[w - 1];
    }
}

/// A row `drow` of the image (gradient) from its padded row's even columns `p0` and odd ones `p1`, the left padding
/// `pw` dropped: column `x` is padded column `x + pw`, at `(x + pw) / 2` of its parity's half. Pair by pair
/// (vectorised as shuffles; element by element, with a parity test each, it was a tenth of a stride-2 3×3's input
/// gradient), an odd width's last column from the even ones.
fn interleave(p0: &[f32], p1: &[f32], pw: usize, drow: &mut [MaybeUninit<f32>]) {
    let (even, odd) = if pw.is_multiple_of(2) { (p0, p1) } else { (p1, p0) };
    let (even, odd) = (&even[pw / 2..], &odd[pw.div_ceil(2)..]);
    let w = drow.len();
    let (pairs, last) = drow.split_at_mut(w / 2 * 2);
    for ((pair, &e), &o) in pairs.chunks_exact_mut(2).zip(even).zip(odd) {
        pair[0].write(e);
        pair[1].write(o);
    }
    if let Some(v) = last.first_mut() {
        v.write(even[w / 2]);
    }
}
