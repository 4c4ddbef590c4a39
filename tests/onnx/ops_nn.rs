//! Generated graphs for the image operators: Conv, MaxPool, AveragePool, the global pools and
//! BatchNormalization, each against a direct loop and with a finite-difference gradient check.

use armoury::nn::Module;
use armoury::onnx::proto::AttributeProto;
use armoury::{ModuleExt, Tensor};
use ndarray::{Array4, ArrayD, IxDyn};

use super::build::{attr_f, attr_i, attr_ints, attr_s, node, Graph};
use super::ops::{check, spaced};

/// Direct convolution with ONNX pads [top, left, bottom, right].
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &Tensor,
    w: &Tensor,
    b: Option<&[f32]>,
    s: [usize; 2],
    p: [usize; 4],
    d: [usize; 2],
    group: usize,
) -> ArrayD<f32> {
    let x = x.to_array().into_dimensionality::<ndarray::Ix4>().expect("rank 4");
    let w = w.to_array().into_dimensionality::<ndarray::Ix4>().expect("rank 4");
    let (n, c, h, wd) = x.dim();
    let (o, cg, kh, kw) = w.dim();
    let ho = (h + p[0] + p[2] - d[0] * (kh - 1) - 1) / s[0] + 1;
    let wo = (wd + p[1] + p[3] - d[1] * (kw - 1) - 1) / s[1] + 1;
    let og = o / group;
    assert_eq!(cg * group, c);
    let mut out = Array4::<f32>::zeros((n, o, ho, wo));
    for ((ni, oc, i, j), v) in out.indexed_iter_mut() {
        let g = oc / og;
        let mut acc = b.map_or(0.0, |b| b[oc]);
        for ci in 0..cg {
            for a in 0..kh {
                for bb in 0..kw {
                    let r = (i * s[0] + a * d[0]) as isize - p[0] as isize;
                    let q = (j * s[1] + bb * d[1]) as isize - p[1] as isize;
                    if r >= 0 && q >= 0 && (r as usize) < h && (q as usize) < wd {
                        acc += x[[ni, g * cg + ci, r as usize, q as usize]] * w[[oc, ci, a, bb]];
                    }
                }
            }
        }
        *v = acc;
    }
    out.into_dyn()
}

#[test]
fn conv_grouped_strided_asymmetric_pads_and_auto_pad() {
    let x = spaced(&[2, 4, 5, 5], 20);
    let w = spaced(&[6, 2, 3, 3], 21);
    let b = [0.1f32, -0.2, 0.3, 0.0, 0.5, -0.4];
    let attrs = vec![
        attr_ints("kernel_shape", &[3, 3]),
        attr_ints("strides", &[2, 1]),
        attr_ints("pads", &[1, 0, 0, 2]),
        attr_i("group", 2),
    ];
    let g = Graph::new(13, &[-1, 4, 5, 5])
        .init("conv.weight", &[6, 2, 3, 3], &w.to_vec())
        .init("conv.bias", &[6], &b)
        .node(node("Conv", &["x", "conv.weight", "conv.bias"], &["y"], "conv", attrs))
        .output("y", &[]);
    check(&g, &x, &conv_ref(&x, &w, Some(&b), [2, 1], [1, 0, 0, 2], [1, 1], 2));
    assert_eq!(g.model().parameters().len(), 2, "weight and bias are trainable");

    // auto_pad SAME_UPPER with stride 2 and dilation 2, no bias: 5 → 3 with total padding 4 (2 + 2) per axis.
    let w1 = spaced(&[3, 4, 3, 3], 22);
    let attrs = vec![attr_s("auto_pad", "SAME_UPPER"), attr_ints("strides", &[2, 2]), attr_ints("dilations", &[2, 2])];
    let g = Graph::new(11, &[-1, 4, 5, 5])
        .init("w", &[3, 4, 3, 3], &w1.to_vec())
        .node(node("Conv", &["x", "w"], &["y"], "conv", attrs))
        .output("y", &[]);
    check(&g, &x, &conv_ref(&x, &w1, None, [2, 2], [2, 2, 2, 2], [2, 2], 1));
    // SAME_LOWER with stride 2, kernel 2 on 5: total padding 1, at the start.
    let w2 = spaced(&[2, 4, 2, 2], 23);
    let attrs = vec![attr_s("auto_pad", "SAME_LOWER"), attr_ints("strides", &[2, 2])];
    let g = Graph::new(11, &[-1, 4, 5, 5])
        .init("w", &[2, 4, 2, 2], &w2.to_vec())
        .node(node("Conv", &["x", "w"], &["y"], "conv", attrs))
        .output("y", &[]);
    check(&g, &x, &conv_ref(&x, &w2, None, [2, 2], [1, 1, 0, 0], [1, 1], 1));
}

/// Direct pooling over the padded input; `avg` = Some(count_include_pad).
fn pool_ref(x: &Tensor, k: usize, s: usize, p: [usize; 4], ceil: bool, avg: Option<bool>) -> ArrayD<f32> {
    let x = x.to_array().into_dimensionality::<ndarray::Ix4>().expect("rank 4");
    let (n, c, h, w) = x.dim();
    let len = |d: usize, a: usize, b: usize| {
        let span = d + a + b - k;
        let mut o = if ceil { span.div_ceil(s) + 1 } else { span / s + 1 };
        if ceil && (o - 1) * s >= d + a {
            o -= 1;
        }
        o
    };
    let (ho, wo) = (len(h, p[0], p[2]), len(w, p[1], p[3]));
    let mut out = Array4::<f32>::zeros((n, c, ho, wo));
    for ((ni, ci, i, j), v) in out.indexed_iter_mut() {
        let (mut m, mut sum, mut real, mut cells) = (f32::NEG_INFINITY, 0.0, 0, 0);
        for a in 0..k {
            for b in 0..k {
                let (r, q) = ((i * s + a) as isize - p[0] as isize, (j * s + b) as isize - p[1] as isize);
                if r < (h + p[2]) as isize && q < (w + p[3]) as isize {
                    cells += 1;
                }
                if r >= 0 && q >= 0 && (r as usize) < h && (q as usize) < w {
                    let val = x[[ni, ci, r as usize, q as usize]];
                    m = m.max(val);
                    sum += val;
                    real += 1;
                }
            }
        }
        *v = match avg {
            None => m,
            Some(true) => sum / cells as f32,
            Some(false) => sum / real as f32,
        };
    }
    out.into_dyn()
}

fn pool_graph(op: &str, attrs: Vec<AttributeProto>) -> Graph {
    Graph::new(13, &[-1, 2, 6, 5]).node(node(op, &["x"], &["y"], op, attrs)).output("y", &[])
}

#[test]
fn max_pool_padding_ceil_mode_and_same_upper() {
    let x = spaced(&[2, 2, 6, 5], 24);
    let base = || vec![attr_ints("kernel_shape", &[3, 3]), attr_ints("strides", &[2, 2])];
    let mut a = base();
    a.extend([attr_ints("pads", &[1, 1, 1, 1]), attr_i("ceil_mode", 1)]);
    check(&pool_graph("MaxPool", a), &x, &pool_ref(&x, 3, 2, [1, 1, 1, 1], true, None));
    check(&pool_graph("MaxPool", base()), &x, &pool_ref(&x, 3, 2, [0; 4], false, None));
    // SAME_UPPER, kernel 2 stride 2: H 6 needs no padding, W 5 one column at the end.
    let a = vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[2, 2]), attr_s("auto_pad", "SAME_UPPER")];
    let want = pool_ref(&x, 2, 2, [0, 0, 0, 1], false, None);
    check(&pool_graph("MaxPool", a), &x, &want);
}

#[test]
fn average_pool_count_include_pad_and_asymmetric_padding() {
    let x = spaced(&[2, 2, 6, 5], 25);
    for cip in [false, true] {
        let a = vec![
            attr_ints("kernel_shape", &[3, 3]),
            attr_ints("strides", &[2, 2]),
            attr_ints("pads", &[1, 1, 1, 1]),
            attr_i("count_include_pad", i64::from(cip)),
        ];
        check(&pool_graph("AveragePool", a), &x, &pool_ref(&x, 3, 2, [1, 1, 1, 1], false, Some(cip)));
        // Asymmetric explicit pads: the window sums divided by the real (or all padded) cells.
        let a = vec![
            attr_ints("kernel_shape", &[3, 3]),
            attr_ints("strides", &[2, 2]),
            attr_ints("pads", &[0, 1, 1, 0]),
            attr_i("count_include_pad", i64::from(cip)),
        ];
        check(&pool_graph("AveragePool", a), &x, &pool_ref(&x, 3, 2, [0, 1, 1, 0], false, Some(cip)));
    }
    let a = vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[2, 2]), attr_i("ceil_mode", 1)];
    check(&pool_graph("AveragePool", a), &x, &pool_ref(&x, 2, 2, [0; 4], true, Some(false)));
}

#[test]
fn global_pools() {
    let x = spaced(&[2, 3, 4, 5], 26);
    let xv = x.to_array();
    let mean = ArrayD::from_shape_fn(IxDyn(&[2, 3, 1, 1]), |i| {
        (0..4).flat_map(|r| (0..5).map(move |q| (r, q))).map(|(r, q)| xv[[i[0], i[1], r, q]]).sum::<f32>() / 20.0
    });
    let max = ArrayD::from_shape_fn(IxDyn(&[2, 3, 1, 1]), |i| {
        (0..4).flat_map(|r| (0..5).map(move |q| (r, q))).map(|(r, q)| xv[[i[0], i[1], r, q]]).fold(f32::MIN, f32::max)
    });
    for (op, want) in [("GlobalAveragePool", mean), ("GlobalMaxPool", max)] {
        let g = Graph::new(13, &[-1, 3, 4, 5]).node(node(op, &["x"], &["y"], op, vec![])).output("y", &[-1, 3, 1, 1]);
        check(&g, &x, &want);
    }
}

#[test]
fn batch_normalization_inference() {
    let x = spaced(&[2, 3, 2, 2], 27);
    let (scale, bias, mean, var) = ([1.5f32, -0.5, 0.8], [0.1f32, 0.2, -0.3], [0.05f32, -0.1, 0.2], [0.5f32, 1.2, 0.3]);
    let eps = 1e-3;
    let g = Graph::new(15, &[-1, 3, 2, 2])
        .init("bn.weight", &[3], &scale)
        .init("bn.bias", &[3], &bias)
        .init("bn.running_mean", &[3], &mean)
        .init("bn.running_var", &[3], &var)
        .node(node(
            "BatchNormalization",
            &["x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
            &["y"],
            "bn",
            vec![attr_f("epsilon", eps), attr_f("momentum", 0.9)],
        ))
        .output("y", &[]);
    let xv = x.to_array();
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 2, 2]), |i| {
        let c = i[1];
        (xv[&i] - mean[c]) / (var[c] + eps).sqrt() * scale[c] + bias[c]
    });
    check(&g, &x, &want);
    let m = g.model();
    let kinds: Vec<(String, bool)> = m.named_params().into_iter().map(|(n, p)| (n, p.is_trainable())).collect();
    let expect = [("bn.weight", true), ("bn.bias", true), ("bn.running_mean", false), ("bn.running_var", false)];
    assert_eq!(kinds, expect.map(|(n, t)| (n.to_string(), t)));
    // Training mode is refused, not silently run in inference.
    let g = Graph::new(15, &[-1, 3, 2, 2])
        .init("s", &[3], &scale)
        .init("b", &[3], &bias)
        .init("m", &[3], &mean)
        .init("v", &[3], &var)
        .node(node("BatchNormalization", &["x", "s", "b", "m", "v"], &["y"], "bn", vec![attr_i("training_mode", 1)]))
        .output("y", &[]);
    let err = armoury::onnx::OnnxModel::from_bytes(&g.bytes()).expect_err("training_mode is unsupported");
    assert!(err.to_string().contains("training_mode"), "{err}");
}

/// Conv → Relu → MaxPool 2×2/2 runs as one step (the fused op), giving the separate ops' values and gradients
/// exactly (the native ops are checked against finite differences in `gradcheck`); a Relu whose input another
/// node also reads, a pooling that is not 2×2/2, or an intermediate that is the graph's output stay separate.
#[test]
fn conv_relu_and_pooling_fuse_only_where_nothing_else_reads_them() {
    let x = spaced(&[2, 2, 7, 6], 30);
    let w = spaced(&[3, 2, 3, 3], 31);
    let b = [0.05f32, -0.1, 0.2];
    let conv = || node("Conv", &["x", "w", "b"], &["c"], "conv", vec![attr_ints("kernel_shape", &[3, 3])]);
    let pool = |k: i64| {
        node("MaxPool", &["r"], &["y"], "pool", vec![attr_ints("kernel_shape", &[k, k]), attr_ints("strides", &[2, 2])])
    };
    let base = || Graph::new(13, &[-1, 2, 7, 6]).init("w", &[3, 2, 3, 3], &w.to_vec()).init("b", &[3], &b);
    let bt = Tensor::from_slice(&b, &[3]).expect("bias");
    let conv_relu = x.conv2d(&w, Some(&bt), Default::default()).expect("conv").relu();
    let want = conv_relu.max_pool2d(armoury::ops::Pool2dParams::square(2)).expect("pool").to_array();

    let fused = base().node(conv()).node(node("Relu", &["c"], &["r"], "relu", vec![])).node(pool(2)).output("y", &[]);
    assert_eq!(fused.model().num_nodes(), 1, "Conv, Relu and MaxPool run as one step");
    let got = fused.model().forward_t(&x, false).expect("forward").to_array();
    assert_eq!(got, want, "the fused step gives the separate ops' values exactly");
    // And their gradients (the fused op's own finite-difference check is in `gradcheck`).
    let m = fused.model();
    let (xv, params) = (x.variable(), m.parameters());
    let (wv, bv) = (params[0].tensor(), params[1].tensor());
    let r = Tensor::uniform(want.shape(), -1.0, 1.0, 32);
    let fused_grads = m.forward_t(&xv, false).unwrap().mul(&r).unwrap().sum_all().grad_wrt(&[&xv, &wv, &bv]).unwrap();
    let plain = xv.conv2d(&wv, Some(&bv), Default::default()).unwrap().relu();
    let plain = plain.max_pool2d(armoury::ops::Pool2dParams::square(2)).unwrap();
    let plain_grads = plain.mul(&r).unwrap().sum_all().grad_wrt(&[&xv, &wv, &bv]).unwrap();
    for (a, b) in fused_grads.iter().zip(&plain_grads) {
        assert_eq!(a.to_array(), b.to_array());
    }

    // A 3×3 pooling: only the Relu fuses.
    let g = base().node(conv()).node(node("Relu", &["c"], &["r"], "relu", vec![])).node(pool(3)).output("y", &[]);
    assert_eq!(g.model().num_nodes(), 2, "Conv+Relu, then the pooling");
    // The convolution's output is read twice (Relu and Add): nothing fuses.
    let g = base()
        .node(conv())
        .node(node("Relu", &["c"], &["r"], "relu", vec![]))
        .node(node("Add", &["r", "c"], &["y"], "add", vec![]))
        .output("y", &[]);
    assert_eq!(g.model().num_nodes(), 3);
    let want = &conv_relu.to_array() + &x.conv2d(&w, Some(&bt), Default::default()).expect("conv").to_array();
    assert_eq!(g.model().forward_t(&x, false).expect("forward").to_array(), want);
    // The Relu's output is the graph's output: the pooling after it cannot take it.
    let g = base().node(conv()).node(node("Relu", &["c"], &["r"], "relu", vec![])).output("r", &[]);
    assert_eq!(g.model().num_nodes(), 1, "Conv+Relu");
    assert_eq!(g.model().forward_t(&x, false).expect("forward").to_array(), conv_relu.to_array());
}
