//! Depthwise convolutions (channel multiplier 1: MobileNet's, EfficientNet's and ConvNeXt's) with the channels in
//! the vector lanes ([`simd::depthwise_lanes`](crate::ops::simd::depthwise_lanes)): forward and input gradient.
//!
//! The plane-by-plane kernels ([`super::depthwise`]) run each output row as one multiply-add chain per vector: on
//! a 7×7 or 14×14 map (one vector per row) that is latency-bound, and EfficientNet-B0's depthwise convolutions ran
//! 3–6× slower than onnxruntime's. Here a job takes a block of 16 (AVX-512) or 8 (AVX2) channels of one image and
//! a band of rows: it copies the band channels-last into a zero-padded scratch (one row of the block is then a run
//! of pixel vectors), runs eight pixels' chains side by side, and copies the results back to `[N, C, H, W]`.
//! Bands are sized so the scratch stays in the core's cache, and there are enough jobs for every thread.
//!
//! Each output is the same sum in the same order with the same multiply-adds as in the plane kernels, so the
//! results are the same bits whichever layout runs (tested), and do not depend on the banding, the batch or the
//! thread count.

use rayon::prelude::*;

use super::{After, Clamp, Geom};
use crate::ops::simd::depthwise_lanes as kernels;
use crate::ops::simd::{level, transpose_strided, Level};

/// A job's scratch at most this size (the input band, or the output-gradient band and the image-gradient rows).
const BAND_BYTES: usize = 96 << 10;

/// Jobs per thread wanted, where the rows allow: enough to even out the threads' shares.
const JOBS_PER_THREAD: usize = 4;

/// Whether this layout runs: on the vector levels, channel multiplier 1 (the caller checked the depthwise
/// geometry).
pub(super) fn applies(g: &Geom) -> bool {
    level() != Level::Portable && g.o == g.c
}

/// The weights `[C, 1, kh, kw]` in blocks of `l` channels, `[C/l][kh·kw][l]`, zero past the last channel: each
/// block's `[cn][kh·kw]` transposed in registers, nothing zero-filled first. Element by element (a division and a
/// checked store each) into a zeroed vector it was 124,000 instructions a call for MobileNetV2's 3×3 over 960
/// channels, run before the jobs start, on every pass.
///
/// # Safety
/// The level is not portable (the transpose's AVX2).
unsafe fn weights_in_lanes(ws: &[f32], c: usize, kk: usize, l: usize) -> Vec<f32> {
    // SAFETY: every element is written: a block's lanes `cn..l` with zeros, the rest by the transpose.
    crate::ops::written(c.div_ceil(l) * kk * l, |wl| {
        for (dst, src) in wl.chunks_exact_mut(kk * l).zip(ws[..c * kk].chunks(l * kk)) {
            let cn = src.len() / kk;
            for tap in dst.chunks_exact_mut(l) {
                tap[cn..].iter_mut().for_each(|v| _ = v.write(0.0));
            }
            transpose_strided(src.as_ptr(), kk, dst.as_mut_ptr().cast(), l, cn, kk);
        }
    })
}

/// Rows per band of `total` rows, a row's share of the scratch `row_bytes`, for `pairs` (image, block) pairs.
fn band_rows(total: usize, row_bytes: usize, pairs: usize) -> usize {
    let by_cache = (BAND_BYTES / row_bytes.max(1)).max(1);
    let bands_wanted = (JOBS_PER_THREAD * rayon::current_num_threads()).div_ceil(pairs.max(1));
    by_cache.min(total.div_ceil(bands_wanted)).clamp(1, total.max(1))
}

/// The `[N, C, H, W]` output the jobs write, each its own (image, channel block, rows) positions.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: jobs write disjoint elements (their own channels' rows) and nothing reads the output until all are done.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// Copies the pixel vectors `rows` (`[k][l]`, from [`kernels`]) lane `c` for `c < cn` into planes
    /// `plane_len` apart from `at`: lane `c` of pixel `k` to `at + c·plane_len + k`.
    ///
    /// # Safety
    /// The positions are in the output, no other job writes them, and the level is not portable.
    unsafe fn scatter(self, rows: &[f32], l: usize, cn: usize, at: usize, plane_len: usize) {
        transpose_strided(rows.as_ptr(), l, self.0.add(at), plane_len, rows.len() / l, cn);
    }
}

/// Copies `cn` rows of `len` values, `stride` apart from `src[0]`, into the lanes `0..cn` of `len` pixel vectors
/// of `l` lanes from `dst[0]`.
///
/// # Safety
/// The level is not portable (the transpose's AVX2).
unsafe fn gather(src: &[f32], stride: usize, cn: usize, len: usize, dst: &mut [f32], l: usize) {
    assert!(cn <= l && src.len() >= (cn - 1) * stride + len && dst.len() >= len * l);
    transpose_strided(src.as_ptr(), stride, dst.as_mut_ptr(), l, cn, len);
}

/// `len` floats of a job's results buffer from its first cache-line boundary, grown (with zeros) when short and
/// otherwise left as the last job wrote them: the kernel overwrites all of them. Aligned, a pixel vector is one
/// line: unaligned, every AVX-512 load and store straddled two (measured: a 7×7 over 96@56 1.50 → 1.12 ms).
fn results(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len + ALIGN {
        buf.resize(len + ALIGN, 0.0);
    }
    let at = buf.as_ptr().align_offset(4 * ALIGN).min(ALIGN);
    &mut buf[at..at + len]
}

/// `len` zeros in `buf` from its first cache-line boundary (see [`results`]).
fn zeroed(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.clear();
    buf.resize(len + ALIGN, 0.0);
    let at = buf.as_ptr().align_offset(4 * ALIGN).min(ALIGN);
    &mut buf[at..at + len]
}

/// Floats per cache line.
const ALIGN: usize = 16;

/// The forward `[N, C, Ho, Wo]` (see [`applies`]), with the fused clamp, if any, and `after` applied to each job's
/// results before they are scattered (in cache, outside the flush-to-zero mode).
pub(super) fn forward(
    xs: &[f32],
    ws: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    n: usize,
    act: Option<Clamp>,
    after: After,
) -> Vec<f32> {
    let level = level();
    let l = kernels::lanes(level);
    let (kk, blocks, hw) = (g.kh * g.kw, g.c.div_ceil(l), g.hw_out());
    // SAFETY: the level is not portable (checked by `applies`).
    let wl = unsafe { weights_in_lanes(ws, g.c, kk, l) };
    let mut bl = vec![0.0f32; blocks * l];
    if let Some(b) = bias {
        bl[..g.c].copy_from_slice(b);
    }
    let ((sh, sw), (ph, pw)) = (g.p.stride, g.p.padding);
    let wp = g.w + 2 * pw;
    let rows = band_rows(g.ho, 4 * l * (sh * wp + g.wo), n * blocks);
    let bands = g.ho.div_ceil(rows);
    // The taps row-major from an output's top-left input pixel, and every output of a whole band (a shorter
    // last band takes the first of them): its top-left input pixel in the band and its place in the results.
    let taps: Vec<(isize, usize)> = (0..kk).map(|t| (((t / g.kw * wp + t % g.kw) * l) as isize, t)).collect();
    let pixels: Vec<(usize, usize)> =
        (0..rows * g.wo).map(|p| (((p / g.wo) * sh * wp + (p % g.wo) * sw) * l, p * l)).collect();
    let mut out = Vec::<f32>::with_capacity(n * g.c * hw);
    let dst = Shared(out.as_mut_ptr());
    (0..n * blocks * bands).into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(band, res), job| {
            // One guard for the job's kernels (see `FlushSubnormals`), dropped before `after`.
            let flush = crate::ops::simd::FlushSubnormals::on();
            let (img, b, oy0) = (job / bands / blocks, job / bands % blocks, job % bands * rows);
            let (nr, c0) = (rows.min(g.ho - oy0), b * l);
            let cn = l.min(g.c - c0);
            let in_rows = sh * (nr - 1) + g.kh;
            let band = zeroed(band, in_rows * wp * l);
            let first = (sh * oy0) as isize - ph as isize;
            for r in 0..in_rows {
                let y = first + r as isize;
                if (0..g.h as isize).contains(&y) {
                    let rows = &xs[((img * g.c + c0) * g.h + y as usize) * g.w..];
                    // SAFETY: the level is not portable (checked by `applies`).
                    unsafe { gather(rows, g.h * g.w, cn, g.w, &mut band[(r * wp + pw) * l..], l) };
                }
            }
            // The kernel writes every result: the buffer keeps its length and is not zero-filled per job.
            let res = results(res, nr * g.wo * l);
            if kernels::rows_apply(g.kw, sw, false) {
                let t = kernels::Rows {
                    src: band.as_ptr(),
                    rs: (sh * wp * l) as isize,
                    is: (wp * l) as isize,
                    kh: g.kh,
                    kw: g.kw,
                    sw,
                    flip: false,
                    w: wl[b * kk * l..].as_ptr(),
                    wr: g.kw,
                    wc: 1,
                    start: bl[b * l..].as_ptr(),
                    clamp: Clamp::bounds(act),
                    rows: nr,
                    wo: g.wo,
                    out: res.as_mut_ptr(),
                    ors: g.wo * l,
                    ocs: l,
                };
                // SAFETY: as for the taps below (the same reads and writes, row by row).
                unsafe { kernels::rows(level, &t) };
            } else {
                let t = kernels::Taps {
                    src: band.as_ptr(),
                    taps: taps.as_ptr(),
                    ntaps: kk,
                    w: wl[b * kk * l..].as_ptr(),
                    start: bl[b * l..].as_ptr(),
                    clamp: Clamp::bounds(act),
                    pixels: pixels.as_ptr(),
                    count: nr * g.wo,
                    out: res.as_mut_ptr(),
                };
                // SAFETY: output `(r, ox)` reads band rows `sh·r + i < sh·(nr − 1) + kh` and columns
                // `sw·ox + j < wp`, writes `res[(r·wo + ox)·L..]`; the weights hold `kk` vectors and the bias one from
                // the block's start; the level is not portable.
                unsafe { kernels::taps(level, &t) };
            }
            drop(flush);
            if let Some(f) = after {
                f(res);
            }
            // SAFETY: the scatter writes this job's channels' rows `oy0..oy0 + nr` only; the level is not portable.
            unsafe { dst.scatter(res, l, cn, (img * g.c + c0) * hw + oy0 * g.wo, hw) };
        },
    );
    // SAFETY: the jobs cover every (image, channel, row) and each wrote its whole rows.
    unsafe { out.set_len(n * g.c * hw) };
    out
}

/// The output gradient the input gradient reads.
#[derive(Clone, Copy)]
pub(super) enum OutGrad<'a> {
    /// `[N, C, Ho, Wo]`, masked where the fused ReLU's output (the second slice), if any, is not positive.
    Planes(&'a [f32], Option<&'a [f32]>),
    /// `[N, Ho, Wo, C]`: a block's `cn` channels of a pixel are one run, copied into its vector as they are.
    ChannelsLast(&'a [f32]),
}

/// The input gradient `[N, C, H, W]` from the output gradient `gout` (see [`OutGrad`]).
///
/// Image pixel `(y, x)` takes tap `(i, j)` when `y + ph − i` and `x + pw − j` are multiples of the strides: the
/// pixels fall into `sh·sw` classes by `((y + ph) mod sh, (x + pw) mod sw)`, each with its own taps at fixed
/// offsets. The output-gradient band holds every output row a tap of the band's rows names, zero outside the
/// outputs (adding a zero product leaves a sum's bits as they are: a sum from zero is never −0).
pub(super) fn input_grad(ws: &[f32], g: &Geom, n: usize, gout: OutGrad) -> Vec<f32> {
    let level = level();
    let l = kernels::lanes(level);
    let (kk, blocks, hw, in_plane) = (g.kh * g.kw, g.c.div_ceil(l), g.hw_out(), g.h * g.w);
    // SAFETY: the level is not portable (checked by `applies`).
    let wl = unsafe { weights_in_lanes(ws, g.c, kk, l) };
    let ((sh, sw), (ph, pw)) = (g.p.stride, g.p.padding);
    // Output-gradient columns read: from −⌈(kw − 1)/sw⌉ (zeros before column 0) to (w − 1 + pw)/sw.
    let ml = g.kw;
    let gw = ml + g.wo.max((g.w - 1 + pw) / sw + 1);
    let rows = band_rows(g.h, 4 * l * (gw.div_ceil(sh) + g.w), n * blocks);
    let bands = g.h.div_ceil(rows);
    // Class `(py, px)`'s taps, row-major: `i = py + sh·a`, `j = px + sw·b`, `a` rows and `b` columns before the
    // pixel's base.
    let class_taps: Vec<Vec<(isize, usize)>> = (0..sh * sw)
        .map(|class| {
            let (py, px) = (class / sw, class % sw);
            let rows = (py..g.kh).step_by(sh).enumerate();
            rows.flat_map(|(a, i)| {
                (px..g.kw).step_by(sw).enumerate().map(move |(b, j)| (-(((a * gw + b) * l) as isize), i * g.kw + j))
            })
            .collect()
        })
        .collect();
    let mut dx = Vec::<f32>::with_capacity(n * g.c * in_plane);
    let dst = Shared(dx.as_mut_ptr());
    (0..n * blocks * bands).into_par_iter().for_each_init(
        || (Vec::new(), Vec::new(), Vec::new()),
        |(band, res, pixels), job| {
            // One guard for the job's kernels (see `FlushSubnormals`).
            let _flush = crate::ops::simd::FlushSubnormals::on();
            let (img, b, y0) = (job / bands / blocks, job / bands % blocks, job % bands * rows);
            let (nr, c0) = (rows.min(g.h - y0), b * l);
            let cn = l.min(g.c - c0);
            // The output rows any tap of these image rows names, in range or not.
            let oyb = (y0 + ph) as isize - (g.kh - 1) as isize;
            let oyb = oyb.div_euclid(sh as isize);
            let oye = ((y0 + nr - 1 + ph) / sh + 1) as isize;
            let grows = (oye - oyb) as usize;
            let band = zeroed(band, grows * gw * l);
            for q in 0..grows {
                let oy = oyb + q as isize;
                if !(0..g.ho as isize).contains(&oy) {
                    continue;
                }
                let d = &mut band[(q * gw + ml) * l..];
                let at = ((img * g.c + c0) * g.ho + oy as usize) * g.wo;
                match gout {
                    OutGrad::ChannelsLast(gout) => {
                        let at = ((img * g.ho + oy as usize) * g.wo) * g.c + c0;
                        for (px, src) in d.chunks_exact_mut(l).zip(gout[at..].chunks(g.c)).take(g.wo) {
                            px[..cn].copy_from_slice(&src[..cn]);
                        }
                    }
                    OutGrad::Planes(gout, Some(y)) => {
                        for c in 0..cn {
                            let at = at + c * hw;
                            let masked = gout[at..at + g.wo].iter().zip(&y[at..at + g.wo]);
                            let masked = masked.map(|(&v, &m)| if m > 0.0 { v } else { 0.0 });
                            d[c..].iter_mut().step_by(l).zip(masked).for_each(|(d, v)| *d = v);
                        }
                    }
                    // SAFETY: the level is not portable (checked by `applies`).
                    OutGrad::Planes(gout, None) => unsafe { gather(&gout[at..], hw, cn, g.wo, d, l) },
                }
            }
            let res = results(res, nr * g.w * l);
            for (class, taps) in class_taps.iter().enumerate() {
                let (py, px) = (class / sw, class % sw);
                // The class's first row and column of the band, their counts, and its taps' rows and columns.
                let (r0, x0) = ((py + sh - (y0 + ph) % sh) % sh, (px + sw - pw % sw) % sw);
                let (rows_n, cols_n) = (nr.saturating_sub(r0).div_ceil(sh), g.w.saturating_sub(x0).div_ceil(sw));
                let (ka, kb) = (g.kh.saturating_sub(py).div_ceil(sh), g.kw.saturating_sub(px).div_ceil(sw));
                if ka > 0 && rows_n > 0 && cols_n > 0 && kernels::rows_apply(kb, 1, true) {
                    let row = ((y0 + r0 + ph - py) / sh) as isize - oyb;
                    let col = ml + (x0 + pw - px) / sw;
                    let t = kernels::Rows {
                        src: band[(row as usize * gw + col) * l..].as_ptr(),
                        rs: (gw * l) as isize,
                        is: -((gw * l) as isize),
                        kh: ka,
                        kw: kb,
                        sw: 1,
                        flip: true,
                        w: wl[(b * kk + py * g.kw + px) * l..].as_ptr(),
                        wr: sh * g.kw,
                        wc: sw,
                        start: std::ptr::null(),
                        clamp: None,
                        rows: rows_n,
                        wo: cols_n,
                        out: res[(r0 * g.w + x0) * l..].as_mut_ptr(),
                        ors: sh * g.w * l,
                        ocs: sw * l,
                    };
                    // SAFETY: the class's pixels and taps below, as rows: the same reads and writes.
                    unsafe { kernels::rows(level, &t) };
                    continue;
                }
                pixels.clear();
                for r in (0..nr).filter(|r| (y0 + r + ph) % sh == py) {
                    let row = ((y0 + r + ph - py) / sh) as isize - oyb;
                    for x in (0..g.w).filter(|x| (x + pw) % sw == px) {
                        pixels.push(((row as usize * gw + ml + (x + pw - px) / sw) * l, (r * g.w + x) * l));
                    }
                }
                let t = kernels::Taps {
                    src: band.as_ptr(),
                    taps: taps.as_ptr(),
                    ntaps: taps.len(),
                    w: wl[b * kk * l..].as_ptr(),
                    start: std::ptr::null(),
                    clamp: None,
                    pixels: pixels.as_ptr(),
                    count: pixels.len(),
                    out: res.as_mut_ptr(),
                };
                // SAFETY: a pixel's taps read band rows from `oyb` (the lowest any tap names) to `oye` and columns
                // from `ml − ⌈(kw − 1)/sw⌉ ≥ 0` to `ml + (w − 1 + pw)/sw < gw`; it writes `res[(r·w + x)·L..]`;
                // the weights hold `kk` vectors from the block's start; the level is not portable.
                unsafe { kernels::taps(level, &t) };
            }
            // SAFETY: every pixel of the rows is in one class, so `res` is written; the scatter writes this job's
            // channels' rows `y0..y0 + nr` only.
            unsafe { dst.scatter(res, l, cn, (img * g.c + c0) * in_plane + y0 * g.w, in_plane) };
        },
    );
    // SAFETY: the jobs cover every (image, channel, row) and each wrote its whole rows.
    unsafe { dx.set_len(n * g.c * in_plane) };
    dx
}
