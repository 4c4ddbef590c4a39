//! The packed, cache-blocked product `c (+)= a·b` for large operands of any strides ([`gemm_packed`]), in the
//! manner of BLIS: the smaller side (`b`, or `aᵀ` of the transposed product) is packed once per call into slivers
//! of one register tile's width (contiguous over the whole reduction, zero-padded); the output is computed in
//! blocks of [`MC`] rows × the columns of a job, per [`KC`]-long piece of the reduction, by the register tile of
//! [`gemm_nn`](super::gemm_nn) (6 rows × four 16-lane vectors on AVX-512, × two 8-lane vectors on AVX2) with
//! unmasked vector loads from the packed slivers and broadcasts read in place from the other operand (a scalar
//! load takes any stride, so that side needs no packing: below a `Linear` layer's width its weight is read in
//! place, above it the weight is packed once for the whole batch).
//!
//! The rounding is exactly that of `gemm_nn`: each output element is one fused multiply-add chain over `k` in
//! order, started from zero (or from `c` when accumulating); a piece of the reduction stores the chain's value
//! to `c` and the next piece reloads it, which continues the same chain. So the result does not depend on the
//! blocking, on the other rows (a classifier's output does not depend on its batch), on the thread count, or on
//! which of the two kernels a shape goes to.

use ndarray::{ArrayView2, ArrayViewMut2};

use super::{level, Level};

/// Rows of `c` per job block (a multiple of the register tile's 6 rows).
#[cfg(target_arch = "x86_64")]
const MC: usize = 96;

/// Length of one piece of the reduction: a packed sliver of `b`, `KC ×` tile width, is reread by every row tile.
#[cfg(target_arch = "x86_64")]
const KC: usize = 256;

/// Columns per job (a multiple of either tile width) when the rows alone give too few jobs to share out.
#[cfg(target_arch = "x86_64")]
const NC: usize = 256;

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
        // Pack the smaller side: with more columns than rows compute cᵀ = bᵀ·aᵀ instead (each element is the
        // same chain, a multiply-add being symmetric), so a `Linear` layer's weight is read in place, not
        // repacked on every call (even for the few rows of a classifier's chunk).
        let (a, b) = (a.reborrow(), b.reborrow());
        let (a, b, mut c) = if n > m { (b.reversed_axes(), a.reversed_axes(), c.reversed_axes()) } else { (a, b, c) };
        if c.ncols() == 1 || c.strides()[1] == 1 {
            x86::gemm(level, a, b, c, accumulate, parallel);
        } else {
            let mut tmp =
                if accumulate { c.as_standard_layout().into_owned() } else { ndarray::Array2::zeros(c.dim()) };
            x86::gemm(level, a, b, tmp.view_mut(), accumulate, parallel);
            c.assign(&tmp);
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = parallel;
        unreachable!("off x86-64 the level is always `Portable`")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use ndarray::{ArrayView2, ArrayViewMut2};

    use super::super::gemm::x86::{tile, Tile};
    use super::super::{run_jobs, Level, BLOCK_M};
    use super::{KC, MC, NC};

    /// Columns of one register tile (and of a packed sliver of `b`).
    fn tile_cols(level: Level) -> usize {
        if level == Level::Avx512 {
            64
        } else {
            16
        }
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
        mut c: ArrayViewMut2<f32>,
        accumulate: bool,
        parallel: bool,
    ) {
        let ((m, k), n) = (a.dim(), b.ncols());
        let work = m * n * k;
        let packed = pack_b(level, b, parallel && work >= super::super::PAR_WORK);
        let p = Product {
            a: a.as_ptr(),
            rsa: a.strides()[0],
            csa: a.strides()[1],
            packed_b: packed.as_ptr(),
            c: c.as_mut_ptr(),
            rsc: c.strides()[0],
            k,
            accumulate,
            level,
        };
        // Jobs: blocks of MC rows × NC columns (all columns in one job when the rows give enough jobs).
        let row_blocks = m.div_ceil(MC);
        let col_block = if row_blocks >= 4 { n } else { NC };
        let mut jobs = Vec::new();
        for rb in 0..row_blocks {
            for j in (0..n).step_by(col_block) {
                jobs.push((rb * MC, (m - rb * MC).min(MC), j, (n - j).min(col_block)));
            }
        }
        run_jobs(jobs, parallel, work, |(i, mc, j, nc)| {
            // SAFETY: jobs cover disjoint blocks of `c`; the operands are valid for the product's shape.
            unsafe { p.block(i, mc, j, nc) }
        });
    }

    /// `b` packed into slivers of one tile's width: sliver `s` holds columns `s·w..(s+1)·w` as `k` rows of `w`
    /// contiguous values, zero beyond `n`.
    fn pack_b(level: Level, b: ArrayView2<f32>, parallel: bool) -> Vec<f32> {
        let (k, n) = b.dim();
        let w = tile_cols(level);
        let slivers = n.div_ceil(w);
        let mut out = vec![0.0f32; slivers * k * w];
        let (rs, cs) = (b.strides()[0], b.strides()[1]);
        let ptr = b.as_ptr() as usize;
        let jobs: Vec<(usize, &mut [f32])> = out.chunks_exact_mut(k * w).enumerate().collect();
        run_jobs(jobs, parallel, usize::MAX, |(s, dst)| {
            let ptr = ptr as *const f32;
            let (j0, cols) = (s * w, (n - s * w).min(w));
            if cs == 1 || rs != 1 {
                for (p, row) in dst.chunks_exact_mut(w).enumerate() {
                    for (q, d) in row[..cols].iter_mut().enumerate() {
                        // SAFETY: (p, j0 + q) lies inside `b`.
                        *d = unsafe { *ptr.offset(p as isize * rs + (j0 + q) as isize * cs) };
                    }
                }
            } else {
                // A transposed matrix (rows of `bᵀ` contiguous): 16 rows at a time (one cache line of each
                // column of `b` read, a few KB of the sliver written), so neither side leaves L1.
                for p0 in (0..k).step_by(16) {
                    let p1 = (p0 + 16).min(k);
                    for q in 0..cols {
                        let src = ptr.wrapping_offset((j0 + q) as isize * cs);
                        for p in p0..p1 {
                            // SAFETY: as above.
                            dst[p * w + q] = unsafe { *src.add(p) };
                        }
                    }
                }
            }
        });
        out
    }

    impl Product {
        /// Rows `i..i + mc` × columns `j..j + nc` of `c` (`j` a multiple of the tile width).
        unsafe fn block(&self, i: usize, mc: usize, j: usize, nc: usize) {
            let w = tile_cols(self.level);
            let lanes = if self.level == Level::Avx512 { 16 } else { 8 };
            for p0 in (0..self.k).step_by(KC) {
                let kc = (self.k - p0).min(KC);
                let load = self.accumulate || p0 > 0;
                for jj in (j..j + nc).step_by(w) {
                    let cols = (j + nc - jj).min(w);
                    let nv = cols.div_ceil(lanes);
                    let sliver = self.packed_b.add((jj / w) * self.k * w + p0 * w);
                    for r0 in (0..mc).step_by(BLOCK_M) {
                        let mr = (mc - r0).min(BLOCK_M);
                        // The unpacked kernel's tile with a packed `b` (its sliver's rows `w` apart); `a` is
                        // read in place (broadcasts: any strides do).
                        let t = Tile {
                            k: kc,
                            a: self.a.offset((i + r0) as isize * self.rsa + p0 as isize * self.csa),
                            rsa: self.rsa,
                            csa: self.csa,
                            b: sliver,
                            rsb: w as isize,
                            c: self.c.offset((i + r0) as isize * self.rsc).add(jj),
                            rsc: self.rsc,
                            tail: cols - (nv - 1) * lanes,
                            accumulate: load,
                        };
                        tile(self.level, &t, mr, nv);
                    }
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

    /// Every tail (rows mod 6, columns mod the tile width, reductions across pieces of [`super::KC`]), any
    /// strides of `a`, `b` and `c`, accumulating or not, serial and parallel: bit-identical to the unpacked
    /// kernel (the same multiply-add chains) and close to an f64 product.
    #[test]
    fn matches_the_unpacked_kernel_bit_for_bit() {
        if !accelerated() {
            return;
        }
        for &(m, k, n) in &[(1, 1, 1), (7, 3, 17), (97, 300, 65), (200, 513, 130), (1, 784, 256), (13, 40, 1)] {
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

    /// A row of the product is bit-identical whichever other rows are computed with it (row blocks of 96 and
    /// pieces of the reduction included).
    #[test]
    fn rows_do_not_depend_on_other_rows() {
        if !accelerated() {
            return;
        }
        let (a, b) = (random(300, 600, 4), random(600, 70, 5));
        let mut full = Array2::zeros((300, 70));
        assert!(gemm_packed(a.view(), b.view(), full.view_mut(), false, true));
        for (lo, hi) in [(0, 1), (95, 98), (100, 299), (299, 300)] {
            let mut part = Array2::zeros((hi - lo, 70));
            assert!(gemm_packed(a.slice(s![lo..hi, ..]), b.view(), part.view_mut(), false, true));
            assert_eq!(part, full.slice(s![lo..hi, ..]));
        }
    }
}
