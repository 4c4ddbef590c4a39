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

use super::{Clamp, Geom};
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

/// The weight `ws` (`[O, C]`) transposed and packed, made once per weight tensor `w` and kept with it under `key`;
/// `None` where [`applies`] does not.
pub(super) fn kept(w: &Tensor, key: u64, ws: &[f32], g: &Geom) -> Option<Arc<PackedB>> {
    if !applies(g) {
        return None;
    }
    let wt =
        ArrayView2::from_shape((g.o, g.c), &ws[..g.o * g.c]).expect("a pointwise weight is [O, C]").reversed_axes();
    w.memo(key, |_| simd::pack(wt).ok_or(())).ok()
}

/// The forward `[N, O, H, W]` from the contiguous input `xs` (`n` images) with `Wᵀ` packed ([`kept`]), the bias
/// and the fused clamp.
pub(super) fn forward(
    xs: &[f32],
    wt: &PackedB,
    bias: Option<&[f32]>,
    g: &Geom,
    n: usize,
    act: Option<Clamp>,
) -> Vec<f32> {
    let (c, o, hw) = (g.c, g.o, g.hw_out());
    let mut out = vec![0.0f32; n * o * hw];
    let image = |yt: &mut Vec<f32>, dst: &mut [f32], img: &[f32], par: bool| {
        yt.resize(hw * o, 0.0);
        let xt = ArrayView2::from_shape((c, hw), img).expect("image-sized").reversed_axes();
        let ytv = ArrayViewMut2::from_shape((hw, o), &mut yt[..]).expect("sized above");
        simd::gemm_prepacked(xt, wt, ytv, false, bias, par);
        // In registers with masked edges (`unfold::transpose` takes whole 8×8 blocks only: 49 rows went scalar).
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `yt` holds `hw` rows of `o`, `dst` `o` rows of `hw`; `applies` checked the vector kernels.
        unsafe {
            simd::transpose_strided(yt.as_ptr(), o, dst.as_mut_ptr(), hw, hw, o)
        };
        #[cfg(not(target_arch = "x86_64"))]
        super::unfold::transpose(yt, None, hw, o, dst);
        if let Some(act) = act {
            dst.iter_mut().for_each(|v| *v = act.apply(*v));
        }
    };
    if n == 1 {
        image(&mut Vec::new(), &mut out, xs, true);
    } else {
        out.par_chunks_mut(o * hw)
            .zip(xs.par_chunks(c * hw))
            .for_each_init(Vec::new, |yt, (dst, img)| image(yt, dst, img, false));
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
            let x = Tensor::uniform(&[n, c, hw, hw], -1.0, 1.0, seed);
            let w = Tensor::uniform(&[o, c, 1, 1], -0.1, 0.1, seed + 1);
            let b = Tensor::uniform(&[o], -0.2, 0.2, seed + 2);
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
}
