//! Hand-computed values and derivatives of every op (the derivation in a comment), plus error paths.

use armoury::{Conv2dParams, Error, Pool2dParams, Reduction, Tensor};
use ndarray::{Array2, ArrayD, IxDyn};

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

/// Value and derivative of a unary op at the points `xs`.
fn unary(f: impl Fn(&Tensor) -> Tensor, xs: &[f32], want_y: &[f32], want_dy: &[f32]) {
    let x = t(xs, &[xs.len()]).variable();
    let y = f(&x);
    close(&y.to_vec(), want_y);
    close(&y.grad_wrt(&[&x]).unwrap()[0].to_vec(), want_dy);
}

#[test]
fn unary_values_and_derivatives() {
    // d(−x) = −1
    unary(|x| x.neg(), &[2.0], &[-2.0], &[-1.0]);
    // d(3x+1) = 3
    unary(|x| x.affine(3.0, 1.0), &[2.0], &[7.0], &[3.0]);
    // d x³ = 3x² = 12 at 2
    unary(|x| x.powf(3.0), &[2.0], &[8.0], &[12.0]);
    // d eˣ = eˣ
    unary(|x| x.exp(), &[0.0, 1.0], &[1.0, std::f32::consts::E], &[1.0, std::f32::consts::E]);
    // d ln x = 1/x
    unary(|x| x.log(), &[1.0, 4.0], &[0.0, 4f32.ln()], &[1.0, 0.25]);
    // d √x = 1/(2√x) = 0.25 at 4
    unary(|x| x.sqrt(), &[4.0], &[2.0], &[0.25]);
    // d|x| = sign x
    unary(|x| x.abs(), &[-3.0, 2.0], &[3.0, 2.0], &[-1.0, 1.0]);
    // sign has zero derivative, and sign(0) = 0
    unary(|x| x.sign(), &[-3.0, 0.0, 2.0], &[-1.0, 0.0, 1.0], &[0.0, 0.0, 0.0]);
    // clamp to [0,1]: derivative 1 inside (edges included), 0 outside
    unary(|x| x.clamp(0.0, 1.0), &[-0.5, 0.0, 0.5, 1.0, 1.5], &[0.0, 0.0, 0.5, 1.0, 1.0], &[0.0, 1.0, 1.0, 1.0, 0.0]);
    // relu: 1 for x > 0, 0 for x ≤ 0 (PyTorch's choice at 0)
    unary(|x| x.relu(), &[-1.0, 0.0, 2.0], &[0.0, 0.0, 2.0], &[0.0, 0.0, 1.0]);
    // leaky relu slope 0.1
    unary(|x| x.leaky_relu(0.1), &[-2.0, 3.0], &[-0.2, 3.0], &[0.1, 1.0]);
    // σ(0) = ½, σ' = σ(1−σ) = ¼
    unary(|x| x.sigmoid(), &[0.0], &[0.5], &[0.25]);
    // tanh' = 1 − tanh² = 1 at 0
    unary(|x| x.tanh(), &[0.0], &[0.0], &[1.0]);
    // softplus(0) = ln 2, softplus' = σ; stable at 100 (no overflow)
    unary(|x| x.softplus(), &[0.0, 100.0], &[2f32.ln(), 100.0], &[0.5, 1.0]);
    // atanh' = 1/(1−x²) = 4/3 at ½
    unary(|x| x.atanh(), &[0.5], &[0.5f32.atanh()], &[4.0 / 3.0]);
}

#[test]
fn binary_values_and_derivatives() {
    let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).variable();
    let b = t(&[10.0, 20.0], &[2]).variable(); // broadcast over rows
                                               // Σ a/b: ∂/∂a = 1/b per column; ∂/∂b_j = −Σ_i a_ij / b_j²
    let y = a.div(&b).unwrap();
    close(&y.to_vec(), &[0.1, 0.1, 0.3, 0.2]);
    let g = y.grad_wrt(&[&a, &b]).unwrap();
    close(&g[0].to_vec(), &[0.1, 0.05, 0.1, 0.05]);
    close(&g[1].to_vec(), &[-4.0 / 100.0, -6.0 / 400.0]);
    // Σ a·b: ∂/∂b_j = Σ_i a_ij
    let g = a.mul(&b).unwrap().grad_wrt(&[&b]).unwrap();
    close(&g[0].to_vec(), &[4.0, 6.0]);
    // max with a tie splits the gradient in half (PyTorch)
    let x = t(&[1.0, 5.0, 3.0], &[3]).variable();
    let z = t(&[2.0, 2.0, 3.0], &[3]).variable();
    let g = x.maximum(&z).unwrap().grad_wrt(&[&x, &z]).unwrap();
    close(&g[0].to_vec(), &[0.0, 1.0, 0.5]);
    close(&g[1].to_vec(), &[1.0, 0.0, 0.5]);
    // sub: ∂/∂b = −1, summed over the broadcast axis
    let g = a.sub(&b).unwrap().grad_wrt(&[&b]).unwrap();
    close(&g[0].to_vec(), &[-2.0, -2.0]);
}

#[test]
fn matmul_and_reductions() {
    // [1 2; 3 4]·[5; 6] = [17; 39]; ∂Σ/∂A = 1·Bᵀ rows, ∂Σ/∂B = column sums of A
    let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).variable();
    let b = t(&[5.0, 6.0], &[2, 1]).variable();
    let y = a.matmul(&b).unwrap();
    close(&y.to_vec(), &[17.0, 39.0]);
    let g = y.grad_wrt(&[&a, &b]).unwrap();
    close(&g[0].to_vec(), &[5.0, 6.0, 5.0, 6.0]);
    close(&g[1].to_vec(), &[4.0, 6.0]);
    // sum over axis 1 and mean over everything
    close(&a.sum(&[1], false).unwrap().to_vec(), &[3.0, 7.0]);
    close(&a.mean_all().unwrap().to_vec(), &[2.5]);
    let g = a.mean_all().unwrap().grad_wrt(&[&a]).unwrap();
    close(&g[0].to_vec(), &[0.25; 4]);
    // max along rows: gradient one-hot at the arg max
    let m = a.max(1, false).unwrap();
    close(&m.to_vec(), &[2.0, 4.0]);
    close(&m.grad_wrt(&[&a]).unwrap()[0].to_vec(), &[0.0, 1.0, 0.0, 1.0]);
    close(&a.min(0, false).unwrap().to_vec(), &[1.0, 2.0]);
    assert_eq!(a.argmax(1).unwrap(), vec![1, 1]);
    assert_eq!(a.argmin(0).unwrap(), vec![0, 0]);
    let (v, i) = t(&[0.1, 0.7, 0.2, 0.9, 0.3, 0.5], &[2, 3]).topk(2).unwrap();
    close(&v.to_vec(), &[0.7, 0.2, 0.9, 0.5]);
    assert_eq!(i.into_raw_vec_and_offset().0, vec![1, 2, 0, 2]);
}

#[test]
fn shape_ops_values() {
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    close(&x.t().unwrap().reshape(&[6]).unwrap().to_vec(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    close(&x.narrow(1, 1, 2).unwrap().to_vec(), &[2.0, 3.0, 5.0, 6.0]);
    close(&x.pad(&[(0, 0), (1, 0)], 9.0).unwrap().to_vec(), &[9.0, 1.0, 2.0, 3.0, 9.0, 4.0, 5.0, 6.0]);
    close(&Tensor::concat(&[x.clone(), x.clone()], 0).unwrap().narrow(0, 2, 1).unwrap().to_vec(), &[1.0, 2.0, 3.0]);
    assert_eq!(Tensor::stack(&[x.clone(), x.clone()], 1).unwrap().shape(), &[2, 2, 3]);
    close(&x.index_select(1, &[2, 0]).unwrap().to_vec(), &[3.0, 1.0, 6.0, 4.0]);
    close(&x.pick(&[2, 0]).unwrap().to_vec(), &[3.0, 4.0]);
    let mask = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![true, false, false, false, false, true]).unwrap();
    close(&x.masked_fill(&mask, 0.0).unwrap().to_vec(), &[0.0, 2.0, 3.0, 4.0, 5.0, 0.0]);
    // gradient of index_select with a repeated index accumulates
    let v = x.variable();
    let g = v.index_select(1, &[0, 0]).unwrap().grad_wrt(&[&v]).unwrap();
    close(&g[0].to_vec(), &[2.0, 0.0, 0.0, 2.0, 0.0, 0.0]);
    let idx = Array2::from_shape_vec((2, 1), vec![1, 2]).unwrap();
    close(&x.gather(&idx).unwrap().to_vec(), &[2.0, 6.0]);
}

#[test]
fn conv_pool_values() {
    // 3×3 input, 2×2 kernel of ones: each output is the sum of a 2×2 window (+ bias 1).
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[1, 1, 3, 3]).variable();
    let w = Tensor::ones(&[1, 1, 2, 2]);
    let b = t(&[1.0], &[1]);
    let y = x.conv2d(&w, Some(&b), Conv2dParams::default()).unwrap();
    close(&y.to_vec(), &[13.0, 17.0, 25.0, 29.0]);
    // ∂Σy/∂x counts how many windows cover each pixel: corners 1, edges 2, centre 4
    close(&y.grad_wrt(&[&x]).unwrap()[0].to_vec(), &[1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0]);
    let p = Pool2dParams { kernel: (2, 2), stride: (1, 1), padding: (0, 0), ceil_mode: false, count_include_pad: true };
    let m = x.max_pool2d(p).unwrap();
    close(&m.to_vec(), &[5.0, 6.0, 8.0, 9.0]);
    close(&m.grad_wrt(&[&x]).unwrap()[0].to_vec(), &[0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
    let a = x.avg_pool2d(p).unwrap();
    close(&a.to_vec(), &[3.0, 4.0, 6.0, 7.0]);
    close(&x.global_avg_pool2d().unwrap().to_vec(), &[5.0]);
    // padding 1 with count_include_pad = false divides corners by 1 (only the real pixel)
    let q =
        Pool2dParams { kernel: (2, 2), stride: (2, 2), padding: (1, 1), ceil_mode: false, count_include_pad: false };
    close(&x.avg_pool2d(q).unwrap().to_vec(), &[1.0, 2.5, 5.5, 7.0]);
}

#[test]
fn losses_values() {
    // CE of uniform logits over 4 classes is ln 4; ∂/∂z = softmax − onehot
    let z = Tensor::zeros(&[1, 4]).variable();
    let l = z.cross_entropy(&[2], Reduction::Sum).unwrap();
    close(&l.to_vec(), &[4f32.ln()]);
    close(&l.grad_wrt(&[&z]).unwrap()[0].to_vec(), &[0.25, 0.25, -0.75, 0.25]);
    // stable for huge logits
    let big = t(&[1000.0, 0.0], &[1, 2]);
    close(&big.cross_entropy(&[0], Reduction::Mean).unwrap().to_vec(), &[0.0]);
    close(&big.log_softmax(1).unwrap().to_vec(), &[0.0, -1000.0]);
    // CW margin: max other − own; gradient +1 at the best other class, −1 at the own class
    let z = t(&[1.0, 3.0, 2.0], &[1, 3]).variable();
    let m = z.cw_margin(&[2]).unwrap();
    close(&m.to_vec(), &[1.0]);
    close(&m.grad_wrt(&[&z]).unwrap()[0].to_vec(), &[0.0, 1.0, -1.0]);
    // MSE mean of (1, 2)² = 2.5; KL(p‖p) = 0
    close(&t(&[1.0, 2.0], &[2]).mse_loss(&Tensor::zeros(&[2]), Reduction::Mean).unwrap().to_vec(), &[2.5]);
    let p = t(&[0.25, 0.75], &[1, 2]);
    close(&p.log().kl_div(&p, Reduction::Mean).unwrap().to_vec(), &[0.0]);
    // KL([½,½] ‖ [¼,¾]) = ½ln2 + ½ln(2/3)
    let want = 0.5 * 2f32.ln() + 0.5 * (2.0f32 / 3.0).ln();
    close(&p.log().kl_div(&t(&[0.5, 0.5], &[1, 2]), Reduction::Sum).unwrap().to_vec(), &[want]);
}

#[test]
fn errors_not_panics() {
    let a = Tensor::zeros(&[2, 3]);
    assert!(matches!(a.add(&Tensor::zeros(&[4])), Err(Error::Broadcast { .. })));
    assert!(matches!(a.matmul(&Tensor::zeros(&[2, 3])), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(a.reshape(&[5]), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(a.narrow(1, 2, 5), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.permute(&[0, 0]), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.sum(&[4], false), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.cross_entropy(&[0, 3], Reduction::Mean), Err(Error::LabelOutOfRange { label: 3, .. })));
    assert!(matches!(a.cross_entropy(&[0], Reduction::Mean), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(Tensor::zeros(&[0, 3]).cross_entropy(&[], Reduction::Mean), Err(Error::InvalidArgument { .. })));
    assert!(matches!(
        a.conv2d(&Tensor::zeros(&[1, 1, 1, 1]), None, Conv2dParams::default()),
        Err(Error::RankMismatch { .. })
    ));
    assert!(matches!(a.max_pool2d(Pool2dParams::square(2)), Err(Error::RankMismatch { .. })));
    assert!(matches!(a.index_select(0, &[2]), Err(Error::InvalidArgument { .. })));
    assert!(matches!(Tensor::from_vec(vec![1.0], &[2]), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(Tensor::concat(&[], 0), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.topk(4), Err(Error::InvalidArgument { .. })));
}

#[test]
fn target_directed_gradients_and_no_grad() {
    // y = (x·w).sum(): grad_wrt(x) computes only ∂/∂x; a constant input records no graph.
    let x = Tensor::ones(&[2, 3]).variable();
    let w = Tensor::full(&[3, 1], 2.0).variable();
    let y = x.matmul(&w).unwrap().sum_all();
    let g = y.grad_wrt(&[&x]).unwrap();
    close(&g[0].to_vec(), &[2.0; 6]);
    let c = Tensor::ones(&[2, 3]);
    assert!(!c.relu().is_tracked());
    let inside = armoury::no_grad(|| x.relu());
    assert!(!inside.is_tracked(), "no_grad must record nothing");
    assert!(x.relu().is_tracked());
    // a target the output does not depend on gets zeros
    let unrelated = Tensor::ones(&[4]).variable();
    let g = y.grad_wrt(&[&unrelated]).unwrap();
    close(&g[0].to_vec(), &[0.0; 4]);
    // detach cuts the graph
    let d = x.detach().relu().sum_all();
    close(&d.grad_wrt(&[&x]).unwrap()[0].to_vec(), &[0.0; 6]);
}
