//! The weight gradient on the vector kernels: `dWᵀ[K, Og] = Σ col · doutᵀ` per group, then `dW = (dWᵀ)ᵀ`.
//!
//! The images go in the fixed chunks of [`WGRAD_CHUNK`] whose partial sums are added chunk after chunk (the bits
//! do not depend on the thread count), but the chunks run one after another and the threads share each chunk's
//! product by blocks of up to [`JOB_ROWS`] rows of `dWᵀ`: each job keeps its rows' partial sum in cache and, at the
//! chunk's end, adds it onto the running total, which is kept transposed in `dW` itself. The old way — a chunk
//! per thread, each with a partial sum of the whole `dWᵀ`, then a serial sum and transpose — spent more time moving
//! those partial sums than multiplying on small maps (CIFAR's 4×4 maps of 512 channels: 9.4 MB per chunk for 16
//! positions an image).
//!
//! Within a chunk the images go in runs of [`Dense::per`]: each run's output gradients are transposed (masked by
//! the fused ReLU) and its images padded or unfolded side by side, so one product takes all their positions —
//! at least [`RUN_POSITIONS`] where the chunk has the images. Every element of a chunk's partial sum is one fused
//! multiply-add chain from zero over the chunk's positions in order, and the chunks' sums are added in order from
//! zero, so the bits are those of one product per image accumulated per chunk and the chunks summed in order.

use std::ops::Range;

use ndarray::s;
use rayon::prelude::*;

use super::super::plan::WGRAD_BLOCK;
use super::super::unfold::{direct_unfold, im2col, pad_into, product, transpose};
use super::super::{mat, mat_mut, Geom, WGRAD_CHUNK};
use super::Dense;
use crate::ops::Slots;

/// Output positions a run of images staged together reaches where the chunk has the images (a chunk of
/// CIFAR-sized maps is one run; ImageNet's 56×56 maps go two images a run).
const RUN_POSITIONS: usize = 2048;

/// Floats of `dWᵀ` (1 MB) up to which the chunks run in parallel, each with a partial sum of the whole of it
/// ([`Dense::by_chunks`]): in the core's L2, where the rows' jobs would cost more to dispatch than they save.
const SMALL_DW: usize = 1 << 18;

/// Rows of `dWᵀ` per parallel job at most: their partial sum (`JOB_ROWS × Og` floats) stays in the core's cache.
const JOB_ROWS: usize = 48;

/// Images per product for geometry `g` over a batch of `n`: enough for [`RUN_POSITIONS`] positions, at most a
/// chunk.
pub(super) fn images_per_product(g: &Geom, n: usize) -> usize {
    RUN_POSITIONS.div_ceil(g.hw_out().max(1)).clamp(1, WGRAD_CHUNK.min(n).max(1))
}

/// Rows per job for `k` rows of `dWᵀ`: at most [`JOB_ROWS`], a multiple of the register tile's 6 rows, and at
/// least four jobs a thread where `k` allows. The bits do not depend on it (each element is its own chain).
fn job_rows(k: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (k.div_ceil(4 * threads).div_ceil(6) * 6).clamp(6, JOB_ROWS)
}

/// Columns of `dW` per step of [`add_transposed`]: each row of `part` gives this many consecutive values.
const T_COLS: usize = 16;

/// Adds a job's rows of the chunk's partial sum `p` (`[rows][og]`) onto their columns of the running total `dw`
/// (`[og][k]` from `at`, the job's first column): `dw[o, r] = dw[o, r] + p[r, o]`, or `0 + p[r, o]` at the `first`
/// chunk — the chunks' sums added in order from zero. In blocks of [`T_COLS`] columns, so the writes stay in few
/// cache lines.
///
/// # Safety
///
/// The job owns these positions of `dw`, and unless `first` an earlier chunk wrote them.
unsafe fn add_transposed(p: &[f32], og: usize, k: usize, dw: &Slots, at: usize, first: bool) {
    for o0 in (0..og).step_by(T_COLS) {
        let cols = (og - o0).min(T_COLS);
        for (r, prow) in p.chunks_exact(og).enumerate() {
            for (o, &v) in prow[o0..o0 + cols].iter().enumerate() {
                let i = at + (o0 + o) * k + r;
                // SAFETY: as the caller promises.
                unsafe { dw.write(i, if first { 0.0 + v } else { dw.read(i) + v }) };
            }
        }
    }
}

/// One run's staged operands: each group's `doutᵀ` over the run's positions (`gt`, `[groups][positions][Og]`), and
/// the images padded one after another (`pads`, for the direct kernel) or each group's unfolded matrix with the
/// images side by side (`cat`, `[groups][K][positions]`).
#[derive(Default)]
struct Staged {
    gt: Vec<f32>,
    pads: Vec<f32>,
    cat: Vec<f32>,
}

impl Dense<'_> {
    /// `dW` `[O, K]` on the vector kernels (see the module's documentation).
    pub(super) fn weight_grad_transposed(&self) -> Vec<f32> {
        let g = &self.g;
        let (og, k, groups) = (g.og(), g.k(), g.p.groups);
        let (glen, len) = (k * og, groups * k * og);
        let chunks = self.n.div_ceil(WGRAD_CHUNK);
        if chunks == 0 {
            return vec![0.0; len];
        }
        if len <= SMALL_DW && chunks > 1 {
            return self.by_chunks();
        }
        // The chunk's partial sum `[groups][K][Og]` and the result `[groups][Og][K]`, which holds the running total
        // of the chunks so far: neither is initialised here — each job zeroes its rows of `part` at each chunk's
        // start and writes its columns of `dw` at the first chunk's end.
        let (mut part, mut dw) = (Vec::<f32>::with_capacity(len), Vec::<f32>::with_capacity(len));
        let (part_s, dw_s) = (Slots::raw(part.as_mut_ptr(), len), Slots::raw(dw.as_mut_ptr(), len));
        let rows = job_rows(k);
        let jobs: Vec<(usize, Range<usize>)> =
            (0..groups).flat_map(|grp| (0..k).step_by(rows).map(move |r0| (grp, r0..(r0 + rows).min(k)))).collect();
        let mut staged = Staged::default();
        for c in 0..chunks {
            let (start, end) = (c * WGRAD_CHUNK, ((c + 1) * WGRAD_CHUNK).min(self.n));
            for first in (start..end).step_by(self.per) {
                let count = self.per.min(end - first);
                self.stage(first, count, &mut staged, true);
                let (first_run, last_run) = (first == start, first + count == end);
                let run_job = |(grp, rows): &(usize, Range<usize>)| {
                    let at = grp * glen + rows.start * og;
                    // SAFETY: each job owns rows `rows` of group `grp` in `part` (zeroed here before any read)
                    // and their columns in `dw`; the staged operands are only read.
                    let p = unsafe {
                        if first_run {
                            part_s.zero(at, rows.len() * og);
                        }
                        part_s.slice(at, rows.len() * og)
                    };
                    self.product_rows(&staged, first, count, *grp, rows.clone(), p);
                    if last_run {
                        // SAFETY: as above (`dw` is read only where an earlier chunk wrote it).
                        unsafe { add_transposed(p, og, k, &dw_s, grp * glen + rows.start, c == 0) };
                    }
                };
                jobs.par_iter().for_each(run_job);
            }
        }
        // SAFETY: the first chunk's jobs wrote every column of every group's `dw`.
        unsafe { dw.set_len(len) };
        dw
    }

    /// [`Dense::weight_grad_transposed`] for a small `dWᵀ`: the chunks in parallel, each with its own partial sum
    /// of the whole `dWᵀ` (staged and multiplied on its thread), then the partial sums added in order and
    /// transposed.
    fn by_chunks(&self) -> Vec<f32> {
        let g = &self.g;
        let (og, k, groups) = (g.og(), g.k(), g.p.groups);
        let parts: Vec<Vec<f32>> = (0..self.n.div_ceil(WGRAD_CHUNK))
            .into_par_iter()
            .map(|c| {
                let (start, end) = (c * WGRAD_CHUNK, ((c + 1) * WGRAD_CHUNK).min(self.n));
                let mut part = vec![0.0f32; groups * k * og];
                let mut staged = Staged::default();
                for first in (start..end).step_by(self.per) {
                    let count = self.per.min(end - first);
                    self.stage(first, count, &mut staged, false);
                    for (grp, p) in part.chunks_exact_mut(k * og).enumerate() {
                        self.product_rows(&staged, first, count, grp, 0..k, p);
                    }
                }
                part
            })
            .collect();
        let mut dw = vec![0.0f32; groups * k * og];
        for (grp, d) in dw.chunks_exact_mut(k * og).enumerate() {
            for (kk, acc_row) in (0..k).map(|kk| (kk, grp * k * og + kk * og)) {
                for o in 0..og {
                    // In order from zero, as the chunks' sums are added on the other path.
                    d[o * k + kk] = parts.iter().fold(0.0, |t, p| t + p[acc_row + o]);
                }
            }
        }
        dw
    }

    /// Stages the `count` images from `first` (in parallel, an image a job, with `parallel`): their masked output
    /// gradients transposed into `s.gt`, and the images padded into `s.pads` (direct kernel) or unfolded into
    /// `s.cat`.
    fn stage(&self, first: usize, count: usize, s: &mut Staged, parallel: bool) {
        let g = &self.g;
        let (og, k, hw, in_len, groups) = (g.og(), g.k(), g.hw_out(), g.c * g.h * g.w, g.p.groups);
        let positions = count * hw;
        s.gt.resize(groups * positions * og, 0.0);
        let direct = self.dw_plan.is_some();
        let padded = direct && g.p.padding != (0, 0);
        let u = direct_unfold(g);
        let pad_len = if padded { g.c * u.h * u.w } else { 0 };
        s.pads.resize(if padded { count * pad_len } else { 0 }, 0.0);
        // Off the direct kernel the unfolded matrix is staged unless one pointwise image is read in place.
        let unfolded = !(direct || count == 1 && g.is_pointwise());
        s.cat.resize(if unfolded { groups * k * positions } else { 0 }, 0.0);
        let slots = |v: &mut Vec<f32>| Slots::raw(v.as_mut_ptr(), v.len());
        let (gt, cat, pads) = (slots(&mut s.gt), slots(&mut s.cat), slots(&mut s.pads));
        let one = |(eb, col): &mut (Vec<f32>, Vec<f32>), m: usize| {
            let i = first + m;
            let (graw, yimg) = self.src.image(g, i, eb);
            for grp in 0..groups {
                let (lo, hi) = (grp * og * hw, (grp + 1) * og * hw);
                // SAFETY: image `m`'s rows of each group's `doutᵀ` are its own.
                let dst = unsafe { gt.slice((grp * positions + m * hw) * og, hw * og) };
                transpose(&graw[lo..hi], yimg.map(|y| &y[lo..hi]), og, hw, dst);
            }
            let img = &self.xs[i * in_len..(i + 1) * in_len];
            if padded {
                // SAFETY: image `m`'s slot is its own.
                pad_into(img, g, unsafe { pads.slice(m * pad_len, pad_len) });
            }
            if !unfolded {
                return;
            }
            for grp in 0..groups {
                let src = if g.is_pointwise() {
                    &img[grp * g.cg() * hw..(grp + 1) * g.cg() * hw]
                } else {
                    col.resize(k * hw, 0.0);
                    im2col(img, g, grp * g.cg(), col);
                    &col[..]
                };
                for (r, row) in src.chunks_exact(hw).enumerate() {
                    // SAFETY: image `m`'s columns of each row are its own.
                    let dst = unsafe { cat.slice((grp * k + r) * positions + m * hw, hw) };
                    dst.copy_from_slice(row);
                }
            }
        };
        if count == 1 || !parallel {
            let mut bufs = Default::default();
            (0..count).for_each(|m| one(&mut bufs, m));
        } else {
            (0..count).into_par_iter().for_each_init(Default::default, one);
        }
    }

    /// `p += ` rows `rows` of group `grp`'s `dWᵀ` over the staged run of `count` images from `first`.
    fn product_rows(&self, s: &Staged, first: usize, count: usize, grp: usize, rows: Range<usize>, p: &mut [f32]) {
        let g = &self.g;
        let (og, k, hw, in_len) = (g.og(), g.k(), g.hw_out(), g.c * g.h * g.w);
        let positions = count * hw;
        let gt = &s.gt[grp * positions * og..][..positions * og];
        if let Some(plan) = &self.dw_plan {
            // The unfolded images are read in place, never written out.
            let u = direct_unfold(g);
            let imgs = if g.p.padding != (0, 0) { &s.pads[..] } else { &self.xs[first * in_len..] };
            plan.run(&imgs[grp * g.cg() * u.h * u.w..], gt, og, p, count, rows);
            return;
        }
        let src = if s.cat.is_empty() {
            &self.xs[first * in_len + grp * g.cg() * hw..][..g.cg() * hw]
        } else {
            &s.cat[grp * k * positions..][..k * positions]
        };
        let a = mat(&src[rows.start * positions..rows.end * positions], rows.len(), positions);
        let b = mat(gt, positions, og);
        // In blocks of positions, as the direct kernel takes them; the chains carry on through `p`.
        for p0 in (0..positions).step_by(WGRAD_BLOCK) {
            let p1 = (p0 + WGRAD_BLOCK).min(positions);
            product(a.slice(s![.., p0..p1]), b.slice(s![p0..p1, ..]), mat_mut(p, rows.len(), og), true, false);
        }
    }
}
