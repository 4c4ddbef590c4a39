//! The convolution tile kernels the planners in `ops::conv` drive, all reading the image in place (implicit GEMM):
//! - [`direct`]: a forward tile — output channels × vectors of output positions, each element one fused
//!   multiply-add chain over the kernel taps from the bias, with the ReLU and optionally 2×2 max pooling (value and
//!   arg-max) applied as the tile is stored;
//! - [`gather`]: a weight-gradient tile — kernel taps × vectors of output channels, accumulated over the output
//!   positions;
//! - [`scatter`]: an input-gradient tile — rows of `Wᵀ` × vectors of output positions, added into the image
//!   gradient at the rows' tap offsets.
//!
//! Each takes a descriptor the planner fills (raw pointers and offsets, validated by the planner) and dispatches on
//! the level and the tile's rows and vectors to a body specialised for them (`tile_dispatch!`). x86-64 only: on
//! other targets no plan is ever made.

use super::isa::{clamp, ld, load_tile, store_tile, tile_dispatch, tile_match, Avx2, Avx512, Isa};
use super::{Level, BLOCK_M};

/// One register tile of a direct convolution: `R ≤ 6` output channels (rows of `a`, `rsa` apart, and of the
/// output, `rsc` apart) by `V` vectors of output positions, vector `v` reading the image at `src[v] + koff[k]` for
/// the `k`-th kernel tap and writing `lanes[v]` outputs at `dst[v]`. With a nonzero `gap` every vector is split
/// (for output rows of half a vector): its lower half reads at `src[v] + koff[k]`, its upper half `gap` further
/// on — two output rows in one vector, all lanes used.
pub(crate) struct Direct {
    pub(crate) k: usize,
    pub(crate) a: *const f32,
    pub(crate) rsa: usize,
    pub(crate) koff: *const isize,
    pub(crate) src: [*const f32; 4],
    pub(crate) dst: [*mut f32; 4],
    pub(crate) lanes: [usize; 4],
    pub(crate) rsc: usize,
    pub(crate) gap: usize,
    pub(crate) bias: [f32; BLOCK_M],
    /// The output clamped to `[lo, hi]` as it is stored (`[0, ∞)`: the ReLU), or not.
    pub(crate) clamp: Option<[f32; 2]>,
    /// With 2×2 max pooling in the store (after the ReLU): vectors `2p` and `2p + 1` are two adjacent output rows
    /// of one column run, and instead of `dst` their windows' maxima go to `pooled[p]` (row `r` at `r·rsp`), their
    /// flat arg-max (`idx_base[p] + r·rsi` plus the window entry's offset: 0, 1, `w`, `w + 1`) to `idx[p]` unless
    /// it is null. With split vectors (`gap`), a pair's lower halves are one pair of rows and its upper halves
    /// the next, and the arg-max of the upper half's windows is `jump` further on; their pooled outputs (and
    /// indices) go `pgap` after the lower half's, or right after them when `pgap` is 0.
    pub(crate) pool: bool,
    pub(crate) pooled: [*mut f32; 2],
    pub(crate) idx: [*mut u32; 2],
    pub(crate) idx_base: [u32; 2],
    pub(crate) rsp: usize,
    pub(crate) rsi: u32,
    pub(crate) w: u32,
    pub(crate) jump: u32,
    pub(crate) pgap: usize,
}

/// One register tile of a convolution's weight gradient read straight from the image: `R ≤ 6` kernel taps (rows
/// of `dWᵀ`; tap `r` reads the image at `a[r] + aoff[p]` for output position `p`) by `V` vectors of output
/// channels, accumulated over the `k` output positions into `c`.
pub(crate) struct Gather {
    pub(crate) k: usize,
    pub(crate) a: [*const f32; BLOCK_M],
    pub(crate) aoff: *const isize,
    pub(crate) b: *const f32,
    pub(crate) rsb: isize,
    pub(crate) c: *mut f32,
    pub(crate) rsc: isize,
    pub(crate) tail: usize,
}

/// A vector of output positions of a convolution: where it starts in one channel of the output gradient (`src`) and
/// in the (unpadded) image (`dst`), and how many of its lanes are positions.
#[derive(Clone, Copy)]
pub(crate) struct Pos {
    pub(crate) src: usize,
    pub(crate) dst: usize,
    pub(crate) lanes: usize,
}

/// One register tile of a convolution's input gradient added straight into the image gradient (the adjoint of
/// [`Direct`]): `R ≤ 6` rows of `Wᵀ` (row `r` at `a[r]`, its `k` output channels contiguous) by groups of `V`
/// vectors of output positions (`groups` of them at `pos`; vector `v` reads the output gradient at
/// `gout + pos.src + p·rsb` for output channel `p`), each result added into the image gradient at
/// `dx + pos.dst + roff[r]`.
pub(crate) struct Scatter {
    pub(crate) k: usize,
    pub(crate) a: [*const f32; BLOCK_M],
    pub(crate) roff: [isize; BLOCK_M],
    pub(crate) gout: *const f32,
    pub(crate) rsb: usize,
    pub(crate) dx: *mut f32,
    pub(crate) pos: *const Pos,
    pub(crate) groups: usize,
}

/// Runs the direct-convolution tile kernel specialised for `r` rows and `v` vectors (masked or not).
pub(crate) unsafe fn direct(level: Level, t: &Direct, r: usize, v: usize) {
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
    if !MASKED && t.gap != 0 {
        accumulate::<S, R, V, false, true>(t, &masks, &mut acc);
    } else {
        accumulate::<S, R, V, MASKED, false>(t, &masks, &mut acc);
    }
    if t.pool {
        // Through `black_box`: the pooled store indexes its copy of the tile at run time, and without the copy
        // the accumulators would live in memory for the whole multiply-add loop (a store after every FMA).
        pool_store::<S, R, V>(t, &std::hint::black_box(acc));
        return;
    }
    let bounds = t.clamp.map(|b| b.map(|v| S::splat(v)));
    for (r, row) in acc.iter().enumerate() {
        for (v, &a) in row.iter().enumerate() {
            let a = clamp::<S>(a, bounds);
            let p = t.dst[v].add(r * t.rsc);
            if MASKED {
                S::store(masks[v], p, a)
            } else {
                S::storeu(p, a)
            }
        }
    }
}

/// [`direct_body`]'s multiply-adds over the kernel taps, with plain, masked or split vectors (`SPLIT`: each
/// vector's halves loaded from two places, [`Direct::gap`] apart).
#[inline(always)]
unsafe fn accumulate<S: Isa, const R: usize, const V: usize, const MASKED: bool, const SPLIT: bool>(
    t: &Direct,
    masks: &[S::M; V],
    acc: &mut [[S::V; V]; R],
) {
    for kk in 0..t.k {
        let o = *t.koff.add(kk);
        let mut bv = [S::zero(); V];
        for (v, b) in bv.iter_mut().enumerate() {
            let p = t.src[v].offset(o);
            *b = if SPLIT {
                S::load_halves(p, p.add(t.gap))
            } else if MASKED {
                S::load(masks[v], p)
            } else {
                S::loadu(p)
            };
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let av = S::splat(*t.a.add(r * t.rsa + kk));
            for (a, &b) in row.iter_mut().zip(&bv) {
                *a = S::fmadd(av, b, *a);
            }
        }
    }
}

/// The pooled store of [`direct_body`]: for each pair of row vectors, the ReLU, then each 2×2 window's maximum
/// and its first arg-max in row-major order (the smallest window offset among the entries equal to the
/// maximum) — what the 2×2 pooling kernel (`simd::pool`) computes from the stored rows.
#[inline(always)]
unsafe fn pool_store<S: Isa, const R: usize, const V: usize>(t: &Direct, acc: &[[S::V; V]; R]) {
    let half = S::LANES / 2;
    let upper = S::not(S::lanes(0, half as isize));
    // Window offsets of the even (left) and odd (right) entries: top row in the lower half, bottom in the upper.
    let offs_even = S::select_i(upper, S::splat_i(t.w as i32), S::splat_i(0));
    let offs_odd = S::add_i(offs_even, S::splat_i(1));
    let none = S::splat_i(i32::MAX);
    // Split vectors: the upper quarter of the result lanes holds the next pooled row, `jump` further on.
    let quarter = half as isize / 2;
    let jump = S::select_i(S::lanes(quarter, half as isize), S::splat_i(t.jump as i32), S::splat_i(0));
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
            if t.pgap != 0 {
                S::store(S::lanes(0, quarter), q, m);
                S::store(S::lanes(quarter, half as isize), q.add(t.pgap - quarter as usize), m);
            } else if n == half {
                S::store_half(q, m)
            } else {
                S::store(m_out, q, m)
            }
            if !t.idx[p].is_null() {
                let at =
                    S::min_i(S::select_i(S::eq(even, m), offs_even, none), S::select_i(S::eq(odd, m), offs_odd, none));
                let at = S::add_i(S::add_i(S::min_i(at, S::swap_halves_i(at)), base), jump);
                let at = S::add_i(at, S::splat_i((r as u32 * t.rsi) as i32));
                let q = t.idx[p].add(r * t.rsp);
                if t.pgap != 0 {
                    S::store_i(S::lanes(0, quarter), q, at);
                    S::store_i(S::lanes(quarter, half as isize), q.add(t.pgap - quarter as usize), at);
                } else if n == half {
                    S::store_half_i(q, at)
                } else {
                    S::store_i(m_out, q, at)
                }
            }
        }
    }
}

/// Runs the weight-gradient tile kernel specialised for `r` rows and `v` vectors (with a partial last vector
/// or not).
pub(crate) unsafe fn gather(level: Level, t: &Gather, r: usize, v: usize) {
    let tail = t.tail < if level == Level::Avx512 { 16 } else { 8 };
    tile_dispatch!(gather_body, Gather, level, t, r, v, tail)
}

/// `R` taps × `V` vectors of `dWᵀ`, accumulated over the output positions in order.
#[inline(always)]
unsafe fn gather_body<S: Isa, const R: usize, const V: usize, const TAIL: bool>(t: &Gather) {
    let last = if TAIL { S::lanes(0, t.tail as isize) } else { S::lanes(0, S::LANES as isize) };
    let mut acc = load_tile::<S, R, V, TAIL>(last, t.c, t.rsc);
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
    store_tile::<S, R, V, TAIL>(last, t.c, t.rsc, &acc);
}

/// Runs the input-gradient tile kernel specialised for `r` rows and `v` vectors a group (masked or not).
pub(crate) unsafe fn scatter(level: Level, t: &Scatter, r: usize, v: usize, masked: bool) {
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
