//! Every differentiable op: a central finite-difference check (loss accumulated in f64) on random shapes,
//! including broadcasting and batch 1, with inputs kept off kinks and ties.
// Test tables read best with `&[x.clone()]`; the clone is of a small test array.
#![allow(clippy::cloned_ref_to_slice_refs)]

use armoury::nn::plan::Fused;
use armoury::nn::{BatchNorm, Layer, Module, Normalize};
use armoury::{no_grad, Conv2dParams, Pool2dParams, Reduction, Result, Tensor};
use ndarray::{Array2, ArrayD, IxDyn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Uniform in ±[lo, hi] (random sign): keeps values at least `lo` away from 0.
fn away_from_zero(shape: &[usize], lo: f32, hi: f32, seed: u64) -> ArrayD<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        let m = lo + (hi - lo) * rng.random::<f32>();
        if rng.random::<bool>() {
            m
        } else {
            -m
        }
    })
}

fn uniform(shape: &[usize], lo: f32, hi: f32, seed: u64) -> ArrayD<f32> {
    Tensor::uniform(shape, lo, hi, seed).to_array()
}

/// Distinct values spaced by `gap`, shuffled: no ties for max/argmax-style ops.
fn distinct(shape: &[usize], gap: f32, seed: u64) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    let mut v: Vec<f32> = (0..n).map(|i| (i as f32 - n as f32 / 2.0) * gap).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in (1..n).rev() {
        v.swap(i, rng.random_range(0..=i));
    }
    ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
}

fn projected(out: &Tensor, r: &ArrayD<f32>) -> f64 {
    out.value().iter().zip(r.iter()).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// Compares autodiff with central differences of L = Σ r ⊙ f(inputs), for every input.
fn check(name: &str, inputs: &[ArrayD<f32>], f: &dyn Fn(&[Tensor]) -> Result<Tensor>) {
    let vars: Vec<Tensor> = inputs.iter().map(|a| Tensor::new(a.clone()).variable()).collect();
    let out = f(&vars).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    let r = uniform(out.shape(), -1.0, 1.0, 7);
    let loss = out.mul(&Tensor::new(r.clone())).unwrap().sum_all();
    let refs: Vec<&Tensor> = vars.iter().collect();
    let grads = loss.grad_wrt(&refs).unwrap();
    let h = 2e-3f32;
    for (k, input) in inputs.iter().enumerate() {
        assert_eq!(grads[k].shape(), input.shape(), "{name}: gradient shape of input {k}");
        let n = input.len();
        let stride = (n / 40).max(1); // at most ~40 probes per input
        for idx in (0..n).step_by(stride) {
            let eval = |delta: f32| {
                let perturbed: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(j, a)| {
                        let mut a = a.clone();
                        if j == k {
                            a.as_slice_mut().unwrap()[idx] += delta;
                        }
                        Tensor::new(a)
                    })
                    .collect();
                projected(&no_grad(|| f(&perturbed)).unwrap(), &r)
            };
            let fd = (eval(h) - eval(-h)) / (2.0 * h as f64);
            let ad = grads[k].value().as_slice().map(|s| s[idx]).unwrap_or_else(|| grads[k].to_vec()[idx]) as f64;
            let tol = 2e-3 + 1e-2 * fd.abs().max(ad.abs());
            assert!(
                (fd - ad).abs() <= tol,
                "{name}: input {k} element {idx}: autodiff {ad:.6} vs finite difference {fd:.6}"
            );
        }
    }
}

#[test]
fn elementwise_binary_with_broadcasting_and_batch_one() {
    // The last four take the per-run slice loops (a per-channel operand, a per-sample-and-channel gate, one
    // broadcast on the left, a single value), the others the `Zip`.
    let shapes: [(&[usize], &[usize]); 8] = [
        (&[3, 4], &[3, 4]),
        (&[2, 3, 4], &[4]),
        (&[1, 5], &[3, 1]),
        (&[1, 1], &[1, 1]),
        (&[2, 3, 4, 5], &[1, 3, 1, 1]),
        (&[2, 3, 4, 5], &[2, 3, 1, 1]),
        (&[3, 1, 1], &[2, 3, 4, 6]),
        (&[2, 3, 4, 5], &[1]),
    ];
    for (i, (sa, sb)) in shapes.iter().enumerate() {
        let s = i as u64 * 10;
        let a = uniform(sa, -2.0, 2.0, s);
        let b = away_from_zero(sb, 0.5, 2.0, s + 1);
        check("add", &[a.clone(), b.clone()], &|t| t[0].add(&t[1]));
        // The fused add and ReLU, with every sum at least 0.25 from the kink.
        let (a1, b1) = (away_from_zero(sa, 0.5, 2.0, s + 2), uniform(sb, -0.25, 0.25, s + 3));
        check("add_relu", &[a1, b1], &|t| t[0].add_relu(&t[1]));
        check("sub", &[a.clone(), b.clone()], &|t| t[0].sub(&t[1]));
        check("mul", &[a.clone(), b.clone()], &|t| t[0].mul(&t[1]));
        check("div", &[a.clone(), b.clone()], &|t| t[0].div(&t[1]));
        // keep a and b apart so max/min has no ties within the step
        let b2 = b.mapv(|v| v + 0.0);
        let a2 =
            ndarray::Zip::from(&a.broadcast(a.raw_dim()).unwrap())
                .map_collect(|&v| if v.abs() < 0.3 { v + 0.6 } else { v });
        check("maximum", &[a2.clone(), b2.mapv(|v| v * 0.1 + 0.05)], &|t| t[0].maximum(&t[1]));
        check("minimum", &[a2, b2.mapv(|v| v * 0.1 + 0.05)], &|t| t[0].minimum(&t[1]));
    }
}

#[test]
fn unary_functions() {
    let x = away_from_zero(&[3, 5], 0.1, 2.0, 3);
    let pos = uniform(&[3, 5], 0.2, 3.0, 4);
    let open = uniform(&[2, 6], -0.8, 0.8, 5);
    check("neg", &[x.clone()], &|t| Ok(t[0].neg()));
    check("affine", &[x.clone()], &|t| Ok(t[0].affine(-1.5, 0.3)));
    check("powf", &[pos.clone()], &|t| Ok(t[0].powf(2.5)));
    check("powf_neg", &[pos.clone()], &|t| Ok(t[0].powf(-0.5)));
    check("exp", &[x.clone()], &|t| Ok(t[0].exp()));
    check("log", &[pos.clone()], &|t| Ok(t[0].log()));
    check("sqrt", &[pos.clone()], &|t| Ok(t[0].sqrt()));
    check("abs", &[x.clone()], &|t| Ok(t[0].abs()));
    check("sign", &[x.clone()], &|t| Ok(t[0].sign()));
    check("clamp", &[x.clone()], &|t| Ok(t[0].clamp(-0.05, 0.05)));
    check("relu", &[x.clone()], &|t| Ok(t[0].relu()));
    check("leaky_relu", &[x.clone()], &|t| Ok(t[0].leaky_relu(0.1)));
    check("sigmoid", &[x.clone()], &|t| Ok(t[0].sigmoid()));
    check("silu", &[x.clone()], &|t| Ok(t[0].silu()));
    check("tanh", &[x.clone()], &|t| Ok(t[0].tanh()));
    check("softplus", &[x.mapv(|v| v * 10.0)], &|t| Ok(t[0].softplus()));
    check("atanh", &[open], &|t| Ok(t[0].atanh()));
}

#[test]
fn matmul_2d_batched_and_broadcast() {
    check("matmul", &[uniform(&[3, 4], -1.0, 1.0, 1), uniform(&[4, 5], -1.0, 1.0, 2)], &|t| t[0].matmul(&t[1]));
    check("matmul_b1", &[uniform(&[1, 4], -1.0, 1.0, 1), uniform(&[4, 2], -1.0, 1.0, 2)], &|t| t[0].matmul(&t[1]));
    check("matmul_t", &[uniform(&[3, 4], -1.0, 1.0, 1), uniform(&[5, 4], -1.0, 1.0, 2)], &|t| t[0].matmul(&t[1].t()?));
    check("bmm", &[uniform(&[2, 3, 4], -1.0, 1.0, 3), uniform(&[2, 4, 2], -1.0, 1.0, 4)], &|t| t[0].matmul(&t[1]));
    check("bmm_2d", &[uniform(&[2, 3, 4], -1.0, 1.0, 3), uniform(&[4, 2], -1.0, 1.0, 4)], &|t| t[0].matmul(&t[1]));
}

#[test]
fn reductions() {
    let x = uniform(&[2, 3, 4], -1.0, 1.0, 9);
    check("sum_all", &[x.clone()], &|t| Ok(t[0].sum_all()));
    check("sum_axes", &[x.clone()], &|t| t[0].sum(&[0, 2], false));
    check("sum_keepdim", &[x.clone()], &|t| t[0].sum(&[1], true));
    check("mean", &[x.clone()], &|t| t[0].mean(&[2], false));
    check("mean_all", &[x.clone()], &|t| t[0].mean_all());
    let d = distinct(&[3, 5], 0.05, 2);
    check("max", &[d.clone()], &|t| t[0].max(1, false));
    check("max_keepdim", &[d.clone()], &|t| t[0].max(0, true));
    check("min", &[d.clone()], &|t| t[0].min(1, false));
    check("topk", &[d], &|t| Ok(t[0].topk(2)?.0));
}

#[test]
fn shape_ops() {
    let x = uniform(&[2, 3, 4], -1.0, 1.0, 11);
    check("reshape", &[x.clone()], &|t| t[0].reshape(&[6, 4]));
    check("flatten", &[x.clone()], &|t| t[0].flatten_from(1));
    check("permute", &[x.clone()], &|t| t[0].permute(&[2, 0, 1])?.mul(&Tensor::ones(&[4, 2, 3])));
    check("transpose_then_matmul", &[x.clone()], &|t| t[0].transpose(1, 2)?.reshape(&[8, 3]));
    check("narrow", &[x.clone()], &|t| t[0].narrow(2, 1, 2));
    // Several narrows of one input (the backward adds each into its slice of the input's gradient in place): a
    // transformer's q, k and v (contiguous slices along the first axis), overlapping slices along the last, and
    // the input read whole too.
    check("narrows_of_one_input", &[uniform(&[3, 2, 4], -1.0, 1.0, 14)], &|t| {
        let (q, k, v) = (t[0].narrow(0, 0, 1)?, t[0].narrow(0, 1, 1)?, t[0].narrow(0, 2, 1)?);
        let overlapping = t[0].narrow(2, 0, 3)?.mul(&t[0].narrow(2, 1, 3)?)?.sum(&[2], true)?;
        q.mul(&k)?.add(&v)?.add(&overlapping)?.mul(&t[0])
    });
    check("pad", &[x.clone()], &|t| t[0].pad(&[(0, 0), (1, 2), (2, 0)], 0.5));
    check("broadcast_to", &[uniform(&[3, 1], -1.0, 1.0, 1)], &|t| t[0].broadcast_to(&[2, 3, 4]));
    check("unsqueeze_squeeze", &[x.clone()], &|t| t[0].unsqueeze(1)?.squeeze(1));
    let y = uniform(&[2, 2, 4], -1.0, 1.0, 12);
    check("concat", &[x.clone(), y], &|t| Tensor::concat(&[t[0].clone(), t[1].clone()], 1));
    check("stack", &[x.clone(), x.mapv(|v| v * 2.0)], &|t| Tensor::stack(&[t[0].clone(), t[1].clone()], 0));
}

#[test]
fn indexing() {
    let x = uniform(&[4, 5], -1.0, 1.0, 13);
    check("index_select", &[x.clone()], &|t| t[0].index_select(0, &[3, 0, 3]));
    check("index_select_cols", &[x.clone()], &|t| t[0].index_select(1, &[4, 1]));
    let idx = Array2::from_shape_vec((4, 2), vec![0, 4, 1, 1, 2, 3, 4, 0]).unwrap();
    check("gather", &[x.clone()], &|t| t[0].gather(&idx));
    check("pick", &[x.clone()], &|t| t[0].pick(&[1, 0, 4, 2]));
    let mask = x.mapv(|v| v > 0.0);
    let y = uniform(&[4, 5], -1.0, 1.0, 14);
    check("where", &[x.clone(), y], &|t| Tensor::where_(&mask, &t[0], &t[1]));
    check("where_broadcast", &[x.clone(), uniform(&[5], -1.0, 1.0, 2)], &|t| Tensor::where_(&mask, &t[0], &t[1]));
    check("masked_fill", &[x], &|t| t[0].masked_fill(&mask, 3.0));
}

/// A depthwise convolution's parameters: `groups` = the input's channels.
fn depthwise(stride: usize, pad: usize, channels: usize) -> Conv2dParams {
    Conv2dParams { stride: (stride, stride), padding: (pad, pad), dilation: (1, 1), groups: channels }
}

#[test]
fn convolution() {
    let cases = [
        ([2, 3, 7, 6], [4, 3, 3, 3], Conv2dParams::default()),
        ([1, 2, 6, 6], [2, 2, 3, 2], Conv2dParams { stride: (2, 1), padding: (1, 1), dilation: (1, 2), groups: 1 }),
        ([2, 4, 5, 5], [6, 2, 3, 3], Conv2dParams { stride: (1, 2), padding: (1, 0), dilation: (1, 1), groups: 2 }),
        ([3, 4, 3, 3], [2, 4, 1, 1], Conv2dParams::default()),
        // Depthwise (groups = channels: its own kernel): 3×3 and 5×5 at stride 1 and 2, 7×7 padded by 3, and a
        // channel multiplier of 2 with an odd size.
        ([2, 3, 7, 9], [3, 1, 3, 3], depthwise(1, 1, 3)),
        ([2, 3, 9, 8], [3, 1, 3, 3], depthwise(2, 1, 3)),
        ([1, 2, 8, 7], [2, 1, 5, 5], depthwise(1, 2, 2)),
        ([2, 2, 11, 9], [2, 1, 5, 5], depthwise(2, 2, 2)),
        ([1, 2, 9, 8], [2, 1, 7, 7], depthwise(1, 3, 2)),
        ([2, 2, 7, 5], [4, 1, 3, 3], depthwise(2, 0, 2)),
    ];
    for (i, (xs, ws, p)) in cases.iter().enumerate() {
        let s = 100 + i as u64 * 3;
        let inputs = [uniform(xs, -1.0, 1.0, s), uniform(ws, -1.0, 1.0, s + 1), uniform(&[ws[0]], -1.0, 1.0, s + 2)];
        let p = *p;
        check(&format!("conv2d case {i}"), &inputs, &move |t| t[0].conv2d(&t[1], Some(&t[2]), p));
        check(&format!("conv2d no bias {i}"), &inputs[..2], &move |t| t[0].conv2d(&t[1], None, p));
        // The fused ReLU (a pre-activation within h of its kink is unlikely for these random inputs).
        check(&format!("conv2d_relu case {i}"), &inputs, &move |t| t[0].conv2d_relu(&t[1], Some(&t[2]), p));
        // A residual added in the convolution's store (a fourth input, the output's shape), then the ReLU: the
        // residual is chosen so that each sum is at least 0.1 from the ReLU's kink, farther than a probe moves it.
        let t = |a: &ArrayD<f32>| Tensor::new(a.clone());
        let z = t(&inputs[0]).conv2d(&t(&inputs[1]), Some(&t(&inputs[2])), p).unwrap().to_array();
        let mut with_res = inputs.to_vec();
        with_res.push(away_from_zero(z.shape(), 0.1, 1.0, s + 3) - &z);
        check(&format!("conv2d_add case {i}"), &with_res, &move |t| t[0].conv2d_add(&t[1], Some(&t[2]), p, &t[3]));
        check(&format!("conv2d_add_relu case {i}"), &with_res, &move |t| {
            t[0].conv2d_add_relu(&t[1], Some(&t[2]), p, &t[3])
        });
        // The fused clamp (ReLU6's form), its bounds in the widest gaps between the convolution's values in the
        // lower and the upper half: a probe moves a value by at most h (inputs and weights within ±1), and a
        // difference across a bound would not be the derivative.
        let mut y = t(&inputs[0]).conv2d(&t(&inputs[1]), Some(&t(&inputs[2])), p).unwrap().to_vec();
        y.sort_by(f32::total_cmp);
        let widest = |from: usize, to: usize| {
            let (gap, at) = (from..to).map(|j| (y[j + 1] - y[j], j)).max_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
            assert!(gap > 4.0 * 2e-3, "{i}: a gap of {gap} leaves no room for the probes");
            (y[at] + y[at + 1]) / 2.0
        };
        let n = y.len();
        let (lo, hi) = (widest(n / 5, n / 2), widest(n / 2, 4 * n / 5));
        check(&format!("conv2d_clamp case {i}"), &inputs, &move |t| t[0].conv2d_clamp(&t[1], Some(&t[2]), p, lo, hi));
    }
    // The fused ReLU and 2×2 max pooling: an odd output height (windows per channel) and an even one (the image
    // pooled as one tall plane), one padded; on the sparse backward (kernel rows of 9 and 12 values over all
    // channels) and the dense one (6).
    let padded = Conv2dParams { padding: (1, 1), ..Default::default() };
    let cases = [
        ([2, 3, 7, 6], [4, 3, 3, 3], Conv2dParams::default()),
        ([2, 2, 6, 7], [3, 2, 3, 3], padded),
        ([2, 4, 6, 7], [3, 4, 3, 3], padded),
    ];
    for (i, (xs, ws, p)) in cases.iter().enumerate() {
        let s = 200 + i as u64 * 3;
        let inputs = [uniform(xs, -1.0, 1.0, s), uniform(ws, -1.0, 1.0, s + 1), uniform(&[ws[0]], -1.0, 1.0, s + 2)];
        let p = *p;
        check(&format!("conv2d_relu_max_pool2 case {i}"), &inputs, &move |t| {
            t[0].conv2d_relu_max_pool2(&t[1], Some(&t[2]), p)
        });
    }
}

#[test]
fn pooling() {
    let x = distinct(&[2, 3, 7, 6], 0.01, 5);
    let sq = Pool2dParams::square(2);
    check("max_pool2d", &[x.clone()], &|t| t[0].max_pool2d(sq));
    let strided =
        Pool2dParams { kernel: (3, 3), stride: (2, 2), padding: (1, 1), ceil_mode: true, count_include_pad: true };
    check("max_pool2d_pad_ceil", &[x.clone()], &|t| t[0].max_pool2d(strided));
    check("avg_pool2d", &[x.clone()], &|t| t[0].avg_pool2d(sq));
    check("avg_pool2d_pad", &[x.clone()], &|t| t[0].avg_pool2d(strided));
    let excl = Pool2dParams { count_include_pad: false, ..strided };
    check("avg_pool2d_exclude_pad", &[x.clone()], &|t| t[0].avg_pool2d(excl));
    check("global_avg_pool2d", &[x.clone()], &|t| t[0].global_avg_pool2d());
    // The separable passes: ceil mode without padding (SqueezeNet, GoogLeNet), stride 1 with padding (Inception
    // branches), a non-square window and stride, and 2×2 windows in ceil mode over an odd plane.
    let windows = [
        ((3, 3), (2, 2), (0, 0), true),
        ((3, 3), (1, 1), (1, 1), false),
        ((2, 3), (1, 2), (1, 1), true),
        ((2, 2), (2, 2), (0, 0), true),
    ];
    for (i, &(kernel, stride, padding, ceil_mode)) in windows.iter().enumerate() {
        let p = Pool2dParams { kernel, stride, padding, ceil_mode, count_include_pad: i % 2 == 0 };
        check(&format!("max_pool2d window {i}"), &[x.clone()], &move |t| t[0].max_pool2d(p));
        check(&format!("avg_pool2d window {i}"), &[x.clone()], &move |t| t[0].avg_pool2d(p));
    }
}

#[test]
fn normalisation_and_softmax() {
    let x = uniform(&[4, 3, 2, 2], -1.0, 1.0, 21);
    let bn = BatchNorm::new(3);
    bn.weight.set(uniform(&[3], 0.5, 1.5, 1)).unwrap();
    bn.bias.set(uniform(&[3], -0.5, 0.5, 2)).unwrap();
    check("batch_norm_train", &[x.clone()], &|t| bn.forward_t(&t[0], true));
    check("batch_norm_eval", &[x.clone()], &|t| bn.forward_t(&t[0], false));
    // Planes of 20 values: the per-channel slice loops.
    check("batch_norm_eval_planes", &[uniform(&[2, 3, 5, 4], -1.0, 1.0, 23)], &|t| bn.forward_t(&t[0], false));
    let norm = Normalize::new(&[0.485, 0.456, 0.406], &[0.229, 0.224, 0.225]).unwrap();
    check("normalize", &[x.clone()], &|t| norm.forward(&t[0]));
    let bn1 = BatchNorm::new(5);
    check("batch_norm1d_train", &[uniform(&[6, 5], -1.0, 1.0, 3)], &|t| bn1.forward_t(&t[0], true));
    // The fused op on x, scale and bias together: [N, C] (planes of one value), small planes, and planes longer
    // than a statistics block (cut into runs).
    for (i, shape) in [&[6, 5][..], &[4, 3, 2, 2], &[2, 2, 48, 48]].into_iter().enumerate() {
        let c = shape[1];
        let s = 30 + 3 * i as u64;
        let inputs = [uniform(shape, -1.0, 2.0, s), uniform(&[c], 0.5, 1.5, s + 1), uniform(&[c], -0.5, 0.5, s + 2)];
        check(&format!("batch_norm {shape:?}"), &inputs, &|t| t[0].batch_norm(&t[1], &t[2], 1e-5));
    }
    // An evaluation-mode BatchNorm and the ReLU after it as one fused step (x, scale and bias), the outputs kept
    // at least 0.04 from the kink.
    let (mean, var) = (Tensor::new(uniform(&[3], -0.1, 0.1, 40)), Tensor::new(uniform(&[3], 0.8, 1.2, 41)));
    let inputs =
        [away_from_zero(&[2, 3, 5, 4], 0.3, 1.0, 42), uniform(&[3], 0.5, 1.5, 43), uniform(&[3], -0.05, 0.05, 44)];
    check("batch_norm_relu", &inputs, &|t| {
        let bn = Layer::BatchNorm {
            weight: t[1].clone(),
            bias: t[2].clone(),
            running_mean: mean.clone(),
            running_var: var.clone(),
            eps: 1e-5,
        };
        Fused::BatchNormRelu.run(&t[0], &[bn, Layer::Relu])
    });
    // A matrix product and its bias as one fused step (chains started at the bias): x, the weight and the bias.
    let inputs = [uniform(&[2, 3, 5], -1.0, 1.0, 45), uniform(&[5, 4], -1.0, 1.0, 46), uniform(&[4], -1.0, 1.0, 47)];
    check("matmul_bias", &inputs, &|t| {
        Fused::MatMulBias.run(&t[0], &[Layer::MatMul { weight: t[1].clone() }, Layer::Add { other: t[2].clone() }])
    });
    let z = uniform(&[3, 6], -3.0, 3.0, 22);
    check("softmax", &[z.clone()], &|t| t[0].softmax(1));
    check("log_softmax", &[z.clone()], &|t| t[0].log_softmax(1));
    check("log_softmax_axis0", &[z], &|t| t[0].log_softmax(0));
    // The fused softmax (last axis) over more rows than a parallel block, on a permuted input.
    let scores = uniform(&[3, 50, 40], -3.0, 3.0, 24);
    check("softmax fused, permuted", &[scores], &|t| t[0].permute(&[2, 0, 1])?.softmax(2));
}

#[test]
fn transformer_ops() {
    let x = uniform(&[2, 3, 5], -2.5, 2.5, 41);
    check("erf", &[x.clone()], &|t| Ok(t[0].erf()));
    check("gelu", &[x.clone()], &|t| Ok(t[0].gelu(false)));
    check("gelu_tanh", &[x.clone()], &|t| Ok(t[0].gelu(true)));
    // The hard functions away from their kinks (±3 for both, and α·x + β ∈ {0, 1} for α = 0.2, β = 0.5).
    let off_kinks =
        away_from_zero(&[4, 6], 0.1, 5.0, 42).mapv(|v| if (v.abs() - 3.0).abs() < 0.1 { v * 0.9 } else { v });
    check("hard_swish", &[off_kinks.clone()], &|t| Ok(t[0].hard_swish()));
    check("hard_sigmoid", &[off_kinks.clone()], &|t| Ok(t[0].hard_sigmoid(1.0 / 6.0, 0.5)));
    let off = off_kinks.mapv(|v| if (v.abs() - 2.5).abs() < 0.1 { v * 0.9 } else { v });
    check("hard_sigmoid_onnx", &[off], &|t| Ok(t[0].hard_sigmoid(0.2, 0.5)));
    // Layer norm: over the last axis with scale and bias, over the last two with a broadcast bias, without
    // parameters, and one row.
    let (w, b) = (uniform(&[5], 0.5, 1.5, 43), uniform(&[5], -1.0, 1.0, 44));
    check("layer_norm", &[x.clone(), w.clone(), b.clone()], &|t| t[0].layer_norm(2, 1e-5, Some(&t[1]), Some(&t[2])));
    let w2 = uniform(&[3, 5], 0.5, 1.5, 45);
    check("layer_norm_2axes", &[x.clone(), w2, b.clone()], &|t| t[0].layer_norm(1, 1e-3, Some(&t[1]), Some(&t[2])));
    check("layer_norm_plain", &[x.clone()], &|t| t[0].layer_norm(2, 1e-5, None, None));
    check("layer_norm_row", &[uniform(&[1, 7], -1.0, 1.0, 46)], &|t| t[0].layer_norm(1, 1e-5, None, None));
    check("layer_norm_scale_only", &[x.clone(), w.clone()], &|t| t[0].layer_norm(2, 1e-5, Some(&t[1]), None));
    check("layer_norm_bias_only", &[x.clone(), b.clone()], &|t| t[0].layer_norm(2, 1e-5, None, Some(&t[1])));
    // A channels-last view (ConvNeXt's LayerNorm after its transpose): the forward's contiguous copy is kept for
    // the backward.
    let maps = uniform(&[2, 5, 3, 4], -1.0, 1.0, 47);
    check("layer_norm_permuted", &[maps, w.clone(), b.clone()], &|t| {
        t[0].permute(&[0, 2, 3, 1])?.layer_norm(3, 1e-5, Some(&t[1]), Some(&t[2]))
    });
    // Softmax along every axis of a rank-3 tensor.
    for axis in 0..3 {
        check(&format!("softmax axis {axis}"), &[x.clone()], &move |t| t[0].softmax(axis));
        check(&format!("log_softmax axis {axis}"), &[x.clone()], &move |t| t[0].log_softmax(axis));
    }
    check("split", &[x.clone()], &|t| {
        let p = t[0].split(2, &[1, 3, 1])?;
        Tensor::concat(&[p[2].clone(), p[0].mul_scalar(2.0), p[1].clone()], 2)
    });
    // Einsum: attention forms, an ellipsis, a reduction, an outer product and three operands.
    let (q, k) = (uniform(&[2, 2, 3, 4], -1.0, 1.0, 47), uniform(&[2, 2, 5, 4], -1.0, 1.0, 48));
    check("einsum_scores", &[q.clone(), k.clone()], &|t| Tensor::einsum("bhqd,bhkd->bhqk", &[&t[0], &t[1]]));
    let p = uniform(&[2, 2, 3, 5], -1.0, 1.0, 49);
    check("einsum_values", &[p, k.clone()], &|t| Tensor::einsum("bhqk,bhkd->bhqd", &[&t[0], &t[1]]));
    let m = uniform(&[4, 3], -1.0, 1.0, 50);
    check("einsum_ellipsis", &[q.clone(), m.clone()], &|t| Tensor::einsum("...ij,...jk->...ik", &[&t[0], &t[1]]));
    check("einsum_reduce", &[q.clone()], &|t| Tensor::einsum("bhqd->dq", &[&t[0]]));
    let v = uniform(&[3], -1.0, 1.0, 51);
    check("einsum_three", &[m.clone(), v.clone(), m.clone()], &|t| {
        Tensor::einsum("ij,j,ik->k", &[&t[0], &t[1], &t[2]])
    });
    // Broadcasting matmul: leading axes of size 1 stretched, vectors on either side.
    let a4 = uniform(&[2, 1, 3, 4], -1.0, 1.0, 52);
    check("matmul_broadcast", &[a4.clone(), uniform(&[3, 4, 2], -1.0, 1.0, 53)], &|t| t[0].matmul(&t[1]));
    check("matmul_rank4_2d", &[a4.clone(), m], &|t| t[0].matmul(&t[1]));
    check("matmul_vectors", &[uniform(&[4], -1.0, 1.0, 54), a4.clone(), v], &|t| {
        t[0].matmul(&t[1].transpose(2, 3)?)?.matmul(&t[2])
    });
}

#[test]
fn losses() {
    let z = uniform(&[4, 5], -3.0, 3.0, 31);
    let labels = [1, 0, 4, 4];
    for red in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        check("cross_entropy", &[z.clone()], &|t| t[0].cross_entropy(&labels, red));
        check("nll", &[z.clone()], &|t| t[0].log_softmax(1)?.nll_loss(&labels, red));
        check("mse", &[z.clone(), uniform(&[4, 5], -1.0, 1.0, 2)], &|t| t[0].mse_loss(&t[1], red));
    }
    let p = uniform(&[4, 5], 0.1, 1.0, 33);
    let q = uniform(&[4, 5], -2.0, 2.0, 34);
    check("kl_div", &[q.clone(), p.clone()], &|t| t[0].log_softmax(1)?.kl_div(&t[1].softmax(1)?, Reduction::Mean));
    check("kl_div_sum", &[q], &|t| t[0].log_softmax(1)?.kl_div(&Tensor::new(p.clone()).softmax(1)?, Reduction::Sum));
    let d = distinct(&[4, 5], 0.1, 35);
    check("cw_margin", &[d], &|t| t[0].cw_margin(&labels));
    check("cross_entropy_batch1", &[uniform(&[1, 3], -1.0, 1.0, 36)], &|t| t[0].cross_entropy(&[2], Reduction::Mean));
}

#[test]
fn a_wrong_backward_would_fail_the_check() {
    // Guard against a checker that cannot fail: a function whose "gradient" is deliberately wrong (detached
    // half) must be rejected.
    let x = uniform(&[3], 0.5, 1.0, 1);
    let result = std::panic::catch_unwind(|| check("detached", &[x], &|t| t[0].mul(&t[0].detach())));
    assert!(result.is_err(), "the finite-difference check accepted a wrong gradient");
}
