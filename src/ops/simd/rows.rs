//! Sums of scaled rows ([`RowSums`]): a sparse matrix (the [`Term`]s) times dense rows, the shape a gradient takes
//! when only a few of its entries are nonzero (the sparse backward of the fused convolution and pooling). Each
//! element's sum is one chain of fused multiply-adds over the terms in order, formed in registers and added to the
//! destination once.
//!
//! Dispatch: [`RowSums::new`] splits a row into column blocks of at most 12 vectors when the vector
//! kernels run; [`RowSums::add`] runs each block on the body specialised for its vector count, or, without the
//! vector kernels, the same chain of plain multiplies and adds.

/// One term of [`RowSums::add`]: `scale` times the source rows starting at `off`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub(crate) struct Term {
    pub scale: f32,
    pub off: u32,
}

/// Sums of scaled rows of `len` values: a sparse matrix (the terms) times dense rows, the shape a gradient takes
/// when only a few of its entries are nonzero. Built once per row length (the split into column blocks of at most
/// 12 vectors), then [`RowSums::add`] per sum.
pub(crate) struct RowSums {
    len: usize,
    /// The column blocks of the vector kernels (`None`: they do not run).
    #[cfg(target_arch = "x86_64")]
    vectors: Option<x86::Blocks>,
}

impl RowSums {
    pub(crate) fn new(len: usize) -> RowSums {
        RowSums {
            len,
            #[cfg(target_arch = "x86_64")]
            vectors: x86::Blocks::plan(len),
        }
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
        #[cfg(target_arch = "x86_64")]
        if let Some(blocks) = &self.vectors {
            // SAFETY: the rows read lie inside `src` (the caller's contract), those written inside `dst` (checked
            // above).
            return unsafe { blocks.add(src, terms, src_step, dst, dst_step, reps) };
        }
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
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::isa::{ld, Avx2, Avx512, Isa};
    use super::super::{level, Level};
    use super::Term;

    /// Vectors of one column block of [`super::RowSums`]: its accumulators, one broadcast and one loaded vector fit
    /// AVX2's 16 registers.
    const ROW_BLOCK: usize = 12;

    /// The split of a row of `len` values into column blocks of at most [`ROW_BLOCK`] vectors.
    pub(super) struct Blocks {
        level: Level,
        /// Per column block: its first column, its vectors and the lanes of its last vector.
        blocks: Vec<(usize, usize, usize)>,
    }

    impl Blocks {
        /// The blocks for rows of `len` values; `None` without the vector kernels.
        pub(super) fn plan(len: usize) -> Option<Blocks> {
            let level = level();
            if level == Level::Portable {
                return None;
            }
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
            Some(Blocks { level, blocks })
        }

        /// [`super::RowSums::add`] on the vector kernels, for arguments it checked.
        pub(super) unsafe fn add(
            &self,
            src: &[f32],
            terms: &[Term],
            src_step: usize,
            dst: &mut [f32],
            dst_step: usize,
            reps: usize,
        ) {
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
                // contract), those written inside `dst` (checked by the caller); masked lanes never touch memory.
                scaled_rows(self.level, &t, n)
            }
        }
    }

    /// One column block of [`super::RowSums::add`] (`n` vectors, the last holding `tail` lanes), read by
    /// [`scaled_rows`].
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

    /// Runs the scaled-rows kernel specialised for `n ≤ ROW_BLOCK` vectors (with a partial last vector or not).
    unsafe fn scaled_rows(level: Level, t: &ScaledRows, n: usize) {
        #[target_feature(enable = "avx512f")]
        unsafe fn wide<const N: usize, const TAIL: bool>(t: &ScaledRows) {
            scaled_rows_body::<Avx512, N, TAIL>(t)
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow<const N: usize, const TAIL: bool>(t: &ScaledRows) {
            scaled_rows_body::<Avx2, N, TAIL>(t)
        }
        let _flush = super::super::isa::FlushSubnormals::on();
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::random;
    use super::{RowSums, Term};

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
}
