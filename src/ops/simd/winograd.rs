//! The transforms of Winograd's minimal filtering F(4×4, 3×3) (Lavin and Gray, "Fast Algorithms for
//! Convolutional Neural Networks", 2016): a 3×3 convolution's 4×4 block of outputs from a 6×6 block of its input as
//! `Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` — 36 multiplies per channel pair where the direct convolution does 144. Summed
//! over the input channels, the element-wise products are 36 independent products `M_ξ = V_ξ · U_ξ` (tiles ×
//! input channels times input channels × output channels), which the caller runs on the product kernel; these are
//! the transforms on either side, on vectors of channels (the image and the products are channels-last):
//! - [`input_tiles`]: `V = Bᵀ d B` for each tile, each 6×6 block read from the zero-padded channels-last image;
//! - [`output_tiles`]: `Y = Aᵀ M A` for each tile, plus the bias, clamped as the convolution's fused ReLU or ReLU6,
//!   stored into the channels-last output;
//! - [`weights`]: `U = G g Gᵀ` for every (input, output) channel pair, in f64 rounded once (not vectorised: made
//!   once per weight and kept with it).
//!
//! The matrices are the paper's (interpolation points 0, ±1, ±2 and ∞). Every value is computed by the same
//! operations in the same order on either instruction set, and a tile's values do not depend on the other tiles,
//! so the results do not depend on the batch, the blocking or the thread count.

use super::{level, Level};

/// Outputs per tile side.
pub(crate) const TILE: usize = 4;

/// Values per tile in the transformed domain (6 × 6).
pub(crate) const POINTS: usize = 36;

/// `G` of F(4, 3): a 3-tap kernel's values at the interpolation points (0, 1, −1, 2, −2, ∞), scaled.
const G: [[f64; 3]; 6] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

/// Output channels whose transforms one step computes side by side (a vector of f64 lanes on AVX-512).
const WEIGHT_LANES: usize = 8;

/// `U[ξ][c][o] = (G · w[o][c] · Gᵀ)[ξ]` for a weight `[O][C][3][3]`: 36 matrices of `C × O` (the product's right
/// operand), each value summed in f64 and rounded once; input channels across threads, [`WEIGHT_LANES`] output
/// channels side by side (compiled for the level's vectors; plain additions and multiplications, so the bits are
/// the same on every level). A weight being trained is transformed again after every update.
pub(crate) fn weights(w: &[f32], o: usize, c: usize) -> Vec<f32> {
    use rayon::prelude::*;
    assert_eq!(w.len(), o * c * 9, "winograd::weights: a [O, C, 3, 3] weight");
    let level = level();
    // SAFETY: each input channel's rows of every point are written by its own job, once for each output channel.
    unsafe {
        crate::ops::written(POINTS * c * o, |slots| {
            let u = crate::ops::Slots::new(slots);
            let job = |ci: usize| {
                for o0 in (0..o).step_by(WEIGHT_LANES) {
                    #[cfg(target_arch = "x86_64")]
                    if level != Level::Portable {
                        x86::weight_lanes(level, w, o, c, ci, o0, u);
                        continue;
                    }
                    weight_lanes(w, o, c, ci, o0, u);
                }
            };
            if o * c >= 1 << 12 {
                (0..c).into_par_iter().for_each(job);
            } else {
                (0..c).for_each(job);
            }
        })
    }
}

/// The transforms of input channel `ci` and output channels `o0..o0 + WEIGHT_LANES` (those below `o`).
///
/// # Safety
///
/// `u` holds `POINTS · c · o` floats, and no other thread writes this channel's positions.
#[inline(always)]
unsafe fn weight_lanes(w: &[f32], o: usize, c: usize, ci: usize, o0: usize, u: crate::ops::Slots) {
    let lanes = WEIGHT_LANES.min(o - o0);
    let mut g = [[0.0f64; WEIGHT_LANES]; 9];
    for l in 0..lanes {
        let taps = &w[((o0 + l) * c + ci) * 9..][..9];
        for (k, &v) in taps.iter().enumerate() {
            g[k][l] = f64::from(v);
        }
    }
    // t = G · g (6 × 3), then U = t · Gᵀ.
    let mut t = [[[0.0f64; WEIGHT_LANES]; 3]; 6];
    for (r, gr) in G.iter().enumerate() {
        for j in 0..3 {
            for l in 0..WEIGHT_LANES {
                t[r][j][l] = gr[0] * g[j][l] + gr[1] * g[3 + j][l] + gr[2] * g[6 + j][l];
            }
        }
    }
    for (r, tr) in t.iter().enumerate() {
        for (s, gs) in G.iter().enumerate() {
            let mut v = [0.0f32; WEIGHT_LANES];
            for l in 0..WEIGHT_LANES {
                v[l] = (tr[0][l] * gs[0] + tr[1][l] * gs[1] + tr[2][l] * gs[2]) as f32;
            }
            let at = ((r * 6 + s) * c + ci) * o + o0;
            for (l, &x) in v[..lanes].iter().enumerate() {
                // SAFETY: inside `u` (`o0 + l < o`), this channel's position.
                unsafe { u.write(at + l, x) };
            }
        }
    }
}

/// The tiles' transformed inputs: for tile `t` with its 6×6 block's top-left corner at `corners[t]` in `src` (a
/// channels-last image, `row` floats from one pixel row to the next, `c` channels per pixel), `v[ξ·plane + t·c +
/// ch] = (Bᵀ d B)[ξ]` where `d` is the block of channel `ch`. `false` (nothing written) without the vector kernels
/// or when `c` is not a whole number of vectors.
///
/// # Safety
///
/// `v` is valid for writes at `ξ·plane + t·c + ch` for every point, tile and channel, and no other thread touches
/// those positions during the call.
pub(crate) unsafe fn input_tiles(
    src: &[f32],
    corners: &[usize],
    row: usize,
    c: usize,
    v: *mut f32,
    plane: usize,
) -> bool {
    let level = level();
    if level == Level::Portable || !c.is_multiple_of(lanes(level)) {
        return false;
    }
    let last = 5 * row + 6 * c;
    assert!(corners.iter().all(|&k| k + last <= src.len()), "winograd::input_tiles: a block outside the image");
    assert!(plane >= corners.len() * c, "winograd::input_tiles: the points' planes overlap");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the level's instructions are present; every block lies inside `src` (asserted above), every store
    // where the caller vouches for.
    unsafe {
        x86::input_tiles(level, src, corners, row, c, v, plane);
    }
    true
}

/// The outputs of some tiles from their products `m[ξ·plane + t·o + ch]` (`corners.len()` tiles of `o` channels):
/// `Y = Aᵀ M A`, plus `bias`, clamped to `clamp`, stored channels-last at `out + corners[t]` (the tile's top-left
/// output, `row` floats from one output row to the next).
pub(crate) struct Outputs<'a> {
    pub(crate) m: &'a [f32],
    pub(crate) plane: usize,
    pub(crate) o: usize,
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) clamp: Option<[f32; 2]>,
    pub(crate) corners: &'a [usize],
    pub(crate) row: usize,
    pub(crate) out: *mut f32,
}

/// Writes the tiles' outputs ([`Outputs`]). `false` without the vector kernels or when `o` is not a whole number
/// of vectors.
///
/// # Safety
///
/// `out` is valid for writes at every tile's 4×4 block (`corners[t] + 3·row + 4·o` floats from it), and no other
/// thread touches those blocks during the call.
pub(crate) unsafe fn output_tiles(t: &Outputs) -> bool {
    let level = level();
    if level == Level::Portable || !t.o.is_multiple_of(lanes(level)) {
        return false;
    }
    let need = if t.corners.is_empty() { 0 } else { (POINTS - 1) * t.plane + t.corners.len() * t.o };
    assert!(t.m.len() >= need && t.bias.is_none_or(|b| b.len() >= t.o), "winograd::output_tiles: sizes");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the level's instructions are present; the reads lie inside `m` and `bias` (asserted), the writes
    // inside the blocks the caller vouches for.
    unsafe {
        x86::output_tiles(level, t);
    }
    true
}

/// Lanes of the level's vectors.
pub(crate) fn lanes(level: Level) -> usize {
    if level == Level::Avx512 {
        16
    } else {
        8
    }
}

// The transforms index a tile's rows and columns by their positions in the matrices (clearer than iterators).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod x86 {
    use super::super::isa::{entry_points, Avx2, Avx512, Isa};
    use super::super::Level;
    use super::Outputs;
    use crate::ops::Slots;

    entry_points! {
        fn weight_lanes(w: &[f32], o: usize, c: usize, ci: usize, o0: usize, u: Slots) = weight_body;
        fn input_tiles(src: &[f32], corners: &[usize], row: usize, c: usize, v: *mut f32, plane: usize) = input_body;
        fn output_tiles(t: &Outputs) = output_body;
    }

    /// [`super::weight_lanes`] compiled for the level's vectors.
    #[inline(always)]
    unsafe fn weight_body<S: Isa>(w: &[f32], o: usize, c: usize, ci: usize, o0: usize, u: Slots) {
        unsafe { super::weight_lanes(w, o, c, ci, o0, u) }
    }

    /// `Bᵀ x` for one column (or row) of six.
    #[inline(always)]
    unsafe fn bt<S: Isa>(x: [S::V; 6]) -> [S::V; 6] {
        let (four, five, two) = (S::splat(4.0), S::splat(-5.0), S::splat(2.0));
        let (m4, m2) = (S::splat(-4.0), S::splat(-2.0));
        let d31 = S::sub(x[3], x[1]);
        let d42 = S::sub(x[4], x[2]);
        [
            S::fmadd(four, x[0], S::fmadd(five, x[2], x[4])),
            S::fmadd(m4, S::add(x[1], x[2]), S::add(x[3], x[4])),
            S::fmadd(four, S::sub(x[1], x[2]), S::sub(x[4], x[3])),
            S::fmadd(two, d31, d42),
            S::fmadd(m2, d31, d42),
            S::fmadd(four, x[1], S::fmadd(five, x[3], x[5])),
        ]
    }

    /// `Aᵀ m` for one column (or row) of six.
    #[inline(always)]
    unsafe fn at<S: Isa>(m: [S::V; 6]) -> [S::V; 4] {
        let (a, b) = (S::add(m[1], m[2]), S::sub(m[1], m[2]));
        let (c, d) = (S::add(m[3], m[4]), S::sub(m[3], m[4]));
        [
            S::add(S::add(m[0], a), c),
            S::fmadd(S::splat(2.0), d, b),
            S::fmadd(S::splat(4.0), c, a),
            S::add(S::fmadd(S::splat(8.0), d, b), m[5]),
        ]
    }

    #[inline(always)]
    unsafe fn input_body<S: Isa>(src: &[f32], corners: &[usize], row: usize, c: usize, dst: *mut f32, plane: usize) {
        let s = src.as_ptr();
        for (t, &corner) in corners.iter().enumerate() {
            for ch in (0..c).step_by(S::LANES) {
                let base = s.add(corner + ch);
                // Columns first: `Bᵀ` down each of the six columns of the block.
                let mut cols = [[S::zero(); 6]; 6];
                for (j, col) in cols.iter_mut().enumerate() {
                    let x = std::array::from_fn(|i| S::loadu(base.add(i * row + j * c)));
                    *col = bt::<S>(x);
                }
                // Then `B` along each row of the result.
                for xi in 0..6 {
                    let y = bt::<S>(std::array::from_fn(|j| cols[j][xi]));
                    for (nu, val) in y.into_iter().enumerate() {
                        S::storeu(dst.add((xi * 6 + nu) * plane + t * c + ch), val);
                    }
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn output_body<S: Isa>(t: &Outputs) {
        let Outputs { m, plane, o, bias, clamp, corners, row, out } = *t;
        let src = m.as_ptr();
        let (lo, hi) = clamp.map_or((S::zero(), S::zero()), |[l, h]| (S::splat(l), S::splat(h)));
        for (t, &corner) in corners.iter().enumerate() {
            for ch in (0..o).step_by(S::LANES) {
                let base = src.add(t * o + ch);
                // `Aᵀ` down each of the six columns, then `A` along each of the four rows.
                let mut cols = [[S::zero(); 4]; 6];
                for (nu, col) in cols.iter_mut().enumerate() {
                    *col = at::<S>(std::array::from_fn(|xi| S::loadu(base.add((xi * 6 + nu) * plane))));
                }
                let b = bias.map_or(S::zero(), |b| S::loadu(b.as_ptr().add(ch)));
                for i in 0..4 {
                    let y = at::<S>(std::array::from_fn(|nu| cols[nu][i]));
                    for (j, val) in y.into_iter().enumerate() {
                        let mut val = S::add(val, b);
                        if clamp.is_some() {
                            val = S::min(S::max(val, lo), hi);
                        }
                        S::storeu(out.add(corner + i * row + j * o + ch), val);
                    }
                }
            }
        }
    }
}
