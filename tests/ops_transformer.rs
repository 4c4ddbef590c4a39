//! The ops modern classifiers need (erf, GELU, hard sigmoid/swish, layer norm, split, einsum, broadcasting matmul):
//! hand-computed or PyTorch values and derivatives, error paths, and results independent of batch and threads.

use armoury::{Error, Tensor};

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

/// Value and derivative of a unary op at the points `xs`.
fn unary(f: impl Fn(&Tensor) -> Tensor, xs: &[f32], want_y: &[f64], want_dy: &[f64]) {
    let x = t(xs, &[xs.len()]).variable();
    let y = f(&x);
    let as32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<_>>();
    close(&y.to_vec(), &as32(want_y), 2e-7);
    close(&y.grad_wrt(&[&x]).unwrap()[0].to_vec(), &as32(want_dy), 5e-7);
}

#[test]
fn activation_values_and_derivatives_match_pytorch() {
    // PyTorch 2.15 in float64: torch.erf, F.gelu(x), F.gelu(x, approximate="tanh") and their torch.autograd.grad at
    // x = −3, −1, 0, 0.5, 3.
    let xs = [-3.0, -1.0, 0.0, 0.5, 3.0];
    unary(
        |x| x.erf(),
        &xs,
        &[-0.9999779095030014, -0.8427007929497149, 0.0, 0.5204998778130465, 0.9999779095030014],
        &[
            0.00013925305194674786,
            0.4151074974205947,
            std::f64::consts::FRAC_2_SQRT_PI,
            0.8787825789354448,
            0.00013925305194674786,
        ],
    );
    unary(
        |x| x.gelu(false),
        &xs,
        &[-0.00404969409489031, -0.15865525393145702, 0.0, 0.34573123063700656, 2.99595030590511],
        &[-0.01194564720418392, -0.08331547058768635, 0.5, 0.8674951246561629, 1.011945647204184],
    );
    unary(
        |x| x.gelu(true),
        &xs,
        &[-0.0036373920817729943, -0.15880800939172324, 0.0, 0.34571400982514394, 2.996362607918227],
        &[-0.011584166630969648, -0.08296408384578252, 0.5, 0.8673699035346424, 1.0115841666309695],
    );
    // PyTorch 2.15 (float32) F.hardswish and F.hardsigmoid at −4, −3, −1.5, 0, 3, 4, with their gradients: at the
    // kinks hardswish' is 0 at −3 and 1 at 3, hardsigmoid' is 0 at both.
    let xs = [-4.0, -3.0, -1.5, 0.0, 3.0, 4.0];
    unary(|x| x.hard_swish(), &xs, &[0.0, 0.0, -0.375, 0.0, 3.0, 4.0], &[0.0, 0.0, 0.0, 0.5, 1.0, 1.0]);
    let sixth = 1.0 / 6.0;
    unary(
        |x| x.hard_sigmoid(1.0 / 6.0, 0.5),
        &xs,
        &[0.0, 0.0, 0.25, 0.5, 1.0, 1.0],
        &[0.0, 0.0, sixth, sixth, 0.0, 0.0],
    );
    // ONNX's default HardSigmoid (α = 0.2, β = 0.5): 0.2x + 0.5 on (−2.5, 2.5), derivative 0.2 there.
    unary(|x| x.hard_sigmoid(0.2, 0.5), &[-3.0, 1.0, 2.6], &[0.0, 0.7, 1.0], &[0.0, 0.2, 0.0]);
}

#[test]
fn layer_norm_values_and_derivatives() {
    // Row [1, 2, 3, 4]: mean 2.5, biased variance 1.25, so x̂ = (x − 2.5)/√1.25 = ±0.4472136, ±1.3416408.
    let xhat = [-1.3416408, -0.4472136, 0.4472136, 1.3416408];
    let x = t(&[1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0], &[2, 4]).variable();
    let y = x.layer_norm(1, 0.0, None, None).unwrap();
    close(&y.to_vec()[..4], &xhat, 1e-6);
    // y = x̂·scale + bias.
    let scale = t(&[1.0, 2.0, 1.0, 2.0], &[4]).variable();
    let bias = t(&[0.0, 0.0, 1.0, 1.0], &[4]).variable();
    let y = x.layer_norm(1, 0.0, Some(&scale), Some(&bias)).unwrap();
    close(&y.to_vec()[4..], &[-1.3416408, -0.8944272, 1.4472136, 3.6832816], 1e-6);
    // ∂Σy/∂bias = 2 per feature (two rows); ∂Σy/∂scale = Σ_rows x̂ = 2x̂.
    let g = y.sum_all().grad_wrt(&[&scale, &bias]).unwrap();
    close(&g[0].to_vec(), &xhat.map(|v| 2.0 * v), 1e-6);
    close(&g[1].to_vec(), &[2.0; 4], 0.0);
    // Σ of a normalised row is 0 whatever x: its gradient is 0. For L = x̂₀ (weights w = e₀), with r = 1/√1.25:
    // ∂L/∂x = r·(w − mean w − x̂·mean(w·x̂)) = r·(e₀ − 0.25 + x̂·0.3354102) = [0.2683282, −0.3577709, −0.0894427,
    // 0.1788854].
    let x1 = t(&[1.0, 2.0, 3.0, 4.0], &[1, 4]).variable();
    let y = x1.layer_norm(1, 0.0, None, None).unwrap();
    close(&y.sum_all().grad_wrt(&[&x1]).unwrap()[0].to_vec(), &[0.0; 4], 1e-6);
    let w = t(&[1.0, 0.0, 0.0, 0.0], &[1, 4]);
    let g = y.mul(&w).unwrap().sum_all().grad_wrt(&[&x1]).unwrap();
    close(&g[0].to_vec(), &[0.2683282, -0.3577709, -0.0894427, 0.1788854], 1e-6);
    // ε: a constant row normalises to 0 instead of NaN.
    let c = Tensor::full(&[2, 3], 5.0).layer_norm(1, 1e-5, None, None).unwrap();
    assert!(c.to_vec().iter().all(|&v| v == 0.0));
}

#[test]
fn layer_norm_is_pytorchs_over_trailing_axes() {
    // F.layer_norm(x, x.shape[1:], w, b, 1e-5) against the definition in f64 on a [2, 3, 4] input, normalised
    // over the last two axes, with a scale of shape [3, 4] and a bias of shape [4] (broadcast).
    let x = Tensor::uniform(&[2, 3, 4], -2.0, 2.0, 1);
    let w = Tensor::uniform(&[3, 4], 0.5, 1.5, 2);
    let b = Tensor::uniform(&[4], -1.0, 1.0, 3);
    let y = x.layer_norm(1, 1e-5, Some(&w), Some(&b)).unwrap().to_vec();
    let (xv, wv, bv) = (x.to_vec(), w.to_vec(), b.to_vec());
    for (row, yr) in xv.chunks(12).zip(y.chunks(12)) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / 12.0;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 12.0;
        for (j, (&v, &got)) in row.iter().zip(yr).enumerate() {
            let want = (v as f64 - mean) / (var + 1e-5).sqrt() * wv[j] as f64 + bv[j % 4] as f64;
            assert!((got as f64 - want).abs() < 2e-6, "{got} vs {want}");
        }
    }
}

#[test]
fn split_einsum_and_broadcast_matmul_values() {
    let x = t(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[2, 5]).variable();
    let parts = x.split(1, &[2, 0, 3]).unwrap();
    assert_eq!(parts.iter().map(|p| p.shape().to_vec()).collect::<Vec<_>>(), [vec![2, 2], vec![2, 0], vec![2, 3]]);
    close(&parts[2].to_vec(), &[2.0, 3.0, 4.0, 7.0, 8.0, 9.0], 0.0);
    // L = Σ 2·part₀ + Σ part₂: the gradient scatters back, 2 on the first two columns, 1 on the rest.
    let l = parts[0].mul_scalar(2.0).sum_all().add(&parts[2].sum_all()).unwrap();
    close(&l.grad_wrt(&[&x]).unwrap()[0].to_vec(), &[2.0, 2.0, 1.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0], 0.0);

    let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = t(&[5.0, 6.0, 7.0, 8.0], &[2, 2]);
    let ein = |eq: &str, ops: &[&Tensor]| Tensor::einsum(eq, ops).unwrap();
    // [[1,2],[3,4]]·[[5,6],[7,8]] = [[19,22],[43,50]], explicitly and in the implicit form.
    close(&ein("ij,jk->ik", &[&a, &b]).to_vec(), &[19.0, 22.0, 43.0, 50.0], 0.0);
    close(&ein("ij,jk", &[&a, &b]).to_vec(), &[19.0, 22.0, 43.0, 50.0], 0.0);
    close(&ein("ij->ji", &[&a]).to_vec(), &[1.0, 3.0, 2.0, 4.0], 0.0);
    close(&ein("ij->j", &[&a]).to_vec(), &[4.0, 6.0], 0.0);
    close(&ein("ij->", &[&a]).to_vec(), &[10.0], 0.0);
    close(&ein("ij,ij->i", &[&a, &b]).to_vec(), &[17.0, 53.0], 0.0);
    let u = t(&[1.0, 2.0], &[2]);
    let v = t(&[3.0, 4.0, 5.0], &[3]);
    close(&ein("i,j->ij", &[&u, &v]).to_vec(), &[3.0, 4.0, 5.0, 6.0, 8.0, 10.0], 0.0);
    // Three operands: Σᵢₖ uᵢ·(AB)ᵢₖ = 1·(19 + 22) + 2·(43 + 50) = 227.
    close(&ein("i,ij,jk->", &[&u, &a, &b]).to_vec(), &[227.0], 0.0);

    // Broadcasting matmul: a vector on either side, and leading axes of size 1 stretched.
    close(&u.matmul(&a).unwrap().to_vec(), &[7.0, 10.0], 0.0);
    close(&a.matmul(&u).unwrap().to_vec(), &[5.0, 11.0], 0.0);
    let stacked = Tensor::stack(&[a.clone(), b.clone()], 0).unwrap().unsqueeze(1).unwrap(); // [2, 1, 2, 2]
    let y = stacked.matmul(&Tensor::stack(&[a.clone(), a.clone(), b.clone()], 0).unwrap()).unwrap();
    assert_eq!(y.shape(), &[2, 3, 2, 2]);
    // Item (1, 2) is B·B = [[67,78],[91,106]].
    close(&y.to_vec()[20..24], &[67.0, 78.0, 91.0, 106.0], 0.0);
}

#[test]
fn einsum_matches_the_products_it_stands_for() {
    let q = Tensor::uniform(&[2, 3, 5, 4], -1.0, 1.0, 1);
    let k = Tensor::uniform(&[2, 3, 6, 4], -1.0, 1.0, 2);
    let same = |a: &Tensor, b: &Tensor| {
        assert_eq!(a.shape(), b.shape());
        close(&a.to_vec(), &b.to_vec(), 1e-5);
    };
    // Attention scores and their product with the values (ViT, Swin: bhqd,bhkd->bhqk and bhqk,bhkd->bhqd).
    let scores = Tensor::einsum("bhqd,bhkd->bhqk", &[&q, &k]).unwrap();
    same(&scores, &q.matmul(&k.transpose(2, 3).unwrap()).unwrap());
    let out = Tensor::einsum("bhqk, bhkd -> bhqd", &[&scores, &k]).unwrap();
    same(&out, &scores.matmul(&k).unwrap());
    // MaxViT's relative attention, as torchvision writes it (upper-case indices, spaces).
    let q5 = q.unsqueeze(1).unwrap();
    let k5 = k.unsqueeze(1).unwrap();
    let s5 = Tensor::einsum("B G H I D, B G H J D -> B G H I J", &[&q5, &k5]).unwrap();
    same(&s5, &scores.unsqueeze(1).unwrap());
    // Ellipses broadcast; a batch of one matrix against one matrix.
    let m = Tensor::uniform(&[4, 7], -1.0, 1.0, 3);
    same(&Tensor::einsum("...ij,...jk->...ik", &[&q, &m]).unwrap(), &q.matmul(&m).unwrap());
    let (q3, k3) = (q.reshape(&[6, 5, 4]).unwrap(), k.reshape(&[6, 4, 6]).unwrap());
    same(&Tensor::einsum("bij,bjk->bik", &[&q3, &k3]).unwrap(), &q3.matmul(&k3).unwrap());
    // A permuted result: bhqk with the query axis last.
    same(&Tensor::einsum("bhqd,bhkd->bhkq", &[&q, &k]).unwrap(), &scores.transpose(2, 3).unwrap());
}

#[test]
fn misuse_is_an_error_naming_the_equation() {
    let a = Tensor::zeros(&[2, 3]);
    let b = Tensor::zeros(&[3, 4]);
    let err = |eq: &str, ops: &[&Tensor]| match Tensor::einsum(eq, ops) {
        Err(Error::InvalidArgument { op: "einsum", msg }) => {
            assert!(msg.contains(eq), "{msg}");
            msg
        }
        other => panic!("{eq}: {other:?}"),
    };
    assert!(err("ii->i", &[&Tensor::zeros(&[3, 3])]).contains("diagonal"));
    err("ij,jk->ik", &[&a]);
    err("ij,jk->iz", &[&a, &b]);
    err("ij,jk->ii", &[&a, &b]);
    err("ij,kl->ik", &[&a, &Tensor::zeros(&[2, 2, 2])]);
    err("ij,jk->ik", &[&a, &Tensor::zeros(&[4, 4])]);
    err("i1,jk->ik", &[&a, &b]);
    err("ij->i->j", &[&a]);
    assert!(matches!(a.split(1, &[1, 1]), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.split(2, &[3]), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.split(1, &[usize::MAX, 4]), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.layer_norm(2, 1e-5, None, None), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.layer_norm(1, -1.0, None, None), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.layer_norm(1, 1e-5, Some(&Tensor::zeros(&[2])), None), Err(Error::Broadcast { .. })));
    assert!(matches!(Tensor::zeros(&[2, 0]).layer_norm(1, 1e-5, None, None), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.matmul(&Tensor::zeros(&[2, 4, 4])), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(Tensor::zeros(&[2, 2, 3]).matmul(&Tensor::zeros(&[3, 3, 4])), Err(Error::Broadcast { .. })));
    assert!(matches!(Tensor::scalar(1.0).matmul(&a), Err(Error::ShapeMismatch { .. })));
}

/// A sample's layer norm, GELU and batched product (forward and input gradient) do not depend on the other samples
/// in its batch, nor on the number of threads.
#[test]
fn results_are_independent_of_batch_and_threads() {
    let run = |x: &Tensor| {
        let x = x.variable();
        let w = Tensor::uniform(&[48], 0.5, 1.5, 9);
        let h = x.layer_norm(1, 1e-6, Some(&w), None).unwrap().gelu(false).hard_swish();
        let h3 = h.reshape(&[x.shape()[0], 6, 8]).unwrap();
        let y = Tensor::einsum("bij,bkj->bik", &[&h3, &h3]).unwrap().erf().sum_all();
        let g = y.grad_wrt(&[&x]).unwrap().remove(0);
        (y.item().unwrap(), g.to_vec())
    };
    // 700 rows × 48 features: above the threshold where rows are split across threads.
    let big = Tensor::uniform(&[700, 48], -3.0, 3.0, 4);
    let (_, g_all) = run(&big);
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let (_, g_one_thread) = one.install(|| run(&big));
    assert!(g_all == g_one_thread, "the gradient depends on the thread count");
    for (start, len) in [(0, 1), (699, 1), (100, 33)] {
        let (_, g) = run(&big.narrow(0, start, len).unwrap());
        assert!(g[..] == g_all[start * 48..(start + len) * 48], "rows {start}+{len} depend on their batch");
    }
}
