//! Hand-written vector kernels for the shapes convolutions produce, on AVX-512 or on AVX2 with FMA (chosen at run
//! time), where the `gemm` crate's packing and generic tiles leave much of a core's throughput unused.
//!
//! [`gemm_nn`] computes `c (+)= a·b` when the rows of `b` and `c` are contiguous: a register tile of up to 6 rows of
//! `a` (broadcast) times up to four 16-lane vectors of columns of `b` (AVX-512) or two 8-lane ones (AVX2), over the
//! whole reduction, with no packing — convolution operands (`W·col`, `Wᵀ·dout`) are already in that layout and
//! small enough to stay in L2. Each output element is one fused multiply-add chain over `k` in order, whatever
//! `m`, `n`, the tiling or the thread count, so results are deterministic and a row never depends on the other
//! rows. [`im2col`], [`col2im`] and [`max_pool_2x2`] move whole runs of a row with masked vector loads and stores.
//!
//! The kernels are written once, generic over the instruction set ([`x86::Isa`]), and compiled for each behind a
//! `#[target_feature]` entry point. On other CPUs the functions return `false` and the caller uses the `gemm`
//! crate or its scalar loops.

use std::mem::MaybeUninit;

use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

/// The vector instruction set the kernels use, from most to least capable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// No hand-written kernels: the `gemm` crate and scalar loops.
    Portable,
    /// AVX2 and FMA: 8-lane vectors.
    Avx2,
    /// AVX-512F: 16-lane vectors and lane masks.
    Avx512,
}

/// The instruction set the kernels run on: the best the CPU has, capped by the environment variable
/// `ARMOURY_SIMD` (`avx2` or `portable`; CI sets it to test every path on one machine). Decided once.
#[inline]
pub(crate) fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let cpu = if std::arch::is_x86_feature_detected!("avx512f") {
            Level::Avx512
        } else if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            Level::Avx2
        } else {
            Level::Portable
        };
        #[cfg(not(target_arch = "x86_64"))]
        let cpu = Level::Portable;
        let cap = match std::env::var("ARMOURY_SIMD").as_deref() {
            Ok("portable") | Ok("none") => Level::Portable,
            Ok("avx2") => Level::Avx2,
            _ => Level::Avx512,
        };
        cpu.min(cap)
    })
}

/// Whether the hand-written kernels run (on either instruction set).
#[inline]
pub(crate) fn accelerated() -> bool {
    level() != Level::Portable
}

/// Column blocks of this many multiply-adds or more are split across threads (when the caller allows it).
const PAR_WORK: usize = 1 << 21;

/// `c = a·b`, or `c += a·b` when `accumulate`, for `b` and `c` with contiguous rows; `a` may have any strides.
/// Returns `false` without touching `c` when the CPU has neither instruction set or the layout does not fit.
pub(crate) fn gemm_nn(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    accumulate: bool,
    parallel: bool,
) -> bool {
    let ((m, k), n) = (a.dim(), b.ncols());
    debug_assert!(b.nrows() == k && c.dim() == (m, n));
    let level = level();
    if level == Level::Portable {
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
        level,
    };
    let block_n = if level == Level::Avx512 { 64 } else { 16 };
    let blocks = n.div_ceil(block_n);
    let nested = rayon::current_thread_index().is_some();
    if parallel && !nested && blocks > 1 && m * n * k >= PAR_WORK {
        (0..blocks).into_par_iter().for_each(|blk| {
            let j = blk * block_n;
            // SAFETY: blocks write disjoint column ranges of `c`; the operands outlive this call.
            unsafe { ops.block(j, (n - j).min(block_n)) }
        });
    } else {
        for blk in 0..blocks {
            let j = blk * block_n;
            // SAFETY: as above, sequentially.
            unsafe { ops.block(j, (n - j).min(block_n)) }
        }
    }
    true
}

/// Rows of `a`/`c` per register tile (AVX-512: 6 × 4 accumulators + 4 `b` vectors + 1 broadcast fit the 32
/// registers; AVX2: 6 × 2 + 2 + 1 fit the 16).
const BLOCK_M: usize = 6;

/// `m` rows split evenly over the fewest register tiles of at most [`BLOCK_M`] (25 = 5 × 5, not 4 × 6 + 1: a
/// one-row tile has too few independent accumulators to hide the multiply-add latency): each tile's first row
/// and row count.
fn tile_rows(m: usize) -> impl Iterator<Item = (usize, usize)> {
    let tiles = m.div_ceil(BLOCK_M);
    let (base, extra) = (m / tiles.max(1), m % tiles.max(1));
    (0..tiles).scan(0, move |next, tile| {
        let (at, mr) = (*next, base + usize::from(tile < extra));
        *next += mr;
        Some((at, mr))
    })
}

/// The bias of the tile of output channels `i..i + mr` (zeros without one).
fn tile_bias(bias: Option<&[f32]>, i: usize, mr: usize) -> [f32; BLOCK_M] {
    let mut rows = [0.0f32; BLOCK_M];
    if let Some(b) = bias {
        rows[..mr].copy_from_slice(&b[i..i + mr]);
    }
    rows
}

/// `f` on every job: across threads when `parallel` allows it, there are `work` multiply-adds or more and this
/// is not already a rayon task; else in order on this thread.
fn run_jobs<J: Send>(jobs: Vec<J>, parallel: bool, work: usize, f: impl Fn(J) + Sync + Send) {
    let nested = rayon::current_thread_index().is_some();
    if parallel && !nested && jobs.len() > 1 && work >= PAR_WORK {
        jobs.into_par_iter().for_each(f);
    } else {
        jobs.into_iter().for_each(f);
    }
}

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
    level: Level,
}

// SAFETY: the pointers come from views borrowed for the duration of `gemm_nn`; concurrent tasks touch disjoint
// columns of `c` and only read `a` and `b`.
unsafe impl Send for Operands {}
unsafe impl Sync for Operands {}

impl Operands {
    /// All rows of `c` for the `nb` columns (at most one block) starting at `j`.
    unsafe fn block(&self, j: usize, nb: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let lanes = if self.level == Level::Avx512 { 16 } else { 8 };
            let nv = nb.div_ceil(lanes);
            let tail = nb - (nv - 1) * lanes;
            for (i, mr) in tile_rows(self.m) {
                let t = Tile {
                    k: self.k,
                    a: self.a.offset(i as isize * self.rsa),
                    rsa: self.rsa,
                    csa: self.csa,
                    b: self.b.add(j),
                    rsb: self.rsb,
                    c: self.c.offset(i as isize * self.rsc).add(j),
                    rsc: self.rsc,
                    tail,
                    accumulate: self.accumulate,
                };
                x86::tile(self.level, &t, mr, nv);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (j, nb);
            unreachable!("gemm_nn checks the instruction set first");
        }
    }
}

/// One register tile: `R ≤ 6` rows by `V` vectors of columns, the last vector holding `tail` columns.
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
    tail: usize,
    accumulate: bool,
}

/// One register tile of a direct convolution: `R ≤ 6` output channels (rows of `a`, `rsa` apart, and of the
/// output, `rsc` apart) by `V` vectors of output positions, vector `v` reading the image at `src[v] + koff[k]` for
/// the `k`-th kernel tap and writing `lanes[v]` outputs at `dst[v]`.
#[allow(dead_code)]
struct Direct {
    k: usize,
    a: *const f32,
    rsa: usize,
    koff: *const isize,
    src: [*const f32; 4],
    dst: [*mut f32; 4],
    lanes: [usize; 4],
    rsc: usize,
    bias: [f32; BLOCK_M],
    relu: bool,
    /// With 2×2 max pooling in the store (after the ReLU): vectors `2p` and `2p + 1` are two adjacent output rows
    /// of one column run, and instead of `dst` their windows' maxima go to `pooled[p]` (row `r` at `r·rsp`), their
    /// flat arg-max (`idx_base[p] + r·rsi` plus the window entry's offset: 0, 1, `w`, `w + 1`) to `idx[p]` unless
    /// it is null.
    pool: bool,
    pooled: [*mut f32; 2],
    idx: [*mut u32; 2],
    idx_base: [u32; 2],
    rsp: usize,
    rsi: u32,
    w: u32,
}

/// Whether [`DirectConv`] runs this geometry: the vector kernels are present, the geometry is unpadded (the
/// caller pads) with a column stride of 1, and output rows fill the vectors well (at least 3/4 of the lanes; an
/// 8-wide row on 16 lanes is better served by unfolding).
pub(crate) fn conv_direct_fits(u: &Unfold) -> bool {
    let lanes = match level() {
        Level::Portable => return false,
        Level::Avx2 => 8,
        Level::Avx512 => 16,
    };
    let fits = u.h > (u.ho.max(1) - 1) * u.sh + (u.kh - 1) * u.dh && u.w > u.wo.max(1) - 1 + (u.kw - 1) * u.dw;
    u.ph == 0 && u.pw == 0 && u.ho > 0 && u.wo > 0 && fits && 4 * u.wo >= 3 * u.wo.div_ceil(lanes) * lanes
}

/// A convolution of one image group computed straight from the image (implicit GEMM), without unfolding it:
/// `out[Og, Ho·Wo] = W[Og, K] · col[K, Ho·Wo]` plus the bias, then the ReLU when `relu`, where `col` is never
/// written — each register tile loads its input runs from the image at the kernel taps' offsets. Built once per
/// op for a geometry satisfying [`conv_direct_fits`] (the taps' offsets and the vectors of output positions),
/// then [`DirectConv::run`] per image group.
///
/// Each output element is the same fused multiply-add chain as [`gemm_nn`] over the im2col matrix with the
/// output prefilled by the bias, so both paths give identical bits.
pub(crate) struct DirectConv {
    u: Unfold,
    level: Level,
    max_vecs: usize,
    /// Image offset of each row of the virtual im2col matrix (channel, kernel row, kernel column).
    koff: Vec<isize>,
    /// (input offset, output offset, lanes) of every vector of output positions, row by row.
    vecs: Vec<(usize, usize, usize)>,
    /// For [`DirectConv::run_pooled`]: the vectors of each pair of output rows `2i, 2i + 1` (input offsets of both,
    /// lanes, the pooled output's offset in a channel, the window's flat offset in a channel's `Ho × Wo` plane).
    pairs: Vec<(usize, usize, usize, usize, usize)>,
}

impl DirectConv {
    /// The plan for `u`, which must satisfy [`conv_direct_fits`].
    pub(crate) fn new(u: &Unfold) -> DirectConv {
        assert!(conv_direct_fits(u), "conv_direct: geometry");
        let level = level();
        let (lanes, max_vecs) = if level == Level::Avx512 { (16, 4) } else { (8, 2) };
        let mut koff = Vec::with_capacity(u.cg * u.kh * u.kw);
        for c in 0..u.cg {
            for ki in 0..u.kh {
                for kj in 0..u.kw {
                    koff.push((c * u.h * u.w + ki * u.dh * u.w + kj * u.dw) as isize);
                }
            }
        }
        let mut vecs = Vec::with_capacity(u.ho * u.wo.div_ceil(lanes));
        for oh in 0..u.ho {
            for ow in (0..u.wo).step_by(lanes) {
                vecs.push((oh * u.sh * u.w + ow, oh * u.wo + ow, (u.wo - ow).min(lanes)));
            }
        }
        let mut pairs = Vec::new();
        for oh in (0..u.ho / 2 * 2).step_by(2) {
            for ow in (0..u.wo / 2 * 2).step_by(lanes) {
                let n = (u.wo - ow).min(lanes);
                let (top, pooled) = (oh * u.sh * u.w + ow, oh / 2 * (u.wo / 2) + ow / 2);
                pairs.push((top, top + u.sh * u.w, n, pooled, oh * u.wo + ow));
            }
        }
        DirectConv { u: *u, level, max_vecs, koff, vecs, pairs }
    }

    /// `max_pool2d(relu(conv), 2×2, stride 2)` of one image group straight from the registers: `pooled[Og, Ho/2,
    /// Wo/2]` and, unless `idx` is empty, each window's first arg-max, flat in the channel's `Ho × Wo` plane — or,
    /// with `tall`, in the image's output taken as one `O·Ho × Wo` plane, this group's channels starting at
    /// `idx_offset`. The same values and indices as
    /// [`DirectConv::run`] with the ReLU followed by [`max_pool_2x2`]; the convolution's output is never stored.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_pooled(
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
            for group in self.pairs.chunks(self.max_vecs / 2) {
                let mut t = Direct {
                    k,
                    a: wt[i * k..].as_ptr(),
                    rsa: k,
                    koff: self.koff.as_ptr(),
                    src: [img.as_ptr(); 4],
                    dst: [std::ptr::null_mut(); 4],
                    lanes: [0; 4],
                    rsc: 0,
                    bias: bias_rows,
                    relu: true,
                    pool: true,
                    pooled: [std::ptr::null_mut(); 2],
                    idx: [std::ptr::null_mut(); 2],
                    idx_base: [0; 2],
                    rsp: pp,
                    rsi,
                    w: u.wo as u32,
                };
                for (p, &(top, bottom, n, at, flat)) in group.iter().enumerate() {
                    // Every tap of every lane stays inside the image (`conv_direct_fits`); each pair's windows
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
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the level's instructions are present; loads stay inside `img`, stores inside the tile's
                // pooled rows and indices (masked lanes never touch memory).
                unsafe {
                    x86::direct(self.level, &t, mr, 2 * group.len());
                }
            }
        };
        run_jobs(jobs, parallel, og * hw * k, run);
    }

    /// `out[Og, Ho·Wo]` (every element written; it need not be initialised) from one image group `img` and its
    /// weights `wt[Og, K]`. With `parallel` (and enough work, outside a rayon task) the tiles of output channels
    /// are split across threads.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        img: &[f32],
        wt: &[f32],
        og: usize,
        bias: Option<&[f32]>,
        relu: bool,
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
                && img.len() >= u.cg * u.h * u.w,
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
            let dst = rows.as_mut_ptr().cast::<f32>();
            for group in self.vecs.chunks(self.max_vecs) {
                let mut t = Direct {
                    k,
                    a: wt[i * k..].as_ptr(),
                    rsa: k,
                    koff: self.koff.as_ptr(),
                    src: [img.as_ptr(); 4],
                    dst: [dst; 4],
                    lanes: [0; 4],
                    rsc: hw,
                    bias: bias_rows,
                    relu,
                    pool: false,
                    pooled: [std::ptr::null_mut(); 2],
                    idx: [std::ptr::null_mut(); 2],
                    idx_base: [0; 2],
                    rsp: 0,
                    rsi: 0,
                    w: 0,
                };
                for (v, &(src, out_at, n)) in group.iter().enumerate() {
                    // Every tap of every lane stays inside the image (`conv_direct_fits`), every store inside
                    // `rows`.
                    t.src[v] = img.as_ptr().wrapping_add(src);
                    t.dst[v] = dst.wrapping_add(out_at);
                    t.lanes[v] = n;
                }
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the level's instructions are present; loads stay inside `img` and stores inside `rows`
                // (masked lanes never touch memory).
                unsafe {
                    x86::direct(self.level, &t, mr, group.len());
                }
            }
        };
        run_jobs(jobs, parallel, og * hw * k, run);
    }
}

/// One register tile of a convolution's weight gradient read straight from the image: `R ≤ 6` kernel taps (rows
/// of `dWᵀ`; tap `r` reads the image at `a[r] + aoff[p]` for output position `p`) by `V` vectors of output
/// channels, accumulated over the `k` output positions into `c`.
#[allow(dead_code)]
struct Gather {
    k: usize,
    a: [*const f32; BLOCK_M],
    aoff: *const isize,
    b: *const f32,
    rsb: isize,
    c: *mut f32,
    rsc: isize,
    tail: usize,
}

/// `dWᵀ[K, Og] += col[K, Ho·Wo] · doutᵀ[Ho·Wo, Og]` for one image group, with `col` (the im2col matrix) read
/// straight from the image instead of written out: each register tile broadcasts its taps' inputs at the output
/// positions' offsets. Built once per backward (the offsets), then [`WeightGrad::run`] per image group. The
/// geometry must be unpadded (the caller pads) with a column stride of 1. Every element is the same fused
/// multiply-add chain over the positions, in order, as [`gemm_nn`] on the unfolded image, so the bits agree.
pub(crate) struct WeightGrad {
    u: Unfold,
    level: Level,
    /// Image offset of each output position.
    aoff: Vec<isize>,
    /// Image offset of each row of the virtual im2col matrix (channel, kernel row, kernel column).
    koff: Vec<usize>,
}

impl WeightGrad {
    /// The plan for `u`; `None` without the vector kernels or for a geometry they do not take.
    pub(crate) fn new(u: &Unfold) -> Option<WeightGrad> {
        let level = level();
        if level == Level::Portable || u.ph != 0 || u.pw != 0 || u.ho == 0 || u.wo == 0 {
            return None;
        }
        let inside = u.h > (u.ho - 1) * u.sh + (u.kh - 1) * u.dh && u.w > u.wo - 1 + (u.kw - 1) * u.dw;
        assert!(inside, "conv_weight_grad: geometry");
        let mut aoff = Vec::with_capacity(u.ho * u.wo);
        for oh in 0..u.ho {
            for ow in 0..u.wo {
                aoff.push((oh * u.sh * u.w + ow) as isize);
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
        Some(WeightGrad { u: *u, level, aoff, koff })
    }

    /// `acc += ` one image group's `dWᵀ` from the image group `img` and `gt = doutᵀ` (rows of `og` contiguous;
    /// `acc` likewise).
    pub(crate) fn run(&self, img: &[f32], gt: &[f32], og: usize, acc: &mut [f32]) {
        let u = &self.u;
        let (k, hw) = (u.cg * u.kh * u.kw, u.ho * u.wo);
        assert!(
            og > 0 && img.len() >= u.cg * u.h * u.w && gt.len() >= hw * og && acc.len() >= k * og,
            "conv_weight_grad: sizes"
        );
        let (lanes, block_n) = if self.level == Level::Avx512 { (16, 64) } else { (8, 16) };
        for j in (0..og).step_by(block_n) {
            let nb = (og - j).min(block_n);
            let nv = nb.div_ceil(lanes);
            for (i, mr) in tile_rows(k) {
                let mut t = Gather {
                    k: hw,
                    a: [img.as_ptr(); BLOCK_M],
                    aoff: self.aoff.as_ptr(),
                    b: gt[j..].as_ptr(),
                    rsb: og as isize,
                    c: acc[i * og + j..].as_mut_ptr(),
                    rsc: og as isize,
                    tail: nb - (nv - 1) * lanes,
                };
                for (r, a) in t.a.iter_mut().enumerate().take(mr) {
                    *a = img[self.koff[i + r]..].as_ptr();
                }
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the level's instructions are present; every tap at every position lies inside the image
                // (checked by `new`), every row of `gt` and `acc` touched inside them (masked lanes never touch
                // memory).
                unsafe {
                    x86::gather(self.level, &t, mr, nv);
                }
            }
        }
    }
}

/// A vector of output positions of a convolution: where it starts in one channel of the output gradient (`src`) and
/// in the (unpadded) image (`dst`), and how many of its lanes are positions.
#[derive(Clone, Copy)]
struct Pos {
    src: usize,
    dst: usize,
    lanes: usize,
}

/// One register tile of a convolution's input gradient added straight into the image gradient (the adjoint of
/// [`Direct`]): `R ≤ 6` rows of `Wᵀ` (row `r` at `a[r]`, its `k` output channels contiguous) by groups of `V`
/// vectors of output positions (`groups` of them at `pos`; vector `v` reads the output gradient at
/// `gout + pos.src + p·rsb` for output channel `p`), each result added into the image gradient at
/// `dx + pos.dst + roff[r]`.
#[allow(dead_code)]
struct Scatter {
    k: usize,
    a: [*const f32; BLOCK_M],
    roff: [isize; BLOCK_M],
    gout: *const f32,
    rsb: usize,
    dx: *mut f32,
    pos: *const Pos,
    groups: usize,
}

/// `Wᵀ` of one group's weights `W[Og, K]` as [`InputGrad`] reads it: row `r` (the `r`-th row of the unfolded
/// matrix, a kernel tap of one input channel) holds its `og` weights contiguously.
pub(crate) fn pack_input_grad(wg: &[f32], og: usize, k: usize, out: &mut [f32]) {
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

/// Input channels per independent piece of [`InputGrad`]: a fixed number, so the order of additions into the
/// image gradient does not depend on how pieces are shared among threads.
const INPUT_GRAD_CHANNELS: usize = 12;

/// The input gradient of one convolution group, computed without the unfolded matrix: the product
/// `dcol = Wᵀ·dout` is formed a register tile at a time and each tile is added straight into the image gradient
/// at its rows' kernel taps — what [`col2im`] does with the whole product, with nothing written in between. Built
/// once per backward (tiles and position vectors), then [`InputGrad::run`] per image.
///
/// Input channels are taken in fixed pieces; within a piece the rows are ordered by kernel column, kernel row, then
/// channel, so the rows of one tile add into different planes or rows, never into partly overlapping runs. Each
/// element of the image gradient takes its contributions in an order set by the geometry alone, so the result is
/// the same whether the pieces run on one thread or several.
pub(crate) struct InputGrad<'a> {
    u: Unfold,
    og: usize,
    wt_t: &'a [f32],
    level: Level,
    max_vecs: usize,
    pos: Vec<Pos>,
    masked: bool,
    /// Per piece: its channel count and its tiles.
    pieces: Vec<(usize, Vec<TileRows>)>,
}

impl<'a> InputGrad<'a> {
    /// The plan for geometry `u` (unpadded — the caller pads — and satisfying [`conv_direct_fits`]) with `og`
    /// output channels and `Wᵀ` packed by [`pack_input_grad`]; `None` without the vector kernels or when the
    /// geometry does not fit.
    pub(crate) fn new(u: &Unfold, og: usize, wt_t: &'a [f32]) -> Option<InputGrad<'a>> {
        let level = level();
        let k = u.cg * u.kh * u.kw;
        if level == Level::Portable || !conv_direct_fits(u) || og == 0 || wt_t.len() < k * og {
            return None;
        }
        let (lanes, max_vecs) = if level == Level::Avx512 { (16, 4) } else { (8, 2) };
        let mut pos = Vec::with_capacity(u.ho * u.wo.div_ceil(lanes));
        for oh in 0..u.ho {
            for ow in (0..u.wo).step_by(lanes) {
                pos.push(Pos { src: oh * u.wo + ow, dst: oh * u.sh * u.w + ow, lanes: (u.wo - ow).min(lanes) });
            }
        }
        let masked = pos.iter().any(|p| p.lanes < lanes);
        let plane = u.h * u.w;
        let mut pieces = Vec::new();
        for c0 in (0..u.cg).step_by(INPUT_GRAD_CHANNELS) {
            let cn = (u.cg - c0).min(INPUT_GRAD_CHANNELS);
            let mut rows = Vec::with_capacity(u.kh * u.kw * cn);
            for kj in 0..u.kw {
                for ki in 0..u.kh {
                    for c in 0..cn {
                        let r = ((c0 + c) * u.kh + ki) * u.kw + kj;
                        rows.push((r, (c * plane + ki * u.dh * u.w + kj * u.dw) as isize));
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
        Some(InputGrad { u: *u, og, wt_t, level, max_vecs, pos, masked, pieces })
    }

    /// `dx[Cg, H, W] +=` the input gradient of one image group from its output gradient `gout[Og, Ho·Wo]`. With
    /// `parallel` (and enough work, outside a rayon task) the pieces of input channels run on several threads.
    pub(crate) fn run(&self, gout: &[f32], dx: &mut [f32], parallel: bool) {
        let (u, og) = (&self.u, self.og);
        let (hw, plane) = (u.ho * u.wo, u.h * u.w);
        assert!(gout.len() >= og * hw && dx.len() >= u.cg * plane, "InputGrad::run: sizes");
        let full = self.pos.len() / self.max_vecs * self.max_vecs;
        let run = |(cn, tiles): &(usize, Vec<TileRows>), dst: &mut [f32]| {
            debug_assert!(dst.len() == cn * plane);
            for tr in tiles {
                let mut t = Scatter {
                    k: og,
                    a: [self.wt_t.as_ptr(); BLOCK_M],
                    roff: tr.roff,
                    gout: gout.as_ptr(),
                    rsb: hw,
                    dx: dst.as_mut_ptr(),
                    pos: self.pos.as_ptr(),
                    groups: full / self.max_vecs,
                };
                for (a, &row) in t.a.iter_mut().zip(&tr.rows[..tr.mr]) {
                    *a = self.wt_t[row * og..].as_ptr();
                }
                // SAFETY: the level's instructions are present; loads stay inside `gout` and `wt_t`, and every tap
                // of every position vector lands inside the piece's planes (`conv_direct_fits`); masked lanes never
                // touch memory.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    if t.groups > 0 {
                        x86::scatter(self.level, &t, tr.mr, self.max_vecs, self.masked);
                    }
                    if full < self.pos.len() {
                        t.pos = self.pos[full..].as_ptr();
                        t.groups = 1;
                        x86::scatter(self.level, &t, tr.mr, self.pos.len() - full, self.masked);
                    }
                }
            }
        };
        let jobs: Vec<_> = self.pieces.iter().zip(dx[..u.cg * plane].chunks_mut(INPUT_GRAD_CHANNELS * plane)).collect();
        run_jobs(jobs, parallel, og * hw * u.cg * u.kh * u.kw, |(piece, d)| run(piece, d));
    }
}

/// One term of [`RowSums::add`]: `scale` times the source rows starting at `off`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub(crate) struct Term {
    pub scale: f32,
    pub off: u32,
}

/// One column block of [`RowSums::add`] (`n` vectors, the last holding `tail` lanes), read by
/// [`x86::scaled_rows`].
#[allow(dead_code)]
struct ScaledRows {
    src: *const f32,
    src_step: usize,
    terms: *const Term,
    count: usize,
    dst: *mut f32,
    dst_step: usize,
    reps: usize,
    tail: usize,
}

/// Vectors of one column block of [`RowSums`]: its accumulators, one broadcast and one loaded vector fit AVX2's
/// 16 registers.
const ROW_BLOCK: usize = 12;

/// Sums of scaled rows of `len` values: a sparse matrix (the terms) times dense rows, the shape a gradient takes
/// when only a few of its entries are nonzero. Built once per row length (the split into column blocks of at most
/// [`ROW_BLOCK`] vectors), then [`RowSums::add`] per sum.
pub(crate) struct RowSums {
    len: usize,
    level: Level,
    /// Per column block: its first column, its vectors and the lanes of its last vector.
    blocks: Vec<(usize, usize, usize)>,
}

impl RowSums {
    pub(crate) fn new(len: usize) -> RowSums {
        let level = level();
        let lanes = if level == Level::Avx512 { 16 } else { 8 };
        let nv = len.div_ceil(lanes);
        let per = nv.div_ceil(nv.div_ceil(ROW_BLOCK).max(1)).max(1);
        let blocks = (0..nv)
            .step_by(per)
            .map(|v0| {
                let n = per.min(nv - v0);
                (v0 * lanes, n, (len - v0 * lanes).min(n * lanes) - (n - 1) * lanes)
            })
            .collect();
        RowSums { len, level, blocks }
    }

    /// For each `r < reps`: `dst[r·dst_step..][..len] += Σₜ t.scale · src[t.off + r·src_step..][..len]`. Each
    /// element's sum is one chain of fused multiply-adds over the terms in order, formed in registers and added to
    /// `dst` once; without the vector kernels, the same chain of plain multiplies and adds.
    ///
    /// # Safety
    /// Every term's rows lie inside `src`: `t.off + (reps − 1)·src_step + len ≤ src.len()`. (`dst` is checked:
    /// this panics when its rows would reach past it.)
    pub(crate) unsafe fn add(
        &self,
        src: &[f32],
        terms: &[Term],
        src_step: usize,
        dst: &mut [f32],
        dst_step: usize,
        reps: usize,
    ) {
        let len = self.len;
        if terms.is_empty() || len == 0 || reps == 0 {
            return;
        }
        let span = |step: usize| (reps - 1) * step + len;
        assert!(span(dst_step) <= dst.len(), "RowSums::add: destination size");
        debug_assert!(terms.iter().all(|t| t.off as usize + span(src_step) <= src.len()), "RowSums::add: terms");
        if self.level == Level::Portable {
            for r in 0..reps {
                let (s, d) = (r * src_step, &mut dst[r * dst_step..][..len]);
                for (j, out) in d.iter_mut().enumerate() {
                    let mut acc = 0.0f32;
                    for t in terms {
                        // SAFETY: inside `src` by the caller's contract.
                        acc += t.scale * unsafe { *src.get_unchecked(t.off as usize + s + j) };
                    }
                    *out += acc;
                }
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        for &(col, n, tail) in &self.blocks {
            let t = ScaledRows {
                src: src.as_ptr().add(col),
                src_step,
                terms: terms.as_ptr(),
                count: terms.len(),
                dst: dst.as_mut_ptr().add(col),
                dst_step,
                reps,
                tail,
            };
            // SAFETY: the level's instructions are present; the rows read lie inside `src` (the caller's
            // contract), those written inside `dst` (checked above); masked lanes never touch memory.
            x86::scaled_rows(self.level, &t, n)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Direct, Gather, Level, ScaledRows, Scatter, Tile, Unfold};
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
        unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
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
        unsafe fn max(a: __m512, b: __m512) -> __m512 {
            _mm512_max_ps(a, b)
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
        unsafe fn max(a: __m256, b: __m256) -> __m256 {
            _mm256_max_ps(a, b)
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
    }

    /// Entry points: each kernel compiled once per instruction set, with that set's features enabled.
    macro_rules! entry_points {
        ($(fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $body:ident;)*) => {
            $(
                pub(super) unsafe fn $name(level: Level, $($arg: $ty),*) $(-> $ret)? {
                    #[target_feature(enable = "avx512f")]
                    unsafe fn wide($($arg: $ty),*) $(-> $ret)? { $body::<Avx512>($($arg),*) }
                    #[target_feature(enable = "avx2,fma")]
                    unsafe fn narrow($($arg: $ty),*) $(-> $ret)? { $body::<Avx2>($($arg),*) }
                    match level {
                        Level::Avx512 => wide($($arg),*),
                        Level::Avx2 => narrow($($arg),*),
                        Level::Portable => unreachable!("callers check the level first"),
                    }
                }
            )*
        };
    }

    entry_points! {
        fn im2col(img: &[f32], u: &Unfold, col: &mut [f32]) = im2col_body;
        fn max_pool_2x2(plane: &[f32], h: usize, w: usize, out: &mut [f32], idx: &mut [u32]) -> bool = pool_body;
        fn max_pool_2x2_backward(plane: &[f32], h: usize, w: usize, out: &[f32], g: &[f32], dx: *mut f32) -> bool
            = pool_backward_body;
        fn relu_max_pool_2x2_expand(h: usize, w: usize, out: &[f32], g: &[f32], idx: &[u32], dx: &mut [f32])
            = pool_expand_body;
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
                for k in 0..4 {
                    let lo = _mm256_permute2f128_ps::<0x20>(tt[k], tt[k + 4]);
                    let hi = _mm256_permute2f128_ps::<0x31>(tt[k], tt[k + 4]);
                    _mm256_storeu_ps(d.add((c0 + k) * rows + r0), lo);
                    _mm256_storeu_ps(d.add((c0 + k + 4) * rows + r0), hi);
                }
            }
        }
    }

    /// `f::<r, v, flag>(t)` for the runtime `r` and `v` among the listed values.
    macro_rules! tile_match {
        ($f:ident, $fl:literal, $t:ident, $r:ident, $v:ident, [$($rr:literal)*], $vs:tt) => {
            match $r { $( $rr => tile_match!(@vecs $f, $fl, $t, $v, $rr, $vs), )* _ => unreachable!("tile rows ≤ 6") }
        };
        (@vecs $f:ident, $fl:literal, $t:ident, $v:ident, $rr:literal, [$($vv:literal)*]) => {
            match $v { $( $vv => $f::<$rr, $vv, $fl>($t), )* _ => unreachable!("tile vectors ≤ 4 (AVX-512) or 2 (AVX2)") }
        };
    }

    /// Runs `$body::<Isa, R, V, FLAG>(t)` for the level's instruction set, specialised for `r` rows, `v` vectors
    /// and the flag (a partial vector present or not).
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
            match ($level, $flag) {
                (Level::Avx512, false) => tile_match!(wide, false, t, r, v, [1 2 3 4 5 6], [1 2 3 4]),
                (Level::Avx512, true) => tile_match!(wide, true, t, r, v, [1 2 3 4 5 6], [1 2 3 4]),
                (Level::Avx2, false) => tile_match!(narrow, false, t, r, v, [1 2 3 4 5 6], [1 2]),
                (Level::Avx2, true) => tile_match!(narrow, true, t, r, v, [1 2 3 4 5 6], [1 2]),
                (Level::Portable, _) => unreachable!("callers check the level first"),
            }
        }};
    }

    /// Runs the product tile kernel specialised for `r` rows and `v` vectors (with a partial last vector or not).
    pub(super) unsafe fn tile(level: Level, t: &Tile, r: usize, v: usize) {
        let tail = t.tail < if level == Level::Avx512 { 16 } else { 8 };
        tile_dispatch!(tile_body, Tile, level, t, r, v, tail)
    }

    /// Runs the weight-gradient tile kernel specialised for `r` rows and `v` vectors (with a partial last vector
    /// or not).
    pub(super) unsafe fn gather(level: Level, t: &Gather, r: usize, v: usize) {
        let tail = t.tail < if level == Level::Avx512 { 16 } else { 8 };
        tile_dispatch!(gather_body, Gather, level, t, r, v, tail)
    }

    /// `R` taps × `V` vectors of `dWᵀ`, accumulated over the output positions in order.
    #[inline(always)]
    unsafe fn gather_body<S: Isa, const R: usize, const V: usize, const TAIL: bool>(t: &Gather) {
        let last = if TAIL { S::lanes(0, t.tail as isize) } else { S::lanes(0, S::LANES as isize) };
        let mut acc = [[S::zero(); V]; R];
        for (r, row) in acc.iter_mut().enumerate() {
            for (v, a) in row.iter_mut().enumerate() {
                *a = ld::<S, V, TAIL>(last, t.c.offset(r as isize * t.rsc).add(S::LANES * v), v);
            }
        }
        let mut bp = t.b;
        for p in 0..t.k {
            let o = *t.aoff.add(p);
            let mut bv = [S::zero(); V];
            for (v, b) in bv.iter_mut().enumerate() {
                *b = ld::<S, V, TAIL>(last, bp.add(S::LANES * v), v);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = S::splat(*t.a[r].offset(o));
                for (a, &b) in row.iter_mut().zip(&bv) {
                    *a = S::fmadd(av, b, *a);
                }
            }
            bp = bp.offset(t.rsb);
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &a) in row.iter().enumerate() {
                let p = t.c.offset(r as isize * t.rsc).add(S::LANES * v);
                if TAIL && v + 1 == V {
                    S::store(last, p, a)
                } else {
                    S::storeu(p, a)
                }
            }
        }
    }

    /// Runs the direct-convolution tile kernel specialised for `r` rows and `v` vectors (masked or not).
    pub(super) unsafe fn direct(level: Level, t: &Direct, r: usize, v: usize) {
        let full = if level == Level::Avx512 { 16 } else { 8 };
        let masked = t.lanes[..v].iter().any(|&l| l < full);
        tile_dispatch!(direct_body, Direct, level, t, r, v, masked)
    }

    /// `R` output channels × `V` vectors of output positions of a convolution, read straight from the image:
    /// row `k` of the virtual im2col matrix is the image at `src[v] + koff[k]`. Each element is one fused
    /// multiply-add chain over `k` in order, started from the bias — the same chain as the im2col product.
    #[inline(always)]
    unsafe fn direct_body<S: Isa, const R: usize, const V: usize, const MASKED: bool>(t: &Direct) {
        // A plain loop, not `array::from_fn`: its closure would not inline into the entry point.
        let mut masks = [S::lanes(0, S::LANES as isize); V];
        if MASKED {
            for (m, &n) in masks.iter_mut().zip(&t.lanes) {
                *m = S::lanes(0, n as isize);
            }
        }
        let mut acc = [[S::zero(); V]; R];
        for (r, row) in acc.iter_mut().enumerate() {
            *row = [S::splat(t.bias[r]); V];
        }
        for kk in 0..t.k {
            let o = *t.koff.add(kk);
            let mut bv = [S::zero(); V];
            for (v, b) in bv.iter_mut().enumerate() {
                let p = t.src[v].offset(o);
                *b = if MASKED { S::load(masks[v], p) } else { S::loadu(p) };
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = S::splat(*t.a.add(r * t.rsa + kk));
                for (a, &b) in row.iter_mut().zip(&bv) {
                    *a = S::fmadd(av, b, *a);
                }
            }
        }
        if t.pool {
            pool_store::<S, R, V>(t, &acc);
            return;
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &a) in row.iter().enumerate() {
                let a = if t.relu { S::max(a, S::zero()) } else { a };
                let p = t.dst[v].add(r * t.rsc);
                if MASKED {
                    S::store(masks[v], p, a)
                } else {
                    S::storeu(p, a)
                }
            }
        }
    }

    /// The pooled store of [`direct_body`]: for each pair of row vectors, the ReLU, then each 2×2 window's maximum
    /// and its first arg-max in row-major order (the smallest window offset among the entries equal to the
    /// maximum) — what [`pool_body`] computes from the stored rows.
    #[inline(always)]
    unsafe fn pool_store<S: Isa, const R: usize, const V: usize>(t: &Direct, acc: &[[S::V; V]; R]) {
        let half = S::LANES / 2;
        let upper = S::not(S::lanes(0, half as isize));
        // Window offsets of the even (left) and odd (right) entries: top row in the lower half, bottom in the upper.
        let offs_even = S::select_i(upper, S::splat_i(t.w as i32), S::splat_i(0));
        let offs_odd = S::add_i(offs_even, S::splat_i(1));
        let none = S::splat_i(i32::MAX);
        for p in 0..V / 2 {
            let n = t.lanes[2 * p] / 2;
            if n == 0 {
                continue;
            }
            let m_out = S::lanes(0, n as isize);
            let base = S::add_i(S::splat_i(t.idx_base[p] as i32), S::evens());
            for (r, row) in acc.iter().enumerate() {
                let (top, bottom) = (S::max(row[2 * p], S::zero()), S::max(row[2 * p + 1], S::zero()));
                let (even, odd) = S::deinterleave(top, bottom);
                let m = S::max(even, odd);
                let m = S::max(m, S::swap_halves(m));
                let q = t.pooled[p].add(r * t.rsp);
                if n == half {
                    S::store_half(q, m)
                } else {
                    S::store(m_out, q, m)
                }
                if !t.idx[p].is_null() {
                    let at = S::min_i(
                        S::select_i(S::eq(even, m), offs_even, none),
                        S::select_i(S::eq(odd, m), offs_odd, none),
                    );
                    let at = S::add_i(S::min_i(at, S::swap_halves_i(at)), base);
                    let at = S::add_i(at, S::splat_i((r as u32 * t.rsi) as i32));
                    let q = t.idx[p].add(r * t.rsp);
                    if n == half {
                        S::store_half_i(q, at)
                    } else {
                        S::store_i(m_out, q, at)
                    }
                }
            }
        }
    }

    /// Runs the input-gradient tile kernel specialised for `r` rows and `v` vectors a group (masked or not).
    pub(super) unsafe fn scatter(level: Level, t: &Scatter, r: usize, v: usize, masked: bool) {
        tile_dispatch!(scatter_body, Scatter, level, t, r, v, masked)
    }

    /// For each group of `V` position vectors in turn: `R` rows of `Wᵀ` × the group's vectors of `Wᵀ·dout` (one
    /// fused multiply-add chain per element over the output channels, in order), each added into the image
    /// gradient at its row's tap offset, row by row.
    #[inline(always)]
    unsafe fn scatter_body<S: Isa, const R: usize, const V: usize, const MASKED: bool>(t: &Scatter) {
        for g in 0..t.groups {
            let pos = std::slice::from_raw_parts(t.pos.add(g * V), V);
            // Plain loops, not `array::from_fn`: its closure would not inline into the entry point.
            let mut masks = [S::lanes(0, S::LANES as isize); V];
            let mut src = [t.gout; V];
            for v in 0..V {
                if MASKED {
                    masks[v] = S::lanes(0, pos[v].lanes as isize);
                }
                src[v] = t.gout.add(pos[v].src);
            }
            let mut acc = [[S::zero(); V]; R];
            for p in 0..t.k {
                let mut bv = [S::zero(); V];
                for (v, b) in bv.iter_mut().enumerate() {
                    let q = src[v].add(p * t.rsb);
                    *b = if MASKED { S::load(masks[v], q) } else { S::loadu(q) };
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = S::splat(*t.a[r].add(p));
                    for (a, &b) in row.iter_mut().zip(&bv) {
                        *a = S::fmadd(av, b, *a);
                    }
                }
            }
            for (r, row) in acc.iter().enumerate() {
                for (v, (&a, &m)) in row.iter().zip(&masks).enumerate() {
                    let q = t.dx.add(pos[v].dst).offset(t.roff[r]);
                    if MASKED {
                        S::store(m, q, S::add(S::load(m, q), a))
                    } else {
                        S::storeu(q, S::add(S::loadu(q), a))
                    }
                }
            }
        }
    }

    /// Runs the scaled-rows kernel specialised for `n ≤ ROW_BLOCK` vectors (with a partial last vector or not).
    pub(super) unsafe fn scaled_rows(level: Level, t: &ScaledRows, n: usize) {
        #[target_feature(enable = "avx512f")]
        unsafe fn wide<const N: usize, const TAIL: bool>(t: &ScaledRows) {
            scaled_rows_body::<Avx512, N, TAIL>(t)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow<const N: usize, const TAIL: bool>(t: &ScaledRows) {
            scaled_rows_body::<Avx2, N, TAIL>(t)
        }
        macro_rules! vectors {
            ($f:ident, $tail:literal) => {
                match n {
                    1 => $f::<1, $tail>(t),
                    2 => $f::<2, $tail>(t),
                    3 => $f::<3, $tail>(t),
                    4 => $f::<4, $tail>(t),
                    5 => $f::<5, $tail>(t),
                    6 => $f::<6, $tail>(t),
                    7 => $f::<7, $tail>(t),
                    8 => $f::<8, $tail>(t),
                    9 => $f::<9, $tail>(t),
                    10 => $f::<10, $tail>(t),
                    11 => $f::<11, $tail>(t),
                    12 => $f::<12, $tail>(t),
                    _ => unreachable!("column blocks hold at most ROW_BLOCK vectors"),
                }
            };
        }
        let full = if level == Level::Avx512 { 16 } else { 8 };
        match (level, t.tail < full) {
            (Level::Avx512, false) => vectors!(wide, false),
            (Level::Avx512, true) => vectors!(wide, true),
            (Level::Avx2, false) => vectors!(narrow, false),
            (Level::Avx2, true) => vectors!(narrow, true),
            (Level::Portable, _) => unreachable!("callers check the level first"),
        }
    }

    /// For each repetition: the `N` vectors of `Σₜ scale·src[off..]` in registers, one fused multiply-add chain per
    /// lane over the terms in order, then added into `dst`.
    #[inline(always)]
    unsafe fn scaled_rows_body<S: Isa, const N: usize, const TAIL: bool>(t: &ScaledRows) {
        let last = if TAIL { S::lanes(0, t.tail as isize) } else { S::lanes(0, S::LANES as isize) };
        let terms = std::slice::from_raw_parts(t.terms, t.count);
        for r in 0..t.reps {
            let src = t.src.add(r * t.src_step);
            let mut acc = [S::zero(); N];
            for term in terms {
                let s = S::splat(term.scale);
                let p = src.add(term.off as usize);
                for (v, a) in acc.iter_mut().enumerate() {
                    *a = S::fmadd(s, ld::<S, N, TAIL>(last, p.add(S::LANES * v), v), *a);
                }
            }
            let d = t.dst.add(r * t.dst_step);
            for (v, &a) in acc.iter().enumerate() {
                let q = d.add(S::LANES * v);
                if TAIL && v + 1 == N {
                    S::store(last, q, S::add(S::load(last, q), a))
                } else {
                    S::storeu(q, S::add(S::loadu(q), a))
                }
            }
        }
    }

    /// Vector `v` of a tile row: the last one masked to `last` with `TAIL`, the others plain moves (a function, not
    /// a closure: it must inline into the entry point for the intrinsics to).
    #[inline(always)]
    unsafe fn ld<S: Isa, const V: usize, const TAIL: bool>(last: S::M, p: *const f32, v: usize) -> S::V {
        if TAIL && v + 1 == V {
            S::load(last, p)
        } else {
            S::loadu(p)
        }
    }

    /// `R` rows × `V` vectors of `c`, one fused multiply-add chain per element over the whole reduction; with
    /// `TAIL` the last vector holds only `t.tail` columns.
    #[inline(always)]
    unsafe fn tile_body<S: Isa, const R: usize, const V: usize, const TAIL: bool>(t: &Tile) {
        let last = if TAIL { S::lanes(0, t.tail as isize) } else { S::lanes(0, S::LANES as isize) };
        let mut acc = [[S::zero(); V]; R];
        if t.accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, a) in row.iter_mut().enumerate() {
                    *a = ld::<S, V, TAIL>(last, t.c.offset(r as isize * t.rsc).add(S::LANES * v), v);
                }
            }
        }
        let (mut ap, mut bp) = (t.a, t.b);
        for _ in 0..t.k {
            let mut bv = [S::zero(); V];
            for (v, b) in bv.iter_mut().enumerate() {
                *b = ld::<S, V, TAIL>(last, bp.add(S::LANES * v), v);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = S::splat(*ap.offset(r as isize * t.rsa));
                for (a, &b) in row.iter_mut().zip(&bv) {
                    *a = S::fmadd(av, b, *a);
                }
            }
            ap = ap.offset(t.csa);
            bp = bp.offset(t.rsb);
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &a) in row.iter().enumerate() {
                let p = t.c.offset(r as isize * t.rsc).add(S::LANES * v);
                if TAIL && v + 1 == V {
                    S::store(last, p, a)
                } else {
                    S::storeu(p, a)
                }
            }
        }
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

    #[inline(always)]
    unsafe fn pool_body<S: Isa>(plane: &[f32], h: usize, w: usize, out: &mut [f32], idx: &mut [u32]) -> bool {
        let (l, ho, wo) = (S::LANES, h / 2, w / 2);
        let all = S::lanes(0, l as isize);
        let p = plane.as_ptr();
        let (below, one) = (S::splat_i(w as i32), S::splat_i(1));
        for i in 0..ho {
            let (top, bottom) = (p.add(2 * i * w), p.add((2 * i + 1) * w));
            let mut j0 = 0;
            while j0 < wo {
                let n = (wo - j0).min(l) as isize;
                let m_out = S::lanes(0, n);
                // 2n input columns from 2·j0, in two masked halves of one vector each — or whole vectors where
                // they stay inside the plane (the extra lanes read the next row and are not used), and whole-vector
                // stores where they stay inside the output (the extra lanes land on outputs of later rows, written
                // again when those come: rows go in address order). Masked moves are slow on some CPUs.
                let inside = (2 * i + 1) * w + 2 * j0 + 2 * l <= h * w;
                let (m_lo, m_hi) =
                    if inside { (all, all) } else { (S::lanes(0, 2 * n), S::lanes(0, 2 * n - l as isize)) };
                let m_store = if i * wo + j0 + l <= ho * wo { all } else { m_out };
                let (t, b) = (top.add(2 * j0), bottom.add(2 * j0));
                let (a, b_) = S::deinterleave(S::load(m_lo, t), S::load(m_hi, t.wrapping_add(l)));
                let (c, d) = S::deinterleave(S::load(m_lo, b), S::load(m_hi, b.wrapping_add(l)));
                let b = b_;
                if !S::is_empty(S::and(S::or(S::unordered(a, b), S::unordered(c, d)), m_out)) {
                    return false;
                }
                let m = S::max(S::max(a, b), S::max(c, d));
                S::store(m_store, out.as_mut_ptr().add(i * wo + j0), m);
                if !idx.is_empty() {
                    // Flat indices of the four window entries; the first entry equal to the maximum wins.
                    let base = S::add_i(S::splat_i((2 * i * w + 2 * j0) as i32), S::evens());
                    let mut at = S::add_i(S::add_i(base, below), one);
                    at = S::select_i(S::eq(c, m), S::add_i(base, below), at);
                    at = S::select_i(S::eq(b, m), S::add_i(base, one), at);
                    at = S::select_i(S::eq(a, m), base, at);
                    S::store_i(m_store, idx.as_mut_ptr().add(i * wo + j0), at);
                }
                j0 += l;
            }
        }
        true
    }

    #[inline(always)]
    unsafe fn pool_backward_body<S: Isa>(
        plane: &[f32],
        h: usize,
        w: usize,
        out: &[f32],
        g: &[f32],
        dx: *mut f32,
    ) -> bool {
        let (l, ho, wo) = (S::LANES, h / 2, w / 2);
        let p = plane.as_ptr();
        for i in 0..ho {
            let (top, bottom) = (p.add(2 * i * w), p.add((2 * i + 1) * w));
            let (dtop, dbottom) = (dx.add(2 * i * w), dx.add((2 * i + 1) * w));
            let mut j0 = 0;
            while j0 < wo {
                let n = (wo - j0).min(l) as isize;
                let m_out = S::lanes(0, n);
                let (m_lo, m_hi) = (S::lanes(0, 2 * n), S::lanes(0, 2 * n - l as isize));
                let (t, b) = (top.add(2 * j0), bottom.add(2 * j0));
                let (a, b_) = S::deinterleave(S::load(m_lo, t), S::load(m_hi, t.wrapping_add(l)));
                let (c, d) = S::deinterleave(S::load(m_lo, b), S::load(m_hi, b.wrapping_add(l)));
                let b = b_;
                if !S::is_empty(S::and(S::or(S::unordered(a, b), S::unordered(c, d)), m_out)) {
                    return false;
                }
                let (m, gv) =
                    (S::load(m_out, out.as_ptr().add(i * wo + j0)), S::load(m_out, g.as_ptr().add(i * wo + j0)));
                // The gradient goes to the first entry equal to the maximum (row-major), as the forward's arg-max.
                let ea = S::eq(a, m);
                let eb = S::and(S::eq(b, m), S::not(ea));
                let seen = S::or(ea, eb);
                let ec = S::and(S::eq(c, m), S::not(seen));
                let ed = S::not(S::or(seen, ec));
                store_windows::<S>(dtop.add(2 * j0), dbottom.add(2 * j0), (m_lo, m_hi), [ea, eb, ec, ed], gv);
                j0 += l;
            }
        }
        zero_outside_windows(dx, h, w);
        true
    }

    /// The gradients `gv` of `LANES` 2×2 windows written into their entries: window lane `i`'s top pair at
    /// `top[2i..2i+2]`, bottom pair at `bottom[2i..2i+2]`, each entry `gv` where its lane set `e` (top left, top
    /// right, bottom left, bottom right) holds the lane, else zero; `m` are the lanes of the two halves to store.
    #[inline(always)]
    unsafe fn store_windows<S: Isa>(top: *mut f32, bottom: *mut f32, m: (S::M, S::M), e: [S::M; 4], gv: S::V) {
        let l = S::LANES;
        let (lo, hi) = S::interleave(S::keep(e[0], gv), S::keep(e[1], gv));
        S::store(m.0, top, lo);
        S::store(m.1, top.wrapping_add(l), hi);
        let (lo, hi) = S::interleave(S::keep(e[2], gv), S::keep(e[3], gv));
        S::store(m.0, bottom, lo);
        S::store(m.1, bottom.wrapping_add(l), hi);
    }

    /// Zeroes the entries of an `h×w` plane that lie in no 2×2 window: an odd last column and an odd last row.
    #[inline(always)]
    unsafe fn zero_outside_windows(dx: *mut f32, h: usize, w: usize) {
        if w % 2 == 1 {
            for i in 0..h / 2 * 2 {
                *dx.add(i * w + w - 1) = 0.0;
            }
        }
        for j in h / 2 * 2 * w..h * w {
            *dx.add(j) = 0.0;
        }
    }

    /// [`pool_expand_body`] for even `h` and `w` with `Wo` a multiple of half a vector: the pooled plane is walked
    /// flat, a whole vector at a time, and each half-vector (which stays inside one pooled row) expands into one
    /// whole vector of each of its two rows — no lanes idle at the end of a row, and no masked stores (only a final
    /// half-vector's loads are masked).
    #[inline(always)]
    unsafe fn pool_expand_packed<S: Isa>(h: usize, w: usize, out: &[f32], g: &[f32], idx: &[u32], dx: &mut [f32]) {
        let (l, half, wo) = (S::LANES, S::LANES / 2, w / 2);
        let total = (h / 2) * wo;
        let (one, below, first) = (S::splat_i(1), S::splat_i(w as i32), S::lanes(0, half as isize));
        let dx = dx.as_mut_ptr();
        let mut f = 0;
        while f < total {
            let n = (total - f).min(l);
            let m_in = S::lanes(0, n as isize);
            let (y, gv) = (S::load(m_in, out.as_ptr().add(f)), S::load(m_in, g.as_ptr().add(f)));
            let arg = S::load_i(m_in, idx.as_ptr().add(f));
            let pos = S::gt(y, S::zero());
            // Each half's first window: its top-left entry, flat in the h×w plane.
            let corner = |k: usize| 2 * ((k / wo) * w + k % wo);
            let (c0, c1) = (corner(f), corner(f + half));
            // Lane t of the lower half names 2t past its corner; of the upper half, 2(t − half).
            let offsets = S::select_i(first, S::splat_i(c0 as i32), S::splat_i(c1 as i32 - l as i32));
            let base = S::add_i(offsets, S::evens());
            let ea = S::and(S::eq_i(arg, base), pos);
            let eb = S::and(S::eq_i(arg, S::add_i(base, one)), pos);
            let ec = S::and(S::eq_i(arg, S::add_i(base, below)), pos);
            let ed = S::and(S::eq_i(arg, S::add_i(S::add_i(base, below), one)), pos);
            let (top_lo, top_hi) = S::interleave(S::keep(ea, gv), S::keep(eb, gv));
            let (bottom_lo, bottom_hi) = S::interleave(S::keep(ec, gv), S::keep(ed, gv));
            S::storeu(dx.add(c0), top_lo);
            S::storeu(dx.add(c0 + w), bottom_lo);
            if n == l {
                S::storeu(dx.add(c1), top_hi);
                S::storeu(dx.add(c1 + w), bottom_hi);
            }
            f += l;
        }
    }

    #[inline(always)]
    unsafe fn pool_expand_body<S: Isa>(h: usize, w: usize, out: &[f32], g: &[f32], idx: &[u32], dx: &mut [f32]) {
        let (l, ho, wo) = (S::LANES, h / 2, w / 2);
        if h.is_multiple_of(2) && w.is_multiple_of(2) && wo.is_multiple_of(l / 2) {
            return pool_expand_packed::<S>(h, w, out, g, idx, dx);
        }
        let (one, below) = (S::splat_i(1), S::splat_i(w as i32));
        let dx = dx.as_mut_ptr();
        for i in 0..ho {
            let (dtop, dbottom) = (dx.add(2 * i * w), dx.add((2 * i + 1) * w));
            let mut j0 = 0;
            while j0 < wo {
                let n = (wo - j0).min(l) as isize;
                let m_out = S::lanes(0, n);
                let (m_lo, m_hi) = (S::lanes(0, 2 * n), S::lanes(0, 2 * n - l as isize));
                let at = i * wo + j0;
                // Whole-vector loads where they stay inside the pooled plane (the extra lanes are not used).
                let m_in = if at + l <= ho * wo { S::lanes(0, l as isize) } else { m_out };
                let (y, gv) = (S::load(m_in, out.as_ptr().add(at)), S::load(m_in, g.as_ptr().add(at)));
                let arg = S::load_i(m_in, idx.as_ptr().add(at));
                // The window entry the arg-max names, where the pooled output (the ReLU's) is positive.
                let pos = S::gt(y, S::zero());
                let base = S::add_i(S::splat_i((2 * i * w + 2 * j0) as i32), S::evens());
                let ea = S::and(S::eq_i(arg, base), pos);
                let eb = S::and(S::eq_i(arg, S::add_i(base, one)), pos);
                let ec = S::and(S::eq_i(arg, S::add_i(base, below)), pos);
                let ed = S::and(S::eq_i(arg, S::add_i(S::add_i(base, below), one)), pos);
                store_windows::<S>(dtop.add(2 * j0), dbottom.add(2 * j0), (m_lo, m_hi), [ea, eb, ec, ed], gv);
                j0 += l;
            }
        }
        zero_outside_windows(dx, h, w);
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
/// contiguous run, copied with masked vector moves that also zero the padding). `false`: no vector kernels, do
/// nothing.
pub(crate) fn im2col(img: &[f32], u: &Unfold, col: &mut [f32]) -> bool {
    let level = level();
    if level == Level::Portable {
        return false;
    }
    assert!(img.len() >= u.cg * u.h * u.w && col.len() >= u.cg * u.kh * u.kw * u.ho * u.wo, "im2col: sizes");
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
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `im2col`.
    unsafe {
        x86::col2im(level, col, u, img);
    }
    true
}

/// 2×2 max pooling with stride 2 of one plane `h×w` (windows inside the plane) into `out[h/2 × w/2]` and the flat
/// arg-max into `idx`: the first maximum of each window in row-major order, as the scalar scan. Planes holding a
/// NaN are left to the caller (`false`), as are CPUs without the vector kernels.
/// An empty `idx` asks for the values only.
pub(crate) fn max_pool_2x2(plane: &[f32], h: usize, w: usize, out: &mut [f32], idx: &mut [u32]) -> bool {
    let (ho, wo) = (h / 2, w / 2);
    let idx_ok = idx.is_empty() || idx.len() >= ho * wo;
    let level = level();
    if level == Level::Portable || plane.len() < h * w || out.len() < ho * wo || !idx_ok || h * w >= 1 << 31 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the level's instructions are present and every access stays inside the slices checked above.
    unsafe {
        x86::max_pool_2x2(level, plane, h, w, out, idx)
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The gradient of [`max_pool_2x2`] for one plane, written densely into every element of `dx[h×w]` (which need
/// not be initialised): each window's output gradient `g` goes to its first entry equal to the pooled maximum
/// `out` (row-major, the forward's arg-max), every other entry gets zero. Recomputing the arg-max here spares the
/// forward the index and the backward a zero fill and a scalar scatter. Planes holding a NaN are left to the
/// caller (`false`, `dx` partly written), as are CPUs without the vector kernels.
pub(crate) fn max_pool_2x2_backward(
    plane: &[f32],
    h: usize,
    w: usize,
    out: &[f32],
    g: &[f32],
    dx: &mut [MaybeUninit<f32>],
) -> bool {
    let (ho, wo) = (h / 2, w / 2);
    let level = level();
    if level == Level::Portable || plane.len() < h * w || dx.len() < h * w || out.len() < ho * wo || g.len() < ho * wo {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the level's instructions are present and every access stays inside the slices checked above.
    unsafe {
        x86::max_pool_2x2_backward(level, plane, h, w, out, g, dx.as_mut_ptr().cast())
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The gradient of a ReLU followed by 2×2 max pooling of stride 2, for one `h×w` plane: every entry of `dx` is
/// written — the pooled gradient `g` at its window's arg-max `idx` (flat in the plane) where the pooled output
/// `out` is positive, zero elsewhere (and in an odd last row or column). `false` (nothing written) without the
/// vector kernels.
pub(crate) fn relu_max_pool_2x2_expand(
    h: usize,
    w: usize,
    out: &[f32],
    g: &[f32],
    idx: &[u32],
    dx: &mut [f32],
) -> bool {
    let (ho, wo) = (h / 2, w / 2);
    let level = level();
    let sizes = dx.len() >= h * w && out.len() >= ho * wo && g.len() >= ho * wo && idx.len() >= ho * wo;
    if level == Level::Portable || !sizes || h * w >= 1 << 31 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the level's instructions are present and every access stays inside the slices checked above.
    unsafe {
        x86::relu_max_pool_2x2_expand(level, h, w, out, g, idx, dx);
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

    /// The pooled gradient goes to each window's arg-max where the pooled output is positive, and every other entry
    /// of the plane is zero (even over garbage): planes whose pooled rows fill whole half-vectors (the packed walk)
    /// and planes that do not, odd sizes included.
    #[test]
    fn pool_expansion_matches_its_definition() {
        use rand::{Rng, SeedableRng};
        if !accelerated() {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for (h, w) in [
            (2, 2),
            (4, 8),
            (8, 8),
            (24, 24),
            (384, 24),
            (256, 8),
            (6, 16),
            (4, 32),
            (2, 24),
            (7, 9),
            (5, 8),
            (8, 7),
            (3, 3),
            (10, 6),
            (12, 20),
        ] {
            let (ho, wo) = (h / 2, w / 2);
            let out: Vec<f32> = (0..ho * wo).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let g: Vec<f32> = (0..ho * wo).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let idx: Vec<u32> = (0..ho * wo)
                .map(|k| ((2 * (k / wo) + rng.random_range(0..2)) * w + 2 * (k % wo) + rng.random_range(0..2)) as u32)
                .collect();
            let mut want = vec![0.0f32; h * w];
            for k in 0..ho * wo {
                if out[k] > 0.0 {
                    want[idx[k] as usize] = g[k];
                }
            }
            let mut got = vec![f32::NAN; h * w];
            assert!(relu_max_pool_2x2_expand(h, w, &out, &g, &idx, &mut got));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{h}×{w}");
        }
    }

    /// Every tile shape (rows 1–6 × vectors 1–4 with masked tails), accumulating or not, with a transposed `a`,
    /// serial and split across threads — against an f64 triple loop.
    #[test]
    fn matches_reference_products() {
        if !accelerated() {
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

    /// Sums of scaled rows: each of `reps` destination rows gains `Σ scale · row` (against the sum in f64), and
    /// nothing outside them changes — row lengths below one vector, with a partial last vector, and over several
    /// column blocks; terms in any order, repeated, and none.
    #[test]
    fn row_sums_match_definition() {
        let src: Vec<f32> = random(1, 4000, 1).into_raw_vec_and_offset().0;
        for (case, &len) in [1usize, 5, 8, 9, 16, 80, 97, 200, 385].iter().enumerate() {
            let sums = RowSums::new(len);
            let (src_step, dst_step, reps) = (len + 3 + case, len + 1, 1 + case % 4);
            let max_off = src.len() - ((reps - 1) * src_step + len);
            let offs = [0, max_off, 7 % (max_off + 1), max_off / 2, 7 % (max_off + 1)];
            let terms: Vec<Term> =
                offs.iter().enumerate().map(|(i, &o)| Term { scale: 0.5 - i as f32 * 0.3, off: o as u32 }).collect();
            let dst0: Vec<f32> = random(1, reps * dst_step + 5, 2 + case as u64).into_raw_vec_and_offset().0;
            for n in [0, 1, terms.len()] {
                let mut dst = dst0.clone();
                // SAFETY: every term's rows lie inside `src` (`max_off` above).
                unsafe { sums.add(&src, &terms[..n], src_step, &mut dst, dst_step, reps) };
                for (j, (&got, &was)) in dst.iter().zip(&dst0).enumerate() {
                    let (r, col) = (j / dst_step, j % dst_step);
                    let want = if r < reps && col < len {
                        let add: f64 = terms[..n]
                            .iter()
                            .map(|t| t.scale as f64 * src[t.off as usize + r * src_step + col] as f64)
                            .sum();
                        was as f64 + add
                    } else {
                        was as f64
                    };
                    assert!((got as f64 - want).abs() <= 1e-5, "len {len}, {n} terms, element {j}: {got} vs {want}");
                }
            }
        }
    }

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

    /// A row of the product is bit-identical whichever other rows are computed with it.
    #[test]
    fn rows_do_not_depend_on_other_rows() {
        if !accelerated() {
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
