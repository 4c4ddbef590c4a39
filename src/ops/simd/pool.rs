//! 2×2 max pooling of stride 2, the shape the cnn's layers pool with: the forward ([`max_pool_2x2`]: the maximum
//! and first arg-max of each window), its backward recomputing the arg-max ([`max_pool_2x2_backward`]), and the
//! backward of the fused convolution, ReLU and pooling from a stored arg-max ([`relu_max_pool_2x2_expand`]). Each
//! window pair of rows is split into even and odd columns by a deinterleave, so a vector holds one lane per window.
//!
//! Dispatch: each function checks the level and the sizes (`false` sends the caller to its scalar loop) and calls
//! the body compiled for the level's instruction set (`entry_points!`).

use std::mem::MaybeUninit;

use super::{level, Level};

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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::isa::{entry_points, Avx2, Avx512, Isa};
    use super::super::Level;

    entry_points! {
        fn max_pool_2x2(plane: &[f32], h: usize, w: usize, out: &mut [f32], idx: &mut [u32]) -> bool = pool_body;
        fn max_pool_2x2_backward(plane: &[f32], h: usize, w: usize, out: &[f32], g: &[f32], dx: *mut f32) -> bool
            = pool_backward_body;
        fn relu_max_pool_2x2_expand(h: usize, w: usize, out: &[f32], g: &[f32], idx: &[u32], dx: &mut [f32])
            = pool_expand_body;
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

#[cfg(test)]
mod tests {
    use super::super::accelerated;
    use super::relu_max_pool_2x2_expand;

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
}
