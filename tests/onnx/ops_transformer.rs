//! The operators of transformers and the newer convnets (Erf, Gelu, HardSigmoid, HardSwish, LayerNormalization,
//! Split, Einsum) and the classic exporter's decomposed LayerNorm and GELU: tiny graphs, their outputs against
//! PyTorch's values or the formula, and the finite-difference gradient check of `check`.

use armoury::{no_grad, Error, Module, ModuleExt, Tensor};
use ndarray::{ArrayD, IxDyn};

use super::build::{attr_f, attr_i, attr_ints, attr_s, node, Graph};
use super::ops::{check, spaced};

/// The points PyTorch's values below are taken at (off the hard functions' kinks at ±3 and ±2.5).
const XS: [f32; 6] = [-3.5, -1.0, -0.25, 0.5, 1.5, 2.9];

fn unary(opset: i64, op: &str, attrs: Vec<armoury::onnx::proto::AttributeProto>, want: &[f64]) {
    let x = Tensor::from_slice(&XS, &[2, 3]).expect("shape");
    let g = Graph::new(opset, &[-1, 3]).node(node(op, &["x"], &["y"], op, attrs)).output("y", &[-1, 3]);
    let want = ArrayD::from_shape_vec(IxDyn(&[2, 3]), want.iter().map(|&v| v as f32).collect()).expect("shape");
    check(&g, &x, &want);
}

#[test]
fn erf_gelu_and_hard_activations_match_pytorch() {
    // PyTorch 2.15 in float64 at XS: torch.erf, F.gelu (both forms), F.hardswish, F.hardsigmoid, and
    // clamp(0.2x + 0.5, 0, 1) (ONNX's default HardSigmoid).
    let erf = [-0.9999992569016276, -0.8427007929497149, -0.27632639016823696, 0.5204998778130465, 0.9661051464753108];
    unary(13, "Erf", vec![], &[&erf[..], &[0.9999589021219005]].concat());
    let gelu = [-0.0008142017766243903, -0.15865525393145702, -0.10032341857926907, 0.34573123063700656];
    let gelu = [&gelu[..], &[1.399789198096713, 2.8945891414288862]].concat();
    unary(20, "Gelu", vec![], &gelu);
    unary(20, "Gelu", vec![attr_s("approximate", "none")], &gelu);
    let tanh = [-0.0006161976553737403, -0.15880800939172324, -0.100324649298315, 0.34571400982514394];
    unary(
        20,
        "Gelu",
        vec![attr_s("approximate", "tanh")],
        &[&tanh[..], &[1.3995715769802328, 2.895033333764528]].concat(),
    );
    let swish = [0.0, -1.0 / 3.0, -0.11458333333333333, 0.2916666666666667, 1.125, 2.8516666666666666];
    unary(14, "HardSwish", vec![], &swish);
    let sixth = [0.0, 1.0 / 3.0, 0.4583333333333333, 0.5833333333333334, 0.75, 0.9833333333333334];
    unary(13, "HardSigmoid", vec![attr_f("alpha", 1.0 / 6.0), attr_f("beta", 0.5)], &sixth);
    unary(13, "HardSigmoid", vec![], &[0.0, 0.3, 0.45, 0.6, 0.8, 1.0]);
    let g = Graph::new(20, &[-1, 3])
        .node(node("Gelu", &["x"], &["y"], "gelu", vec![attr_s("approximate", "sigmoid")]))
        .output("y", &[]);
    assert!(matches!(load_error(&g), Some(Error::UnsupportedOnnx { .. })));
}

/// The error loading a graph gives (`None` when it loads).
fn load_error(g: &Graph) -> Option<Error> {
    armoury::onnx::OnnxModel::from_bytes(&g.bytes()).err()
}

/// Layer norm of `x` over the axes from `axis` on, in f64: (x − mean)/√(var + ε)·scale + bias, with `scale` and
/// `bias` indexed by the position within the normalised axes (modulo their length, for a broadcast one).
fn layer_norm_ref(x: &Tensor, axis: usize, eps: f64, scale: &[f32], bias: &[f32]) -> ArrayD<f32> {
    let d: usize = x.shape()[axis..].iter().product();
    let v = x.to_vec();
    let mut out = Vec::with_capacity(v.len());
    for row in v.chunks(d) {
        let mean = row.iter().map(|&a| f64::from(a)).sum::<f64>() / d as f64;
        let var = row.iter().map(|&a| (f64::from(a) - mean).powi(2)).sum::<f64>() / d as f64;
        for (j, &a) in row.iter().enumerate() {
            let s = f64::from(scale[j % scale.len()]);
            let b = if bias.is_empty() { 0.0 } else { f64::from(bias[j % bias.len()]) };
            out.push(((f64::from(a) - mean) / (var + eps).sqrt() * s + b) as f32);
        }
    }
    ArrayD::from_shape_vec(IxDyn(x.shape()), out).expect("shape")
}

#[test]
fn layer_normalization_axes_parameters_and_statistics() {
    let x = spaced(&[2, 3, 4], 31);
    let (w, b) = ([0.5f32, 1.5, -1.0, 2.0], [0.1f32, -0.2, 0.3, 0.0]);
    // Over the last axis (the default), Scale and B trainable.
    let g = Graph::new(17, &[-1, 3, 4])
        .init("w", &[4], &w)
        .init("b", &[4], &b)
        .node(node("LayerNormalization", &["x", "w", "b"], &["y"], "ln", vec![attr_f("epsilon", 1e-3)]))
        .output("y", &[-1, 3, 4]);
    check(&g, &x, &layer_norm_ref(&x, 2, 1e-3, &w, &b));
    assert_eq!(g.model().parameters().len(), 2, "Scale and B are trainable");
    // Over the last two axes (axis 1), a scale of shape [3, 4] and no B.
    let w12: Vec<f32> = (0..12).map(|i| 0.5 + i as f32 / 12.0).collect();
    let g = Graph::new(17, &[-1, 3, 4])
        .init("w", &[3, 4], &w12)
        .node(node("LayerNormalization", &["x", "w"], &["y"], "ln", vec![attr_i("axis", 1)]))
        .output("y", &[]);
    check(&g, &x, &layer_norm_ref(&x, 1, 1e-5, &w12, &[]));
    // The optional outputs: y = Y·InvStdDev + Mean, with Mean and InvStdDev of shape [2, 1, 1].
    let g = Graph::new(17, &[-1, 3, 4])
        .init("w", &[4], &w)
        .node(node("LayerNormalization", &["x", "w"], &["n", "mean", "inv"], "ln", vec![attr_i("axis", -2)]))
        .node(node("Mul", &["n", "inv"], &["s"], "scale", vec![]))
        .node(node("Add", &["s", "mean"], &["y"], "shift", vec![]))
        .output("y", &[]);
    let n = layer_norm_ref(&x, 1, 1e-5, &w, &[]);
    let xv = x.to_vec();
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |i| {
        let row: Vec<f64> = xv[i[0] * 12..][..12].iter().map(|&a| f64::from(a)).collect();
        let mean = row.iter().sum::<f64>() / 12.0;
        let var = row.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / 12.0;
        (f64::from(n[&i]) / (var + 1e-5).sqrt() + mean) as f32
    });
    check(&g, &x, &want);
    // Only InvStdDev asked for (Mean's name left empty): it is the second value computed, not the first.
    let g = Graph::new(17, &[-1, 3, 4])
        .init("w", &[4], &w)
        .node(node("LayerNormalization", &["x", "w"], &["n", "", "inv"], "ln", vec![]))
        .node(node("Mul", &["n", "inv"], &["y"], "scale", vec![]))
        .output("y", &[]);
    let n = layer_norm_ref(&x, 2, 1e-5, &w, &[]);
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |i| {
        let row: Vec<f64> = xv[(i[0] * 3 + i[1]) * 4..][..4].iter().map(|&a| f64::from(a)).collect();
        let mean = row.iter().sum::<f64>() / 4.0;
        let var = row.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / 4.0;
        (f64::from(n[&i]) / (var + 1e-5).sqrt()) as f32
    });
    check(&g, &x, &want);
    // Statistics in another precision than float32 are refused.
    let g = Graph::new(17, &[-1, 3, 4])
        .init("w", &[4], &w)
        .node(node("LayerNormalization", &["x", "w"], &["y"], "ln", vec![attr_i("stash_type", 11)]))
        .output("y", &[]);
    assert!(matches!(load_error(&g), Some(Error::UnsupportedOnnx { .. })));
}

/// `x` with the pieces of axis 2 in the order given: (start, len) each.
fn reorder(x: &Tensor, pieces: &[(usize, usize)]) -> ArrayD<f32> {
    let parts: Vec<Tensor> = pieces.iter().map(|&(s, l)| x.narrow(2, s, l).expect("in range")).collect();
    Tensor::concat(&parts, 2).expect("same shapes").to_array()
}

#[test]
fn split_by_attribute_input_equal_parts_and_num_outputs() {
    let x = spaced(&[2, 3, 4], 32);
    let cat = |a: &str, b: &str| node("Concat", &[a, b], &["y"], "cat", vec![attr_i("axis", 2)]);
    // Opset 11: sizes [1, 3] as an attribute; the pieces joined in reverse order.
    let g = Graph::new(11, &[-1, 3, 4])
        .node(node("Split", &["x"], &["a", "b"], "split", vec![attr_i("axis", 2), attr_ints("split", &[1, 3])]))
        .node(cat("b", "a"))
        .output("y", &[]);
    check(&g, &x, &reorder(&x, &[(1, 3), (0, 1)]));
    // Opset 13: sizes [3, 1] as an input (a constant, not a parameter).
    let g = Graph::new(13, &[-1, 3, 4])
        .init_i("sizes", &[2], &[3, 1])
        .node(node("Split", &["x", "sizes"], &["a", "b"], "split", vec![attr_i("axis", -1)]))
        .node(cat("b", "a"))
        .output("y", &[]);
    check(&g, &x, &reorder(&x, &[(3, 1), (0, 3)]));
    assert!(g.model().parameters().is_empty());
    // Neither: two equal parts.
    let g = Graph::new(13, &[-1, 3, 4])
        .node(node("Split", &["x"], &["a", "b"], "split", vec![attr_i("axis", 2)]))
        .node(cat("b", "a"))
        .output("y", &[]);
    check(&g, &x, &reorder(&x, &[(2, 2), (0, 2)]));
    // Opset 18, num_outputs = 3 over 4: parts of ⌈4/3⌉ = 2, the last one smaller (2, 2, 0).
    let g = Graph::new(18, &[-1, 3, 4])
        .node(node("Split", &["x"], &["a", "b", "c"], "split", vec![attr_i("axis", 2), attr_i("num_outputs", 3)]))
        .node(node("Concat", &["c", "b", "a"], &["y"], "cat", vec![attr_i("axis", 2)]))
        .output("y", &[]);
    check(&g, &x, &reorder(&x, &[(2, 2), (0, 2)]));
    // Sizes that do not add up are an error when the node runs.
    let g = Graph::new(13, &[-1, 3, 4])
        .init_i("sizes", &[2], &[3, 3])
        .node(node("Split", &["x", "sizes"], &["a", "b"], "split", vec![attr_i("axis", 2)]))
        .node(cat("b", "a"))
        .output("y", &[]);
    let m = armoury::onnx::OnnxModel::from_bytes(&g.bytes());
    let err = m.and_then(|m| no_grad(|| m.forward_t(&x, false))).expect_err("sizes 3 + 3 for 4");
    assert!(err.to_string().contains("split sizes"), "{err}");
}

#[test]
fn einsum_batched_products_and_unsupported_equations() {
    let x = spaced(&[2, 3, 4], 33);
    let w: Vec<f32> = (0..20).map(|i| (i as f32 - 9.5) / 10.0).collect();
    // bij,jk->bik: x times a trainable [4, 5].
    let g = Graph::new(13, &[-1, 3, 4])
        .init("w", &[4, 5], &w)
        .node(node("Einsum", &["x", "w"], &["y"], "ein", vec![attr_s("equation", "bij,jk->bik")]))
        .output("y", &[]);
    let xv = x.to_array();
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 5]), |i| {
        (0..4).map(|j| xv[[i[0], i[1], j]] * w[j * 5 + i[2]]).sum::<f32>()
    });
    check(&g, &x, &want);
    // Attention scores x·xᵀ per sample (bik,bjk->bij), both operands the input.
    let g = Graph::new(13, &[-1, 3, 4])
        .node(node("Einsum", &["x", "x"], &["y"], "ein", vec![attr_s("equation", "bik,bjk->bij")]))
        .output("y", &[]);
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 3, 3]), |i| {
        (0..4).map(|k| xv[[i[0], i[1], k]] * xv[[i[0], i[2], k]]).sum::<f32>()
    });
    check(&g, &x, &want);
    // A diagonal is refused, naming the node and the equation.
    let g = Graph::new(13, &[-1, 3, 3])
        .node(node("Einsum", &["x"], &["y"], "diag", vec![attr_s("equation", "bii->bi")]))
        .output("y", &[]);
    let sq = spaced(&[2, 3, 3], 34);
    let m = armoury::onnx::OnnxModel::from_bytes(&g.bytes());
    match m.and_then(|m| no_grad(|| m.forward_t(&sq, false))) {
        Err(Error::UnsupportedOnnx { what, node, op, .. }) => {
            assert!(what.contains("bii->bi") && node == "diag" && op == "Einsum", "{what}");
        }
        other => panic!("a diagonal: {other:?}"),
    }
}

#[test]
fn classic_exporters_decomposed_layer_norm_and_gelu() {
    // TorchScript at opset 13 writes LayerNorm as ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add.
    let x = spaced(&[2, 3, 4], 35);
    let (w, b) = ([0.5f32, 1.5, -1.0, 2.0], [0.1f32, -0.2, 0.3, 0.0]);
    let g = Graph::new(13, &[-1, 3, 4])
        .init("two", &[], &[2.0])
        .init("eps", &[], &[1e-5])
        .init("w", &[4], &w)
        .init("b", &[4], &b)
        .node(node("ReduceMean", &["x"], &["mean"], "mean", vec![attr_ints("axes", &[-1])]))
        .node(node("Sub", &["x", "mean"], &["d"], "sub", vec![]))
        .node(node("Pow", &["d", "two"], &["d2"], "pow", vec![]))
        .node(node("ReduceMean", &["d2"], &["var"], "var", vec![attr_ints("axes", &[-1])]))
        .node(node("Add", &["var", "eps"], &["ve"], "add_eps", vec![]))
        .node(node("Sqrt", &["ve"], &["std"], "sqrt", vec![]))
        .node(node("Div", &["d", "std"], &["n"], "div", vec![]))
        .node(node("Mul", &["n", "w"], &["s"], "mul", vec![]))
        .node(node("Add", &["s", "b"], &["y"], "add", vec![]))
        .output("y", &[]);
    check(&g, &x, &layer_norm_ref(&x, 2, 1e-5, &w, &b));
    // … and GELU as x·½·(1 + erf(x/√2)): Div, Erf, Add, Mul, Mul; PyTorch's F.gelu at XS (see above).
    let g = Graph::new(13, &[-1, 3])
        .init("sqrt2", &[], &[std::f32::consts::SQRT_2])
        .init("one", &[], &[1.0])
        .init("half", &[], &[0.5])
        .node(node("Div", &["x", "sqrt2"], &["u"], "div", vec![]))
        .node(node("Erf", &["u"], &["e"], "erf", vec![]))
        .node(node("Add", &["e", "one"], &["p"], "add", vec![]))
        .node(node("Mul", &["x", "p"], &["xp"], "mul", vec![]))
        .node(node("Mul", &["xp", "half"], &["y"], "half", vec![]))
        .output("y", &[]);
    let want = [-0.0008142017766243903, -0.15865525393145702, -0.10032341857926907, 0.34573123063700656];
    let want: Vec<f32> =
        [&want[..], &[1.399789198096713, 2.8945891414288862]].concat().iter().map(|&v| v as f32).collect();
    let x = Tensor::from_slice(&XS, &[2, 3]).expect("shape");
    check(&g, &x, &ArrayD::from_shape_vec(IxDyn(&[2, 3]), want).expect("shape"));
}

/// A model built from these ops keeps its inferred shapes: the load-time estimate covers every value.
#[test]
fn shape_inference_covers_the_new_ops() {
    let g = Graph::new(18, &[-1, 3, 4])
        .init("w", &[4], &[1.0; 4])
        .node(node("LayerNormalization", &["x", "w"], &["n"], "ln", vec![]))
        .node(node("Split", &["n"], &["a", "b"], "split", vec![attr_i("axis", 2), attr_i("num_outputs", 2)]))
        .node(node("Einsum", &["a", "b"], &["y"], "ein", vec![attr_s("equation", "bik,bjk->bij")]))
        .output("y", &[-1, 3, 3]);
    let m = g.model();
    let e = m.memory_estimate().expect("every shape inferred at load");
    // x, n (12 floats a sample each), a, b (6 each) and y (9).
    assert_eq!(e.graph_bytes, (e.batch_size * (12 + 12 + 6 + 6 + 9) * 4) as u128);
    let y = no_grad(|| m.forward_t(&spaced(&[2, 3, 4], 36), false)).expect("forward");
    assert_eq!(y.shape(), &[2, 3, 3]);
    assert_eq!(m.parameters().len(), 1);
}
