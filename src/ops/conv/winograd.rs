//! A 3×3 convolution of stride 1 by Winograd's minimal filtering F(4×4, 3×3) (Lavin and Gray, 2016): each 4×4
//! block of outputs costs 36 multiplies per channel pair where the direct convolution spends 144, so the products
//! — `M_ξ[tiles, O] = V_ξ[tiles, C] · U_ξ[C, O]` for the 36 points ξ — are a quarter of the direct convolution's
//! multiply-adds, on the product kernels (a large `U_ξ` packed once: [`Transform`]). Around them (`simd::winograd`):
//! 1. the images are copied channels-last and zero-padded to whole tiles (`Hp = 4·⌈Ho/4⌉ + 2` rows);
//! 2. the tiles of all images are taken in blocks (sized so that a block's transformed inputs and products stay
//!    near the core's cache): each block's inputs transformed, its 36 products, its outputs transformed with the
//!    bias and the fused clamp into a channels-last output — or, with fewer than [`BLOCKS_PER_THREAD`] blocks per
//!    thread (small maps), step by step across the threads: all inputs, the 36 products one point per job, all
//!    outputs;
//! 3. the output is copied back to `[N, O, Ho, Wo]`.
//!
//! The weight's transform `U` (36 matrices `C × O`, four times the weight) is made once per weight and kept with
//! it by the caller. A tile's values depend only on its own inputs, so the results do not depend on the batch,
//! the blocking or the thread count; they differ from the direct convolution's by the transforms' rounding
//! (measured in the tests and docs/performance.md: a few 1e-6 of the outputs' scale).
//!
//! Taken for 3×3 convolutions of stride and dilation 1, ungrouped, with at least [`MIN_CHANNELS`] channels on each
//! side, in whole vectors, and padding of at most 2 — the ResNets', VGGs', DenseNets' and WideResNets' — and, by
//! the transposition the input gradient runs as, their input gradients too.

use std::sync::Arc;

use ndarray::ArrayViewMut2;
use rayon::prelude::*;

use super::unfold::transpose;
use super::{Clamp, Geom};
use crate::ops::simd::winograd::{self as kernels, POINTS, TILE};
use crate::ops::simd::{self, level, Level, PackedB};
use crate::ops::Slots;
use crate::Tensor;

/// The memo keys ([`Tensor::derived`](crate::Tensor)) of a weight's transform and of its flipped layout's (the
/// input gradient's): apart from the flipped layout's (the group count) and the BatchNorm folds' (top bits set).
pub(super) const KEY: u64 = 1 << 61;
pub(super) const KEY_FLIPPED: u64 = 1 << 61 | 1;

/// The fewest input and output channels taken: below it the transforms' cost is not repaid.
pub(super) const MIN_CHANNELS: usize = 32;

/// Whether Winograd runs at all: not when the environment variable `ARMOURY_NO_WINOGRAD` is set (to any value),
/// for the direct convolution's rounding or a side-by-side measurement. Decided once.
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ARMOURY_NO_WINOGRAD").is_none())
}

/// Whether the geometry runs here (see the module's note), on this machine's kernels.
pub(super) fn applies(g: &Geom) -> bool {
    let level = level();
    if level == Level::Portable || !enabled() {
        return false;
    }
    let lanes = kernels::lanes(level);
    let p = &g.p;
    g.kh == 3
        && g.kw == 3
        && p.stride == (1, 1)
        && p.dilation == (1, 1)
        && p.groups == 1
        && p.padding.0 <= 2
        && p.padding.1 <= 2
        && g.c >= MIN_CHANNELS
        && g.o >= MIN_CHANNELS
        && g.c.is_multiple_of(lanes)
        && g.o.is_multiple_of(lanes)
        && g.ho >= TILE
        && g.wo >= TILE
}

/// A weight's transform `U`: one `C × O` matrix per point ξ, row-major, or — when the 36 of them outgrow the core's
/// L2 ([`PACK_FLOATS`]) — each packed for the product ([`simd::pack`]: slivers of the register tile's width,
/// contiguous over the channels). Packed, a point's matrix is one sequential stream: on a small map the products are
/// few (ResNet-18's 7×7 stage: 16 tiles at batch 4) and each point's `U_ξ` (1 MB at 512 channels) comes from
/// memory; read in place, its rows 2 KB apart and a quarter-line run from each, it outran the prefetchers. A small
/// transform stays in cache and its products are small, where the packed product's set-up cost more than it saved
/// (DenseNet-121's `128 → 32`). Either way each element is the same chain of multiply-adds (over the channels in
/// order, from zero), so the bits are the same.
pub(super) enum Transform {
    /// The row-major matrices, `[ξ][c][o]`.
    Rows(Vec<f32>),
    /// One packed matrix per point.
    Packed(Vec<PackedB>),
}

/// The size (floats) from which a transform is packed: 2 MB, the core's L2.
const PACK_FLOATS: usize = 1 << 19;

/// The transform of the `[O, C, 3, 3]` weight `ws` where the geometry runs here ([`applies`]), kept with the
/// tensor `w` under `key` ([`KEY`] for `w`'s own values, [`KEY_FLIPPED`] for its flipped layout): an attack's
/// passes make it once. `None` where Winograd does not run.
pub(super) fn kept(w: &Tensor, key: u64, ws: &[f32], g: &Geom) -> Option<Arc<Transform>> {
    if !applies(g) {
        return None;
    }
    let (c, o) = (g.c, g.o);
    w.memo(key, |_| Transform::new(kernels::weights(ws, o, c), c, o, POINTS * c * o >= PACK_FLOATS)).ok()
}

impl Transform {
    /// The matrices `u` (`[ξ][c][o]`), packed when `packed` (`Err` when the vector kernels are missing).
    fn new(u: Vec<f32>, c: usize, o: usize, packed: bool) -> Result<Transform, ()> {
        if !packed {
            return Ok(Transform::Rows(u));
        }
        let points = (0..POINTS).map(|xi| simd::pack(super::mat(&u[xi * c * o..][..c * o], c, o)).ok_or(()));
        points.collect::<Result<Vec<_>, ()>>().map(Transform::Packed)
    }
}

/// Tiles per block: a block's transformed inputs and products (`36 · tiles · (C + O)` floats) about 1 MB, at
/// least 24 tiles (the weight's transform is read once per block) and a multiple of the product's 6-row tile.
fn block_tiles(g: &Geom) -> usize {
    let fit = (1 << 18) / (POINTS * (g.c + g.o));
    (fit / 6 * 6).clamp(24, 96)
}

/// Blocks of tiles per thread below which the work goes step by step instead ([`Tiling::stepwise`]): few
/// blocks leave threads idle, and each block reads the whole weight transform.
const BLOCKS_PER_THREAD: usize = 4;

/// What the blocks of tiles share: the padded channels-last images, the weight's transform, the bias and clamp,
/// the channel counts and the rows' strides of the images and the output.
struct Tiling<'a> {
    xt: &'a [f32],
    u: &'a Transform,
    bias: Option<&'a [f32]>,
    act: Option<[f32; 2]>,
    c: usize,
    o: usize,
    row_in: usize,
    row_out: usize,
}

/// A block's buffers: its tiles' corners in the images and the output, transformed inputs and products.
#[derive(Default)]
struct Scratch {
    cin: Vec<usize>,
    cout: Vec<usize>,
    v: Vec<f32>,
    m: Vec<f32>,
}

impl Scratch {
    fn corners(
        &mut self,
        range: std::ops::Range<usize>,
        corner_in: impl Fn(usize) -> usize,
        corner_out: impl Fn(usize) -> usize,
    ) {
        self.cin.clear();
        self.cin.extend(range.clone().map(corner_in));
        self.cout.clear();
        self.cout.extend(range.map(corner_out));
    }
}

impl Tiling<'_> {
    /// One block of tiles from start to end on this thread: its inputs transformed, 36 products, its outputs.
    ///
    /// # Safety
    ///
    /// `out` is the stage, and no other thread writes this block's tiles.
    unsafe fn block(&self, s: &mut Scratch, out: Slots) {
        // One guard for the block's transforms and products (see `FlushSubnormals`).
        let _flush = simd::FlushSubnormals::on();
        let (c, o, nt) = (self.c, self.o, s.cin.len());
        s.v.resize(POINTS * nt * c, 0.0);
        s.m.resize(POINTS * nt * o, 0.0);
        // SAFETY: the block's own buffer, `POINTS` planes of `nt · c`.
        let done = unsafe { kernels::input_tiles(self.xt, &s.cin, self.row_in, c, s.v.as_mut_ptr(), nt * c) };
        assert!(done, "winograd: the kernels `applies` checked");
        for xi in 0..POINTS {
            self.product(xi, &s.v[xi * nt * c..][..nt * c], super::mat_mut(&mut s.m[xi * nt * o..][..nt * o], nt, o));
        }
        // SAFETY: as the caller vouches.
        let done = unsafe { kernels::output_tiles(&self.outputs(&s.m, nt * o, &s.cout, out)) };
        assert!(done, "winograd: the kernels `applies` checked");
    }

    /// The output transform of the tiles at `corners` from their products `m` (points `plane` apart).
    fn outputs<'b>(&'b self, m: &'b [f32], plane: usize, corners: &'b [usize], out: Slots) -> kernels::Outputs<'b> {
        let (o, bias, clamp, row) = (self.o, self.bias, self.act, self.row_out);
        kernels::Outputs { m, plane, o, bias, clamp, corners, row, out: out.ptr() }
    }

    /// `m = v · U_ξ` for one point's plane of some tiles (`m`: their `nt × O` products), every element of `m`
    /// written and none read.
    fn product(&self, xi: usize, v: &[f32], m: ArrayViewMut2<f32>) {
        let (c, o) = (self.c, self.o);
        let nt = v.len() / c;
        let a = super::mat(v, nt, c);
        match self.u {
            Transform::Packed(points) => simd::gemm_prepacked(a, &points[xi], m, false, None, false),
            Transform::Rows(u) => {
                let b = super::mat(&u[xi * c * o..][..c * o], c, o);
                assert!(simd::gemm_nn(a, b, m, false, false), "winograd: the product kernel");
            }
        }
    }

    /// All tiles step by step, each step across the threads: every input transformed (tiles shared out), the 36
    /// products (one point per job: each reads its part of the weight's transform once), every output.
    ///
    /// # Safety
    ///
    /// `out` is the stage.
    unsafe fn stepwise(
        &self,
        tiles: usize,
        corner_in: impl Fn(usize) -> usize + Sync,
        corner_out: impl Fn(usize) -> usize + Sync,
        out: Slots,
    ) {
        let (c, o) = (self.c, self.o);
        let chunk = tiles.div_ceil(2 * rayon::current_num_threads()).max(1);
        // Neither buffer is zero-filled first (a pass over each per call): every element is written before it
        // is read.
        // SAFETY: the chunks' tiles cover `0..tiles`, and each tile's transform writes its column of every plane.
        let v = unsafe {
            crate::ops::written(POINTS * tiles * c, |slots| {
                let vs = Slots::new(slots);
                (0..tiles.div_ceil(chunk)).into_par_iter().for_each(|k| {
                    let cin: Vec<usize> = (k * chunk..tiles.min((k + 1) * chunk)).map(&corner_in).collect();
                    // SAFETY (of the enclosing block): this chunk's tiles' columns of every plane, apart from every
                    // other chunk's.
                    let done =
                        kernels::input_tiles(self.xt, &cin, self.row_in, c, vs.ptr().add(k * chunk * c), tiles * c);
                    assert!(done, "winograd: the kernels `applies` checked");
                });
            })
        };
        // SAFETY: each point's product, not accumulating, writes every element of its plane before reading any.
        let m = unsafe {
            crate::ops::written(POINTS * tiles * o, |slots| {
                slots.par_chunks_mut(tiles * o).enumerate().for_each(|(xi, m)| {
                    // A view of raw memory (no reference to a float is made): the point's `tiles × O` plane.
                    let m = ArrayViewMut2::from_shape_ptr((tiles, o), m.as_mut_ptr().cast::<f32>());
                    self.product(xi, &v[xi * tiles * c..][..tiles * c], m)
                })
            })
        };
        (0..tiles.div_ceil(chunk)).into_par_iter().for_each(|k| {
            let first = k * chunk;
            let cout: Vec<usize> = (first..tiles.min((k + 1) * chunk)).map(&corner_out).collect();
            // SAFETY: this chunk's tiles, apart from every other chunk's; the caller vouches for the stage.
            let done = unsafe { kernels::output_tiles(&self.outputs(&m[first * o..], tiles * o, &cout, out)) };
            assert!(done, "winograd: the kernels `applies` checked");
        });
    }
}

/// The convolution's values `[N, O, Ho, Wo]` from the contiguous input `xs` (`n` images), the weight's transform
/// `u` ([`kept`]) and the bias, plus the residual `res` (`[N, O, Ho, Wo]`) when given — added to each image as it
/// is written back, in cache — clamped as `act` says.
pub(super) fn forward(
    xs: &[f32],
    u: &Transform,
    bias: Option<&[f32]>,
    g: &Geom,
    n: usize,
    (act, res): (Option<Clamp>, Option<&[f32]>),
) -> Vec<f32> {
    let (c, o) = (g.c, g.o);
    let (th, tw) = (g.ho.div_ceil(TILE), g.wo.div_ceil(TILE));
    let (hp, wp) = (TILE * th + 2, TILE * tw + 2);
    let (ph, pw) = g.p.padding;
    debug_assert!(applies(g), "winograd::forward: a geometry `applies` takes");
    let whole = match u {
        Transform::Rows(u) => u.len() == POINTS * c * o,
        Transform::Packed(points) => points.len() == POINTS,
    };
    assert!(whole, "winograd::forward: the weight's transform");

    // 1. Channels-last, zero-padded to whole tiles.
    let (in_len, padded_len) = (c * g.h * g.w, hp * wp * c);
    let zero = std::mem::MaybeUninit::new(0.0f32);
    // SAFETY: every row of every image is written: zeros outside the image, the image's row inside.
    let xt = unsafe {
        crate::ops::written(n * padded_len, |slots| {
            slots.par_chunks_mut(padded_len).zip(xs.par_chunks(in_len)).for_each_init(Vec::new, |tmp, (dst, img)| {
                tmp.resize(in_len, 0.0);
                transpose(img, None, c, g.h * g.w, tmp);
                for (r, row) in dst.chunks_exact_mut(wp * c).enumerate() {
                    let Some(src) = r.checked_sub(ph).filter(|&i| i < g.h).map(|i| &tmp[i * g.w * c..][..g.w * c])
                    else {
                        row.fill(zero);
                        continue;
                    };
                    let (left, rest) = row.split_at_mut(pw * c);
                    let (mid, right) = rest.split_at_mut(g.w * c);
                    left.fill(zero);
                    mid.iter_mut().zip(src).for_each(|(d, &v)| _ = d.write(v));
                    right.fill(zero);
                }
            })
        })
    };

    // 2. The tiles' transformed inputs, 36 products and transformed outputs (channels-last, whole tiles).
    let (oh, ow) = (TILE * th, TILE * tw);
    let stage_len = oh * ow * o;
    let tiles = n * th * tw;
    let corner_in = |t: usize| {
        let (img, ty, tx) = (t / (th * tw), t / tw % th, t % tw);
        img * padded_len + (TILE * ty * wp + TILE * tx) * c
    };
    let corner_out = |t: usize| {
        let (img, ty, tx) = (t / (th * tw), t / tw % th, t % tw);
        img * stage_len + (TILE * ty * ow + TILE * tx) * o
    };
    // The clamp in the products' store, unless it comes after the residual's sum.
    let inner = if res.is_some() { None } else { act };
    let tiling = Tiling { xt: &xt, u, bias, act: Clamp::bounds(inner), c, o, row_in: wp * c, row_out: ow * o };
    // SAFETY: every tile's 4×4 block of every output channel is written, and the tiles cover the stage.
    let stage = unsafe {
        crate::ops::written(n * stage_len, |slots| {
            let out = Slots::new(slots);
            let per = block_tiles(g);
            if tiles.div_ceil(per) >= BLOCKS_PER_THREAD * rayon::current_num_threads() {
                (0..tiles.div_ceil(per)).into_par_iter().for_each_init(Scratch::default, |s, blk| {
                    let range = blk * per..tiles.min((blk + 1) * per);
                    s.corners(range, corner_in, corner_out);
                    tiling.block(s, out);
                });
            } else {
                tiling.stepwise(tiles, corner_in, corner_out, out);
            }
        })
    };

    // 3. Back to `[N, O, Ho, Wo]`.
    let out_len = o * g.ho * g.wo;
    let whole = oh == g.ho && ow == g.wo;
    // SAFETY: each image's slot is written whole, by the transpose or row by row.
    unsafe {
        crate::ops::written(n * out_len, |slots| {
            let images = slots.par_chunks_mut(out_len).zip(stage.par_chunks(stage_len)).enumerate();
            images.for_each_init(Vec::new, |tmp, (i, (dst, src))| {
                let dst = &mut *(dst as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]);
                if whole {
                    transpose(src, None, oh * ow, o, dst);
                } else {
                    tmp.resize(stage_len, 0.0);
                    transpose(src, None, oh * ow, o, tmp);
                    for (plane, from) in dst.chunks_exact_mut(g.ho * g.wo).zip(tmp.chunks_exact(oh * ow)) {
                        for (r, row) in plane.chunks_exact_mut(g.wo).enumerate() {
                            row.copy_from_slice(&from[r * ow..][..g.wo]);
                        }
                    }
                }
                if let Some(r) = res {
                    super::forward::add_residual(dst, &r[i * out_len..(i + 1) * out_len], act);
                }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::geometry;
    use super::*;
    use crate::Conv2dParams;

    /// The step-by-step path (few tiles) writes every element of its transformed inputs and products before
    /// reading them (neither buffer is zero-filled): on a heap dirtied with NaN blocks of their sizes
    /// ([`crate::ops::poisoned`]) it gives the same bits, all finite.
    #[test]
    fn the_stepwise_buffers_are_written_before_they_are_read() {
        if !simd::accelerated() || !enabled() {
            return;
        }
        let p = Conv2dParams { padding: (1, 1), ..Default::default() };
        let (n, c, h, o) = (1, 32, 8, 48);
        let g = geometry(&[n, c, h, h], &[o, c, 3, 3], None, p).unwrap();
        let tiles = n * h.div_ceil(TILE) * h.div_ceil(TILE);
        assert!(applies(&g) && tiles.div_ceil(block_tiles(&g)) < BLOCKS_PER_THREAD, "goes step by step");
        let xs = Tensor::uniform(&[n, c, h, h], -1.0, 1.0, 1).to_vec();
        let ws = Tensor::uniform(&[o, c, 3, 3], -0.1, 0.1, 2).to_vec();
        let u = Transform::new(kernels::weights(&ws, o, c), c, o, false).unwrap();
        let want = forward(&xs, &u, None, &g, n, (None, None));
        let got = crate::ops::poisoned(&[POINTS * tiles * c, POINTS * tiles * o], || {
            forward(&xs, &u, None, &g, n, (None, None))
        });
        assert!(got.iter().all(|v| v.is_finite()), "no element left unwritten");
        assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    /// A transform packed for the product gives the row-major one's bits (each product's chains over the channels
    /// in order, across the packed kernel's pieces of the reduction too), on a partial sliver (80 outputs), partial
    /// tiles, the bias and the clamp, step by step and in blocks; and a weight takes the packed form from
    /// [`PACK_FLOATS`] on.
    #[test]
    fn a_packed_transform_gives_the_same_bits() {
        if !simd::accelerated() || !enabled() {
            return;
        }
        let p = Conv2dParams { padding: (1, 1), ..Default::default() };
        for (n, c, h, w, o) in [(2, 272, 7, 9, 80), (4, 32, 96, 95, 48)] {
            let g = geometry(&[n, c, h, w], &[o, c, 3, 3], None, p).unwrap();
            assert!(applies(&g));
            let xs = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, 1).to_vec();
            let ws = Tensor::uniform(&[o, c, 3, 3], -0.1, 0.1, 2).to_vec();
            let bias = Tensor::uniform(&[o], -1.0, 1.0, 3).to_vec();
            let u = kernels::weights(&ws, o, c);
            let (plain, packed) = (Transform::new(u.clone(), c, o, false), Transform::new(u, c, o, true));
            let (plain, packed) = (plain.unwrap(), packed.unwrap());
            assert!(matches!(plain, Transform::Rows(_)));
            assert!(matches!(&packed, Transform::Packed(points) if points.len() == POINTS));
            for act in [None, Some(Clamp::RELU)] {
                let want = forward(&xs, &plain, Some(&bias), &g, n, (act, None));
                let got = forward(&xs, &packed, Some(&bias), &g, n, (act, None));
                assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{n}×{c}×{h}×{w} → {o}");
            }
            let wt = Tensor::new(ndarray::Array::from_shape_vec(vec![o, c, 3, 3], ws).unwrap());
            let kept = kept(&wt, KEY, &wt.to_vec(), &g).unwrap();
            assert_eq!(matches!(*kept, Transform::Rows(_)), POINTS * c * o < PACK_FLOATS, "{c} → {o}");
        }
    }
}
