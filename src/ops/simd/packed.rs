//! The packed, cache-blocked product `c (+)= a·b` for large operands of any strides ([`gemm_packed`]), in the
//! manner of BLIS: `b` is packed once per call into slivers of one register tile's width (contiguous over the whole
//! reduction, zero-padded), and each job packs its block of rows of `a`, one `kc`-long piece of the reduction at a
//! time, into panels of the tile's 6 rows (6 values a step, contiguous). The piece of a sliver (`kc ×` 64 floats on
//! AVX-512, 32 KB) stays in L1 while every row tile of the block passes over it, and the block of `a` (at most
//! [`MC`] rows × `kc`) stays in L2 while the slivers pass; the register tile is `gemm_nn`'s 6 rows × four 16-lane
//! vectors (AVX-512) or × two 8-lane vectors (AVX2), here with constant strides: per step, unmasked vector loads
//! from the sliver, broadcasts from the panel, nothing else. With fewer than [`PACK_A_COLS`] columns (a `Linear`
//! layer's outputs, or its few rows when computed transposed) `a` is read in place instead, by broadcasts that
//! take any strides: packing it would cost about as much as using it. Packing buffers are per thread and reused,
//! so a product does not page in fresh memory.
//!
//! The work is shared out in blocks of whole row tiles (and whole slivers when there are few rows), as many as
//! evenly fill the pool's threads.
//!
//! The rounding is exactly that of `gemm_nn`: each output element is one fused multiply-add chain over `k` in
//! order, started from zero (or from `c` when accumulating); a piece of the reduction stores the chain's value
//! to `c` and the next piece reloads it, which continues the same chain. So the result does not depend on the
//! blocking, on the other rows (a classifier's output does not depend on its batch), on the thread count, or on
//! which of the two kernels a shape goes to.

use ndarray::{ArrayView2, ArrayViewMut2};

use super::{level, Level};

/// Most rows of `c` per job block (a multiple of the register tile's 6 rows): their packed piece of `a`,
/// `MC × kc`, stays in L2 while every sliver of `b` passes over it.
#[cfg(target_arch = "x86_64")]
const MC: usize = 96;

/// From this many columns of `c` on, `a` is packed too (each piece once per job, reused by every sliver of `b`);
/// with fewer, a tile's broadcasts read it in place: packing a piece of `a` costs about as much as a few slivers'
/// multiply-adds with it, so below this width it measured slower (a `Linear` layer of 128–512 outputs at batch
/// 1000: 10–20%).
#[cfg(target_arch = "x86_64")]
const PACK_A_COLS: usize = 768;

/// What a float of `c` copied across (from a buffer into a `c` whose rows are not contiguous) costs, in floats
/// packed: ConvNeXt-T's input gradient through its last stage's `3072 → 768` weight, `196 × 768` by `768 × 3072`,
/// ran at 96 GFLOP/s flipped (with the copy, chosen when the copy counted once) and 146–176 as it is.
#[cfg(target_arch = "x86_64")]
const COPY_COST: usize = 4;

/// Whether `c = a·b` (`m × k` by `k × n`) runs as `cᵀ = bᵀ·aᵀ`: whichever orientation moves fewer floats.
/// The product packs all of its `b` (`k ×` its columns) on every call, and a `c` whose rows are not contiguous is
/// computed into a buffer and copied across — each float of that copy counted [`COPY_COST`] times, a strided
/// write costing that much more than a packed one. So a classifier chunk's 32 rows through a `Linear` layer of
/// 256 outputs put the chunk in `b` (25,000 floats packed, 8,000 copied, instead of the whole 200,000-float weight
/// packed on every chunk), while a square product keeps a row-major `c`. Not when the flipped product would read
/// its `a` (this `b`, transposed) in place across rows — fewer than [`PACK_A_COLS`] columns of `cᵀ` and `b`'s rows
/// not contiguous columns of it: every broadcast then lands on another cache line (ConvNeXt-T's last stage, 196
/// rows through a row-major `768 × 3072` weight, ran at half the speed flipped).
#[cfg(target_arch = "x86_64")]
fn flip(m: usize, k: usize, n: usize, b_strides: &[isize], c_strides: &[isize]) -> bool {
    let copy = |contiguous: bool| if contiguous { 0 } else { COPY_COST * m * n };
    let as_is = k * n + copy(n == 1 || c_strides[1] == 1);
    let flipped = k * m + copy(m == 1 || c_strides[0] == 1);
    let strided_in_place = m < PACK_A_COLS && k > 1 && n > 1 && b_strides[0] != 1;
    flipped < as_is && !strided_in_place
}

/// `c = a·b`, or `c += a·b` when `accumulate`, for any strides of `a`, `b` and `c`. Returns `false` without
/// touching `c` when the CPU has neither instruction set.
pub(crate) fn gemm_packed(
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
    if super::gemm::empty_product(k, &mut c, accumulate) {
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // Compute cᵀ = bᵀ·aᵀ when that is cheaper (each element is the same chain, a multiply-add being
        // symmetric): see [`flip`].
        let (a, b) = (a.reborrow(), b.reborrow());
        let flip = flip(m, k, n, b.strides(), c.strides());
        let (a, b, c) = if flip { (b.reversed_axes(), a.reversed_axes(), c.reversed_axes()) } else { (a, b, c) };
        with_contiguous_rows(c, accumulate, |c| x86::gemm(level, a, b, c, accumulate, parallel));
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = parallel;
        unreachable!("off x86-64 the level is always `Portable`")
    }
}

/// `f` on `c` when its rows are contiguous, else on a row-major copy (of `c` when accumulating) copied back after.
#[cfg(target_arch = "x86_64")]
fn with_contiguous_rows(mut c: ArrayViewMut2<f32>, accumulate: bool, f: impl FnOnce(ArrayViewMut2<f32>)) {
    if c.ncols() == 1 || c.strides()[1] == 1 {
        f(c);
    } else {
        let mut tmp = if accumulate { c.as_standard_layout().into_owned() } else { ndarray::Array2::zeros(c.dim()) };
        f(tmp.view_mut());
        c.assign(&tmp);
    }
}

/// A right-hand operand `b` (`k × n`) packed once for many products ([`gemm_prepacked`]): a weight's packed form,
/// kept with the weight ([`crate::tensor::Tensor::derived`]) so that an attack's passes do not repack it on every
/// call — ViT-B/16's MLP weights are 2.4 M floats each, ConvNeXt-T's last stage's too. The layout is the one
/// [`gemm_packed`] packs into on the instruction set of this process (fixed at start-up).
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    data: Vec<f32>,
}

/// `b` packed for [`gemm_prepacked`], or `None` when the CPU has neither instruction set.
pub(crate) fn pack(b: ArrayView2<f32>) -> Option<PackedB> {
    let level = level();
    if level == Level::Portable {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let (k, n) = b.dim();
        let w = x86::tile_cols(level);
        let mut data = vec![0.0; n.div_ceil(w) * k * w];
        // Split across threads from about as many floats as a product packs in parallel for (`PAR_WORK`
        // multiply-adds over a sliver's 64 columns).
        x86::pack_b(w, b, &mut data, k * n >= super::PAR_WORK / 64);
        Some(PackedB { k, n, data })
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("off x86-64 the level is always `Portable`")
}

/// `c = a·b` (or `c += a·b`) with `b` packed beforehand ([`pack`]): the same multiply-add chains, so the same bits,
/// as [`gemm_packed`] of the unpacked `b`, in `b`'s orientation (nothing to pack, so none is cheaper).
///
/// With `bias` (`n` values, not with `accumulate`), column `j`'s chains start at `bias[j]`: `c = bias + a·b` with
/// no pass of its own (a `Linear` layer's or an ONNX MatMul's bias).
pub(crate) fn gemm_prepacked(
    a: ArrayView2<f32>,
    b: &PackedB,
    c: ArrayViewMut2<f32>,
    accumulate: bool,
    bias: Option<&[f32]>,
    parallel: bool,
) {
    gemm_prepacked_then(a, b, c, accumulate, bias, parallel, None)
}

/// Work on each row of a block of `c` once the block's product is complete, while it is in cache: `(row, first
/// column, the row's columns of the block)`. It runs in the ordinary floating-point mode (not the kernels'
/// flush-to-zero), so it gives the bits of the same work done in a pass after the product.
pub(crate) type RowsAfter<'a> = &'a (dyn Fn(usize, usize, &mut [f32]) + Sync);

/// [`gemm_prepacked`], then `after` on every row of `c`, block by block as each block's product completes (an
/// elementwise backward fused into the product that makes its gradient: the gradient is not written out and read
/// back).
pub(crate) fn gemm_prepacked_then(
    a: ArrayView2<f32>,
    b: &PackedB,
    mut c: ArrayViewMut2<f32>,
    accumulate: bool,
    bias: Option<&[f32]>,
    parallel: bool,
    after: Option<RowsAfter>,
) {
    let (m, k) = a.dim();
    let rows_after = |c: &mut ArrayViewMut2<f32>| {
        if let Some(f) = after {
            for (i, mut row) in c.rows_mut().into_iter().enumerate() {
                match row.as_slice_mut() {
                    Some(r) => f(i, 0, r),
                    None => {
                        let mut r = row.to_vec();
                        f(i, 0, &mut r);
                        row.assign(&ndarray::ArrayView1::from(&r));
                    }
                }
            }
        }
    };
    assert!(k == b.k && c.dim() == (m, b.n), "gemm_prepacked: callers check shapes");
    assert!(bias.is_none_or(|v| v.len() == b.n && !accumulate), "gemm_prepacked: a bias per column, not accumulating");
    if let (0, Some(v)) = (k, bias) {
        c.rows_mut().into_iter().for_each(|mut row| row.assign(&ndarray::ArrayView1::from(v)));
        return rows_after(&mut c);
    }
    if super::gemm::empty_product(k, &mut c, accumulate) {
        return rows_after(&mut c);
    }
    #[cfg(target_arch = "x86_64")]
    {
        let level = level();
        with_contiguous_rows(c, accumulate, |c| x86::run(level, a, &b.data, c, accumulate, bias, parallel, after));
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (parallel, accumulate, bias, m);
        unreachable!("a `PackedB` is only made on x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::cell::Cell;

    use ndarray::{ArrayView2, ArrayViewMut2};

    use super::super::gemm::x86::{reduce_prefetching, start_at_cols, tile, Prefetch, Tile};
    use super::super::isa::{load_tile, store_tile, tile_dispatch, tile_match, Avx2, Avx512, Isa, PlainFloats};
    use super::super::{run_jobs, tile_rows, Level, BLOCK_M};
    use super::{MC, PACK_A_COLS};

    /// Columns of one register tile (and of a packed sliver of `b`).
    pub(super) fn tile_cols(level: Level) -> usize {
        if level == Level::Avx512 {
            64
        } else {
            16
        }
    }

    /// Length of one piece of the reduction: a sliver of `b` over it (`kc ×` tile width) stays in L1 (32 KB of
    /// the 48 on AVX-512) while every row tile of the block reads it. With `a` read in place a piece twice as long
    /// (64 KB) measured faster while every tile drained the pipeline on entry (`FlushSubnormals`); without the
    /// drain the L1-sized piece is the faster one (single thread, GFLOP/s, 256 → 128: `196 × 1024 × 256` 75–130 →
    /// 132–141, `784 × 512 × 128` 120–140 → 143–155, `1000 × 784 × 256` 127–140 → 131–147; ResNet-50's forward +
    /// ∂x 1–3% faster).
    fn kc(level: Level) -> usize {
        if level == Level::Avx512 {
            128
        } else {
            256
        }
    }

    thread_local! {
        /// The packed `b` of the product this thread runs (reused, so a product does not page in fresh memory).
        static PACKED_B: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
        /// The packed block of `a` of the job this thread runs.
        static PANELS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    }

    /// The length of this thread's packed `b` (the largest it has packed so far).
    #[cfg(test)]
    pub(super) fn packed_b_len() -> usize {
        let buf = PACKED_B.take();
        let len = buf.len();
        PACKED_B.set(buf);
        len
    }

    /// Scratch buffers larger than this (in floats) are freed after use instead of kept for the next product.
    const KEEP: usize = 1 << 24;

    /// `f` on `len` floats of the thread's buffer `slot` (contents unspecified). A product that starts while
    /// another holds the buffer on this thread (a task stolen while waiting) gets a fresh one.
    fn with_scratch<R>(
        slot: &'static std::thread::LocalKey<Cell<Vec<f32>>>,
        len: usize,
        f: impl FnOnce(&mut [f32]) -> R,
    ) -> R {
        let mut buf = slot.take();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        let out = f(&mut buf[..len]);
        if buf.len() <= KEEP {
            slot.set(buf);
        }
        out
    }

    /// Raw operands of one product; `c` has contiguous rows.
    #[derive(Clone, Copy)]
    struct Product {
        a: *const f32,
        rsa: isize,
        csa: isize,
        packed_b: *const f32,
        c: *mut f32,
        rsc: isize,
        k: usize,
        accumulate: bool,
        /// Where column `j`'s chains start (`bias[j]`), or null: from zero (or `c` when accumulating).
        bias: *const f32,
        pack_a: bool,
        level: Level,
    }

    // SAFETY: the pointers come from views (and a buffer) that outlive the product; concurrent jobs write
    // disjoint blocks of `c` and only read the rest.
    unsafe impl Send for Product {}
    unsafe impl Sync for Product {}

    pub(super) fn gemm(
        level: Level,
        a: ArrayView2<f32>,
        b: ArrayView2<f32>,
        c: ArrayViewMut2<f32>,
        accumulate: bool,
        parallel: bool,
    ) {
        let ((m, k), n) = (a.dim(), b.ncols());
        let work = m * n * k;
        let w = tile_cols(level);
        with_scratch(&PACKED_B, n.div_ceil(w) * k * w, |packed| {
            pack_b(w, b, packed, parallel && work >= super::super::PAR_WORK);
            run(level, a, packed, c, accumulate, None, parallel, None);
        });
    }

    /// `c (+)= a·b` with `b` packed by [`pack_b`] into `packed` (`c`'s columns wide, `a`'s columns deep), the
    /// chains started at `bias` (one value per column) when given; then `after` on each job's rows of `c`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        level: Level,
        a: ArrayView2<f32>,
        packed: &[f32],
        mut c: ArrayViewMut2<f32>,
        accumulate: bool,
        bias: Option<&[f32]>,
        parallel: bool,
        after: Option<super::RowsAfter>,
    ) {
        let ((m, k), n) = (a.dim(), c.ncols());
        let w = tile_cols(level);
        assert!(packed.len() >= n.div_ceil(w) * k * w, "the packed `b` holds every sliver");
        let p = Product {
            a: a.as_ptr(),
            rsa: a.strides()[0],
            csa: a.strides()[1],
            packed_b: packed.as_ptr(),
            c: c.as_mut_ptr(),
            rsc: c.strides()[0],
            k,
            accumulate,
            bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
            pack_a: n >= PACK_A_COLS,
            level,
        };
        run_jobs(jobs(m, n, w, parallel), parallel, m * n * k, |(i, mc, j, nc)| {
            // SAFETY: jobs cover disjoint blocks of `c`; the operands are valid for the product's shape.
            unsafe { p.block(i, mc, j, nc) };
            if let Some(f) = after {
                let _plain = PlainFloats::on();
                for r in i..i + mc {
                    // SAFETY: row `r`'s columns `j..j + nc` are this job's (rows of `c` are contiguous), written
                    // by the product just now; no other job touches them.
                    let row = unsafe { std::slice::from_raw_parts_mut(p.c.offset(r as isize * p.rsc).add(j), nc) };
                    f(r, j, row);
                }
            }
        });
    }

    /// The blocks of `c` the work is shared out in, `(first row, rows, first column, columns)`: rows in blocks of
    /// whole register tiles, at most [`MC`] rows and as even as can be, in a multiple of the pool's threads when
    /// `parallel`; split by columns too (whole slivers of `w`) while there are fewer than two blocks per thread.
    /// The split changes only which thread computes an element, never how, so results do not depend on it.
    fn jobs(m: usize, n: usize, w: usize, parallel: bool) -> Vec<(usize, usize, usize, usize)> {
        let threads = if parallel { rayon::current_num_threads().max(1) } else { 1 };
        let tiles = m.div_ceil(BLOCK_M);
        let mut row_parts = tiles.div_ceil(MC / BLOCK_M).max(1);
        if threads > 1 {
            row_parts = row_parts.div_ceil(threads) * threads;
        }
        let row_parts = row_parts.min(tiles);
        let slivers = n.div_ceil(w);
        let col_parts = if threads > 1 { (2 * threads).div_ceil(row_parts).clamp(1, slivers) } else { 1 };
        let mut jobs = Vec::with_capacity(row_parts * col_parts);
        for rp in 0..row_parts {
            let (t0, t1) = (rp * tiles / row_parts, (rp + 1) * tiles / row_parts);
            let (i0, i1) = (t0 * BLOCK_M, (t1 * BLOCK_M).min(m));
            for cp in 0..col_parts {
                let (s0, s1) = (cp * slivers / col_parts, (cp + 1) * slivers / col_parts);
                let (j0, j1) = (s0 * w, (s1 * w).min(n));
                if i1 > i0 && j1 > j0 {
                    jobs.push((i0, i1 - i0, j0, j1 - j0));
                }
            }
        }
        jobs
    }

    /// `b` packed into `out` as slivers of `w` columns: sliver `s` holds columns `s·w..(s+1)·w` as `k` rows of
    /// `w` contiguous values, zero beyond `n`.
    pub(super) fn pack_b(w: usize, b: ArrayView2<f32>, out: &mut [f32], parallel: bool) {
        let (k, n) = b.dim();
        let (rs, cs) = (b.strides()[0], b.strides()[1]);
        let ptr = b.as_ptr() as usize;
        let jobs: Vec<(usize, &mut [f32])> = out.chunks_exact_mut(k * w).enumerate().collect();
        run_jobs(jobs, parallel, usize::MAX, |(s, dst)| {
            let ptr = ptr as *const f32;
            let (j0, cols) = (s * w, (n - s * w).min(w));
            if cs == 1 || k == 1 {
                for (p, row) in dst.chunks_exact_mut(w).enumerate() {
                    // SAFETY: row p, columns j0..j0 + cols lie inside `b` (contiguous when cs == 1, or one row).
                    let src = unsafe { std::slice::from_raw_parts(ptr.offset(p as isize * rs + j0 as isize), cols) };
                    if cs == 1 {
                        row[..cols].copy_from_slice(src);
                    } else {
                        for (q, d) in row[..cols].iter_mut().enumerate() {
                            // SAFETY: (0, j0 + q) lies inside `b`.
                            *d = unsafe { *ptr.offset((j0 + q) as isize * cs) };
                        }
                    }
                    row[cols..].fill(0.0);
                }
            } else if rs == 1 && cs > 0 {
                // A transposed matrix (rows of `bᵀ` contiguous): the sliver is its `cols × k` block transposed,
                // in 8×8 blocks in registers.
                // SAFETY: rows `j0..j0 + cols` of `bᵀ` (`cs` apart, `k` long) lie inside `b`; the sliver holds
                // `k` rows of `w ≥ cols`; both vector levels have AVX2.
                unsafe {
                    crate::ops::simd::transpose_strided(
                        ptr.offset(j0 as isize * cs),
                        cs as usize,
                        dst.as_mut_ptr(),
                        w,
                        cols,
                        k,
                    )
                };
                for row in dst.chunks_exact_mut(w) {
                    row[cols..].fill(0.0);
                }
            } else {
                for (p, row) in dst.chunks_exact_mut(w).enumerate() {
                    for (q, d) in row[..cols].iter_mut().enumerate() {
                        // SAFETY: (p, j0 + q) lies inside `b`.
                        *d = unsafe { *ptr.offset(p as isize * rs + (j0 + q) as isize * cs) };
                    }
                    row[cols..].fill(0.0);
                }
            }
        });
    }

    /// One register tile over packed operands: `k` steps of a panel of `a` (6 values a step) and of a sliver of
    /// `b` (one tile width a step); `c`'s last vector holds `tail` columns.
    pub(super) struct Packed {
        pub(super) k: usize,
        pub(super) a: *const f32,
        pub(super) b: *const f32,
        pub(super) c: *mut f32,
        pub(super) rsc: isize,
        pub(super) tail: usize,
        pub(super) accumulate: bool,
        /// Unless null (or `accumulate`), column `j`'s chains start at `cols[j]`.
        pub(super) cols: *const f32,
        /// What to fetch into L1 meanwhile (this tile's share of the next sliver).
        pub(super) prefetch: Prefetch,
    }

    /// Runs [`packed_body`] specialised for `r` rows and `v` vectors.
    pub(super) unsafe fn packed_tile(level: Level, t: &Packed, r: usize, v: usize) {
        let tail = t.tail < if level == Level::Avx512 { 16 } else { 8 };
        tile_dispatch!(packed_body, Packed, level, t, r, v, tail)
    }

    /// `R` rows × `V` vectors of `c`, one fused multiply-add chain per element over the piece: `gemm_nn`'s tile
    /// body with the packed operands' strides as constants, so each step is `V` loads, `R` broadcasts and `R·V`
    /// multiply-adds with no address arithmetic but two increments.
    #[inline(always)]
    unsafe fn packed_body<S: Isa, const R: usize, const V: usize, const TAIL: bool>(t: &Packed) {
        let w: isize = if S::LANES == 16 { 64 } else { 16 };
        let last = if TAIL { S::lanes(0, t.tail as isize) } else { S::lanes(0, S::LANES as isize) };
        let mut acc = if t.accumulate { load_tile::<S, R, V, TAIL>(last, t.c, t.rsc) } else { [[S::zero(); V]; R] };
        if !t.accumulate && !t.cols.is_null() {
            start_at_cols::<S, R, V, TAIL>(&mut acc, last, t.cols);
        }
        reduce_prefetching::<S, R, V, TAIL>(&mut acc, last, t.k, (t.a, 1, BLOCK_M as isize), (t.b, w), t.prefetch);
        store_tile::<S, R, V, TAIL>(last, t.c, t.rsc, &acc);
    }

    impl Product {
        /// Rows `i..i + mc` × columns `p0..p0 + kc` of `a` packed into `dst` as panels of at most [`BLOCK_M`]
        /// rows, one per register tile of [`tile_rows`] (49 rows: four of 6 and five of 5, not eight of 6 and a
        /// one-row tile that cannot hide the multiply-add latency): panel `t` holds its tile's rows as `kc` groups of 6
        /// values (zero past the tile's rows), so a tile's broadcasts walk contiguous memory.
        unsafe fn pack_a(&self, i: usize, mc: usize, p0: usize, kc: usize, dst: &mut [f32]) {
            for (panel, (r0, rows)) in dst.chunks_exact_mut(BLOCK_M * kc).zip(tile_rows(mc)) {
                let src = self.a.offset((i + r0) as isize * self.rsa + p0 as isize * self.csa);
                let mut rows_at = [src; BLOCK_M];
                for (r, at) in rows_at.iter_mut().enumerate().take(rows) {
                    *at = src.offset(r as isize * self.rsa);
                }
                let d = panel.as_mut_ptr();
                if self.csa == 1 {
                    for p in 0..kc {
                        for (r, at) in rows_at.iter().enumerate() {
                            *d.add(p * BLOCK_M + r) = if r < rows { *at.add(p) } else { 0.0 };
                        }
                    }
                } else {
                    for p in 0..kc {
                        for (r, at) in rows_at.iter().enumerate() {
                            *d.add(p * BLOCK_M + r) = if r < rows { *at.offset(p as isize * self.csa) } else { 0.0 };
                        }
                    }
                }
            }
        }

        /// Rows `i..i + mc` × columns `j..j + nc` of `c` (`j` a multiple of the tile width): per piece of the
        /// reduction, the rows' block of `a` packed once (it stays in L2), then each sliver of `b` (in L1) times
        /// every row tile, the row tiles fetching the next sliver (or the next piece's first) into L1 meanwhile.
        unsafe fn block(&self, i: usize, mc: usize, j: usize, nc: usize) {
            let w = tile_cols(self.level);
            let kc_max = kc(self.level).min(self.k);
            let len = if self.pack_a { mc.div_ceil(BLOCK_M) * BLOCK_M * kc_max } else { 0 };
            // The piece `p0..` of the sliver holding column `jj`, as cache lines.
            let piece = |jj: usize, p0: usize| Prefetch {
                at: self.packed_b.add((jj / w) * self.k * w + p0 * w),
                lines: (self.k - p0).min(kc_max) * w / 16,
            };
            with_scratch(&PANELS, len, |panels| {
                for p0 in (0..self.k).step_by(kc_max) {
                    let kc = (self.k - p0).min(kc_max);
                    if self.pack_a {
                        self.pack_a(i, mc, p0, kc, panels);
                    }
                    for jj in (j..j + nc).step_by(w) {
                        let next = if jj + w < j + nc {
                            piece(jj + w, p0)
                        } else if p0 + kc < self.k {
                            piece(j, p0 + kc)
                        } else {
                            Prefetch::NONE
                        };
                        self.sliver(i, mc, jj, (j + nc - jj).min(w), p0, kc, panels, next);
                    }
                }
            });
        }

        /// Rows `i..i + mc` × the `cols` columns from `jj` of `c`, over the piece `p0..p0 + kc` of the reduction;
        /// the row tiles fetch an even share each of `next`.
        #[allow(clippy::too_many_arguments)]
        unsafe fn sliver(
            &self,
            i: usize,
            mc: usize,
            jj: usize,
            cols: usize,
            p0: usize,
            kc: usize,
            panels: &[f32],
            next: Prefetch,
        ) {
            let (w, lanes) = (tile_cols(self.level), if self.level == Level::Avx512 { 16 } else { 8 });
            let nv = cols.div_ceil(lanes);
            let tail = cols - (nv - 1) * lanes;
            let load = self.accumulate || p0 > 0;
            // The first piece of the reduction starts the chains at the bias, the next ones continue them from `c`.
            let cols = if load || self.bias.is_null() { std::ptr::null() } else { self.bias.add(jj) };
            let sliver = self.packed_b.add((jj / w) * self.k * w + p0 * w);
            let tiles = tile_rows(mc).count();
            for (t, (r0, mr)) in tile_rows(mc).enumerate() {
                let c = self.c.offset((i + r0) as isize * self.rsc).add(jj);
                let (l0, l1) = (t * next.lines / tiles, (t + 1) * next.lines / tiles);
                let prefetch = Prefetch { at: next.at.wrapping_add(l0 * 16), lines: l1 - l0 };
                if self.pack_a {
                    let a = panels.as_ptr().add(t * BLOCK_M * kc);
                    let t = Packed { k: kc, a, b: sliver, c, rsc: self.rsc, tail, accumulate: load, cols, prefetch };
                    packed_tile(self.level, &t, mr, nv);
                } else {
                    // Few columns: `a` read in place by the unpacked kernel's tile (broadcasts take any strides).
                    let t = Tile {
                        k: kc,
                        a: self.a.offset((i + r0) as isize * self.rsa + p0 as isize * self.csa),
                        rsa: self.rsa,
                        csa: self.csa,
                        b: sliver,
                        rsb: w as isize,
                        c,
                        rsc: self.rsc,
                        tail,
                        accumulate: load,
                        rows: std::ptr::null(),
                        cols,
                        clamp: None,
                        residual: std::ptr::null(),
                        prefetch,
                    };
                    tile(self.level, &t, mr, nv);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{s, Array2};

    use super::super::{accelerated, gemm_nn, tests::random};
    use super::gemm_packed;

    /// Every tail (rows mod 6, columns mod the tile width, reductions across pieces of `kc`), `a` packed or
    /// read in place, any
    /// strides of `a`, `b` and `c`, accumulating or not, serial and parallel: bit-identical to the unpacked
    /// kernel (the same multiply-add chains) and close to an f64 product.
    #[test]
    fn matches_the_unpacked_kernel_bit_for_bit() {
        if !accelerated() {
            return;
        }
        for &(m, k, n) in
            &[(1, 1, 1), (7, 3, 17), (97, 300, 65), (200, 513, 130), (1, 784, 256), (13, 40, 1), (97, 300, 1000)]
        {
            let (a, b, c0) = (random(m, k, 1), random(k, n, 2), random(m, n, 3));
            let (at, bt) = (a.t().to_owned(), b.t().to_owned());
            for acc in [false, true] {
                let mut want = c0.clone();
                assert!(gemm_nn(a.view(), b.view(), want.view_mut(), acc, false));
                for (f64_i, f64_j) in [(0, 0), (m - 1, n - 1)] {
                    let mut s = if acc { c0[[f64_i, f64_j]] as f64 } else { 0.0 };
                    for p in 0..k {
                        s += a[[f64_i, p]] as f64 * b[[p, f64_j]] as f64;
                    }
                    assert!((want[[f64_i, f64_j]] as f64 - s).abs() <= 1e-4 * (1.0 + s.abs()));
                }
                for par in [false, true] {
                    for (av, bv) in [(a.view(), b.view()), (at.t(), bt.t())] {
                        let mut c = c0.clone();
                        assert!(gemm_packed(av, bv, c.view_mut(), acc, par));
                        assert_eq!(c, want, "{m}x{k}x{n} acc {acc} par {par}");
                        // A column-major `c`, and one with neither stride 1.
                        let mut ct = c0.t().to_owned();
                        assert!(gemm_packed(av, bv, ct.view_mut().reversed_axes(), acc, par));
                        assert_eq!(ct.t(), want);
                        let mut wide = Array2::zeros((m, 2 * n));
                        wide.slice_mut(s![.., ..;2]).assign(&c0);
                        assert!(gemm_packed(av, bv, wide.slice_mut(s![.., ..;2]), acc, par));
                        assert_eq!(wide.slice(s![.., ..;2]), want);
                    }
                }
            }
        }
    }

    /// The same bits whatever the thread count (1, 2 or 3 threads: other job splits, columns split too when
    /// there are few rows) and when products run concurrently on the pool's threads (each with its own packing
    /// buffers).
    #[test]
    fn results_do_not_depend_on_threads() {
        if !accelerated() {
            return;
        }
        use rayon::prelude::*;
        for &(m, k, n) in &[(150, 700, 300), (40, 1500, 900), (20, 1000, 900)] {
            let (a, b) = (random(m, k, 6), random(k, n, 7));
            let mut want = Array2::zeros((m, n));
            assert!(gemm_nn(a.view(), b.view(), want.view_mut(), false, false));
            for threads in [1, 2, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let got = pool.install(|| {
                    let mut c = Array2::zeros((m, n));
                    assert!(gemm_packed(a.view(), b.view(), c.view_mut(), false, true));
                    c
                });
                assert_eq!(got, want, "{m}x{k}x{n} on {threads} threads");
            }
            let mut top = Array2::zeros((m, n));
            assert!(gemm_packed(a.view(), b.view(), top.view_mut(), false, true));
            assert_eq!(top, want);
            let concurrent: Vec<Array2<f32>> = (0..4)
                .into_par_iter()
                .map(|_| {
                    let mut c = Array2::zeros((m, n));
                    assert!(gemm_packed(a.view(), b.view(), c.view_mut(), false, true));
                    c
                })
                .collect();
            assert!(concurrent.iter().all(|c| c == want));
        }
    }

    /// A classifier chunk (32 rows) through a `Linear` layer (`x·Wᵀ`, 784 → 256) packs the chunk, not the
    /// weight: packing the whole weight on every chunk made the Fashion-MNIST mlp's forward 1.6× slower. A
    /// square product keeps its row-major `c` (no copy); a column-major one is computed transposed.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_small_side_is_packed() {
        if !accelerated() {
            return;
        }
        let (x, w) = (random(32, 784, 8), random(256, 784, 9));
        let packed = std::thread::spawn(move || {
            let mut c = Array2::zeros((32, 256));
            assert!(gemm_packed(x.view(), w.t(), c.view_mut(), false, false));
            super::x86::packed_b_len()
        })
        .join()
        .unwrap();
        assert!(packed <= 784 * 64, "packed {packed} floats: the weight was packed, not the chunk");
        // A `Linear` weight `[n, k]` as `b = wᵀ` (strides `(1, k)`).
        assert!(super::flip(32, 784, 256, &[1, 784], &[256, 1]));
        assert!(!super::flip(1024, 1024, 1024, &[1, 1024], &[1024, 1]));
        assert!(super::flip(1024, 1024, 1024, &[1, 1024], &[1, 1024]));
        assert!(!super::flip(1000, 784, 256, &[1, 784], &[256, 1]));
        // A row-major `[k, n]` weight (ONNX MatMul): flipped, a few rows would broadcast across its rows in place.
        assert!(!super::flip(196, 768, 3072, &[3072, 1], &[3072, 1]));
        // …nor when the flipped product's `c` would be copied across at length (an input gradient `g·wᵀ`).
        assert!(!super::flip(196, 768, 3072, &[1, 768], &[3072, 1]));
    }

    /// A transposed `b` (a weight `[n, k]` as `wᵀ`, an input gradient's product) is packed by register transposes
    /// with masked edges: the same bits as the same `b` laid out row-major, on partial slivers and odd lengths.
    #[test]
    fn a_transposed_b_packs_to_the_same_product() {
        if !accelerated() {
            return;
        }
        for &(m, k, n) in &[(200, 37, 150), (13, 9, 70), (64, 130, 65), (7, 1000, 3)] {
            let (a, w) = (random(m, k, 11), random(n, k, 12));
            let (mut strided, mut standard) = (Array2::zeros((m, n)), Array2::zeros((m, n)));
            assert!(gemm_packed(a.view(), w.t(), strided.view_mut(), false, true));
            let b = w.t().as_standard_layout().into_owned();
            assert!(gemm_packed(a.view(), b.view(), standard.view_mut(), false, true));
            let bits = |c: &Array2<f32>| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(bits(&strided) == bits(&standard), "{m}x{k}x{n}");
        }
    }

    /// A row of the product is bit-identical whichever other rows are computed with it (row blocks and pieces of
    /// the reduction included).
    #[test]
    fn rows_do_not_depend_on_other_rows() {
        if !accelerated() {
            return;
        }
        let (a, b) = (random(300, 600, 4), random(600, 800, 5));
        let mut full = Array2::zeros((300, 800));
        assert!(gemm_packed(a.view(), b.view(), full.view_mut(), false, true));
        for (lo, hi) in [(0, 1), (95, 98), (100, 299), (299, 300)] {
            let mut part = Array2::zeros((hi - lo, 800));
            assert!(gemm_packed(a.slice(s![lo..hi, ..]), b.view(), part.view_mut(), false, true));
            assert_eq!(part, full.slice(s![lo..hi, ..]));
        }
    }
}
