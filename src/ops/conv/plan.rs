//! Planners for the convolution tile kernels (`simd::conv`): each works out once per op what the register tiles of
//! one image group read and write — kernel taps' offsets in the image, vectors of output positions, tiles of
//! output channels or of `Wᵀ` rows — then runs them image group by image group.
//! - [`DirectConv`]: the forward straight from the image (implicit GEMM), with the bias and ReLU, or pooled 2×2;
//! - [`WeightGrad`]: `dWᵀ += col · doutᵀ` with the unfolded image read in place;
//! - [`InputGrad`]: `Wᵀ·dout` added tile by tile straight into the image gradient (no col2im pass).
//!
//! Each planner's `plan` returns `None` when its kernels do not run (no vector instruction set, or a geometry they
//! do not take), and the caller takes the unfolding path. x86-64 only; elsewhere `no_plan.rs` stands in, whose
//! planners never plan.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::Clamp;
use crate::ops::simd::conv::{self as kernels, Direct, Gather, Pos, Scatter};
use crate::ops::simd::{level, run_jobs, tile_bias, tile_rows, Level, Unfold, BLOCK_M};

/// Whether the direct kernels ([`DirectConv`], [`InputGrad`]) take this geometry: the vector kernels are present,
/// the geometry is unpadded (the caller pads) with a column stride of 1, and output rows fill the vectors well (at
/// least 3/4 of the lanes; an 8-wide row on 16 lanes is better served by unfolding).
fn direct_fits(u: &Unfold) -> bool {
    let lanes = match level() {
        Level::Portable => return false,
        Level::Avx2 => 8,
        Level::Avx512 => 16,
    };
    let fits = u.h > (u.ho.max(1) - 1) * u.sh + (u.kh - 1) * u.dh && u.w > u.wo.max(1) - 1 + (u.kw - 1) * u.dw;
    u.ph == 0 && u.pw == 0 && u.ho > 0 && u.wo > 0 && fits && 4 * u.wo >= 3 * u.wo.div_ceil(lanes) * lanes
}

/// Whether [`DirectConv`] takes this geometry with split vectors: unpadded, a column stride of 1, output rows of
/// exactly half a vector (8 on 16 lanes, as after a 5×5 convolution of a 12×12 map) and at least two of them, so
/// that each vector holds two output rows and every lane is used.
fn split_fits(u: &Unfold) -> bool {
    let lanes = match level() {
        Level::Portable => return false,
        Level::Avx2 => 8,
        Level::Avx512 => 16,
    };
    let fits = u.ho >= 2 && u.h > (u.ho - 1) * u.sh + (u.kh - 1) * u.dh && u.w > u.wo - 1 + (u.kw - 1) * u.dw;
    u.ph == 0 && u.pw == 0 && 2 * u.wo == lanes && fits
}

/// A convolution of one image group computed straight from the image (implicit GEMM), without unfolding it:
/// `out[Og, Ho·Wo] = W[Og, K] · col[K, Ho·Wo]` plus the bias, then the fused clamp (ReLU, ReLU6), where `col` is never
/// written — each register tile loads its input runs from the image at the kernel taps' offsets. Built once per
/// op (the taps' offsets and the vectors of output positions), then [`DirectConv::run`] per image group.
///
/// Each output element is the same fused multiply-add chain as `simd::gemm_nn` over the im2col matrix with the
/// output prefilled by the bias, so both paths give identical bits.
pub(super) struct DirectConv {
    u: Unfold,
    /// A column stride of 2, read from the phased image ([`DirectConv::plan_phased`]).
    phased: bool,
    level: Level,
    lanes: usize,
    max_vecs: usize,
    /// Image offset of each row of the virtual im2col matrix (channel, kernel row, kernel column).
    koff: Vec<isize>,
    /// (input offset, output offset, lanes) of every vector of output positions, row by row; the first `split.0`
    /// of them split ([`split_fits`]: two output rows each, the second `split.1` further on in the image).
    vecs: Vec<(usize, usize, usize)>,
    split: (usize, usize),
    /// For [`DirectConv::run_pooled`]: the vectors of each pair of output rows `2i, 2i + 1` (input offsets of both,
    /// lanes, the pooled output's offset in a channel, the window's flat offset in a channel's `Ho × Wo` plane);
    /// the first `pair_split.0` of them split, pairing rows `4q, 4q + 2` with `4q + 1, 4q + 3`, the second row of
    /// each vector `pair_split.1` further on in the image.
    pairs: Vec<(usize, usize, usize, usize, usize)>,
    pair_split: (usize, usize),
    /// With a stride of 2 both ways and a plan over the image's four stride phases ([`DirectConv::plan_phased`]):
    /// the row pitch of the grid of output positions the vectors run over (a phase's row, `⌈w/2⌉`); 0 otherwise.
    grid: usize,
}

/// How much more of the vector lanes the grid of [`DirectConv::plan_phased`] must fill than the output rows do (or,
/// where they do not fit, the unfolded product's vectors over all the outputs) for it to run: it costs a copy of
/// each output across, from the grid's rows to the output's. WRN-28-10's `320 → 640` of stride 2 on 16² (64
/// outputs: whole vectors unfolded, 64 of the grid's 72 positions) ran 36.4–36.8 ms unfolded, 43.1–43.7 on the grid.
const GRID_GAIN: f64 = 1.03;

impl DirectConv {
    /// The plan for `u`; `None` without the vector kernels or for a geometry they do not take ([`direct_fits`],
    /// [`split_fits`]).
    pub(super) fn plan(u: &Unfold) -> Option<DirectConv> {
        let split = split_fits(u);
        if !split && !direct_fits(u) {
            return None;
        }
        Some(Self::build(u, split, false, 0))
    }

    /// The plan of a convolution with a column stride of 2 (column dilation 1) on the same kernels, reading the
    /// image [`unfold::phased`](super::unfold::phased) laid out — each row's even columns, then its odd ones, each
    /// half `⌈w/2⌉` long: tap `kj` of output column `ow` reads column `2·ow + kj`, which is `ow + kj/2` of the even
    /// half for an even `kj` and of the odd half for an odd one, so every tap's run of output positions reads
    /// consecutive values (the stride phases of the image). `u` is the padded geometry with its true output size.
    /// Each output is the same multiply-add chain over the taps in order as the unfolded product's, so the bits
    /// do not change; `None` where [`direct_fits`] does not hold. Never pooled.
    ///
    /// With a row stride of 2 too (row dilation 1), where the output rows fill the vector lanes poorly (28 outputs a
    /// row on 16 lanes: two vectors, one an eighth empty), the plan reads the image in its four stride phases
    /// instead ([`unfold::quartered`](super::unfold::quartered): even or odd rows × even or odd columns, each a
    /// plane of `⌈h/2⌉` rows of `⌈w/2⌉`). Tap `(ki, kj)` of output `(oh, ow)` then reads position
    /// `(oh + ki/2)·⌈w/2⌉ + ow + kj/2` of its phase plane, so consecutive positions of the grid `oh·⌈w/2⌉ + ow` read
    /// consecutive values across the rows: the vectors run over the grid whole, its `⌈w/2⌉ − wo` columns past each
    /// row's outputs computed and dropped when each tile's rows are copied into the output (28 of every 29
    /// positions kept, where the rows' vectors kept 28 of 32). The same chains, so the same bits.
    pub(super) fn plan_phased(u: &Unfold) -> Option<DirectConv> {
        if u.dw != 1 {
            return None;
        }
        match Self::grid_pitch(u) {
            0 => direct_fits(u).then(|| Self::build(u, false, true, 0)),
            grid => Some(Self::build(u, false, true, grid)),
        }
    }

    /// The grid's row pitch `⌈w/2⌉` where a convolution of column stride 2 runs over the grid of the four stride
    /// phases (see [`DirectConv::plan_phased`]; its input gradient too, [`InputGrad::plan_phased`]), else 0.
    fn grid_pitch(u: &Unfold) -> usize {
        let rows = direct_fits(u).then(|| Self::lane_fill(u.wo, u.wo));
        // Without the rows' plan the convolution is unfolded: one product whose vectors run over all the outputs.
        let other = rows.unwrap_or_else(|| Self::lane_fill(u.ho * u.wo, u.ho * u.wo));
        let grid = Self::grid_fits(u).then(|| Self::lane_fill(u.ho * u.wo, u.ho * u.w.div_ceil(2)));
        if grid.is_some_and(|g| g > other * GRID_GAIN) {
            u.w.div_ceil(2)
        } else {
            0
        }
    }

    /// The share of the vector lanes holding outputs when `used` of `positions` consecutive positions are outputs.
    fn lane_fill(used: usize, positions: usize) -> f64 {
        let lanes = if level() == Level::Avx512 { 16 } else { 8 };
        used as f64 / (positions.div_ceil(lanes) * lanes) as f64
    }

    /// Whether the grid over the four stride phases ([`DirectConv::plan_phased`]) takes `u`: the vector kernels
    /// present, a stride of 2 both ways with no dilation (the column stride is the caller's), unpadded (the caller
    /// pads), the taps inside the image, and at least 3/4 of the lanes holding outputs.
    fn grid_fits(u: &Unfold) -> bool {
        level() != Level::Portable
            && u.sh == 2
            && u.dh == 1
            && u.ph == 0
            && u.pw == 0
            && u.ho > 0
            && u.wo > 0
            && u.h >= 2 * (u.ho - 1) + u.kh
            && u.w >= 2 * (u.wo - 1) + u.kw
            && 15 + u.kw / 2 <= super::unfold::QUARTER_SLACK
            && 4.0 * Self::lane_fill(u.ho * u.wo, u.ho * u.w.div_ceil(2)) >= 3.0
    }

    /// Whether the plan runs over the grid of the four stride phases ([`DirectConv::plan_phased`]).
    #[cfg(test)]
    pub(super) fn on_grid(&self) -> bool {
        self.grid > 0
    }

    /// A row of the image as the kernels read it: `w` values, or the two phases of `⌈w/2⌉`.
    fn row_len(u: &Unfold, phased: bool) -> usize {
        if phased {
            2 * u.w.div_ceil(2)
        } else {
            u.w
        }
    }

    /// The values of one channel of the image the kernels read (see [`DirectConv::image`]).
    pub(super) fn plane_len(&self) -> usize {
        Self::channel_len(&self.u, self.phased, self.grid)
    }

    /// One channel of the image as the kernels read it: rows of [`DirectConv::row_len`], or on the grid four phase
    /// planes of `⌈h/2⌉` rows of `grid` and the slack after them ([`unfold::quarter_len`](super::unfold::quarter_len)).
    fn channel_len(u: &Unfold, phased: bool, grid: usize) -> usize {
        if grid > 0 {
            4 * u.h.div_ceil(2) * grid + super::unfold::QUARTER_SLACK
        } else {
            u.h * Self::row_len(u, phased)
        }
    }

    /// The image the kernels read: `img` zero-padded ([`padded`](super::unfold::padded)), and in its stride
    /// phases when the plan reads them ([`DirectConv::plan_phased`]: two, or four for the grid), in `scratch`
    /// unless `img` serves as it is.
    pub(super) fn image<'a>(&self, img: &'a [f32], g: &super::Geom, scratch: &'a mut Vec<f32>) -> &'a [f32] {
        if self.grid > 0 {
            super::unfold::quartered(img, g, scratch)
        } else if self.phased {
            super::unfold::phased(img, g, scratch)
        } else {
            super::unfold::padded(img, g, scratch)
        }
    }

    /// Where tap `(ki, kj)` of the first output is in a channel of the image as the kernels read it: row `ki`
    /// (dilated), column `kj` (in its column phase when phased), or on the grid `ki / 2` rows and `kj / 2` columns
    /// into phase plane `(ki % 2, kj % 2)`.
    fn tap(u: &Unfold, phased: bool, grid: usize, ki: usize, kj: usize) -> usize {
        if grid > 0 {
            (ki % 2 * 2 + kj % 2) * u.h.div_ceil(2) * grid + ki / 2 * grid + kj / 2
        } else if phased {
            ki * u.dh * Self::row_len(u, true) + kj % 2 * u.w.div_ceil(2) + kj / 2
        } else {
            ki * u.dh * u.w + kj * u.dw
        }
    }

    fn build(u: &Unfold, split: bool, phased: bool, grid: usize) -> DirectConv {
        let level = level();
        let (lanes, max_vecs) = if level == Level::Avx512 { (16, 4) } else { (8, 2) };
        // Pooled, rows of a whole number of vectors and a half (8 or 24 on 16 lanes): the halves are split vectors.
        let pool_split = !phased && u.wo % lanes == lanes / 2;
        let rw = Self::row_len(u, phased);
        let plane = Self::channel_len(u, phased, grid);
        let mut koff = Vec::with_capacity(u.cg * u.kh * u.kw);
        for c in 0..u.cg {
            for ki in 0..u.kh {
                for kj in 0..u.kw {
                    koff.push((c * plane + Self::tap(u, phased, grid, ki, kj)) as isize);
                }
            }
        }
        if grid > 0 {
            // The grid's positions in vectors, wherever the rows break: position `p` of the grid reads `p` on.
            let vecs = (0..u.ho * grid).step_by(lanes).map(|p| (p, p, (u.ho * grid - p).min(lanes))).collect();
            let (pairs, pair_split, split) = (Vec::new(), (0, 0), (0, 0));
            return DirectConv { u: *u, phased, level, lanes, max_vecs, koff, vecs, split, pairs, pair_split, grid };
        }
        let row = u.sh * rw;
        // Split vectors hold output rows `oh, oh + 1`, whose outputs are contiguous; an odd last row is plain.
        let split_rows = if split { u.ho / 2 * 2 } else { 0 };
        let mut vecs: Vec<_> = (0..split_rows).step_by(2).map(|oh| (oh * row, oh * u.wo, lanes)).collect();
        let split_vecs = (vecs.len(), if split { row } else { 0 });
        for oh in split_rows..u.ho {
            for ow in (0..u.wo).step_by(lanes) {
                vecs.push((oh * row + ow, oh * u.wo + ow, (u.wo - ow).min(lanes)));
            }
        }
        // Pooled, split: for the last half vector of output rows `4q … 4q + 3` (from column `tail`), vector A holds
        // rows `4q, 4q + 2`, B rows `4q + 1, 4q + 3`; the windows of the second pair sit `2·Wo` further on in the
        // flat plane than the lanes' evens reach (half a vector). The rest of those rows are plain pairs.
        let quads = if pool_split { u.ho / 4 } else { 0 };
        let tail = u.wo / lanes * lanes;
        let mut pairs: Vec<_> = (0..quads)
            .map(|q| (4 * q * row + tail, (4 * q + 1) * row + tail, lanes, q * u.wo + tail / 2, 4 * q * u.wo + tail))
            .collect();
        let pair_split = (pairs.len(), if pool_split { 2 * row } else { 0 });
        for oh in (0..4 * quads).step_by(2) {
            for ow in (0..tail).step_by(lanes) {
                let (top, pooled) = (oh * row + ow, oh / 2 * (u.wo / 2) + ow / 2);
                pairs.push((top, top + row, lanes, pooled, oh * u.wo + ow));
            }
        }
        for oh in (4 * quads..u.ho / 2 * 2).step_by(2) {
            for ow in (0..u.wo / 2 * 2).step_by(lanes) {
                let n = (u.wo - ow).min(lanes);
                let (top, pooled) = (oh * row + ow, oh / 2 * (u.wo / 2) + ow / 2);
                pairs.push((top, top + row, n, pooled, oh * u.wo + ow));
            }
        }
        if phased {
            pairs.clear();
        }
        DirectConv { u: *u, phased, level, lanes, max_vecs, koff, vecs, split: split_vecs, pairs, pair_split, grid: 0 }
    }

    /// Tiles' worth of `list` (at most `per` entries each) with their gap: the first `split.0` entries split, with
    /// `split.1`, the rest plain.
    fn groups<T>(list: &[T], split: (usize, usize), per: usize) -> impl Iterator<Item = (&[T], usize)> {
        let (head, tail) = list.split_at(split.0);
        head.chunks(per).map(move |g| (g, split.1)).chain(tail.chunks(per).map(|g| (g, 0)))
    }

    /// `max_pool2d(relu(conv), 2×2, stride 2)` of one image group straight from the registers: `pooled[Og, Ho/2,
    /// Wo/2]` and, unless `idx` is empty, each window's first arg-max, flat in the channel's `Ho × Wo` plane — or,
    /// with `tall`, in the image's output taken as one `O·Ho × Wo` plane, this group's channels starting at
    /// `idx_offset`. The same values and indices as
    /// [`DirectConv::run`] with the ReLU followed by `simd::max_pool_2x2`; the convolution's output is never stored.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_pooled(
        &self,
        img: &[f32],
        wt: &[f32],
        og: usize,
        bias: Option<&[f32]>,
        pooled: &mut [f32],
        idx: &mut [u32],
        (tall, idx_offset): (bool, u32),
        parallel: bool,
    ) {
        let u = &self.u;
        let (k, hw, pp) = (u.cg * u.kh * u.kw, u.ho * u.wo, (u.ho / 2) * (u.wo / 2));
        let with_idx = !idx.is_empty();
        assert!(!self.phased, "conv_direct pooled: a stride-1 plan");
        assert!(
            og > 0
                && wt.len() >= og * k
                && pooled.len() >= og * pp
                && (!with_idx || idx.len() >= og * pp)
                && bias.is_none_or(|b| b.len() >= og)
                && img.len() >= u.cg * u.h * u.w
                && hw * og < 1 << 31,
            "conv_direct pooled: sizes"
        );
        let rsi = if tall { hw as u32 } else { 0 };
        // Each tile of output channels owns its pooled rows (and indices).
        let (mut rest, mut rest_idx) = (&mut pooled[..og * pp], &mut idx[..if with_idx { og * pp } else { 0 }]);
        let jobs: Vec<_> = tile_rows(og)
            .map(|(i, mr)| {
                let (rows, tail) = std::mem::take(&mut rest).split_at_mut(mr * pp);
                let (irows, itail) = std::mem::take(&mut rest_idx).split_at_mut(if with_idx { mr * pp } else { 0 });
                (rest, rest_idx) = (tail, itail);
                (i, mr, rows, irows)
            })
            .collect();
        let run = |(i, mr, rows, irows): (usize, usize, &mut [f32], &mut [u32])| {
            let bias_rows = tile_bias(bias, i, mr);
            let (dst, idst) = (rows.as_mut_ptr(), irows.as_mut_ptr());
            for (group, gap) in Self::groups(&self.pairs, self.pair_split, self.max_vecs / 2) {
                let mut t = Direct {
                    k,
                    a: wt[i * k..].as_ptr(),
                    rsa: k,
                    koff: self.koff.as_ptr(),
                    src: [img.as_ptr(); 4],
                    dst: [std::ptr::null_mut(); 4],
                    lanes: [0; 4],
                    rsc: 0,
                    gap,
                    bias: bias_rows,
                    clamp: Clamp::bounds(Some(Clamp::RELU)),
                    pool: true,
                    pooled: [std::ptr::null_mut(); 2],
                    idx: [std::ptr::null_mut(); 2],
                    idx_base: [0; 2],
                    rsp: pp,
                    rsi,
                    w: u.wo as u32,
                    jump: if gap != 0 { (2 * u.wo - self.lanes / 2) as u32 } else { 0 },
                    // The second pooled row's half straight after the first's when that is a quarter vector.
                    pgap: if gap != 0 && 4 * (u.wo / 2) != self.lanes { u.wo / 2 } else { 0 },
                };
                for (p, &(top, bottom, n, at, flat)) in group.iter().enumerate() {
                    // Every tap of every lane stays inside the image (`direct_fits`); each pair's windows
                    // stay inside its rows' pooled outputs.
                    t.src[2 * p] = img.as_ptr().wrapping_add(top);
                    t.src[2 * p + 1] = img.as_ptr().wrapping_add(bottom);
                    (t.lanes[2 * p], t.lanes[2 * p + 1]) = (n, n);
                    t.pooled[p] = dst.wrapping_add(at);
                    if with_idx {
                        t.idx[p] = idst.wrapping_add(at);
                    }
                    t.idx_base[p] = idx_offset + (i as u32) * rsi + flat as u32;
                }
                // SAFETY: the level's instructions are present; loads stay inside `img`, stores inside the tile's
                // pooled rows and indices (masked lanes never touch memory).
                unsafe {
                    kernels::direct(self.level, &t, mr, 2 * group.len());
                }
            }
        };
        run_jobs(jobs, parallel, og * hw * k, run);
    }

    /// `out[Og, Ho·Wo]` (every element written; it need not be initialised) from one image group `img` and its
    /// weights `wt[Og, K]`. With `parallel` (and enough work, outside a rayon task) the tiles of output channels
    /// are split across threads.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &self,
        img: &[f32],
        wt: &[f32],
        og: usize,
        bias: Option<&[f32]>,
        act: Option<Clamp>,
        out: &mut [MaybeUninit<f32>],
        parallel: bool,
    ) {
        let u = &self.u;
        let (k, hw) = (u.cg * u.kh * u.kw, u.ho * u.wo);
        assert!(
            og > 0
                && wt.len() >= og * k
                && out.len() >= og * hw
                && bias.is_none_or(|b| b.len() >= og)
                && img.len() >= u.cg * self.plane_len(),
            "conv_direct: sizes"
        );
        // Each tile of output channels owns its output rows.
        let mut rest = &mut out[..og * hw];
        let jobs: Vec<_> = tile_rows(og)
            .map(|(i, mr)| {
                let (rows, tail) = std::mem::take(&mut rest).split_at_mut(mr * hw);
                rest = tail;
                (i, mr, rows)
            })
            .collect();
        let run = |(i, mr, rows): (usize, usize, &mut [MaybeUninit<f32>])| {
            let bias_rows = tile_bias(bias, i, mr);
            // On the grid the tiles write their rows of the grid, copied into the output's rows after.
            let mut on_grid = Vec::<f32>::new();
            let (dst, rsc) = if self.grid > 0 {
                on_grid.reserve_exact(mr * u.ho * self.grid);
                (on_grid.as_mut_ptr(), u.ho * self.grid)
            } else {
                (rows.as_mut_ptr().cast::<f32>(), hw)
            };
            for (group, gap) in Self::groups(&self.vecs, self.split, self.max_vecs) {
                let mut t = Direct {
                    k,
                    a: wt[i * k..].as_ptr(),
                    rsa: k,
                    koff: self.koff.as_ptr(),
                    src: [img.as_ptr(); 4],
                    dst: [dst; 4],
                    lanes: [0; 4],
                    rsc,
                    gap,
                    bias: bias_rows,
                    clamp: Clamp::bounds(act),
                    pool: false,
                    pooled: [std::ptr::null_mut(); 2],
                    idx: [std::ptr::null_mut(); 2],
                    idx_base: [0; 2],
                    rsp: 0,
                    rsi: 0,
                    w: 0,
                    jump: 0,
                    pgap: 0,
                };
                for (v, &(src, out_at, n)) in group.iter().enumerate() {
                    // Every tap of every lane stays inside the image (`direct_fits`), every store inside
                    // `rows`.
                    t.src[v] = img.as_ptr().wrapping_add(src);
                    t.dst[v] = dst.wrapping_add(out_at);
                    t.lanes[v] = n;
                }
                // SAFETY: the level's instructions are present; loads stay inside `img` (on the grid, the positions
                // past a row's outputs read at most `kw / 2` values past a channel's planes, into its slack) and
                // stores inside `rows` or the grid's rows (masked lanes never touch memory).
                unsafe {
                    kernels::direct(self.level, &t, mr, group.len());
                }
            }
            if self.grid > 0 {
                let out = rows.as_mut_ptr().cast::<f32>();
                for r in 0..mr {
                    for oh in 0..u.ho {
                        // SAFETY: the tiles wrote every position of the grid's `mr` rows of `ho·grid`; output row `oh`
                        // of channel `r` is the first `wo` positions of the grid's row `oh`, inside `rows`.
                        unsafe {
                            let from = on_grid.as_ptr().add(r * rsc + oh * self.grid);
                            std::ptr::copy_nonoverlapping(from, out.add(r * hw + oh * u.wo), u.wo);
                        }
                    }
                }
            }
        };
        run_jobs(jobs, parallel, og * hw * k, run);
    }
}

/// Output positions per block of [`WeightGrad::run`] (and of the unfolded weight gradient's product): 256 rows of
/// a 64-column block of `doutᵀ` are 64 KB, in the core's L2 across the row tiles.
pub(super) const WGRAD_BLOCK: usize = 256;

/// `dWᵀ[K, Og] += col[K, Ho·Wo] · doutᵀ[Ho·Wo, Og]` for one image group, with `col` (the im2col matrix) read
/// straight from the image instead of written out: each register tile broadcasts its taps' inputs at the output
/// positions' offsets. Built once per backward (the offsets), then [`WeightGrad::run`] per image group. The
/// geometry must be unpadded (the caller pads) with a column stride of 1. Every element is the same fused
/// multiply-add chain over the positions, in order, as `simd::gemm_nn` on the unfolded image, so the bits agree.
///
/// One run may take several images laid out `stride` floats apart (their positions one after another, their
/// `doutᵀ` rows likewise): on a small map the chains then run over all of them in registers, where one image's
/// few positions per load and store of the whole `dWᵀ` left the product bound by memory (CIFAR's 4×4 maps:
/// 16 positions per 9.4 MB of `dWᵀ` read and written). The chains are the same as image after image, so are
/// the bits.
pub(super) struct WeightGrad {
    u: Unfold,
    level: Level,
    /// Image offset of each output position, image after image (as many as [`WeightGrad::plan`] was given).
    aoff: Vec<isize>,
    /// Floats from one image to the next.
    stride: usize,
    /// Image offset of each row of the virtual im2col matrix (channel, kernel row, kernel column).
    koff: Vec<usize>,
}

impl WeightGrad {
    /// The plan for `u`, over up to `images` images `stride` floats apart; `None` without the vector kernels or
    /// for a geometry they do not take.
    pub(super) fn plan(u: &Unfold, images: usize, stride: usize) -> Option<WeightGrad> {
        let level = level();
        if level == Level::Portable || u.ph != 0 || u.pw != 0 || u.ho == 0 || u.wo == 0 {
            return None;
        }
        let inside = u.h > (u.ho - 1) * u.sh + (u.kh - 1) * u.dh && u.w > u.wo - 1 + (u.kw - 1) * u.dw;
        assert!(inside, "conv_weight_grad: geometry");
        assert!(stride >= u.cg * u.h * u.w, "conv_weight_grad: image stride");
        let mut aoff = Vec::with_capacity(images * u.ho * u.wo);
        for m in 0..images {
            for oh in 0..u.ho {
                for ow in 0..u.wo {
                    aoff.push((m * stride + oh * u.sh * u.w + ow) as isize);
                }
            }
        }
        let mut koff = Vec::with_capacity(u.cg * u.kh * u.kw);
        for c in 0..u.cg {
            for ki in 0..u.kh {
                for kj in 0..u.kw {
                    koff.push(c * u.h * u.w + ki * u.dh * u.w + kj * u.dw);
                }
            }
        }
        Some(WeightGrad { u: *u, level, aoff, stride, koff })
    }

    /// `acc += ` rows `rows` of the `dWᵀ` of one image group over `images` images, from the image group `img` (the
    /// first image's; the others `stride` floats on) and `gt = doutᵀ` (the images' positions one after another,
    /// rows of `og` contiguous); `acc` holds just those rows, `og` contiguous.
    pub(super) fn run(&self, img: &[f32], gt: &[f32], og: usize, acc: &mut [f32], images: usize, rows: Range<usize>) {
        let u = &self.u;
        let (k, hw) = (u.cg * u.kh * u.kw, images * u.ho * u.wo);
        assert!(
            og > 0
                && images > 0
                && rows.end <= k
                && hw <= self.aoff.len()
                && img.len() >= (images - 1) * self.stride + u.cg * u.h * u.w
                && gt.len() >= hw * og
                && acc.len() >= rows.len() * og,
            "conv_weight_grad: sizes"
        );
        let (lanes, block_n) = if self.level == Level::Avx512 { (16, 64) } else { (8, 16) };
        // Positions in blocks of `WGRAD_BLOCK`, each block's rows of `doutᵀ` kept in cache across the row tiles;
        // every tile's chains carry on from the block before through `acc`.
        for (j, p0) in (0..og).step_by(block_n).flat_map(|j| (0..hw).step_by(WGRAD_BLOCK).map(move |p0| (j, p0))) {
            let nb = (og - j).min(block_n);
            let nv = nb.div_ceil(lanes);
            for (i, mr) in tile_rows(rows.len()) {
                let mut t = Gather {
                    k: (hw - p0).min(WGRAD_BLOCK),
                    a: [img.as_ptr(); BLOCK_M],
                    aoff: self.aoff[p0..].as_ptr(),
                    b: gt[p0 * og + j..].as_ptr(),
                    rsb: og as isize,
                    c: acc[i * og + j..].as_mut_ptr(),
                    rsc: og as isize,
                    tail: nb - (nv - 1) * lanes,
                };
                for (r, a) in t.a.iter_mut().enumerate().take(mr) {
                    *a = img[self.koff[rows.start + i + r]..].as_ptr();
                }
                // SAFETY: the level's instructions are present; every tap at every position lies inside the image
                // (checked by `plan`), every row of `gt` and `acc` touched inside them (masked lanes never touch
                // memory).
                unsafe {
                    kernels::gather(self.level, &t, mr, nv);
                }
            }
        }
    }
}

/// `Wᵀ` of one group's weights `W[Og, K]` as [`InputGrad`] reads it: row `r` (the `r`-th row of the unfolded
/// matrix, a kernel tap of one input channel) holds its `og` weights contiguously.
fn pack_input_grad(wg: &[f32], og: usize, k: usize, out: &mut [f32]) {
    for (o, wrow) in wg[..og * k].chunks_exact(k).enumerate() {
        for (r, &v) in wrow.iter().enumerate() {
            out[r * og + o] = v;
        }
    }
}

/// The rows of `Wᵀ` one register tile of [`InputGrad`] covers: their indices and tap offsets in the image.
#[derive(Clone, Copy)]
struct TileRows {
    mr: usize,
    rows: [usize; BLOCK_M],
    roff: [isize; BLOCK_M],
}

/// Floats of output gradient one block of [`InputGrad`]'s position vectors reads (256 KB: in L2 while every
/// register tile of `Wᵀ` passes over it).
const SCATTER_BLOCK_FLOATS: usize = 1 << 16;

/// Input channels per independent piece of [`InputGrad`]: a fixed number, so the order of additions into the
/// image gradient does not depend on how pieces are shared among threads.
const INPUT_GRAD_CHANNELS: usize = 12;

/// The input gradient of a convolution, group by group, computed without the unfolded matrix: the product
/// `dcol = Wᵀ·dout` is formed a register tile at a time and each tile is added straight into the image gradient
/// at its rows' kernel taps — what `simd::col2im` does with the whole product, with nothing written in between.
/// Built once per backward (`Wᵀ` packed, tiles and position vectors — the same for every group), then
/// [`InputGrad::run`] per image group.
///
/// Input channels are taken in fixed pieces; within a piece the rows are ordered by kernel column, kernel row, then
/// channel, so the rows of one tile add into different planes or rows, never into partly overlapping runs. Each
/// element of the image gradient takes its contributions in an order set by the geometry alone, so the result is
/// the same whether the pieces run on one thread or several.
pub(super) struct InputGrad {
    u: Unfold,
    og: usize,
    /// `Wᵀ` of each group in turn, packed by [`pack_input_grad`].
    wt_t: Vec<f32>,
    level: Level,
    max_vecs: usize,
    pos: Vec<Pos>,
    masked: bool,
    /// A column stride of 2: the image gradient is laid out in its stride phases ([`InputGrad::plan_phased`]).
    phased: bool,
    /// On the grid of the four stride phases: its row pitch (as [`DirectConv`]'s), else 0.
    grid: usize,
    /// Per piece: its channel count and its tiles.
    pieces: Vec<(usize, Vec<TileRows>)>,
}

impl InputGrad {
    /// The plan for geometry `u` (unpadded — the caller pads) with a column stride of 1, `og` output channels per
    /// group and the weights `w[G·Og, K]` of every group; `None` without the vector kernels or for a geometry they
    /// do not take ([`direct_fits`]).
    pub(super) fn plan(u: &Unfold, og: usize, w: &[f32]) -> Option<InputGrad> {
        Self::build(u, og, w, false)
    }

    /// The plan of a convolution with a column stride of 2 (column dilation 1), adding into the padded image
    /// gradient laid out in its stride phases as [`DirectConv::plan_phased`] reads the image (each row's even
    /// columns, then its odd ones, each half `⌈w/2⌉` long): tap `kj` of output column `ow` adds into column
    /// `2·ow + kj`, which is `ow + kj/2` of the half of `kj`'s parity, so every tap's run of output positions adds
    /// into consecutive values. The caller turns the phases back into rows ([`unphased`](super::unfold::unphased)).
    ///
    /// Where the forward runs over the grid of the four stride phases ([`DirectConv::plan_phased`]), so does this:
    /// the output gradient copied onto the grid with zeros past each row's outputs and up to a whole last vector
    /// ([`InputGrad::on_grid`]), every vector whole, adding into the image gradient laid out as
    /// [`quartered`](super::unfold::quartered) lays out the image (zeros added past the outputs, into the next
    /// phase row or the channel's slack), turned back into rows by [`unquartered`](super::unfold::unquartered).
    pub(super) fn plan_phased(u: &Unfold, og: usize, w: &[f32]) -> Option<InputGrad> {
        if u.dw == 1 {
            Self::build(u, og, w, true)
        } else {
            None
        }
    }

    /// Whether the image gradient is laid out in stride phases ([`InputGrad::plan_phased`]).
    pub(super) fn phased(&self) -> bool {
        self.phased
    }

    /// Whether the image gradient is laid out in the four stride phases of the grid ([`InputGrad::plan_phased`]).
    pub(super) fn on_grid(&self) -> bool {
        self.grid > 0
    }

    /// The values of one channel of the image gradient the kernels add into.
    pub(super) fn plane_len(&self) -> usize {
        DirectConv::channel_len(&self.u, self.phased, self.grid)
    }

    /// Positions of one channel of the output gradient as the kernels read it: `Ho·Wo`, or on the grid its rows of
    /// `grid` up to a whole last vector.
    fn grid_len(&self) -> usize {
        let lanes = if self.level == Level::Avx512 { 16 } else { 8 };
        (self.u.ho * self.grid).next_multiple_of(lanes)
    }

    fn build(u: &Unfold, og: usize, w: &[f32], phased: bool) -> Option<InputGrad> {
        let level = level();
        let k = u.cg * u.kh * u.kw;
        if level == Level::Portable || og == 0 {
            return None;
        }
        let grid = if phased { DirectConv::grid_pitch(u) } else { 0 };
        if grid == 0 && !direct_fits(u) {
            return None;
        }
        let rw = DirectConv::row_len(u, phased);
        let mut wt_t = vec![0.0f32; w.len()];
        for (wg, packed) in w.chunks_exact(og * k).zip(wt_t.chunks_exact_mut(og * k)) {
            pack_input_grad(wg, og, k, packed);
        }
        let (lanes, max_vecs) = if level == Level::Avx512 { (16, 4) } else { (8, 2) };
        let mut pos = Vec::with_capacity(u.ho * u.wo.div_ceil(lanes));
        if grid > 0 {
            // Whole vectors over the grid, read from the output gradient copied onto it.
            let len = (u.ho * grid).next_multiple_of(lanes);
            pos.extend((0..len).step_by(lanes).map(|p| Pos { src: p, dst: p, lanes }));
        } else {
            for oh in 0..u.ho {
                for ow in (0..u.wo).step_by(lanes) {
                    pos.push(Pos { src: oh * u.wo + ow, dst: oh * u.sh * rw + ow, lanes: (u.wo - ow).min(lanes) });
                }
            }
        }
        let masked = pos.iter().any(|p| p.lanes < lanes);
        let plane = DirectConv::channel_len(u, phased, grid);
        let mut pieces = Vec::new();
        for c0 in (0..u.cg).step_by(INPUT_GRAD_CHANNELS) {
            let cn = (u.cg - c0).min(INPUT_GRAD_CHANNELS);
            let mut rows = Vec::with_capacity(u.kh * u.kw * cn);
            for kj in 0..u.kw {
                for ki in 0..u.kh {
                    for c in 0..cn {
                        let r = ((c0 + c) * u.kh + ki) * u.kw + kj;
                        rows.push((r, (c * plane + DirectConv::tap(u, phased, grid, ki, kj)) as isize));
                    }
                }
            }
            let list = tile_rows(rows.len())
                .map(|(i, mr)| {
                    let mut t = TileRows { mr, rows: [0; BLOCK_M], roff: [0; BLOCK_M] };
                    for (r, &(row, off)) in rows[i..i + mr].iter().enumerate() {
                        (t.rows[r], t.roff[r]) = (row, off);
                    }
                    t
                })
                .collect();
            pieces.push((cn, list));
        }
        Some(InputGrad { u: *u, og, wt_t, level, max_vecs, pos, masked, phased, grid, pieces })
    }

    /// `dx[Cg, H, W] +=` the input gradient of image group `grp` from its output gradient `gout[Og, Ho·Wo]` (each
    /// plane [`InputGrad::plane_len`] long, in stride phases when [`InputGrad::phased`]). With `parallel` (and
    /// enough work, outside a rayon task) the pieces of input channels run on several threads.
    pub(super) fn run(&self, grp: usize, gout: &[f32], dx: &mut [f32], parallel: bool) {
        let (u, og) = (&self.u, self.og);
        let (hw, plane, k) = (u.ho * u.wo, self.plane_len(), u.cg * u.kh * u.kw);
        let wt_t = &self.wt_t[grp * og * k..(grp + 1) * og * k];
        assert!(gout.len() >= og * hw && dx.len() >= u.cg * plane, "InputGrad::run: sizes");
        // On the grid: the output gradient's rows `grid` apart, zeros past each row's outputs and to a whole vector.
        let (on_grid, rsb) = if self.grid > 0 {
            let len = self.grid_len();
            let mut on_grid = vec![0.0f32; og * len];
            for (dst, src) in on_grid.chunks_exact_mut(len).zip(gout[..og * hw].chunks_exact(hw)) {
                for (d, s) in dst.chunks_mut(self.grid).zip(src.chunks_exact(u.wo)) {
                    d[..u.wo].copy_from_slice(s);
                }
            }
            (on_grid, len)
        } else {
            (Vec::new(), hw)
        };
        let gout = if self.grid > 0 { &on_grid[..] } else { gout };
        let full = self.pos.len() / self.max_vecs * self.max_vecs;
        // Position vectors per block: every tile passes over a block's output gradient (`og` values a lane) while
        // it stays in L2, instead of over the whole image's (the stem's 64 × 112² took each tile's pass from
        // memory). Small maps are one block: the order of their additions is as it was.
        let lanes = if self.level == Level::Avx512 { 16 } else { 8 };
        let per_block = (SCATTER_BLOCK_FLOATS / (og * lanes)).max(1).next_multiple_of(self.max_vecs);
        let run = |(cn, tiles): &(usize, Vec<TileRows>), dst: &mut [f32]| {
            debug_assert!(dst.len() == cn * plane);
            for b0 in (0..self.pos.len()).step_by(per_block) {
                let b1 = (b0 + per_block).min(full);
                for tr in tiles {
                    let mut t = Scatter {
                        k: og,
                        a: [wt_t.as_ptr(); BLOCK_M],
                        roff: tr.roff,
                        gout: gout.as_ptr(),
                        rsb,
                        dx: dst.as_mut_ptr(),
                        pos: self.pos[b0..].as_ptr(),
                        groups: b1.saturating_sub(b0) / self.max_vecs,
                    };
                    for (a, &row) in t.a.iter_mut().zip(&tr.rows[..tr.mr]) {
                        *a = wt_t[row * og..].as_ptr();
                    }
                    // SAFETY: the level's instructions are present; loads stay inside `gout` and `wt_t`, and every
                    // tap of every position vector lands inside the piece's planes (`direct_fits`); masked lanes
                    // never touch memory.
                    unsafe {
                        if t.groups > 0 {
                            kernels::scatter(self.level, &t, tr.mr, self.max_vecs, self.masked);
                        }
                        if full < self.pos.len() && b0 + per_block >= self.pos.len() {
                            t.pos = self.pos[full..].as_ptr();
                            t.groups = 1;
                            kernels::scatter(self.level, &t, tr.mr, self.pos.len() - full, self.masked);
                        }
                    }
                }
            }
        };
        let jobs: Vec<_> = self.pieces.iter().zip(dx[..u.cg * plane].chunks_mut(INPUT_GRAD_CHANNELS * plane)).collect();
        run_jobs(jobs, parallel, og * hw * u.cg * u.kh * u.kw, |(piece, d)| run(piece, d));
    }
}
