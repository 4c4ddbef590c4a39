//! Tests of the convolution against direct loops and of its paths against each other: the unfolded product, the
//! direct kernels and Winograd, bit for bit where they promise it; the fused ops in `fused`.

use ndarray::{Array4, Ix4};

use super::backward::conv2d_backward;
use super::unfold::{im2col, product, transpose};
use super::*;
use crate::ops::pool::Pool2dParams;

mod fused;

/// The direct seven-loop convolution: the oracle for the im2col kernel.
fn naive(x: &Array4<f32>, w: &Array4<f32>, b: &[f32], p: Conv2dParams) -> Array4<f32> {
    let (n, c, h, wd) = x.dim();
    let (o, cg, kh, kw) = w.dim();
    let ho = out_size(h, kh, p.stride.0, p.padding.0, p.dilation.0).unwrap();
    let wo = out_size(wd, kw, p.stride.1, p.padding.1, p.dilation.1).unwrap();
    let og = o / p.groups;
    let mut out = Array4::zeros((n, o, ho, wo));
    for ni in 0..n {
        for oc in 0..o {
            let grp = oc / og;
            for i in 0..ho {
                for j in 0..wo {
                    let mut s = b[oc] as f64;
                    for ci in 0..cg {
                        for a in 0..kh {
                            for bb in 0..kw {
                                let ih = (i * p.stride.0 + a * p.dilation.0) as isize - p.padding.0 as isize;
                                let iw = (j * p.stride.1 + bb * p.dilation.1) as isize - p.padding.1 as isize;
                                if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < wd {
                                    s += (x[[ni, grp * cg + ci, ih as usize, iw as usize]] * w[[oc, ci, a, bb]]) as f64;
                                }
                            }
                        }
                    }
                    out[[ni, oc, i, j]] = s as f32;
                }
            }
        }
    }
    let _ = c;
    out
}

#[test]
fn im2col_gemm_matches_direct_convolution() {
    let cases = [
        (2, 4, 9, 8, 6, 3, 3, Conv2dParams::default()),
        (3, 4, 9, 8, 6, 3, 2, Conv2dParams { stride: (2, 1), padding: (1, 2), dilation: (1, 2), groups: 2 }),
        (1, 6, 5, 5, 6, 1, 1, Conv2dParams { groups: 3, ..Default::default() }),
        (2, 3, 7, 7, 4, 1, 1, Conv2dParams::default()),
        (2, 2, 9, 37, 3, 3, 5, Conv2dParams { padding: (2, 1), ..Default::default() }),
        (1, 4, 11, 20, 4, 3, 3, Conv2dParams { stride: (2, 1), padding: (1, 3), dilation: (2, 2), groups: 2 }),
        (3, 16, 12, 12, 32, 5, 5, Conv2dParams::default()),
        // Stride 1: the input gradient as the flipped convolution — dilated and grouped, pointwise, and padding
        // beyond the kernel's reach (which takes the other path, as do cases 0 and 4: unpadded, smaller outputs).
        (2, 4, 9, 11, 6, 3, 3, Conv2dParams { padding: (2, 2), dilation: (2, 2), groups: 2, ..Default::default() }),
        (2, 8, 5, 7, 6, 1, 1, Conv2dParams::default()),
        (1, 2, 6, 6, 3, 3, 3, Conv2dParams { padding: (3, 3), ..Default::default() }),
        (3, 6, 7, 7, 9, 3, 3, Conv2dParams { padding: (1, 1), groups: 3, ..Default::default() }),
    ];
    for (seed, &(n, c, h, w, o, kh, kw, p)) in cases.iter().enumerate() {
        let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed as u64);
        let wt = Tensor::uniform(&[o, c / p.groups, kh, kw], -1.0, 1.0, 100 + seed as u64);
        let b = Tensor::uniform(&[o], -1.0, 1.0, 200 + seed as u64);
        let got = x.conv2d(&wt, Some(&b), p).unwrap();
        let x4 = x.to_array().into_dimensionality::<Ix4>().unwrap();
        let w4 = wt.to_array().into_dimensionality::<Ix4>().unwrap();
        let want = naive(&x4, &w4, &b.to_vec(), p);
        assert_eq!(got.shape(), want.shape());
        for (a, b) in got.value().iter().zip(want.iter()) {
            assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "case {seed}: {a} vs {b}");
        }
    }
}

/// The direct (implicit-GEMM) forward gives the same bits as unfolding the image and running the product
/// onto the bias, with and without the fused ReLU: each output is the same multiply-add chain. Geometries
/// with full and partial vectors, padding, row stride, dilation and groups.
#[test]
fn direct_forward_equals_unfolded_product() {
    let cases = [
        (2, 1, 28, 28, 16, 5, 5, Conv2dParams::default()),
        (2, 16, 12, 12, 32, 5, 5, Conv2dParams::default()),
        (2, 3, 13, 30, 7, 3, 3, Conv2dParams { padding: (1, 1), ..Default::default() }),
        (1, 4, 11, 21, 4, 3, 3, Conv2dParams { stride: (2, 1), padding: (1, 3), dilation: (2, 2), groups: 2 }),
        (1, 2, 6, 45, 13, 2, 4, Conv2dParams::default()),
        // Output rows of half a vector (8 on AVX-512, 4 on AVX2), run as split vectors: an odd last row, stride 2.
        (2, 3, 13, 12, 5, 5, 5, Conv2dParams::default()),
        (1, 2, 20, 12, 6, 5, 5, Conv2dParams { stride: (2, 1), ..Default::default() }),
        (2, 3, 9, 8, 7, 5, 5, Conv2dParams::default()),
        // A column stride of 2, read from the image's stride phases: a stem-like 7×7 (odd padded width), a 3×3
        // with partial vectors, an even padded width, grouped with a dilated row.
        (1, 3, 37, 63, 5, 7, 7, Conv2dParams { stride: (2, 2), padding: (3, 3), ..Default::default() }),
        (2, 4, 21, 57, 6, 3, 3, Conv2dParams { stride: (2, 2), padding: (1, 1), ..Default::default() }),
        (1, 2, 9, 60, 3, 3, 3, Conv2dParams { stride: (2, 2), padding: (1, 1), ..Default::default() }),
        (1, 4, 15, 62, 4, 3, 3, Conv2dParams { stride: (2, 2), padding: (0, 1), dilation: (2, 1), groups: 2 }),
        // A 1×1 of stride 2: subsampled and one product, not the stride phases.
        (2, 8, 18, 64, 5, 1, 1, Conv2dParams { stride: (2, 2), ..Default::default() }),
        // The stem's 7×7/2 with 64 outputs on a map whose position vectors (30 rows of 44 outputs: three, the last
        // partial) are more than one block of the phased input gradient's (64 on AVX-512, 128 on AVX2).
        (1, 3, 60, 87, 64, 7, 7, Conv2dParams { stride: (2, 2), padding: (3, 3), ..Default::default() }),
        // A stride of 2 both ways on the grid of the four stride phases (and case 9 above): rows of 28 outputs
        // from an odd padded width, a 5×5 (two positions past each row's 36 outputs), grouped with rows of 12
        // outputs from an odd padded height. Then 48 outputs on 60 positions of the grid, 5×5: not the grid.
        (1, 5, 20, 55, 7, 3, 3, Conv2dParams { stride: (2, 2), padding: (1, 1), ..Default::default() }),
        (2, 3, 9, 72, 5, 5, 5, Conv2dParams { stride: (2, 2), padding: (2, 2), ..Default::default() }),
        (2, 4, 19, 26, 6, 3, 3, Conv2dParams { stride: (2, 2), groups: 2, ..Default::default() }),
        (1, 3, 12, 16, 4, 5, 5, Conv2dParams { stride: (2, 2), padding: (2, 2), ..Default::default() }),
    ];
    // The cases whose rows fill the lanes less well than the grid does (the grid at least 3% more).
    let on_grid = [9, 14, 15, 16];
    for (seed, &(n, c, h, w, o, kh, kw, p)) in cases.iter().enumerate() {
        if p.stride.1 == 2 && crate::ops::simd::accelerated() {
            let g = geometry(&[n, c, h, w], &[o, c / p.groups, kh, kw], None, p).unwrap();
            let plan = super::forward::direct_plan(&g);
            // Case 17's rows of 8 outputs fit 8 lanes (AVX2), not 16: unfolded there.
            let wide = crate::ops::simd::level() == crate::ops::simd::Level::Avx512;
            let unfolded = kh == 1 || seed == 17 && wide;
            assert_eq!(plan.is_some(), !unfolded, "case {seed}: the phased direct path, or unfolded");
            let grid = plan.is_some_and(|plan| plan.on_grid());
            assert_eq!(grid, on_grid.contains(&seed), "case {seed}: the grid of the four stride phases, or not");
        }
        let seed = seed as u64;
        let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed);
        let wt = Tensor::uniform(&[o, c / p.groups, kh, kw], -1.0, 1.0, 10 + seed);
        let b = Tensor::uniform(&[o], -1.0, 1.0, 20 + seed);
        let g = geometry(x.shape(), wt.shape(), None, p).unwrap();
        let (og, k, hw) = (g.og(), g.k(), g.hw_out());
        let (xs, ws, bs) = (x.to_vec(), wt.to_vec(), b.to_vec());
        let mut want = vec![0.0f32; n * o * hw];
        let mut col = vec![0.0f32; k * hw];
        for (img, out) in xs.chunks(c * h * w).zip(want.chunks_mut(o * hw)) {
            for (plane, &bv) in out.chunks_mut(hw).zip(&bs) {
                plane.fill(bv);
            }
            for grp in 0..p.groups {
                im2col(img, &g, grp * g.cg(), &mut col);
                let wg = mat(&ws[grp * og * k..(grp + 1) * og * k], og, k);
                product(
                    wg,
                    mat(&col, k, hw),
                    mat_mut(&mut out[grp * og * hw..(grp + 1) * og * hw], og, hw),
                    true,
                    false,
                );
            }
        }
        let got = x.conv2d(&wt, Some(&b), p).unwrap().to_vec();
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "case {seed}");
        let fused = x.conv2d_relu(&wt, Some(&b), p).unwrap().to_vec();
        assert!(fused.iter().zip(&want).all(|(a, b)| a.to_bits() == b.max(0.0).to_bits()), "case {seed} relu");
        let clamped = x.conv2d_clamp(&wt, Some(&b), p, -0.25, 0.5).unwrap().to_vec();
        assert!(
            clamped.iter().zip(&want).all(|(a, b)| a.to_bits() == b.clamp(-0.25, 0.5).to_bits()),
            "case {seed} clamp"
        );
    }
}

/// The weight gradient read straight from the image gives the same bits as unfolding it and running the
/// product (`dWᵀ += col · doutᵀ`), on the geometries of the forward test. (Without the vector kernels there
/// is no implicit path: the adjoint test covers the `gemm` one.)
#[test]
fn implicit_weight_gradient_equals_unfolded_product() {
    if !simd::accelerated() {
        return;
    }
    let cases = [
        (3, 1, 28, 28, 16, 5, 5, Conv2dParams::default()),
        (3, 16, 12, 12, 32, 5, 5, Conv2dParams::default()),
        (2, 3, 13, 30, 7, 3, 3, Conv2dParams { padding: (1, 1), ..Default::default() }),
        (1, 4, 11, 21, 4, 3, 3, Conv2dParams { stride: (2, 1), padding: (1, 3), dilation: (2, 2), groups: 2 }),
    ];
    for (seed, &(n, c, h, w, o, kh, kw, p)) in cases.iter().enumerate() {
        let seed = seed as u64;
        let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed);
        let wt = Tensor::uniform(&[o, c / p.groups, kh, kw], -1.0, 1.0, 10 + seed);
        let g = geometry(x.shape(), wt.shape(), None, p).unwrap();
        let (og, k, hw) = (g.og(), g.k(), g.hw_out());
        let gout = Tensor::uniform(&[n, o, g.ho, g.wo], -1.0, 1.0, 20 + seed).to_array();
        let got = conv2d_backward(&x, &wt, false, &p, &gout, None, &[false, true]).unwrap()[1].clone().unwrap();
        let (xs, gs) = (x.to_vec(), gout.iter().copied().collect::<Vec<f32>>());
        let mut acc = vec![0.0f32; o * k];
        let (mut col, mut gt) = (vec![0.0f32; k * hw], vec![0.0f32; og * hw]);
        for (img, gimg) in xs.chunks(c * h * w).zip(gs.chunks(o * hw)) {
            for grp in 0..p.groups {
                im2col(img, &g, grp * g.cg(), &mut col);
                transpose(&gimg[grp * og * hw..(grp + 1) * og * hw], None, og, hw, &mut gt);
                let dst = mat_mut(&mut acc[grp * og * k..(grp + 1) * og * k], k, og);
                product(mat(&col, k, hw), mat(&gt, hw, og), dst, true, false);
            }
        }
        let mut want: Vec<f32> = Vec::with_capacity(o * k);
        for grp in acc.chunks(og * k) {
            want.extend(mat(grp, k, og).t().iter());
        }
        let got: Vec<f32> = got.iter().copied().collect();
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "case {seed}");
    }
}

/// The backward (input, weight and bias gradients) against the direct adjoint sums in f64, over the
/// geometries the vectorised im2col/col2im distinguish: padding, row stride, dilation, groups, rows wider
/// than one 16-lane vector, and a column stride that takes the scalar path; those of the input gradient as a
/// flipped forward convolution (stride 1); and those of the input gradient added into stride phases (a column
/// stride of 2). The image gradient is made without a zero-fill, each path writing it whole or zeroing it first:
/// run after a block of NaNs of its size is freed, an element left out shows.
#[test]
fn backward_matches_direct_adjoint() {
    let cases = [
        (2, 3, 10, 9, 4, 3, 3, Conv2dParams::default()),
        (2, 2, 9, 37, 3, 3, 5, Conv2dParams { padding: (2, 1), ..Default::default() }),
        (1, 4, 11, 20, 4, 3, 3, Conv2dParams { stride: (2, 1), padding: (1, 3), dilation: (2, 2), groups: 2 }),
        (2, 2, 8, 8, 2, 3, 2, Conv2dParams { stride: (1, 2), padding: (1, 1), ..Default::default() }),
        (3, 16, 12, 12, 32, 5, 5, Conv2dParams::default()),
        // A column stride of 2, added into the image gradient's stride phases: a stem-like 7×7 (odd padded width),
        // a 3×3 with partial vectors, an even padded width, a 1×1, grouped with a dilated row.
        (1, 3, 37, 63, 5, 7, 7, Conv2dParams { stride: (2, 2), padding: (3, 3), ..Default::default() }),
        (2, 14, 21, 57, 6, 3, 3, Conv2dParams { stride: (2, 2), padding: (1, 1), ..Default::default() }),
        (1, 2, 9, 60, 3, 3, 3, Conv2dParams { stride: (2, 2), padding: (1, 1), ..Default::default() }),
        (1, 4, 15, 62, 4, 3, 3, Conv2dParams { stride: (2, 2), padding: (0, 1), dilation: (2, 1), groups: 2 }),
        // A 1×1 of stride 2: the product scattered back (col2im), not the stride phases.
        (2, 8, 18, 64, 5, 1, 1, Conv2dParams { stride: (2, 2), ..Default::default() }),
        // The stem's 7×7/2 with 64 outputs on a map whose position vectors (30 rows of 44 outputs: three, the last
        // partial) are more than one block of the phased input gradient's (64 on AVX-512, 128 on AVX2).
        (1, 3, 60, 87, 64, 7, 7, Conv2dParams { stride: (2, 2), padding: (3, 3), ..Default::default() }),
        // A stride of 2 both ways, added into the grid of the four stride phases (and case 6 above, whose 14
        // channels are two pieces): rows of 28 outputs from an odd padded width, a 5×5, grouped with an odd padded
        // height, and 64 outputs over more than one block of position vectors.
        (1, 5, 20, 55, 7, 3, 3, Conv2dParams { stride: (2, 2), padding: (1, 1), ..Default::default() }),
        (2, 3, 9, 72, 5, 5, 5, Conv2dParams { stride: (2, 2), padding: (2, 2), ..Default::default() }),
        (2, 4, 19, 26, 6, 3, 3, Conv2dParams { stride: (2, 2), groups: 2, ..Default::default() }),
        (1, 3, 80, 56, 64, 3, 3, Conv2dParams { stride: (2, 2), padding: (1, 1), ..Default::default() }),
        // Padded with a stride of 1 on the direct kernels (a small output: not the flipped forward), added into a
        // padded scratch whose rows are copied across.
        (2, 3, 12, 40, 4, 7, 7, Conv2dParams { padding: (1, 1), ..Default::default() }),
    ];
    let on_grid = [6, 11, 12, 13, 14];
    for (seed, &(n, c, h, w, o, kh, kw, p)) in cases.iter().enumerate() {
        let seed = seed as u64;
        let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed);
        let wt = Tensor::uniform(&[o, c / p.groups, kh, kw], -1.0, 1.0, 10 + seed);
        let g = geometry(x.shape(), wt.shape(), None, p).unwrap();
        assert_eq!(super::backward::transposed_fits(&g), seed == 1, "case {seed}: the input gradient's path");
        if seed == 15 && crate::ops::simd::accelerated() {
            let plan = super::backward::input_grad_plan(&g, &wt.to_vec());
            assert!(plan.is_some_and(|plan| !plan.phased()), "case {seed}: the direct path, padded");
        } else if seed >= 5 && crate::ops::simd::accelerated() {
            let plan = super::backward::input_grad_plan(&g, &wt.to_vec());
            assert_eq!(plan.as_ref().is_some_and(|plan| plan.phased()), kh > 1, "case {seed}: the phased direct path");
            let grid = plan.is_some_and(|plan| plan.on_grid());
            assert_eq!(grid, on_grid.contains(&seed), "case {seed}: the grid of the four stride phases, or not");
        }
        let gout = Tensor::uniform(&[n, o, g.ho, g.wo], -1.0, 1.0, 20 + seed).to_array();
        // The image gradient is not zero-filled first: an element no path writes shows as a NaN of the poison.
        let grads = crate::ops::poisoned(&[n * c * h * w], || {
            conv2d_backward(&x, &wt, true, &p, &gout, None, &[true, true, true]).unwrap()
        });
        let (dx, dw, db) = (grads[0].as_ref().unwrap(), grads[1].as_ref().unwrap(), grads[2].as_ref().unwrap());
        let (x4, w4) = (x.to_array(), wt.to_array());
        let mut want_dx = ndarray::ArrayD::<f64>::zeros(x4.shape());
        let mut want_dw = ndarray::ArrayD::<f64>::zeros(w4.shape());
        let mut want_db = vec![0.0f64; o];
        let (og, cg) = (o / p.groups, c / p.groups);
        for ni in 0..n {
            for oc in 0..o {
                for i in 0..g.ho {
                    for j in 0..g.wo {
                        let gv = gout[[ni, oc, i, j]] as f64;
                        want_db[oc] += gv;
                        for ci in 0..cg {
                            for a in 0..kh {
                                for b in 0..kw {
                                    let ih = (i * p.stride.0 + a * p.dilation.0) as isize - p.padding.0 as isize;
                                    let iw = (j * p.stride.1 + b * p.dilation.1) as isize - p.padding.1 as isize;
                                    if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= w {
                                        continue;
                                    }
                                    let xc = oc / og * cg + ci;
                                    let (ih, iw) = (ih as usize, iw as usize);
                                    want_dx[[ni, xc, ih, iw]] += gv * w4[[oc, ci, a, b]] as f64;
                                    want_dw[[oc, ci, a, b]] += gv * x4[[ni, xc, ih, iw]] as f64;
                                }
                            }
                        }
                    }
                }
            }
        }
        let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs());
        assert!(dx.iter().zip(&want_dx).all(|(&a, &b)| close(a, b)), "case {seed}: input gradient");
        assert!(dw.iter().zip(&want_dw).all(|(&a, &b)| close(a, b)), "case {seed}: weight gradient");
        assert!(db.iter().zip(&want_db).all(|(&a, &b)| close(a, b)), "case {seed}: bias gradient");
    }
}

/// The input gradient of an image is the same bits whether the image is alone (its pieces of input channels
/// split across threads) or one of a batch (each image on one thread): the direct kernel's order of additions
/// into the image gradient depends on the geometry only. Large enough for the split (two and three pieces,
/// one padded, one in stride phases, one on the grid of the four stride phases, whose positions past the outputs
/// add into each channel's own slack), and the one-channel case.
#[test]
fn input_gradient_does_not_depend_on_the_batch_or_threads() {
    let padded = Conv2dParams { padding: (2, 1), ..Default::default() };
    let phased = Conv2dParams { stride: (2, 2), padding: (1, 1), ..Default::default() };
    for (c, hw, o, p) in [
        (16, 40, 32, Conv2dParams::default()),
        (1, 120, 16, Conv2dParams::default()),
        (30, 20, 8, padded),
        (30, 60, 8, phased),
        (30, 56, 8, phased),
    ] {
        let x = Tensor::uniform(&[3, c, hw, hw], -1.0, 1.0, 1);
        let wt = Tensor::uniform(&[o, c, 5, 5], -1.0, 1.0, 2);
        let g = geometry(x.shape(), wt.shape(), None, p).unwrap();
        if crate::ops::simd::accelerated() && p.stride.1 == 2 {
            let grid = super::backward::input_grad_plan(&g, &wt.to_vec()).is_some_and(|plan| plan.on_grid());
            assert_eq!(grid, hw == 56, "{hw}²: 27 outputs a row of 29 grid positions, or 29 of 31");
        }
        let gout = Tensor::uniform(&[3, o, g.ho, g.wo], -1.0, 1.0, 3).to_array();
        let batch = conv2d_backward(&x, &wt, false, &p, &gout, None, &[true, false]).unwrap()[0].clone().unwrap();
        for i in 0..3 {
            let xi = Tensor::new(x.value().slice(ndarray::s![i..i + 1, .., .., ..]).to_owned().into_dyn());
            let gi = gout.slice(ndarray::s![i..i + 1, .., .., ..]).to_owned().into_dyn();
            let one = conv2d_backward(&xi, &wt, false, &p, &gi, None, &[true, false]).unwrap()[0].clone().unwrap();
            let want = batch.slice(ndarray::s![i..i + 1, .., .., ..]);
            assert!(one.iter().zip(want.iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "c {c}, image {i}");
        }
    }
}

/// No input or no output channels is an error, not a panic; an empty batch is an empty output.
#[test]
fn zero_channels_are_an_error_and_an_empty_batch_is_empty() {
    let p = Conv2dParams::default();
    let (x, w) = (Tensor::zeros(&[2, 0, 5, 5]), Tensor::zeros(&[3, 0, 3, 3]));
    assert!(matches!(x.conv2d(&w, None, p), Err(Error::InvalidArgument { .. })));
    let (x, w) = (Tensor::zeros(&[2, 1, 5, 5]), Tensor::zeros(&[0, 1, 3, 3]));
    assert!(matches!(x.conv2d_relu_max_pool2(&w, None, p), Err(Error::InvalidArgument { .. })));
    let x = Tensor::zeros(&[0, 1, 6, 6]).variable();
    let w = Tensor::uniform(&[2, 1, 3, 3], -1.0, 1.0, 1).variable();
    for y in [x.conv2d(&w, None, p).unwrap(), x.conv2d_relu_max_pool2(&w, None, p).unwrap()] {
        assert_eq!(y.shape()[0], 0);
        let g = y.sum_all().grad_wrt(&[&x, &w]).unwrap();
        assert_eq!(g[0].shape(), &[0, 1, 6, 6]);
        assert!(g[1].to_vec().iter().all(|&v| v == 0.0));
    }
}

#[test]
fn kernel_larger_than_input_is_an_error() {
    let x = Tensor::zeros(&[1, 1, 3, 3]);
    let w = Tensor::zeros(&[1, 1, 5, 5]);
    assert!(matches!(x.conv2d(&w, None, Conv2dParams::default()), Err(Error::InvalidArgument { .. })));
    let w = Tensor::zeros(&[2, 2, 1, 1]);
    assert!(matches!(x.conv2d(&w, None, Conv2dParams::default()), Err(Error::ShapeMismatch { .. })));
}

/// Small maps (4×4, 3×3 and 5×5 outputs) run with several images side by side in one product: each image's output
/// and input gradient are the bits it gets alone (bias and fused ReLU included), and the values match the naive
/// convolution.
#[test]
fn small_maps_side_by_side_do_not_depend_on_the_batch() {
    let padded = Conv2dParams { padding: (1, 1), ..Default::default() };
    for (n, c, hw, o, k, p) in
        [(9, 6, 4, 10, 3, padded), (5, 3, 5, 7, 3, Conv2dParams::default()), (3, 4, 5, 5, 1, padded)]
    {
        let x = Tensor::uniform(&[n, c, hw, hw], -1.0, 1.0, 1);
        let w = Tensor::uniform(&[o, c, k, k], -1.0, 1.0, 2);
        let b = Tensor::uniform(&[o], -0.5, 0.5, 3);
        let g = geometry(x.shape(), w.shape(), None, p).unwrap();
        let batch = x.conv2d_relu(&w, Some(&b), p).unwrap().to_array();
        let plain = x.conv2d(&w, Some(&b), p).unwrap().to_array();
        let want = naive(
            &x.to_array().into_dimensionality().unwrap(),
            &w.to_array().into_dimensionality().unwrap(),
            &b.to_vec(),
            p,
        );
        assert!(plain.iter().zip(want.iter()).all(|(a, b)| (a - b).abs() <= 1e-4), "{n}x{c}x{hw}: values");
        let gout = Tensor::uniform(&[n, o, g.ho, g.wo], -1.0, 1.0, 4).to_array();
        let dx = conv2d_backward(&x, &w, true, &p, &gout, None, &[true, false, false]).unwrap()[0].clone().unwrap();
        for i in 0..n {
            let one =
                |t: &Tensor| Tensor::new(t.value().slice(ndarray::s![i..i + 1, .., .., ..]).to_owned().into_dyn());
            let alone = one(&x).conv2d_relu(&w, Some(&b), p).unwrap().to_array();
            let mine = batch.slice(ndarray::s![i..i + 1, .., .., ..]);
            assert!(alone.iter().zip(mine.iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "image {i}: values");
            let gi = gout.slice(ndarray::s![i..i + 1, .., .., ..]).to_owned().into_dyn();
            let di = conv2d_backward(&one(&x), &w, true, &p, &gi, None, &[true, false, false]).unwrap()[0].clone();
            let mine = dx.slice(ndarray::s![i..i + 1, .., .., ..]);
            assert!(di.unwrap().iter().zip(mine.iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "image {i}: dx");
        }
    }
}

/// The hand-written kernels run with subnormals flushed (`simd::isa::FlushSubnormals`): a sum whose every product
/// is subnormal is 0 there (in IEEE arithmetic the 144 products of 1e-40 add up to a normal 1.44e-38), and a
/// subnormal input reads as 0 (1e-40 · 1e10 would be 1e-30); the mode ends with the kernel, on the calling thread
/// and on rayon's workers.
#[test]
fn kernels_flush_subnormals_and_restore_the_mode() {
    if !simd::accelerated() {
        return;
    }
    let ieee = || {
        let t = std::hint::black_box(1e-20f32) * std::hint::black_box(1e-20f32);
        t.is_subnormal() && std::hint::black_box(1e-40f32) * std::hint::black_box(1e10f32) > 0.0
    };
    assert!(ieee(), "the test thread starts in IEEE mode");
    for (k, pad) in [(3, 1), (1, 0)] {
        // The direct kernels (3×3) and the packed product (1×1).
        let p = Conv2dParams { padding: (pad, pad), ..Conv2dParams::default() };
        let (c, o) = (144 / (k * k), 8);
        let tiny = Tensor::full(&[2, c, 6, 6], 1e-20).conv2d(&Tensor::full(&[o, c, k, k], 1e-20), None, p).unwrap();
        let naive_centre = 1.44e-38f32;
        assert!(naive_centre.is_normal());
        assert!(tiny.value().iter().all(|&v| v == 0.0), "{k}×{k}: subnormal products are flushed");
        let sub = Tensor::full(&[2, c, 6, 6], 1e-40).conv2d(&Tensor::full(&[o, c, k, k], 1e10), None, p).unwrap();
        assert!(sub.value().iter().all(|&v| v == 0.0), "{k}×{k}: subnormal inputs read as zero");
        // Ordinary values are untouched by the mode.
        let ones = Tensor::full(&[2, c, 6, 6], 1.0).conv2d(&Tensor::full(&[o, c, k, k], 1.0), None, p).unwrap();
        assert_eq!(ones.value()[[0, 0, 2, 2]], 144.0);
        assert!(ieee(), "{k}×{k}: the calling thread is back in IEEE mode");
        assert!(rayon::broadcast(|_| ieee()).into_iter().all(|b| b), "{k}×{k}: so are rayon's workers");
    }
}

/// The weight gradient on the vector kernels is, bit for bit, what its documentation promises (`backward::wgrad`):
/// per chunk of `WGRAD_CHUNK` images, one fused multiply-add chain from zero over the chunk's output positions in
/// order (image after image), then the chunks' sums added in order from zero — whichever way it is computed: the
/// chunks in parallel with a partial sum each (a small `dWᵀ`), or the chunks one after another with the rows of
/// `dWᵀ` (more than 256 K floats) shared out and several images staged side by side (one run per chunk, or several: 18×18 maps go 7
/// images a run), read from the padded images in place or unfolded (a column stride of 2, a pointwise kernel),
/// grouped, over 11 images (a full chunk and a partial one) or one.
#[test]
fn weight_gradient_chains_each_chunk_and_sums_the_chunks_in_order() {
    if !simd::accelerated() {
        return;
    }
    let pad = |s: usize, p: usize, groups: usize| Conv2dParams {
        stride: (s, s),
        padding: (p, p),
        groups,
        ..Default::default()
    };
    // (n, c, map, o, kernel, params): the rows-shared way unless `dWᵀ` is small and there are several chunks.
    let cases = [
        (11, 64, 4, 512, 3, pad(1, 1, 1)),
        (11, 64, 18, 1024, 3, pad(1, 1, 2)),
        (11, 64, 8, 512, 3, pad(2, 1, 1)),
        (11, 512, 8, 1024, 1, pad(2, 0, 1)),
        (11, 64, 4, 256, 3, pad(1, 1, 1)),
        (11, 8, 9, 16, 3, pad(1, 1, 2)),
        (11, 12, 6, 20, 1, pad(1, 0, 1)),
        (1, 6, 5, 10, 1, pad(1, 0, 1)),
        (1, 6, 7, 10, 3, pad(1, 1, 1)),
    ];
    for (case, &(n, c, map, o, k, p)) in cases.iter().enumerate() {
        let seed = case as u64;
        let x = Tensor::uniform(&[n, c, map, map], -1.0, 1.0, seed);
        let w = Tensor::uniform(&[o, c / p.groups, k, k], -1.0, 1.0, 10 + seed);
        let g = geometry(x.shape(), w.shape(), None, p).unwrap();
        let gout = Tensor::uniform(&[n, o, g.ho, g.wo], -1.0, 1.0, 20 + seed).to_array();
        let got = conv2d_backward(&x, &w, false, &p, &gout, None, &[false, true]).unwrap()[1].clone().unwrap();
        let (xs, gs) = (x.to_array(), gout.into_dimensionality::<Ix4>().unwrap());
        let (og, cg) = (g.og(), g.cg());
        let mut want = Vec::with_capacity(o * cg * k * k);
        for oc in 0..o {
            let grp = oc / og;
            for ci in 0..cg {
                for (a, b) in (0..k).flat_map(|a| (0..k).map(move |b| (a, b))) {
                    let mut total = 0.0f32;
                    for chunk in (0..n).collect::<Vec<_>>().chunks(WGRAD_CHUNK) {
                        let mut s = 0.0f32;
                        for (&i, oh, ow) in chunk
                            .iter()
                            .flat_map(|i| (0..g.ho).flat_map(move |oh| (0..g.wo).map(move |ow| (i, oh, ow))))
                        {
                            let ih = (oh * p.stride.0 + a) as isize - p.padding.0 as isize;
                            let iw = (ow * p.stride.1 + b) as isize - p.padding.1 as isize;
                            let inside = ih >= 0 && iw >= 0 && (ih as usize) < map && (iw as usize) < map;
                            let v = if inside { xs[[i, grp * cg + ci, ih as usize, iw as usize]] } else { 0.0 };
                            s = v.mul_add(gs[[i, oc, oh, ow]], s);
                        }
                        total += s;
                    }
                    want.push(total);
                }
            }
        }
        let got: Vec<f32> = got.iter().copied().collect();
        let same = got.iter().zip(&want).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
        assert_eq!(same, want.len(), "case {case}: {same} of {} values the same bits", want.len());
    }
}

/// 3×3 convolutions of stride 1 with 32 channels or more run by Winograd's F(4×4, 3×3) (on the vector kernels):
/// the values of the direct loops to the transforms' rounding — partial tiles, padding 0 to 2, the fused clamp —
/// an image's values the same bits alone as in a batch and on one thread, and the input gradient (the flipped
/// convolution, also by Winograd) the direct adjoint's to rounding.
#[test]
fn winograd_matches_the_direct_convolution() {
    let pad = |p: usize| Conv2dParams { padding: (p, p), ..Default::default() };
    // The last case has blocks enough for each thread to take whole blocks; the others go step by step. The
    // fifth's weight transform is packed for the product (`winograd::Transform`).
    let cases = [
        (2, 32, 8, 8, 32, 1),
        (3, 48, 13, 11, 64, 1),
        (2, 32, 9, 10, 48, 0),
        (2, 64, 6, 7, 32, 2),
        (2, 128, 7, 7, 144, 1),
        (3, 32, 64, 64, 32, 1),
    ];
    for (seed, &(n, c, h, w, o, p)) in cases.iter().enumerate() {
        let p = pad(p);
        let g = geometry(&[n, c, h, w], &[o, c, 3, 3], None, p).unwrap();
        let on = crate::ops::simd::accelerated() && super::winograd::enabled();
        assert_eq!(super::winograd::applies(&g), on, "case {seed}");
        let seed = seed as u64;
        let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed).variable();
        let wt = Tensor::uniform(&[o, c, 3, 3], -0.2, 0.2, 10 + seed);
        let b = Tensor::uniform(&[o], -1.0, 1.0, 20 + seed);
        let got = x.conv2d(&wt, Some(&b), p).unwrap();
        let x4 = x.to_array().into_dimensionality::<Ix4>().unwrap();
        let w4 = wt.to_array().into_dimensionality::<Ix4>().unwrap();
        let want = naive(&x4, &w4, &b.to_vec(), p);
        let worst = got.value().iter().zip(want.iter()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        let scale = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        eprintln!("case {seed}: worst {worst:e} of {scale}");
        assert!(worst <= 1e-5 * scale.max(1.0), "case {seed}: {worst} of {scale}");
        let clamped = x.conv2d_clamp(&wt, Some(&b), p, -0.25, 0.5).unwrap().to_vec();
        assert!(clamped.iter().zip(got.value().iter()).all(|(a, b)| a.to_bits() == b.clamp(-0.25, 0.5).to_bits()));
        // Fused with the ReLU and a 2×2 max pooling: the separate ops' bits.
        let pooled = x.conv2d_relu_max_pool2(&wt, Some(&b), p).unwrap();
        let separate = x.conv2d_relu(&wt, Some(&b), p).unwrap().max_pool2d(Pool2dParams::square(2)).unwrap();
        assert_eq!(pooled.to_vec(), separate.to_vec(), "case {seed}: pooled");
        // Its input gradient alone (an attack's pass) through Winograd on the expanded gradient: the separate ops'.
        let rp = Tensor::uniform(pooled.shape(), -1.0, 1.0, 40 + seed);
        let gp = pooled.mul(&rp).unwrap().sum_all().grad_wrt(&[&x]).unwrap().remove(0).to_vec();
        let gs = separate.mul(&rp).unwrap().sum_all().grad_wrt(&[&x]).unwrap().remove(0).to_vec();
        // (Where the input gradient does not run as the flipped convolution by Winograd — a smaller output, or
        // no vector kernels — the fused op takes the sparse sums: the same values to rounding.)
        let worst = gp.iter().zip(&gs).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        let bound = if super::backward::winograd_input_grad(&g) {
            0.0
        } else {
            4e-6 * gs.iter().fold(1.0f32, |m, v| m.max(v.abs()))
        };
        assert!(worst <= bound, "case {seed}: the pooled input gradient differs by {worst}");
        // One image alone, on one thread: the same bits.
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| {
            let xi = Tensor::new(x.value().slice(ndarray::s![n - 1..n, .., .., ..]).to_owned().into_dyn());
            xi.conv2d(&wt, Some(&b), p).unwrap()
        });
        let last = got.value().slice(ndarray::s![n - 1..n, .., .., ..]).to_owned();
        assert!(one.value().iter().zip(last.iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "case {seed}: alone");
        // The input gradient against the direct adjoint: Σ r·conv(x) differentiated by hand.
        let r = Tensor::uniform(got.shape(), -1.0, 1.0, 30 + seed);
        let dx = got.mul(&r).unwrap().sum_all().grad_wrt(&[&x]).unwrap().remove(0).to_vec();
        let (r4, mut want) = (r.to_array().into_dimensionality::<Ix4>().unwrap(), Array4::<f64>::zeros(x4.dim()));
        let (ho, wo) = (g.ho, g.wo);
        for ((ni, oc, i, j), &rv) in r4.indexed_iter() {
            for ci in 0..c {
                for a in 0..3 {
                    for bb in 0..3 {
                        let (ih, iw) =
                            ((i + a) as isize - p.padding.0 as isize, (j + bb) as isize - p.padding.1 as isize);
                        if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < w {
                            want[[ni, ci, ih as usize, iw as usize]] += f64::from(rv * w4[[oc, ci, a, bb]]);
                        }
                    }
                }
            }
        }
        let _ = (ho, wo);
        let worst = dx.iter().zip(want.iter()).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0f64, f64::max);
        let scale = want.iter().map(|v| v.abs()).fold(0.0f64, f64::max);
        eprintln!("case {seed}: dx worst {worst:e} of {scale}");
        assert!(worst <= 1e-5 * scale.max(1.0), "case {seed}: dx {worst} of {scale}");
    }
}
