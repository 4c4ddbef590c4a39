//! The fused convolutions against the ops they fuse — ReLU, ReLU + 2×2 max pooling, a clamp, a residual sum, SiLU —
//! on every forward path: the same bits forward, and the same gradients where the fused op promises them.

use super::super::*;
use crate::ops::pool::Pool2dParams;

/// `conv2d_relu` is `relu(conv2d(…))` bit for bit: values, and the gradients of input, weight and bias.
#[test]
fn fused_relu_equals_conv_then_relu() {
    let padded = Conv2dParams { padding: (1, 1), ..Default::default() };
    for (n, p) in [(3, Conv2dParams::default()), (11, Conv2dParams::default()), (1, padded)] {
        let x = Tensor::uniform(&[n, 2, 9, 9], -1.0, 1.0, 1).variable();
        let w = Tensor::uniform(&[4, 2, 3, 3], -1.0, 1.0, 2).variable();
        let b = Tensor::uniform(&[4], -0.5, 0.5, 3).variable();
        let r = Tensor::uniform(&[n, 4, 9 - 2 + 2 * p.padding.0, 9 - 2 + 2 * p.padding.1], -1.0, 1.0, 4);
        let fused = x.conv2d_relu(&w, Some(&b), p).unwrap();
        let plain = x.conv2d(&w, Some(&b), p).unwrap().relu();
        assert_eq!(fused.to_array(), plain.to_array());
        let gf = fused.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &w, &b]).unwrap();
        let gp = plain.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &w, &b]).unwrap();
        for (a, b) in gf.iter().zip(&gp) {
            assert_eq!(a.to_array(), b.to_array());
        }
    }
}

/// `conv2d_relu_max_pool2` is `max_pool2d(relu(conv2d(…)), 2×2)`: values bit for bit (recorded or not), and
/// the gradients of input, weight and bias — bit for bit on the dense backward, to rounding on the sparse one
/// (which adds in another order). Odd output sizes (an unpooled last row and column), padding, groups, one
/// image (the split inside the image) and many, the cnn's two layers, and a NaN input (the ReLU maps it to 0
/// in both); on the direct kernels' pooled store (rows that fill the vectors) and on the buffered path.
#[test]
fn fused_pool_equals_conv_relu_then_pool() {
    let padded = Conv2dParams { padding: (1, 1), ..Default::default() };
    let grouped = Conv2dParams { padding: (1, 2), groups: 2, ..Default::default() };
    let cases = [
        (3, 2, 9, 9, 4, 3, Conv2dParams::default()),
        (1, 2, 9, 10, 4, 3, padded),
        (2, 4, 11, 9, 6, 3, grouped),
        (5, 1, 28, 28, 16, 5, Conv2dParams::default()),
        (5, 16, 12, 12, 32, 5, Conv2dParams::default()),
        (2, 4, 10, 14, 6, 3, Conv2dParams { padding: (1, 1), groups: 2, ..Default::default() }),
        (1, 16, 30, 30, 32, 5, Conv2dParams::default()),
        (2, 3, 11, 17, 5, 3, Conv2dParams::default()),
        // Split vectors (output rows of half a vector): a leftover pair of rows, two tiles of quads, stride 2, AVX2.
        (2, 3, 11, 12, 5, 5, Conv2dParams::default()),
        (2, 3, 20, 12, 4, 5, Conv2dParams::default()),
        (1, 2, 20, 12, 3, 5, Conv2dParams { stride: (2, 1), ..Default::default() }),
        (2, 3, 12, 8, 7, 5, Conv2dParams::default()),
        // Split halves after whole vectors (24 = 16 + 8 is the cnn's conv1): rows of 40 on AVX-512 and a leftover
        // pair, rows of 12 on AVX2, stride 2.
        (2, 2, 14, 44, 5, 5, Conv2dParams::default()),
        (2, 3, 13, 16, 4, 5, Conv2dParams::default()),
        (1, 2, 28, 28, 3, 5, Conv2dParams { stride: (2, 1), ..Default::default() }),
        // Sparse only: padded (runs of 24 values), and runs of 200 (more than one block of vectors).
        (2, 8, 10, 11, 6, 3, Conv2dParams { padding: (1, 2), ..Default::default() }),
        (9, 40, 8, 8, 3, 5, Conv2dParams::default()),
    ];
    let pool = Pool2dParams::square(2);
    for (seed, &(n, c, h, w, o, k, p)) in cases.iter().enumerate() {
        let seed = seed as u64;
        let mut xv = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed).to_array();
        xv[[0, 0, 1, 1]] = f32::NAN;
        let x = Tensor::new(xv).variable();
        let wt = Tensor::uniform(&[o, c / p.groups, k, k], -1.0, 1.0, 10 + seed).variable();
        let b = Tensor::uniform(&[o], -0.5, 0.5, 20 + seed).variable();
        let fused = x.conv2d_relu_max_pool2(&wt, Some(&b), p).unwrap();
        let plain = x.conv2d(&wt, Some(&b), p).unwrap().relu().max_pool2d(pool).unwrap();
        let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&plain), "case {seed}: values");
        let untracked = crate::no_grad(|| x.conv2d_relu_max_pool2(&wt, Some(&b), p).unwrap());
        assert_eq!(bits(&untracked), bits(&plain), "case {seed}: values, not recorded");
        let r = Tensor::uniform(plain.shape(), -1.0, 1.0, 30 + seed);
        let gf = fused.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &wt, &b]).unwrap();
        let gp = plain.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &wt, &b]).unwrap();
        let sparse = sparse::applies(&geometry(&[n, c, h, w], wt.shape(), None, p).unwrap());
        for (i, (a, b)) in gf.iter().zip(&gp).enumerate() {
            if !sparse {
                assert_eq!(bits(a), bits(b), "case {seed}: gradient {i}");
                continue;
            }
            // The sparse backward adds in another order, and never forms the plain weight gradient's
            // `0 · NaN` where the ReLU passed nothing.
            for (j, (&f, &q)) in a.to_vec().iter().zip(&b.to_vec()).enumerate() {
                let close = (f - q).abs() <= 1e-5 * (1.0 + q.abs());
                assert!(close || q.is_nan() && i == 1 && f.is_finite(), "case {seed}: gradient {i}[{j}] {f} vs {q}");
            }
        }
        let dense = [0, 1, 2, 3, 5, 10, 14];
        assert_eq!(sparse, !dense.contains(&seed), "case {seed}: the backward it means to test");
    }
    // No whole window: the pooling's error, as from the separate ops.
    let x = Tensor::zeros(&[1, 1, 5, 5]);
    let w = Tensor::zeros(&[1, 1, 5, 5]);
    assert!(x.conv2d_relu_max_pool2(&w, None, Conv2dParams::default()).is_err());
}

/// The fused clamp (ReLU6) against the convolution and then `clamp`, on every forward path (direct 3×3, pointwise
/// product, depthwise, strided unfold, small maps side by side): the same bits forward, and the same gradients of
/// input, weight and bias where no value sits on a bound. On a bound the fused op follows PyTorch's ReLU6 (no
/// gradient), where `clamp` passes it; bounds that are not an interval are an error.
#[test]
fn fused_clamp_equals_conv_then_clamp() {
    let cases: [([usize; 4], [usize; 4], Conv2dParams); 5] = [
        ([2, 5, 9, 8], [6, 5, 3, 3], Conv2dParams { padding: (1, 1), ..Conv2dParams::default() }),
        ([2, 12, 7, 7], [10, 12, 1, 1], Conv2dParams::default()),
        ([2, 6, 9, 9], [6, 1, 3, 3], Conv2dParams { padding: (1, 1), groups: 6, ..Conv2dParams::default() }),
        ([2, 4, 9, 9], [5, 4, 3, 3], Conv2dParams { stride: (2, 2), padding: (1, 1), ..Conv2dParams::default() }),
        ([8, 16, 4, 4], [16, 16, 3, 3], Conv2dParams { padding: (1, 1), ..Conv2dParams::default() }),
    ];
    for (i, (xs, ws, p)) in cases.into_iter().enumerate() {
        let seed = 40 + 3 * i as u64;
        let x = Tensor::uniform(&xs, -1.0, 1.0, seed).variable();
        let w = Tensor::uniform(&ws, -0.5, 0.5, seed + 1).variable();
        let b = Tensor::uniform(&[ws[0]], -0.2, 0.2, seed + 2).variable();
        let (lo, hi) = (-0.3, 0.4);
        let fused = x.conv2d_clamp(&w, Some(&b), p, lo, hi).unwrap();
        let plain = x.conv2d(&w, Some(&b), p).unwrap().clamp(lo, hi);
        let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&plain), "case {i}: values");
        let inside = fused.to_vec().iter().filter(|&&v| v > lo && v < hi).count();
        assert!(inside > 0 && inside < fused.numel(), "case {i}: both sides of the bounds are exercised");
        let weights = Tensor::uniform(fused.shape(), -1.0, 1.0, seed + 3);
        let grads = |y: &Tensor| y.mul(&weights).unwrap().sum_all().grad_wrt(&[&x, &w, &b]).unwrap();
        for (name, (a, e)) in ["x", "w", "b"].iter().zip(grads(&fused).iter().zip(&grads(&plain))) {
            assert_eq!(bits(a), bits(e), "case {i}: ∂{name}");
        }
    }
    // On a bound: a zero input and bias give a convolution of exactly 0 = lo.
    let x = Tensor::zeros(&[1, 2, 4, 4]).variable();
    let w = Tensor::uniform(&[3, 2, 3, 3], -0.5, 0.5, 9);
    let p = Conv2dParams { padding: (1, 1), ..Conv2dParams::default() };
    let fused = x.conv2d_clamp(&w, None, p, 0.0, 6.0).unwrap().sum_all().grad_wrt(&[&x]).unwrap();
    assert!(fused[0].to_vec().iter().all(|&v| v == 0.0), "ReLU6's rule: nothing passes at the bound");
    let plain = x.conv2d(&w, None, p).unwrap().clamp(0.0, 6.0).sum_all().grad_wrt(&[&x]).unwrap();
    assert!(plain[0].to_vec().iter().any(|&v| v != 0.0), "clamp's rule: the bound passes");
    for (lo, hi) in [(1.0, 0.0), (f32::NAN, 1.0), (0.0, f32::NAN)] {
        assert!(x.conv2d_clamp(&w, None, p, lo, hi).is_err(), "[{lo}, {hi}]");
    }
}

/// `conv2d_add` and `conv2d_add_relu` against the convolution and then `add` / `add_relu`, on every forward path
/// (direct 3×3 with padding, the unfolded 1×1 whose store adds the residual, the transposed 1×1 on a 7×7 map,
/// depthwise, grouped 3×3 and grouped 1×1 (unfolded, the residual sliced per group), a strided unfold, small maps
/// side by side, Winograd with partial tiles and whole ones, adding as it
/// writes each image back), over one image (split inside it) and several:
/// the same bits forward, recorded or not, and the same gradients of input, weight, bias and residual. A residual of
/// another shape is added with broadcasting; one that does not broadcast is the sum's error.
#[test]
fn fused_residual_equals_conv_then_add() {
    let pad = |k| Conv2dParams { padding: (k, k), ..Conv2dParams::default() };
    let grouped = Conv2dParams { padding: (1, 1), groups: 2, ..Conv2dParams::default() };
    let grouped_1x1 = Conv2dParams { groups: 2, ..Conv2dParams::default() };
    let cases: [([usize; 4], [usize; 4], Conv2dParams); 12] = [
        ([2, 5, 9, 8], [6, 5, 3, 3], pad(1)),
        ([2, 8, 9, 9], [6, 4, 3, 3], grouped),
        ([2, 8, 7, 7], [6, 4, 1, 1], grouped_1x1),
        ([1, 5, 9, 8], [6, 5, 3, 3], pad(1)),
        ([3, 12, 9, 9], [10, 12, 1, 1], Conv2dParams::default()),
        ([1, 40, 12, 12], [70, 40, 1, 1], Conv2dParams::default()),
        ([2, 256, 7, 7], [64, 256, 1, 1], Conv2dParams::default()),
        ([2, 6, 9, 9], [6, 1, 3, 3], Conv2dParams { padding: (1, 1), groups: 6, ..Conv2dParams::default() }),
        ([2, 4, 9, 9], [5, 4, 3, 3], Conv2dParams { stride: (2, 2), padding: (1, 1), ..Conv2dParams::default() }),
        ([8, 16, 4, 4], [16, 16, 3, 3], pad(1)),
        ([2, 32, 10, 10], [32, 32, 3, 3], pad(1)),
        ([1, 32, 8, 8], [48, 32, 3, 3], pad(1)),
    ];
    if simd::accelerated() {
        let g = |i: usize| geometry(&cases[i].0, &cases[i].1, None, cases[i].2).unwrap();
        assert!(super::pointwise::applies(&g(6)) && !super::pointwise::applies(&g(5)), "both 1×1 paths");
        assert!(super::forward::direct_plan(&g(2)).is_none(), "the grouped 1×1 unfolds, group by group");
        let wino = super::winograd::applies(&g(10)) && super::winograd::applies(&g(11));
        assert!(wino || !super::winograd::enabled(), "Winograd runs, on partial tiles and whole ones");
    }
    let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (i, (xs, ws, p)) in cases.into_iter().enumerate() {
        let seed = 90 + 5 * i as u64;
        let x = Tensor::uniform(&xs, -1.0, 1.0, seed).variable();
        let w = Tensor::uniform(&ws, -0.5, 0.5, seed + 1).variable();
        let b = Tensor::uniform(&[ws[0]], -0.2, 0.2, seed + 2).variable();
        let plain = x.conv2d(&w, Some(&b), p).unwrap();
        let r = Tensor::uniform(plain.shape(), -1.0, 1.0, seed + 3).variable();
        let weights = Tensor::uniform(plain.shape(), -1.0, 1.0, seed + 4);
        let grads = |y: &Tensor| y.mul(&weights).unwrap().sum_all().grad_wrt(&[&x, &w, &b, &r]).unwrap();
        for relu in [false, true] {
            let (fused, want) = if relu {
                (x.conv2d_add_relu(&w, Some(&b), p, &r).unwrap(), plain.add_relu(&r).unwrap())
            } else {
                (x.conv2d_add(&w, Some(&b), p, &r).unwrap(), plain.add(&r).unwrap())
            };
            assert_eq!(bits(&fused), bits(&want), "case {i} relu {relu}: values");
            let zeros = fused.to_vec().iter().filter(|&&v| v == 0.0).count();
            assert!(!relu || zeros > 0 && zeros < fused.numel(), "case {i}: both sides of the ReLU");
            for (name, (a, e)) in ["x", "w", "b", "r"].iter().zip(grads(&fused).iter().zip(&grads(&want))) {
                assert_eq!(a.to_array(), e.to_array(), "case {i} relu {relu}: ∂{name}");
            }
            let untracked = crate::no_grad(|| x.conv2d_add_relu(&w, Some(&b), p, &r).unwrap());
            assert!(!relu || bits(&untracked) == bits(&fused), "case {i}: not recorded");
        }
    }
    // Broadcast: a residual per channel is the sum with broadcasting; a residual that does not fit is an error.
    let x = Tensor::uniform(&[2, 3, 6, 6], -1.0, 1.0, 1).variable();
    let w = Tensor::uniform(&[4, 3, 3, 3], -0.5, 0.5, 2);
    let r = Tensor::uniform(&[4, 1, 1], -1.0, 1.0, 3).variable();
    let fused = x.conv2d_add_relu(&w, None, Conv2dParams::default(), &r).unwrap();
    let want = x.conv2d(&w, None, Conv2dParams::default()).unwrap().add(&r).unwrap().relu();
    assert_eq!(bits(&fused), bits(&want));
    let g = |y: &Tensor| y.sum_all().grad_wrt(&[&x, &r]).unwrap();
    for (a, e) in g(&fused).iter().zip(&g(&want)) {
        assert_eq!(a.to_array(), e.to_array());
    }
    let wrong = Tensor::uniform(&[3, 1, 1], -1.0, 1.0, 4);
    assert!(x.conv2d_add(&w, None, Conv2dParams::default(), &wrong).is_err());
    // A residual that is a permuted view (not in standard layout), into the product's store.
    let x = Tensor::uniform(&[3, 12, 9, 9], -1.0, 1.0, 5);
    let w = Tensor::uniform(&[10, 12, 1, 1], -0.5, 0.5, 6);
    let r = Tensor::uniform(&[3, 9, 9, 10], -1.0, 1.0, 7).permute(&[0, 3, 1, 2]).unwrap();
    let want = x.conv2d(&w, None, Conv2dParams::default()).unwrap().add_relu(&r).unwrap();
    assert_eq!(bits(&x.conv2d_add_relu(&w, None, Conv2dParams::default(), &r).unwrap()), bits(&want));
    // Subnormal residuals are flushed alike on every path: small maps side by side (a batch) and the product's store
    // (one image) give each image the same bits.
    let x = Tensor::uniform(&[8, 16, 4, 4], -1.0, 1.0, 8);
    let w = Tensor::zeros(&[16, 16, 3, 3]);
    let r = Tensor::new(ndarray::ArrayD::from_elem(vec![8, 16, 4, 4], 1e-39f32));
    let batch = bits(&x.conv2d_add(&w, None, pad(1), &r).unwrap());
    for i in 0..8 {
        let one = |t: &Tensor| t.narrow(0, i, 1).unwrap();
        let alone = bits(&one(&x).conv2d_add(&w, None, pad(1), &one(&r)).unwrap());
        assert_eq!(alone, batch[i * 256..(i + 1) * 256], "image {i}");
    }
}

/// `conv2d_silu` gives the bits of `conv2d(…).silu()` on every path the forward takes — the transposed and the
/// unfolded pointwise product, a strided 1×1, the direct kernels at strides 1 and 2, unfolding (a stride-2 3×3 over
/// 8 channels), Winograd, small maps side by side (stride 3, a 4×4 map), depthwise planes and channels in lanes,
/// batches of one (the SiLU across threads) — including where the SiLU of a
/// tiny convolution output is subnormal (channel 0: zero weights, bias 1.5e-38), which the kernels' flush-to-zero
/// mode would make 0. Tracked, it is the two ops, gradient included.
#[test]
fn conv_silu_gives_the_two_ops_bits_on_every_path() {
    // (images, channels in, side, channels out, kernel, stride, padding, groups), channels in lanes
    type Case = ((usize, usize, usize, usize), (usize, usize, usize, usize), Option<bool>);
    let cases: &[Case] = &[
        ((2, 256, 7, 64), (1, 1, 0, 1), None),
        ((2, 16, 20, 24), (1, 1, 0, 1), None),
        ((1, 16, 20, 24), (1, 1, 0, 1), None),
        ((2, 16, 14, 8), (1, 2, 0, 1), None),
        ((2, 8, 12, 16), (3, 1, 1, 1), None),
        ((1, 8, 12, 16), (3, 1, 1, 1), None),
        ((2, 32, 12, 32), (3, 1, 1, 1), None),
        ((2, 8, 16, 16), (3, 2, 1, 1), None),
        ((2, 64, 30, 64), (3, 2, 1, 1), None),
        ((2, 4, 13, 6), (3, 3, 1, 1), None),
        ((4, 16, 4, 8), (3, 1, 1, 1), None),
        ((2, 24, 40, 24), (3, 1, 1, 24), Some(false)),
        ((2, 24, 40, 24), (3, 1, 1, 24), Some(true)),
        ((2, 24, 16, 24), (3, 2, 1, 24), Some(false)),
        ((2, 24, 16, 24), (3, 2, 1, 24), Some(true)),
    ];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (i, &((n, c, side, o), (k, s, pad, groups), lanes)) in cases.iter().enumerate() {
        let seed = 900 + 10 * i as u64;
        let x = Tensor::uniform(&[n, c, side, side], -2.0, 2.0, seed);
        let mut w = Tensor::uniform(&[o, c / groups, k, k], -0.3, 0.3, seed + 1).to_vec();
        w[..c / groups * k * k].iter_mut().for_each(|v| *v = 0.0);
        let w = Tensor::from_vec(w, &[o, c / groups, k, k]).unwrap();
        let mut b = Tensor::uniform(&[o], -0.5, 0.5, seed + 2).to_vec();
        b[0] = 1.5e-38;
        let b = Tensor::from_vec(b, &[o]).unwrap();
        let p = Conv2dParams { stride: (s, s), padding: (pad, pad), groups, ..Default::default() };
        depthwise::LAYOUT.with(|f| f.set(lanes));
        let want = x.conv2d(&w, Some(&b), p).unwrap().silu().to_vec();
        let got = x.conv2d_silu(&w, Some(&b), p).unwrap().to_vec();
        let xv = x.variable();
        let y2 = xv.conv2d(&w, Some(&b), p).unwrap().silu();
        let y1 = xv.conv2d_silu(&w, Some(&b), p).unwrap();
        let gy = Tensor::uniform(y1.shape(), -1.0, 1.0, seed + 3);
        let g1 = y1.mul(&gy).unwrap().sum_all().grad_wrt(&[&xv]).unwrap().remove(0);
        let g2 = y2.mul(&gy).unwrap().sum_all().grad_wrt(&[&xv]).unwrap().remove(0);
        depthwise::LAYOUT.with(|f| f.set(None));
        assert!(want.iter().any(|v| *v != 0.0 && v.abs() < f32::MIN_POSITIVE), "case {i}: a subnormal SiLU");
        assert!(bits(&got) == bits(&want), "case {i}: untracked");
        assert!(bits(&y1.to_vec()) == bits(&want), "case {i}: tracked");
        assert!(bits(&g1.to_vec()) == bits(&g2.to_vec()), "case {i}: input gradient");
    }
}
