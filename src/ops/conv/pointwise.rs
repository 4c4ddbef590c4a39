//! Pointwise convolutions (1×1, stride 1, unpadded, ungrouped) over small maps, computed transposed: image by
//! image `yᵀ[HW, O] = xᵀ[HW, C] · Wᵀ[C, O]` on the packed product with `Wᵀ` packed once and kept with the weight,
//! then `yᵀ` copied into `[O, HW]`.
//!
//! The unfolded product `y[O, HW] = W · x` puts the map's pixels in the vector lanes: a 7×7 map's 49 columns take
//! four 16-lane vectors, the last holding one pixel — 23% of the multiply-adds on padding (ResNet-50's last stage
//! ran at 69% of peak, EfficientNet-B0's 7×7 and 14×14 stages likewise). Transposed, the lanes hold output channels,
//! whole vectors for any multiple of 16, and the pixels are the rows of register tiles. Each output is the same
//! chain of multiply-adds, from the bias over the channels in order (the packed product continues a chain across
//! its pieces of the reduction), so the bits do not change; the input gradient (the flipped convolution, `Wᵀ`'s
//! own pointwise convolution) takes the same path with `W` packed under its own key.

use std::sync::Arc;

use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use super::{After, Clamp, Geom};
use crate::ops::simd::{self, Level, PackedB};
use crate::Tensor;

/// The memo keys ([`Tensor::memo`]) of the packed `Wᵀ` of the forward and of the input gradient's flipped weight.
pub(super) const KEY: u64 = 1 << 59;
pub(super) const KEY_FLIPPED: u64 = 1 << 59 | 1;

/// The fewest output channels taken: the lanes hold them.
const MIN_OUTPUTS: usize = 64;

/// The fewest input channels taken: the copy of `yᵀ` into `[O, HW]` costs `O·HW` against the product's `O·HW·C`
/// multiply-adds. On 7×7 maps, four images (ms, before → after): `512 → 2048` 2.37 → 2.15, `2048 → 512` 2.35 →
/// 1.92, `1152 → 192` 0.51 → 0.42, `320 → 1280` 0.95 → 0.90, but `192 → 1152` 0.52 → 0.54.
const MIN_INPUTS: usize = 256;

/// Whether a convolution runs here: pointwise and ungrouped on the vector kernels, with at least [`MIN_INPUTS`]
/// inputs and [`MIN_OUTPUTS`] outputs, and a map under 256 pixels whose last vector of pixels would be mostly
/// padding (more than an eighth of the lanes the map takes).
pub(super) fn applies(g: &Geom) -> bool {
    let hw = g.hw_out();
    let lanes = if simd::level() == Level::Avx512 { 16 } else { 8 };
    let padded = hw.div_ceil(lanes) * lanes;
    simd::accelerated()
        && g.is_pointwise()
        && g.p.groups == 1
        && g.c >= MIN_INPUTS
        && g.o >= MIN_OUTPUTS
        && (1..256).contains(&hw)
        && 8 * padded > 9 * hw
}

/// The weight `ws` (`[O, C]`) transposed and packed for [`forward`], made once per weight tensor `w` and kept with
/// it under `key` ([`KEY`] for the forward, [`KEY_FLIPPED`] for the input gradient's flipped weight); `None` where
/// neither [`applies`] nor [`batch_applies`] does.
pub(super) fn kept(w: &Tensor, key: u64, ws: &[f32], g: &Geom) -> Option<Arc<PackedB>> {
    if !applies(g) && !batch_applies(g) {
        return None;
    }
    let wt =
        ArrayView2::from_shape((g.o, g.c), &ws[..g.o * g.c]).expect("a pointwise weight is [O, C]").reversed_axes();
    w.memo(key, |_| simd::pack(wt).ok_or(())).ok()
}

/// Whether a convolution is one product over the batch: a 1×1 kernel over a 1×1 map, ungrouped, on the vector
/// kernels (a squeeze-and-excitation block's two convolutions) — `[N, C] · Wᵀ`, the images as the product's rows and
/// the output channels in the lanes. Unfolded, each image was a product of one column (one lane of 16 in use):
/// EfficientNet-B0's 32 of them took 1.7 ms of its forward.
fn batch_applies(g: &Geom) -> bool {
    simd::accelerated() && g.is_one_tap() && g.h == 1 && g.w == 1 && g.p.groups == 1
}

/// The residual added and the clamp applied to an output just computed (the sum clamped when both), then `after`
/// (across threads when `par`).
fn finish(dst: &mut [f32], (act, res, after): (Option<Clamp>, Option<&[f32]>, After), par: bool) {
    match (res, act) {
        (Some(r), _) => super::forward::add_residual(dst, r, act),
        (None, Some(act)) => dst.iter_mut().for_each(|v| *v = act.apply(*v)),
        (None, None) => {}
    }
    super::forward::after_image(dst, after, par);
}

/// Whether the input gradient of a strided 1×1 (unpadded, ungrouped, on the vector kernels) runs transposed
/// ([`strided_input_grad`]): with 64 input channels or more (the lanes hold them) and fewer than 768 output pixels.
/// Unfolded, its product `Wᵀ[C, O] · dout[O, HWo]` reads `Wᵀ` in place (too few columns to pack it), one broadcast
/// a cache line apart per step: ResNet-50's projections onto 14² and 7² took 5.7 and 8.1 ms against their
/// forwards' 2.9 and 3.1.
pub(super) fn strided_applies(g: &Geom) -> bool {
    simd::accelerated()
        && g.is_one_tap()
        && g.p.stride != (1, 1)
        && g.p.groups == 1
        && g.c >= MIN_OUTPUTS
        && (1..768).contains(&g.hw_out())
}

/// `W` (`[O, C]`) packed as the right-hand side of [`strided_input_grad`]'s product, made once per weight tensor
/// `w` and kept with it (under [`KEY_FLIPPED`]: what the stride-1 input gradient packs, `W` itself); `None` where
/// [`strided_applies`] does not.
pub(super) fn kept_strided(w: &Tensor, ws: &[f32], g: &Geom) -> Option<Arc<PackedB>> {
    if !strided_applies(g) {
        return None;
    }
    let wv = ArrayView2::from_shape((g.o, g.c), &ws[..g.o * g.c]).expect("a 1×1 weight is [O, C]");
    w.memo(KEY_FLIPPED, |_| simd::pack(wv).ok_or(())).ok()
}

/// One image's input gradient `dimg` (zeroed) of a strided 1×1 from its output gradient `gimg` (`[O, HWo]`):
/// `colᵀ[HWo, C] = doutᵀ · W` on the packed product (`W` packed, [`kept_strided`]), copied into the unfolded
/// gradient `col[C, HWo]` and scattered to the strided pixels (col2im). Each value is the unfolded product's chain,
/// over the output channels in order from zero, so the same bits. `yt` and `col` are scratch.
pub(super) fn strided_input_grad(
    gimg: &[f32],
    wp: &PackedB,
    g: &Geom,
    yt: &mut Vec<f32>,
    col: &mut [f32],
    dimg: &mut [f32],
    par: bool,
) {
    let (c, hw) = (g.c, g.hw_out());
    product_transposed(&gimg[..g.o * hw], hw, wp, None, yt, &mut col[..c * hw], par);
    super::unfold::col2im(&col[..c * hw], g, 0, dimg);
}

/// `dst[N, hw] = (srcᵀ · B)ᵀ` (plus the bias per row of `dst`) for `src[K, hw]` and `B[K, N]` packed: the product
/// `yt[hw, N]` on the packed kernel (the lanes hold `B`'s columns), then copied across in registers. `yt` is
/// scratch; the vector kernels are present (checked by the callers' `applies`).
fn product_transposed(
    src: &[f32],
    hw: usize,
    b: &PackedB,
    bias: Option<&[f32]>,
    yt: &mut Vec<f32>,
    dst: &mut [f32],
    par: bool,
) {
    let (k, n) = (src.len() / hw, dst.len() / hw);
    yt.resize(hw * n, 0.0);
    let st = ArrayView2::from_shape((k, hw), src).expect("src is [K, hw]").reversed_axes();
    let ytv = ArrayViewMut2::from_shape((hw, n), &mut yt[..]).expect("sized above");
    simd::gemm_prepacked(st, b, ytv, false, bias, par);
    // In registers with masked edges (`unfold::transpose` takes whole 8×8 blocks only: 49 rows went scalar).
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `yt` holds `hw` rows of `n`, `dst` `n` rows of `hw`; the callers checked the vector kernels.
    unsafe {
        simd::transpose_strided(yt.as_ptr(), n, dst.as_mut_ptr(), hw, hw, n)
    };
    #[cfg(not(target_arch = "x86_64"))]
    super::unfold::transpose(yt, None, hw, n, dst);
}

/// The forward `[N, O, H, W]` from the contiguous input `xs` (`n` images) with `Wᵀ` packed ([`kept`]), the bias,
/// the residual (`[N, O, H, W]`, added to each image's output while it is in cache), the fused clamp and `after`
/// (applied to each image's output just written).
///
/// Over a 1×1 map ([`batch_applies`]) the batch is one product, `[N, C] · Wᵀ` from the bias: each value the
/// unfolded product's chain (over the input channels in order from the bias, so the same bits, whatever the batch).
pub(super) fn forward(
    xs: &[f32],
    wt: &PackedB,
    bias: Option<&[f32]>,
    g: &Geom,
    n: usize,
    (act, res, after): (Option<Clamp>, Option<&[f32]>, After),
) -> Vec<f32> {
    let (c, o, hw) = (g.c, g.o, g.hw_out());
    if batch_applies(g) {
        let mut out = vec![0.0f32; n * o];
        let x = ArrayView2::from_shape((n, c), &xs[..n * c]).expect("the batch is [N, C]");
        let y = ArrayViewMut2::from_shape((n, o), &mut out[..]).expect("sized above");
        simd::gemm_prepacked(x, wt, y, false, bias, true);
        finish(&mut out, (act, res, after), false);
        return out;
    }
    let mut out = vec![0.0f32; n * o * hw];
    let image = |yt: &mut Vec<f32>, dst: &mut [f32], img: &[f32], r: Option<&[f32]>, par: bool| {
        product_transposed(img, hw, wt, bias, yt, dst, par);
        finish(dst, (act, r, after), par);
    };
    if n == 1 {
        image(&mut Vec::new(), &mut out, &xs[..c * hw], res, true);
    } else {
        out.par_chunks_mut(o * hw)
            .zip(xs.par_chunks(c * hw))
            .enumerate()
            .for_each_init(Vec::new, |yt, (i, (dst, img))| {
                image(yt, dst, img, res.map(|r| &r[i * o * hw..(i + 1) * o * hw]), false)
            });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::backward::conv2d_backward;
    use super::super::forward::values;
    use super::super::{geometry, Clamp, Conv2dParams};
    use super::applies;
    use crate::Tensor;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A 1×1 convolution's seeded input (`n` images of `c` channels, `h × h`), weight (`o` outputs) and bias.
    fn operands(n: usize, c: usize, h: usize, o: usize, seed: u64) -> (Tensor, Tensor, Tensor) {
        let x = Tensor::uniform(&[n, c, h, h], -1.0, 1.0, seed);
        let w = Tensor::uniform(&[o, c, 1, 1], -0.1, 0.1, seed + 1);
        (x, w, Tensor::uniform(&[o], -0.2, 0.2, seed + 2))
    }

    /// A 1×1 convolution over a 1×1 map runs as one product over the batch and gives the unfolded product's bits —
    /// plain, with the fused ReLU, a residual and the SiLU — on squeeze-and-excitation shapes and odd sizes, and an
    /// image's values do not depend on its batch.
    #[test]
    fn one_pixel_maps_are_one_product_with_the_unfolded_bits() {
        use super::super::forward::values_adding;
        use super::batch_applies;
        let p = Conv2dParams::default();
        for (seed, (n, c, o)) in
            [(4, 1152, 48), (4, 48, 1152), (1, 144, 6), (3, 7, 5), (5, 300, 70)].into_iter().enumerate()
        {
            let g = geometry(&[n, c, 1, 1], &[o, c, 1, 1], None, p).unwrap();
            if !crate::ops::simd::accelerated() {
                assert!(!batch_applies(&g), "the portable level unfolds");
                return;
            }
            assert!(batch_applies(&g));
            let (x, w, b) = operands(n, c, 1, o, 300 + 4 * seed as u64);
            let r = Tensor::uniform(&[n, o, 1, 1], -1.0, 1.0, 301 + 4 * seed as u64);
            let (xs, ws, bs, rs) = (x.to_vec(), w.to_vec(), b.to_vec(), r.to_vec());
            let unfolded =
                |act, res: Option<&[f32]>, after| values_adding(&xs, &ws, Some(&bs), &g, n, (act, res, after), None);
            let silu: super::After = Some(crate::ops::vmath::silu_in_place);
            let cases = [
                (x.conv2d(&w, Some(&b), p).unwrap(), unfolded(None, None, None)),
                (x.conv2d_relu(&w, Some(&b), p).unwrap(), unfolded(Some(Clamp::RELU), None, None)),
                (x.conv2d_add(&w, Some(&b), p, &r).unwrap(), unfolded(None, Some(&rs), None)),
                (x.conv2d_silu(&w, Some(&b), p).unwrap(), unfolded(None, None, silu)),
            ];
            for (i, (got, want)) in cases.iter().enumerate() {
                assert!(bits(&got.to_vec()) == bits(want), "{n}×{c}→{o}, case {i}");
            }
            let last = x.narrow(0, n - 1, 1).unwrap().conv2d(&w, Some(&b), p).unwrap();
            assert!(bits(&last.to_vec()) == bits(&cases[0].1[(n - 1) * o..]), "{n}×{c}→{o}: the last image alone");
            // Both ways one fused multiply-add chain in order: from the bias over the input channels, and (the
            // input gradient, also one product over the batch) from zero over the output channels.
            let chain = |start: f32, terms: &mut dyn Iterator<Item = (f32, f32)>| {
                terms.fold(start, |acc, (u, v)| u.mul_add(v, acc))
            };
            let forward: Vec<f32> = (0..n * o)
                .map(|i| chain(bs[i % o], &mut (0..c).map(|k| (ws[i % o * c + k], xs[i / o * c + k]))))
                .collect();
            assert!(bits(&cases[0].0.to_vec()) == bits(&forward), "{n}×{c}→{o}: the forward's chains");
            let xv = x.variable();
            let gy = Tensor::uniform(&[n, o, 1, 1], -1.0, 1.0, 302 + 4 * seed as u64);
            let y = xv.conv2d(&w, Some(&b), p).unwrap().mul(&gy).unwrap().sum_all();
            let dx = y.grad_wrt(&[&xv]).unwrap().remove(0).to_vec();
            let gs = gy.to_vec();
            let want: Vec<f32> =
                (0..n * c).map(|i| chain(0.0, &mut (0..o).map(|k| (ws[k * c + i % c], gs[i / c * o + k])))).collect();
            assert!(bits(&dx) == bits(&want), "{n}×{c}→{o}: the input gradient's chains");
        }
    }

    /// The transposed product gives the unfolded product's bits — forward with the bias and the fused ReLU, and the
    /// input gradient (transposed too where its input, the output gradient, has 256 channels or more) — on 7×7 and
    /// 5×5 maps, channel counts in and out of whole vectors, and an image's values do not depend on the batch; a
    /// 14×14 map (196 pixels: 6% padding) and a 192-channel input stay unfolded.
    #[test]
    fn transposed_product_gives_the_unfolded_bits() {
        let p = Conv2dParams::default();
        let shape = |n, c, hw, o| geometry(&[n, c, hw, hw], &[o, c, 1, 1], None, p).unwrap();
        if !crate::ops::simd::accelerated() {
            assert!(!applies(&shape(2, 256, 7, 64)), "the portable level unfolds");
            return;
        }
        assert!(!applies(&shape(2, 256, 14, 64)) && !applies(&shape(2, 192, 7, 1152)), "left unfolded");
        for (seed, (n, c, hw, o)) in [(3, 256, 7, 64), (2, 300, 5, 270), (1, 272, 7, 256)].into_iter().enumerate() {
            let g = shape(n, c, hw, o);
            assert!(applies(&g), "{c}→{o} on {hw}×{hw} runs transposed");
            let seed = 70 + 4 * seed as u64;
            let (x, w, b) = operands(n, c, hw, o, seed);
            let (xs, ws, bs) = (x.to_vec(), w.to_vec(), b.to_vec());
            for act in [None, Some(Clamp::RELU)] {
                let got = match act {
                    None => x.conv2d(&w, Some(&b), p),
                    Some(_) => x.conv2d_relu(&w, Some(&b), p),
                }
                .unwrap();
                let want = values(&xs, &ws, Some(&bs), &g, n, act, None);
                assert_eq!(bits(&got.to_vec()), bits(&want), "{c}→{o} on {hw}×{hw}, {act:?}: forward");
                let alone = x.narrow(0, n - 1, 1).unwrap().conv2d(&w, Some(&b), p).unwrap();
                let last = got.narrow(0, n - 1, 1).unwrap();
                if act.is_none() {
                    assert_eq!(bits(&alone.to_vec()), bits(&last.to_vec()), "batch-invariant");
                }
            }
            // The input gradient: the flipped convolution of the output gradient by `Wᵀ`, here unfolded by hand.
            let gout = Tensor::uniform(&[n, o, hw, hw], -1.0, 1.0, seed + 3);
            let dx = conv2d_backward(&x, &w, true, &p, &gout.to_array(), None, &[true, false, false]).unwrap();
            let flipped: Vec<f32> = (0..c * o).map(|i| ws[(i % o) * c + i / o]).collect();
            let gt = geometry(&[n, o, hw, hw], &[c, o, 1, 1], None, p).unwrap();
            assert_eq!(applies(&gt), o >= 256, "{o}→{c}: the input gradient runs transposed from 256 channels");
            let want = values(&gout.to_vec(), &flipped, None, &gt, n, None, None);
            let got = dx[0].as_ref().unwrap().iter().copied().collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{c}→{o} on {hw}×{hw}: input gradient");
        }
    }

    /// A strided 1×1's input gradient computed transposed gives the unfolded product's bits (`Wᵀ·dout` per image,
    /// scattered to the strided pixels), with and without the fused ReLU's mask, on maps whose output pixels fill
    /// whole vectors or not, and an odd input map (its last row and column take no gradient); a 28² output (784
    /// pixels) and a 32-channel input stay unfolded.
    #[test]
    fn strided_input_gradient_gives_the_unfolded_bits() {
        use super::super::unfold::{col2im, product};
        use super::{strided_applies, ArrayView2, ArrayViewMut2};
        let p = Conv2dParams { stride: (2, 2), ..Conv2dParams::default() };
        let shape = |n, c, h, o| geometry(&[n, c, h, h], &[o, c, 1, 1], None, p).unwrap();
        if !crate::ops::simd::accelerated() {
            assert!(!strided_applies(&shape(2, 256, 14, 512)), "the portable level unfolds");
            return;
        }
        assert!(!strided_applies(&shape(1, 64, 56, 128)) && !strided_applies(&shape(1, 32, 14, 64)), "left unfolded");
        for (seed, (n, c, h, o)) in [(2, 64, 14, 128), (3, 80, 9, 96), (1, 128, 16, 256)].into_iter().enumerate() {
            let g = shape(n, c, h, o);
            assert!(strided_applies(&g), "{c}→{o} on {h}×{h} /2 runs transposed");
            let seed = 90 + 4 * seed as u64;
            let (x, w, b) = operands(n, c, h, o, seed);
            let y = x.conv2d_relu(&w, Some(&b), p).unwrap();
            let gout = Tensor::uniform(y.shape(), -1.0, 1.0, seed + 3);
            let (ws, hw) = (w.to_vec(), g.hw_out());
            for relu in [false, true] {
                let fused = relu.then(|| (Clamp::RELU, y.value()));
                let dx = conv2d_backward(&x, &w, true, &p, &gout.to_array(), fused, &[true, false, false]).unwrap();
                let got = dx[0].as_ref().unwrap().iter().copied().collect::<Vec<_>>();
                let (gs, ys) = (gout.to_vec(), y.to_vec());
                let mut want = vec![0.0f32; n * c * h * h];
                for (i, dimg) in want.chunks_exact_mut(c * h * h).enumerate() {
                    let gimg: Vec<f32> = (0..o * hw)
                        .map(|j| if !relu || ys[i * o * hw + j] > 0.0 { gs[i * o * hw + j] } else { 0.0 })
                        .collect();
                    let mut col = vec![0.0f32; c * hw];
                    let wt = ArrayView2::from_shape((o, c), &ws[..]).unwrap().reversed_axes();
                    let gm = ArrayView2::from_shape((o, hw), &gimg[..]).unwrap();
                    product(wt, gm, ArrayViewMut2::from_shape((c, hw), &mut col[..]).unwrap(), false, false);
                    col2im(&col, &g, 0, dimg);
                }
                assert_eq!(bits(&got), bits(&want), "{c}→{o} on {h}×{h} /2, ReLU {relu}: input gradient");
            }
        }
    }
}
