//! The dense product kernel: `c (+)= a·b` for `b` and `c` with contiguous rows ([`gemm_nn`]). A register tile of
//! up to 6 rows of `a` (broadcast) times up to four 16-lane vectors of columns of `b` (AVX-512) or two 8-lane ones
//! (AVX2) runs over the whole reduction, with no packing — convolution operands (`W·col`, `Wᵀ·dout`) are already
//! in that layout and small enough to stay in L2. Each output element is one fused multiply-add chain over `k` in
//! order, whatever `m`, `n`, the tiling or the thread count, so results are deterministic and a row never depends
//! on the other rows.
//!
//! Dispatch: [`gemm_nn`] checks the level and the layout (`false` sends the caller to the `gemm` crate), splits
//! the columns into blocks (across threads for large products; serially, in L2-sized panels of blocks swept row
//! tile by row tile) and each block into register tiles, and runs the tile body specialised for the
//! tile's rows and vectors (`tile_dispatch!`).

use ndarray::{ArrayView2, ArrayViewMut2};

use super::{level, Level};

/// `c = a·b`, or `c += a·b` when `accumulate`, for `b` and `c` with contiguous rows; `a` may have any strides.
/// Returns `false` without touching `c` when the CPU has neither instruction set or the layout does not fit.
pub(crate) fn gemm_nn(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    c: ArrayViewMut2<f32>,
    accumulate: bool,
    parallel: bool,
) -> bool {
    gemm_nn_clamped(a, b, c, if accumulate { Start::C } else { Start::Zero }, parallel, None, None)
}

/// Where each multiply-add chain of a product starts: at zero (`c = a·b`), at `c`'s value (`c += a·b`), or at a
/// value per row of `c` (`c = bias + a·b`: a convolution's bias, with nothing written to `c` before the product).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Start<'a> {
    Zero,
    C,
    Rows(&'a [f32]),
}

/// [`gemm_nn`] with its chains started at `start` (a per-row start has `m` values), each result clamped to
/// `[lo, hi]` as it is stored when `clamp` is given (a pointwise convolution's fused ReLU or ReLU6: the tile holds
/// the whole reduction, so the clamp costs no pass of its own). With `residual` (`c`'s shape and row stride, rows
/// contiguous) each result is added to its element first, then clamped: `c = clamp(a·b + residual)`, a residual
/// connection's sum in the store, bit for bit the sum computed after the product (subnormals flushed, as everywhere
/// in the kernels). Returns `false` without touching `c` as [`gemm_nn`] does.
pub(crate) fn gemm_nn_clamped(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    start: Start,
    parallel: bool,
    clamp: Option<[f32; 2]>,
    residual: Option<ArrayView2<f32>>,
) -> bool {
    let ((m, k), n) = (a.dim(), b.ncols());
    debug_assert!(b.nrows() == k && c.dim() == (m, n));
    let level = level();
    if level == Level::Portable {
        return false;
    }
    if let Some(r) = residual {
        assert!(r.dim() == (m, n), "gemm_nn: a residual of c's shape");
        if n > 1 && r.strides()[1] != 1 || m > 1 && r.strides()[0] != c.strides()[0] {
            // The tiles read it at `c`'s offsets: the product's bits first, then the sum and the clamp.
            if !gemm_nn_clamped(a, b, c.view_mut(), start, parallel, None, None) {
                return false;
            }
            let _flush = super::FlushSubnormals::on();
            let [lo, hi] = clamp.unwrap_or([f32::NEG_INFINITY, f32::INFINITY]);
            c.zip_mut_with(&r, |v, &r| *v = (*v + r).max(lo).min(hi));
            return true;
        }
    }
    if let Start::Rows(bias) = start {
        assert!(bias.len() >= m, "gemm_nn: a start value per row");
        if k == 0 {
            for (mut row, &v) in c.rows_mut().into_iter().zip(bias) {
                row.fill(v);
            }
        }
    }
    if empty_product(k, &mut c, !matches!(start, Start::Zero)) {
        if let Some(r) = residual {
            c.zip_mut_with(&r, |v, &r| *v += r);
        }
        if let Some([lo, hi]) = clamp {
            c.mapv_inplace(|v| v.max(lo).min(hi));
        }
        return true;
    }
    if n > 1 && (b.strides()[1] != 1 || c.strides()[1] != 1) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        x86::gemm_nn(level, a, b, c, start, parallel, clamp, residual);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (parallel, clamp, start, residual);
        unreachable!("off x86-64 the level is always `Portable`")
    }
}

/// Finishes a product with no multiply-add to do (`c` empty, or `k == 0`: `c` is zeroed unless accumulating);
/// `false` when there is work.
pub(super) fn empty_product(k: usize, c: &mut ArrayViewMut2<f32>, accumulate: bool) -> bool {
    if c.is_empty() {
        return true;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return true;
    }
    false
}

/// Chains of fused multiply-adds the peak loop keeps in flight: enough independent accumulators to cover the
/// multiply-add latency times the two issue ports on either instruction set (16 vector registers on AVX2).
const PEAK_CHAINS: usize = 12;

/// A tight loop of `iters` rounds of [`PEAK_CHAINS`] independent vector fused multiply-adds on this thread, on the
/// instruction set the kernels use: the FLOPs it did (2 per lane per multiply-add) and a value that depends on
/// every chain (so the loop is not optimised away), or `None` without the hand-written kernels. The benchmarks
/// time it on every thread at once to measure the machine's attainable f32 peak.
pub(crate) fn fma_peak(iters: usize) -> Option<(f64, f32)> {
    let level = level();
    if level == Level::Portable {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let lanes = if level == Level::Avx512 { 16 } else { 8 };
        // SAFETY: the level was checked above; the loop touches no memory but a local.
        let sink = unsafe { x86::fma_loop(level, iters) };
        Some(((2 * PEAK_CHAINS * lanes) as f64 * iters as f64, sink))
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("off x86-64 the level is always `Portable`")
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use ndarray::{ArrayView2, ArrayViewMut2};
    use rayon::prelude::*;

    use super::super::isa::{
        entry_points, ld, load_tile, store_tile_clamped, tile_dispatch, tile_match, Avx2, Avx512, Isa,
    };
    use super::super::{tile_rows, Level, PAR_WORK};

    entry_points! {
        fn fma_loop(iters: usize) -> f32 = fma_loop_body;
    }

    /// [`super::fma_peak`]'s loop: `acc ← acc·a + b` on [`super::PEAK_CHAINS`] accumulators (`a` just below 1,
    /// so the values stay finite and normal), summed at the end.
    #[inline(always)]
    unsafe fn fma_loop_body<S: Isa>(iters: usize) -> f32 {
        let (a, b) = (S::splat(0.999_999), S::splat(1e-6));
        let mut acc = [S::zero(); super::PEAK_CHAINS];
        for (i, v) in acc.iter_mut().enumerate() {
            *v = S::splat(i as f32);
        }
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = S::fmadd(*v, a, b);
            }
        }
        let mut total = S::zero();
        for v in acc {
            total = S::add(total, v);
        }
        let mut out = [0.0f32; 16];
        S::storeu(out.as_mut_ptr(), total);
        out[..S::LANES].iter().sum()
    }

    /// The product of operands [`super::gemm_nn`] validated, in column blocks, across threads when large enough.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_nn(
        level: Level,
        a: ArrayView2<f32>,
        b: ArrayView2<f32>,
        mut c: ArrayViewMut2<f32>,
        start: super::Start,
        parallel: bool,
        clamp: Option<[f32; 2]>,
        residual: Option<ArrayView2<f32>>,
    ) {
        let ((m, k), n) = (a.dim(), b.ncols());
        let ops = Operands {
            clamp,
            residual: residual.map_or(std::ptr::null(), |r| r.as_ptr()),
            a: a.as_ptr(),
            rsa: a.strides()[0],
            csa: a.strides()[1],
            b: b.as_ptr(),
            rsb: b.strides()[0],
            c: c.as_mut_ptr(),
            rsc: c.strides()[0],
            m,
            k,
            accumulate: matches!(start, super::Start::C),
            rows: if let super::Start::Rows(v) = start { v.as_ptr() } else { std::ptr::null() },
            level,
        };
        let block_n = if level == Level::Avx512 { 64 } else { 16 };
        let blocks = n.div_ceil(block_n);
        let nested = rayon::current_thread_index().is_some();
        if parallel && !nested && blocks > 1 && m * n * k >= PAR_WORK {
            (0..blocks).into_par_iter().for_each(|blk| {
                let j = blk * block_n;
                // SAFETY: blocks write disjoint column ranges of `c`; the operands outlive this call.
                unsafe { ops.panel(j, (n - j).min(block_n), block_n) }
            });
        } else {
            // Panels of columns whose rows of `b` fit in `PANEL_BYTES`, each swept row tile by row tile (a panel is
            // one block once two blocks' rows exceed it: k > 1024 on AVX-512).
            let panel = (PANEL_BYTES / (4 * k.max(1)) / block_n).max(1) * block_n;
            for j0 in (0..n).step_by(panel) {
                // SAFETY: as above, sequentially.
                unsafe { ops.panel(j0, (n - j0).min(panel), block_n) }
            }
        }
    }

    /// The bytes of `b` a panel keeps in L2 while each row tile sweeps across them ([`Operands::panel`]).
    ///
    /// Block by block (64 columns on AVX-512, 16 on AVX2; the block's rows of `b` in L1 for all the row tiles),
    /// each row of `c` was written a block's width at a time (256 bytes), every row a stream of its own, and each
    /// row of `b` read as short; in a model, where the output's memory and the input were last touched many layers
    /// ago, those short runs wait on memory. A panel writes each row tile's rows, and reads `b`'s rows, as runs of
    /// the panel's width. Panels were first limited to reductions of k ≤ 32 because from 64 channels up they
    /// measured level to 1.18× slower — on warm data, the way `core --conv` then timed a convolution alone. With the
    /// caches emptied before each call (`core --cold --conv`, two alternations, ms, block by block → panels):
    /// forward `64 → 256` on 56² 2.88–2.97 → 1.86–1.90, `40 → 240` on 28² 0.76–0.77 → 0.33–0.38, `128 → 512` on 28²
    /// 1.76–1.82 → 1.54–1.68, `256 → 512` of stride 2 on 56² 4.31–4.43 → 3.90–4.08; the input gradient of `256 → 64`
    /// on 56² 2.05–2.44 → 1.66–1.77, of `32 → 192` and `40 → 240` on 28² 0.29–0.48 → 0.39–0.55 (slower); the
    /// other shapes level.
    const PANEL_BYTES: usize = 1 << 19;

    /// Raw views of the three operands (validated by [`super::gemm_nn`]).
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
        /// The rows' start values (`Start::Rows`), or null.
        rows: *const f32,
        level: Level,
        clamp: Option<[f32; 2]>,
        /// `c`'s residual (laid out as `c`), or null.
        residual: *const f32,
    }

    // SAFETY: the pointers come from views borrowed for the duration of the product; concurrent tasks touch disjoint
    // columns of `c` and only read `a` and `b`.
    unsafe impl Send for Operands {}
    unsafe impl Sync for Operands {}

    impl Operands {
        /// All rows of `c` for the `nb` columns starting at `j0`: each row tile across the columns, in blocks of
        /// `block_n` — the row tile's `c` written as `mr` runs along its rows, where a block at a time wrote each
        /// row of `c` a block apart. The parallel product hands each task one block.
        unsafe fn panel(&self, j0: usize, nb: usize, block_n: usize) {
            let lanes = if self.level == Level::Avx512 { 16 } else { 8 };
            // One guard for the panel's tiles (see `FlushSubnormals`).
            let _flush = super::super::isa::FlushSubnormals::on();
            for (i, mr) in tile_rows(self.m) {
                for j in (j0..j0 + nb).step_by(block_n) {
                    let cols = (j0 + nb - j).min(block_n);
                    let nv = cols.div_ceil(lanes);
                    let tail = cols - (nv - 1) * lanes;
                    self.tile_at(i, mr, j, nv, tail);
                }
            }
        }

        /// The register tile of rows `i..i + mr` and `nv` vectors of columns from `j` (the last holding `tail`).
        #[inline]
        unsafe fn tile_at(&self, i: usize, mr: usize, j: usize, nv: usize, tail: usize) {
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
                rows: if self.rows.is_null() { self.rows } else { self.rows.add(i) },
                cols: std::ptr::null(),
                clamp: self.clamp,
                residual: if self.residual.is_null() {
                    self.residual
                } else {
                    self.residual.offset(i as isize * self.rsc).add(j)
                },
                prefetch: Prefetch::NONE,
            };
            tile(self.level, &t, mr, nv);
        }
    }

    /// One register tile: `R ≤ 6` rows by `V` vectors of columns, the last vector holding `tail` columns.
    pub(in crate::ops::simd) struct Tile {
        pub(in crate::ops::simd) k: usize,
        pub(in crate::ops::simd) a: *const f32,
        pub(in crate::ops::simd) rsa: isize,
        pub(in crate::ops::simd) csa: isize,
        pub(in crate::ops::simd) b: *const f32,
        pub(in crate::ops::simd) rsb: isize,
        pub(in crate::ops::simd) c: *mut f32,
        pub(in crate::ops::simd) rsc: isize,
        pub(in crate::ops::simd) tail: usize,
        pub(in crate::ops::simd) accumulate: bool,
        /// Unless null (or `accumulate`), row `r`'s chains start at `rows[r]` instead of zero.
        pub(in crate::ops::simd) rows: *const f32,
        /// Unless null (or `accumulate`), column `j`'s chains start at `cols[j]` (a `Linear` layer's bias; `rows`
        /// null then).
        pub(in crate::ops::simd) cols: *const f32,
        /// The results clamped to `[lo, hi]` as they are stored, or not.
        pub(in crate::ops::simd) clamp: Option<[f32; 2]>,
        /// Unless null, the values (laid out as `c`) each result is added to before the clamp and the store.
        pub(in crate::ops::simd) residual: *const f32,
        /// Memory the next tiles will read, fetched into L1 while this one computes.
        pub(in crate::ops::simd) prefetch: Prefetch,
    }

    /// Cache lines to fetch into L1 during a tile's reduction: `lines` consecutive 64-byte lines from `at`,
    /// requested over the tile's first steps (one or a few a step). The packed product hands each tile of a row
    /// block its share of the next sliver of `b`, so that the sliver is in L1 when the block turns to it instead
    /// of arriving from L3 or memory at the first tile's pace: a single-thread `192 × 768 × 3072` product ran
    /// 1.11–1.14× faster in a stand-alone model of the loop. A prefetch changes no value.
    #[derive(Clone, Copy)]
    pub(in crate::ops::simd) struct Prefetch {
        pub(in crate::ops::simd) at: *const f32,
        pub(in crate::ops::simd) lines: usize,
    }

    impl Prefetch {
        pub(in crate::ops::simd) const NONE: Prefetch = Prefetch { at: std::ptr::null(), lines: 0 };
    }

    /// Runs the product tile kernel specialised for `r` rows and `v` vectors (with a partial last vector or not).
    pub(in crate::ops::simd) unsafe fn tile(level: Level, t: &Tile, r: usize, v: usize) {
        let tail = t.tail < if level == Level::Avx512 { 16 } else { 8 };
        tile_dispatch!(tile_body, Tile, level, t, r, v, tail)
    }

    /// `R` rows × `V` vectors of `c`, one fused multiply-add chain per element over the whole reduction; with
    /// `TAIL` the last vector holds only `t.tail` columns.
    #[inline(always)]
    unsafe fn tile_body<S: Isa, const R: usize, const V: usize, const TAIL: bool>(t: &Tile) {
        let last = if TAIL { S::lanes(0, t.tail as isize) } else { S::lanes(0, S::LANES as isize) };
        let mut acc = if t.accumulate { load_tile::<S, R, V, TAIL>(last, t.c, t.rsc) } else { [[S::zero(); V]; R] };
        if !t.accumulate && !t.rows.is_null() {
            for (r, row) in acc.iter_mut().enumerate() {
                *row = [S::splat(*t.rows.add(r)); V];
            }
        }
        if !t.accumulate && !t.cols.is_null() {
            start_at_cols::<S, R, V, TAIL>(&mut acc, last, t.cols);
        }
        reduce_prefetching::<S, R, V, TAIL>(&mut acc, last, t.k, (t.a, t.rsa, t.csa), (t.b, t.rsb), t.prefetch);
        if !t.residual.is_null() {
            let res = load_tile::<S, R, V, TAIL>(last, t.residual, t.rsc);
            for (row, r) in acc.iter_mut().zip(&res) {
                for (a, &r) in row.iter_mut().zip(r) {
                    *a = S::add(*a, r);
                }
            }
        }
        let bounds = t.clamp.map(|b| b.map(|v| S::splat(v)));
        store_tile_clamped::<S, R, V, TAIL>(last, t.c, t.rsc, &acc, bounds);
    }

    /// Every row of a tile set to the `V` vectors at `cols` (the last masked to `last` with `TAIL`): chains that
    /// start at a value per column.
    #[inline(always)]
    pub(in crate::ops::simd) unsafe fn start_at_cols<S: Isa, const R: usize, const V: usize, const TAIL: bool>(
        acc: &mut [[S::V; V]; R],
        last: S::M,
        cols: *const f32,
    ) {
        let mut start = [S::zero(); V];
        for (v, s) in start.iter_mut().enumerate() {
            *s = ld::<S, V, TAIL>(last, cols.add(S::LANES * v), v);
        }
        *acc = [start; R];
    }

    /// A register tile's reduction: `k` steps of `acc[r][v] += a[r]·b[v]`, row `r` of `a` at `r·rsa` from `a`
    /// and steps `csa` apart, `b`'s vectors contiguous and steps `rsb` apart (the last vector masked to `last`
    /// with `TAIL`). Inlined into each tile body (through [`reduce_prefetching`], its only caller), so a caller's
    /// constant strides become immediate offsets.
    #[inline(always)]
    unsafe fn reduce<S: Isa, const R: usize, const V: usize, const TAIL: bool>(
        acc: &mut [[S::V; V]; R],
        last: S::M,
        k: usize,
        (mut ap, rsa, csa): (*const f32, isize, isize),
        (mut bp, rsb): (*const f32, isize),
    ) {
        for _ in 0..k {
            let mut bv = [S::zero(); V];
            for (v, b) in bv.iter_mut().enumerate() {
                *b = ld::<S, V, TAIL>(last, bp.add(S::LANES * v), v);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = S::splat(*ap.offset(r as isize * rsa));
                for (a, &b) in row.iter_mut().zip(&bv) {
                    *a = S::fmadd(av, b, *a);
                }
            }
            ap = ap.offset(csa);
            bp = bp.offset(rsb);
        }
    }

    /// [`reduce`] with the lines of `pf` requested into L1 over its first steps (the same multiply-adds in the
    /// same order).
    #[inline(always)]
    pub(in crate::ops::simd) unsafe fn reduce_prefetching<S: Isa, const R: usize, const V: usize, const TAIL: bool>(
        acc: &mut [[S::V; V]; R],
        last: S::M,
        k: usize,
        (mut ap, rsa, csa): (*const f32, isize, isize),
        (mut bp, rsb): (*const f32, isize),
        pf: Prefetch,
    ) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        if pf.lines == 0 || k == 0 {
            return reduce::<S, R, V, TAIL>(acc, last, k, (ap, rsa, csa), (bp, rsb));
        }
        let per_step = pf.lines.div_ceil(k);
        let steps = pf.lines.div_ceil(per_step);
        let mut line = pf.at.cast::<i8>();
        let mut left = pf.lines;
        for _ in 0..steps {
            for _ in 0..per_step.min(left) {
                _mm_prefetch::<_MM_HINT_T0>(line);
                line = line.wrapping_add(64);
            }
            left = left.saturating_sub(per_step);
            reduce::<S, R, V, TAIL>(acc, last, 1, (ap, rsa, csa), (bp, rsb));
            ap = ap.offset(csa);
            bp = bp.offset(rsb);
        }
        reduce::<S, R, V, TAIL>(acc, last, k - steps, (ap, rsa, csa), (bp, rsb));
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{s, Array2};

    use super::super::{accelerated, tests::random};
    use super::{gemm_nn, gemm_nn_clamped, Start};

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

    /// The clamp in the store gives the product's bits clamped, on every tile shape, accumulating or not.
    #[test]
    fn clamped_store_is_the_product_clamped() {
        if !accelerated() {
            return;
        }
        for &(m, k, n) in &[(1, 1, 1), (5, 3, 17), (7, 40, 65), (13, 400, 130), (3, 0, 9)] {
            for acc in [false, true] {
                let (a, b, c0) = (random(m, k, 6), random(k, n, 7), random(m, n, 8));
                let (mut plain, mut clamped) = (c0.clone(), c0.clone());
                assert!(gemm_nn(a.view(), b.view(), plain.view_mut(), acc, false));
                let start = if acc { Start::C } else { Start::Zero };
                assert!(gemm_nn_clamped(a.view(), b.view(), clamped.view_mut(), start, true, Some([-0.5, 2.0]), None));
                let want = plain.mapv(|v| v.clamp(-0.5, 2.0));
                assert!(want.iter().any(|&v| v == -0.5) || k == 0 || m * n < 20, "{m}x{k}x{n}: the bound is met");
                assert_eq!(clamped.mapv(f32::to_bits), want.mapv(f32::to_bits), "{m}x{k}x{n} acc {acc}");
            }
        }
    }

    /// Chains started at a value per row give the bits of the product accumulated onto those values written
    /// into `c` first (how the convolutions added their bias before), clamped or not, with nothing of `c` read:
    /// `c` starts as NaN.
    #[test]
    fn row_start_is_accumulating_onto_the_rows() {
        if !accelerated() {
            return;
        }
        for &(m, k, n) in &[(1, 1, 1), (5, 3, 17), (7, 40, 65), (13, 400, 130), (3, 0, 9)] {
            let (a, b) = (random(m, k, 9), random(k, n, 10));
            let rows: Vec<f32> = (0..m).map(|i| i as f32 * 0.37 - 1.0).collect();
            for clamp in [None, Some([-0.5, 2.0])] {
                let mut want = Array2::from_shape_fn((m, n), |(i, _)| rows[i]);
                assert!(gemm_nn_clamped(a.view(), b.view(), want.view_mut(), Start::C, false, clamp, None));
                let mut got = Array2::from_elem((m, n), f32::NAN);
                assert!(gemm_nn_clamped(a.view(), b.view(), got.view_mut(), Start::Rows(&rows), true, clamp, None));
                assert_eq!(got.mapv(f32::to_bits), want.mapv(f32::to_bits), "{m}x{k}x{n} {clamp:?}");
            }
        }
    }

    /// A residual added in the store gives the bits of the product with the residual added after it, then clamped,
    /// on every tile shape (masked tails, one and several row tiles, chains from zero, from `c` and from the rows),
    /// serial and split across threads, with the residual's rows inside a wider array (its stride is `c`'s).
    #[test]
    fn residual_in_the_store_is_the_sum_after_the_product() {
        if !accelerated() {
            return;
        }
        for &(m, k, n) in &[(1, 1, 1), (5, 3, 17), (7, 40, 65), (13, 400, 130), (3, 0, 9)] {
            let (a, b, c0) = (random(m, k, 11), random(k, n, 12), random(m, n + 3, 13));
            let wide = random(m, n + 3, 14);
            let res = wide.slice(s![.., ..n]);
            let rows: Vec<f32> = (0..m).map(|i| i as f32 * 0.21 - 0.6).collect();
            for (start, clamp) in
                [(Start::Zero, None), (Start::C, Some([0.0, f32::INFINITY])), (Start::Rows(&rows), Some([-0.3, 0.4]))]
            {
                let mut plain = c0.clone();
                assert!(gemm_nn_clamped(a.view(), b.view(), plain.slice_mut(s![.., ..n]), start, false, None, None));
                let want = plain.slice(s![.., ..n]).to_owned() + res;
                let want = want.mapv(|v| clamp.map_or(v, |[lo, hi]: [f32; 2]| v.max(lo).min(hi)));
                for par in [false, true] {
                    let mut got = c0.clone();
                    let mut out = got.slice_mut(s![.., ..n]);
                    assert!(gemm_nn_clamped(a.view(), b.view(), out.view_mut(), start, par, clamp, Some(res)));
                    assert_eq!(out.mapv(f32::to_bits), want.mapv(f32::to_bits), "{m}x{k}x{n} {clamp:?} {par}");
                }
            }
        }
        // A residual whose rows are not `c`'s distance apart (a single column too) is added after the product.
        let (a, b, wide) = (random(5, 3, 17), random(3, 1, 18), random(5, 4, 19));
        let r = wide.slice(s![.., ..1]);
        let mut plain = Array2::from_elem((5, 1), f32::NAN);
        assert!(gemm_nn_clamped(a.view(), b.view(), plain.view_mut(), Start::Zero, false, None, None));
        let want = (plain + r).mapv(|v| v.max(0.0));
        let mut c = Array2::from_elem((5, 1), f32::NAN);
        assert!(gemm_nn_clamped(
            a.view(),
            b.view(),
            c.view_mut(),
            Start::Zero,
            false,
            Some([0.0, f32::INFINITY]),
            Some(r)
        ));
        assert_eq!(c.mapv(f32::to_bits), want.mapv(f32::to_bits));
    }

    /// A product run serially in panels (row tile by row tile across the columns whose rows of `b` fill
    /// `PANEL_BYTES` — on AVX-512 8192 columns at k = 16, 640 at k = 200, one block at k = 3000) gives the bits of
    /// the parallel run block by block, over several panels and a partial last block: started at given row values
    /// into a NaN-filled `c` (a block skipped stays NaN), and accumulating onto the same random `c` (a block
    /// visited twice is added twice).
    #[test]
    fn panels_give_the_blocks_bits() {
        if !accelerated() {
            return;
        }
        for (k, seed) in [(16, 15), (200, 17), (3000, 19)] {
            let (m, n) = (15, 8192 + 777);
            assert!(m * k * n >= super::super::PAR_WORK, "the parallel run splits the blocks");
            let (a, b) = (random(m, k, seed), random(k, n, seed + 1));
            let rows: Vec<f32> = (0..m).map(|i| i as f32 * 0.1).collect();
            let (mut serial, mut par) = (Array2::from_elem((m, n), f32::NAN), Array2::from_elem((m, n), f32::NAN));
            assert!(gemm_nn_clamped(a.view(), b.view(), serial.view_mut(), Start::Rows(&rows), false, None, None));
            assert!(gemm_nn_clamped(a.view(), b.view(), par.view_mut(), Start::Rows(&rows), true, None, None));
            assert!(serial.iter().all(|v| v.is_finite()), "k = {k}: every element written");
            assert_eq!(serial.mapv(f32::to_bits), par.mapv(f32::to_bits), "k = {k}");
            let c0 = random(m, n, seed + 2);
            let (mut serial, mut par) = (c0.clone(), c0);
            assert!(gemm_nn_clamped(a.view(), b.view(), serial.view_mut(), Start::C, false, None, None));
            assert!(gemm_nn_clamped(a.view(), b.view(), par.view_mut(), Start::C, true, None, None));
            assert_eq!(serial.mapv(f32::to_bits), par.mapv(f32::to_bits), "k = {k}, accumulating");
        }
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
