//! One small generated graph per supported operator: the forward pass against a hand computation, and
//! autodiff against central finite differences for the input and every trainable initialiser.

use armoury::onnx::{float_tensor, OnnxModel};
use armoury::{no_grad, Module, ModuleExt, Tensor};
use ndarray::{ArrayD, IxDyn};

use super::assert_close;
use super::build::{attr_f, attr_i, attr_t, node, Graph};

/// Distinct values in [−0.99, 0.99], at least 0.02 apart and at least 0.01 from 0 (and from ±0.5), shuffled:
/// a step of 5e-3 never crosses a kink of relu, clip or max.
pub(crate) fn spaced(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let keys = Tensor::uniform(&[n], 0.0, 1.0, seed).to_vec();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
    let step = (1.98 / n as f32).clamp(0.02, 0.2);
    let mut v = vec![0.0; n];
    for (rank, &i) in order.iter().enumerate() {
        let x = -0.99 + step * rank as f32;
        v[i] = if x.abs() < 0.01 || (x.abs() - 0.5).abs() < 0.01 { x + 0.011 } else { x };
    }
    Tensor::from_vec(v, shape).expect("sizes match")
}

/// Positive inputs in [0.5, 1.5] (for Log, Sqrt, Pow and divisors).
fn positive(shape: &[usize], seed: u64) -> Tensor {
    Tensor::uniform(shape, 0.5, 1.5, seed)
}

fn arr(shape: &[usize], v: Vec<f32>) -> ArrayD<f32> {
    ArrayD::from_shape_vec(IxDyn(shape), v).expect("sizes match")
}

/// f = Σ r ⊙ model(x), in f64.
fn objective(m: &OnnxModel, x: &Tensor, r: &[f32]) -> f64 {
    let y = no_grad(|| m.forward_t(x, false)).expect("forward");
    y.to_vec().iter().zip(r).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum()
}

/// Central differences (step `h`) against autodiff for the input and every trainable parameter.
fn gradcheck(m: &OnnxModel, x: &Tensor, h: f32) {
    let params: Vec<_> = m.named_params().into_iter().filter(|(_, p)| p.is_trainable()).collect();
    let xv = x.variable();
    let leaves: Vec<Tensor> = params.iter().map(|(_, p)| p.tensor()).collect();
    let y = m.forward_t(&xv, false).expect("forward");
    let r = Tensor::uniform(y.shape(), -1.0, 1.0, 99);
    let loss = y.mul(&r).expect("same shape").sum_all();
    let mut targets = vec![&xv];
    targets.extend(leaves.iter());
    let grads = loss.grad_wrt(&targets).expect("gradients");
    let rv = r.to_vec();
    let check = |what: &str, ad: f32, fd: f64| {
        let tol = 2e-3 + 1e-2 * f64::from(ad.abs());
        assert!((f64::from(ad) - fd).abs() <= tol, "{what}: autodiff {ad}, finite difference {fd}");
    };
    let xs = x.to_vec();
    for (i, &ad) in grads[0].to_vec().iter().enumerate() {
        let at = |d: f32| {
            let mut v = xs.clone();
            v[i] += d;
            objective(m, &Tensor::from_vec(v, x.shape()).expect("shape"), &rv)
        };
        let fd = (at(h) - at(-h)) / (2.0 * f64::from(h));
        check(&format!("∂/∂x[{i}]"), ad, fd);
    }
    for ((name, p), g) in params.iter().zip(&grads[1..]) {
        let orig = p.value();
        for (i, &ad) in g.to_vec().iter().enumerate() {
            let at = |d: f32| {
                let mut v = orig.to_owned();
                *v.iter_mut().nth(i).expect("index in range") += d;
                p.set(v).expect("same shape");
                objective(m, x, &rv)
            };
            let fd = (at(h) - at(-h)) / (2.0 * f64::from(h));
            p.set(orig.clone()).expect("restore");
            check(&format!("∂/∂{name}[{i}]"), ad, fd);
        }
    }
}

/// Forward against `want`, then the gradient check.
pub(crate) fn check(g: &Graph, x: &Tensor, want: &ArrayD<f32>) {
    let m = g.model();
    let y = m.forward_t(x, false).expect("forward");
    assert_close("forward", &y.to_array(), want, 1e-5, 1e-5);
    gradcheck(&m, x, 5e-3);
}

fn unary(op: &str, attrs: Vec<armoury::onnx::proto::AttributeProto>, x: &Tensor, f: impl Fn(f32) -> f32) {
    let g = Graph::new(13, &[-1, 3, 4]).node(node(op, &["x"], &["y"], op, attrs)).output("y", &[-1, 3, 4]);
    check(&g, x, &x.to_array().mapv(f));
}

#[test]
fn elementwise_unary_ops() {
    let x = spaced(&[2, 3, 4], 1);
    unary("Neg", vec![], &x, |v| -v);
    unary("Relu", vec![], &x, |v| v.max(0.0));
    unary("LeakyRelu", vec![attr_f("alpha", 0.2)], &x, |v| if v > 0.0 { v } else { 0.2 * v });
    unary("LeakyRelu", vec![], &x, |v| if v > 0.0 { v } else { 0.01 * v });
    unary("Sigmoid", vec![], &x, |v| 1.0 / (1.0 + (-v).exp()));
    unary("Tanh", vec![], &x, f32::tanh);
    unary("Exp", vec![], &x, f32::exp);
    unary("Identity", vec![], &x, |v| v);
    let p = positive(&[2, 3, 4], 2);
    unary("Log", vec![], &p, f32::ln);
    unary("Sqrt", vec![], &p, f32::sqrt);
}

#[test]
fn binary_ops_broadcast() {
    let x = spaced(&[2, 3, 4], 3);
    let c = [0.7f32, -1.3, 2.1];
    type Case = (&'static str, fn(f32, f32) -> f32);
    let cases: [Case; 4] = [("Add", |a, b| a + b), ("Sub", |a, b| a - b), ("Mul", |a, b| a * b), ("Div", |a, b| a / b)];
    for (op, f) in cases {
        // x ∘ c with c [3, 1] broadcast, and c ∘ x (the initialiser on the left, x positive for Div).
        let g = Graph::new(13, &[-1, 3, 4])
            .init("c", &[3, 1], &c)
            .node(node(op, &["x", "c"], &["y"], op, vec![]))
            .output("y", &[]);
        let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |i| f(x.value()[&i], c[i[1]]));
        check(&g, &x, &want);
        let xp = positive(&[2, 3, 4], 4);
        let g = Graph::new(13, &[-1, 3, 4])
            .init("c", &[3, 1], &c)
            .node(node(op, &["c", "x"], &["y"], op, vec![]))
            .output("y", &[]);
        let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |i| f(c[i[1]], xp.value()[&i]));
        check(&g, &xp, &want);
    }
}

#[test]
fn prelu_with_per_channel_slope() {
    let x = spaced(&[2, 3, 2, 2], 5);
    let slope = [0.1f32, -0.3, 0.5];
    let g = Graph::new(13, &[-1, 3, 2, 2])
        .init("slope", &[3, 1, 1], &slope)
        .node(node("PRelu", &["x", "slope"], &["y"], "prelu", vec![]))
        .output("y", &[]);
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 2, 2]), |i| {
        let v = x.value()[&i];
        if v >= 0.0 {
            v
        } else {
            slope[i[1]] * v
        }
    });
    check(&g, &x, &want);
    assert_eq!(g.model().parameters().len(), 1, "the slope is trainable");
}

/// PRelu's output has the data's shape whatever the slope's (ONNX broadcasts the slope unidirectionally):
/// shape inference once broadcast both ways, so a constant one-element slope of higher rank (`[1, 1, 1, 1, 1]`,
/// run as a leaky relu) was inferred to grow the data by an axis — load-time inference then refused the Gemm
/// after it (no memory estimate) and the run loop's debug check of inferred against executed shapes fired.
#[test]
fn prelu_output_has_the_data_shape_whatever_the_slope() {
    let x = spaced(&[2, 3, 2, 2], 7);
    let w: Vec<f32> = (0..12 * 2).map(|i| (i as f32 - 11.0) / 10.0).collect();
    for (what, slope_shape, slope) in [
        ("[1, 1, 1, 1, 1]", vec![1usize, 1, 1, 1, 1], vec![0.25f32]),
        ("[1]", vec![1], vec![0.25]),
        ("[3, 1, 1]", vec![3, 1, 1], vec![0.25, 0.25, 0.25]),
        ("[1, 3, 1, 1]", vec![1, 3, 1, 1], vec![0.25, 0.25, 0.25]),
    ] {
        // The slope as a Constant node (a constant, not a trainable initialiser), then Flatten and a Gemm that
        // only fit the data's shape.
        let g = Graph::new(13, &[-1, 3, 2, 2])
            .init("w", &[12, 2], &w)
            .node(node(
                "Constant",
                &[],
                &["slope"],
                "slope",
                vec![attr_t("value", float_tensor("", &slope_shape, &slope))],
            ))
            .node(node("PRelu", &["x", "slope"], &["p"], "prelu", vec![]))
            .node(node("Flatten", &["p"], &["f"], "flatten", vec![attr_i("axis", 1)]))
            .node(node("Gemm", &["f", "w"], &["y"], "gemm", vec![]))
            .output("y", &[]);
        let m = g.model();
        let e = m.memory_estimate().unwrap_or_else(|| panic!("slope {what}: load-time shape inference failed"));
        // x, p, f (12 floats a sample each) and y (2), for the default batch.
        assert_eq!(e.graph_bytes, (e.batch_size * (3 * 12 + 2) * 4) as u128, "slope {what}: inferred sizes");
        let y = no_grad(|| m.forward_t(&x, false)).expect("forward");
        assert_eq!(y.shape(), &[2, 2], "slope {what}");
        let leaky = x.to_array().mapv(|v| if v >= 0.0 { v } else { 0.25 * v });
        let f = ndarray::Array2::from_shape_vec((2, 12), leaky.iter().copied().collect()).expect("sizes");
        let wa = ndarray::Array2::from_shape_vec((12, 2), w.clone()).expect("sizes");
        assert_close(&format!("slope {what}"), &y.to_array(), &f.dot(&wa).into_dyn(), 1e-5, 1e-5);
    }
    // A slope that would grow the data is refused, at load (no estimate) and when the node runs.
    let g = Graph::new(13, &[-1, 3, 2, 2])
        .node(node(
            "Constant",
            &[],
            &["slope"],
            "slope",
            vec![attr_t("value", float_tensor("", &[5, 1, 1, 1, 1], &[0.1; 5]))],
        ))
        .node(node("PRelu", &["x", "slope"], &["y"], "prelu", vec![]))
        .output("y", &[]);
    let m = g.model();
    assert!(m.memory_estimate().is_none());
    let err = no_grad(|| m.forward_t(&x, false)).expect_err("a slope of [5, 1, 1, 1, 1] on [2, 3, 2, 2]");
    assert!(err.to_string().contains("does not broadcast"), "{err}");
}

#[test]
fn clip_input_and_attribute_forms() {
    let x = spaced(&[2, 3, 4], 6);
    let g = Graph::new(13, &[-1, 3, 4])
        .init("lo", &[], &[-0.5])
        .init("hi", &[], &[0.3])
        .node(node("Clip", &["x", "lo", "hi"], &["y"], "clip", vec![]))
        .output("y", &[]);
    check(&g, &x, &x.to_array().mapv(|v| v.clamp(-0.5, 0.3)));
    assert!(g.model().parameters().is_empty(), "Clip bounds are constants, not parameters");
    let g = Graph::new(13, &[-1, 3, 4])
        .init("hi", &[], &[0.3])
        .node(node("Clip", &["x", "", "hi"], &["y"], "clip", vec![]))
        .output("y", &[]);
    check(&g, &x, &x.to_array().mapv(|v| v.min(0.3)));
    let g = Graph::new(6, &[-1, 3, 4])
        .node(node("Clip", &["x"], &["y"], "clip", vec![attr_f("min", -0.3), attr_f("max", 0.7)]))
        .output("y", &[]);
    check(&g, &x, &x.to_array().mapv(|v| v.clamp(-0.3, 0.7)));
}

#[test]
fn pow_with_constant_exponent() {
    let x = positive(&[2, 3, 4], 7);
    let g = Graph::new(13, &[-1, 3, 4])
        .init("p", &[], &[2.5])
        .node(node("Pow", &["x", "p"], &["y"], "pow", vec![]))
        .output("y", &[]);
    check(&g, &x, &x.to_array().mapv(|v| v.powf(2.5)));
}

fn softmax_ref(x: &ArrayD<f32>, groups: usize, log: bool) -> ArrayD<f32> {
    // Softmax over contiguous runs of `len` values after moving the axis last is done by the caller.
    let v = x.as_standard_layout().to_owned().into_raw_vec_and_offset().0;
    let len = v.len() / groups;
    let mut out = Vec::with_capacity(v.len());
    for c in v.chunks(len) {
        let m = c.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let s: f32 = c.iter().map(|&a| (a - m).exp()).sum();
        out.extend(c.iter().map(|&a| if log { a - m - s.ln() } else { (a - m).exp() / s }));
    }
    arr(x.shape(), out)
}

#[test]
fn softmax_and_log_softmax_new_and_legacy_axes() {
    let x = spaced(&[2, 3, 4], 8);
    for (op, log) in [("Softmax", false), ("LogSoftmax", true)] {
        // Opset 13: over axis 1 only.
        let g =
            Graph::new(13, &[-1, 3, 4]).node(node(op, &["x"], &["y"], op, vec![attr_i("axis", 1)])).output("y", &[]);
        let xt = x.permute(&[0, 2, 1]).expect("perm").to_array();
        let want = softmax_ref(&xt, 8, log).permuted_axes(IxDyn(&[0, 2, 1]));
        check(&g, &x, &want.as_standard_layout().to_owned());
        // Opset 11: the input is flattened to [2, 12] at axis 1.
        let g =
            Graph::new(11, &[-1, 3, 4]).node(node(op, &["x"], &["y"], op, vec![attr_i("axis", 1)])).output("y", &[]);
        check(&g, &x, &softmax_ref(&x.to_array(), 2, log));
        // Default axis of opset 13: the last.
        let g = Graph::new(13, &[-1, 3, 4]).node(node(op, &["x"], &["y"], op, vec![])).output("y", &[]);
        check(&g, &x, &softmax_ref(&x.to_array(), 6, log));
    }
}

#[test]
fn gemm_and_matmul() {
    // Gemm: y = 0.5·Aᵀ·Bᵀ + 2·C with A = x [4, 2], B [3, 4], C [3].
    let x = spaced(&[4, 2], 9);
    let b = spaced(&[3, 4], 10).to_vec();
    let c = [0.1f32, -0.2, 0.3];
    let g = Graph::new(13, &[4, 2])
        .init("B", &[3, 4], &b)
        .init("C", &[3], &c)
        .node(node(
            "Gemm",
            &["x", "B", "C"],
            &["y"],
            "gemm",
            vec![attr_i("transA", 1), attr_i("transB", 1), attr_f("alpha", 0.5), attr_f("beta", 2.0)],
        ))
        .output("y", &[2, 3]);
    let xv = x.to_array();
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3]), |i| {
        0.5 * (0..4).map(|k| xv[[k, i[0]]] * b[i[1] * 4 + k]).sum::<f32>() + 2.0 * c[i[1]]
    });
    check(&g, &x, &want);
    // Gemm as a PyTorch Linear layer: transB = 1, bias.
    let x = spaced(&[2, 4], 11);
    let g = Graph::new(13, &[-1, 4])
        .init("W", &[3, 4], &b)
        .init("bias", &[3], &c)
        .node(node("Gemm", &["x", "W", "bias"], &["y"], "fc", vec![attr_i("transB", 1)]))
        .output("y", &[-1, 3]);
    let xv = x.to_array();
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3]), |i| {
        (0..4).map(|k| xv[[i[0], k]] * b[i[1] * 4 + k]).sum::<f32>() + c[i[1]]
    });
    check(&g, &x, &want);
    // MatMul [2, 3, 4] · [4, 3] and [2, 4] · [2, 4, 3] (broadcast batch).
    let x = spaced(&[2, 3, 4], 12);
    let g = Graph::new(13, &[-1, 3, 4]).init("W", &[4, 3], &b).node(node("MatMul", &["x", "W"], &["y"], "mm", vec![]));
    let g = g.output("y", &[]);
    let xv = x.to_array();
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 3]), |i| {
        (0..4).map(|k| xv[[i[0], i[1], k]] * b[k * 3 + i[2]]).sum::<f32>()
    });
    check(&g, &x, &want);
    let w2 = spaced(&[2, 4, 3], 13).to_vec();
    let x = spaced(&[2, 4], 14);
    let g = Graph::new(13, &[2, 4])
        .init("W", &[2, 4, 3], &w2)
        .node(node("MatMul", &["x", "W"], &["y"], "mm", vec![]))
        .output("y", &[]);
    let xv = x.to_array();
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 2, 3]), |i| {
        (0..4).map(|k| xv[[i[1], k]] * w2[i[0] * 12 + k * 3 + i[2]]).sum::<f32>()
    });
    check(&g, &x, &want);
}

#[test]
fn constant_shape_and_cast_feed_a_reshape() {
    // PyTorch's `x.view(x.size(0), -1)`: Shape → Gather → Unsqueeze → Concat(Constant) → Reshape, plus a Cast.
    let x = spaced(&[2, 3, 2], 15);
    let g = Graph::new(13, &[-1, 3, 2])
        .init_i("zero", &[], &[0])
        .init_i("axes", &[1], &[0])
        .node(node("Shape", &["x"], &["s"], "shape", vec![]))
        .node(node("Gather", &["s", "zero"], &["n"], "batch", vec![attr_i("axis", 0)]))
        .node(node("Unsqueeze", &["n", "axes"], &["n1"], "unsq", vec![]))
        .node(node(
            "Constant",
            &[],
            &["m1"],
            "minus_one",
            vec![attr_t("value", armoury::onnx::int_tensor("", &[1], &[-1]))],
        ))
        .node(node("Concat", &["n1", "m1"], &["shape"], "cat", vec![attr_i("axis", 0)]))
        .node(node("Cast", &["shape"], &["shape64"], "cast", vec![attr_i("to", 7)]))
        .node(node("Reshape", &["x", "shape64"], &["r"], "reshape", vec![]))
        .node(node("Constant", &[], &["k"], "k", vec![attr_t("value", float_tensor("", &[], &[3.0]))]))
        .node(node("Cast", &["r"], &["rf"], "castf", vec![attr_i("to", 1)]))
        .node(node("Mul", &["rf", "k"], &["y"], "scale", vec![]))
        .output("y", &[-1, 6]);
    let m = g.model();
    assert_eq!(m.num_nodes(), 8, "the two Constants fold; the shape arithmetic runs per batch");
    check(&g, &x, &x.to_array().into_shape_with_order(IxDyn(&[2, 6])).expect("same size").mapv(|v| 3.0 * v));
    // The batch is dynamic: another batch size runs through the same graph.
    let x5 = spaced(&[5, 3, 2], 16);
    assert_eq!(m.forward_t(&x5, false).expect("batch of 5").shape(), &[5, 6]);
}
