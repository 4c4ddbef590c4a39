//! The shape-path operators (ConstantOfShape, Equal, Expand, Mod, Range, Where, Not, ScatterND) in the patterns
//! exporters write — folded once the input shape is known, re-folded for every batch size — and, where they sit on
//! the data path (Expand, Where, ScatterND, Mod of floats), their gradients against finite differences.

use armoury::onnx::proto::AttributeProto;
use armoury::onnx::{int_tensor, OnnxModel};
use armoury::{Error, Module, Tensor};
use ndarray::{ArrayD, IxDyn};

use super::build::{attr_i, attr_ints, attr_s, attr_t, node, Graph};
use super::ops::{check, spaced};

fn arr(shape: &[usize], v: Vec<f32>) -> ArrayD<f32> {
    ArrayD::from_shape_vec(IxDyn(shape), v).expect("sizes match")
}

fn forward(m: &OnnxModel, x: &Tensor) -> Vec<f32> {
    m.forward_t(x, false).expect("forward").to_vec()
}

/// Unsqueeze of `input` at axis 0, in the attribute form before opset 13 and the input form after.
fn unsqueeze0(g: Graph, opset: i64, input: &str, output: &str) -> Graph {
    if opset < 13 {
        g.node(node("Unsqueeze", &[input], &[output], output, vec![attr_ints("axes", &[0])]))
    } else {
        g.init_i("axes0", &[1], &[0]).node(node("Unsqueeze", &[input, "axes0"], &[output], output, vec![]))
    }
}

fn one_int() -> AttributeProto {
    attr_t("value", int_tensor("one", &[1], &[1]))
}

/// ViT's class token, `cls_token.expand(N, -1, -1)` as the TorchScript exporter writes it: the target shape
/// `[N, -1, -1]` from Shape → Gather → Unsqueeze → Concat, its −1s replaced by 1s through ConstantOfShape, Mul,
/// Equal and Where, then Expand and Concat with the patch tokens. Everything but Expand and Concat folds per
/// input shape; the token's gradient sums over the batch.
#[test]
fn vit_class_token_expand() {
    for opset in [11, 13, 18, 21] {
        let cls = [0.25f32, -0.5, 0.75, -0.125];
        let g = Graph::new(opset, &[-1, 3, 4])
            .init("cls", &[1, 1, 4], &cls)
            .init_i("zero", &[], &[0])
            .init_i("minus_ones", &[2], &[-1, -1])
            .init_i("neg", &[], &[-1])
            .node(node("Shape", &["x"], &["s"], "shape", vec![]))
            .node(node("Gather", &["s", "zero"], &["n"], "gather", vec![attr_i("axis", 0)]));
        let g = unsqueeze0(g, opset, "n", "n1")
            .node(node("Concat", &["n1", "minus_ones"], &["spec"], "cat_spec", vec![attr_i("axis", 0)]))
            .node(node("Shape", &["spec"], &["len"], "len", vec![]))
            .node(node("ConstantOfShape", &["len"], &["ones"], "ones", vec![one_int()]))
            .node(node("Mul", &["ones", "neg"], &["negs"], "negs", vec![]))
            .node(node("Equal", &["spec", "negs"], &["eq"], "eq", vec![]))
            .node(node("Where", &["eq", "ones", "spec"], &["target"], "where", vec![]))
            .node(node("Expand", &["cls", "target"], &["tokens"], "expand", vec![]))
            .node(node("Concat", &["tokens", "x"], &["y"], "cat", vec![attr_i("axis", 1)]))
            .output("y", &[-1, 4, 4]);
        let m = g.model();
        assert_eq!(m.num_nodes(), 11, "opset {opset}: nothing folds at load");
        for n in [2usize, 3] {
            let x = spaced(&[n, 3, 4], 40 + n as u64);
            let xv = x.to_vec();
            let want: Vec<f32> =
                (0..n).flat_map(|i| cls.iter().copied().chain(xv[i * 12..(i + 1) * 12].iter().copied())).collect();
            check(&g, &x, &arr(&[n, 4, 4], want));
            assert_eq!(m.num_nodes_for(&[n, 3, 4]), 2, "opset {opset}: only Expand and Concat run");
        }
    }
}

/// Expand keeps a dimension where the target says 1 and broadcasts a 1 of the input's: [N, 3, 1] → [N, 3, 4].
#[test]
fn expand_broadcasts_both_ways() {
    let g = Graph::new(13, &[-1, 3, 1])
        .init_i("target", &[3], &[1, 1, 4])
        .node(node("Expand", &["x", "target"], &["y"], "expand", vec![]))
        .output("y", &[]);
    let x = spaced(&[2, 3, 1], 41);
    let want = x.to_array().broadcast(IxDyn(&[2, 3, 4])).expect("broadcasts").to_owned();
    check(&g, &x, &want);
}

/// Where between the data and a trainable tensor, with a constant mask broadcast over the batch; and a −∞ branch
/// not picked stays out of the result (Exp of it is 0, not NaN).
#[test]
fn where_selects_between_float_tensors() {
    let c = [0.5f32, -0.25, 0.125, 0.75];
    let g = Graph::new(16, &[-1, 4])
        .init_i("mask", &[4], &[1, 0, 0, 1])
        .init("c", &[4], &c)
        .node(node("Where", &["mask", "x", "c"], &["y"], "where", vec![]))
        .output("y", &[]);
    let x = spaced(&[2, 4], 42);
    let xv = x.to_vec();
    let want: Vec<f32> = (0..8).map(|i| if matches!(i % 4, 0 | 3) { xv[i] } else { c[i % 4] }).collect();
    check(&g, &x, &arr(&[2, 4], want));
    let g = Graph::new(9, &[-1, 4])
        .init_i("mask", &[1, 4], &[1, 0, 1, 0])
        .node(node("Constant", &[], &["minf"], "minf", vec![super::build::attr_f("value_float", f32::NEG_INFINITY)]))
        .node(node("Where", &["mask", "x", "minf"], &["w"], "where", vec![]))
        .node(node("Exp", &["w"], &["y"], "exp", vec![]))
        .output("y", &[]);
    let want: Vec<f32> = (0..8).map(|i| if i % 2 == 0 { xv[i].exp() } else { 0.0 }).collect();
    check(&g, &x, &arr(&[2, 4], want));
}

/// Mod on shape arithmetic: fmod = 0 takes the divisor's sign (Python), fmod = 1 the dividend's (C); with the
/// batch in the dividend, each batch size folds to its own values.
#[test]
fn mod_of_integers_both_signs() {
    for (fmod, want2, want3) in [(0, [1.0, 1.0, -2.0], [2.0, 1.0, -2.0]), (1, [-2.0, -1.0, -2.0], [-1.0, -1.0, -2.0])] {
        // Shape(x) − 10 = [N − 10, −3, −5]; mod [3, 2, −3].
        let g = Graph::new(13, &[-1, 7, 5])
            .init_i("ten", &[], &[10])
            .init_i("div", &[3], &[3, 2, -3])
            .node(node("Shape", &["x"], &["s"], "shape", vec![]))
            .node(node("Sub", &["s", "ten"], &["d"], "sub", vec![]))
            .node(node("Mod", &["d", "div"], &["y"], "mod", vec![attr_i("fmod", fmod)]))
            .output("y", &[]);
        let m = g.model();
        // −8 mod 3 is 1 (Python) or −2 (C); −7 mod 3 is 2 or −1.
        assert_eq!(forward(&m, &Tensor::zeros(&[2, 7, 5])), want2, "fmod {fmod}, batch 2");
        assert_eq!(forward(&m, &Tensor::zeros(&[3, 7, 5])), want3, "fmod {fmod}, batch 3");
        assert_eq!(m.num_nodes_for(&[3, 7, 5]), 0, "everything folds");
    }
}

/// Mod of floats (fmod = 1) on the data path: x − c·trunc(x/c); ∂/∂x = 1, ∂/∂c = −trunc(x/c). Without fmod it
/// is refused.
#[test]
fn mod_of_floats_is_differentiable() {
    let g = Graph::new(13, &[-1, 4])
        .init("c", &[1], &[0.45])
        .node(node("Mod", &["x", "c"], &["y"], "mod", vec![attr_i("fmod", 1)]))
        .output("y", &[]);
    let x = spaced(&[2, 4], 43);
    check(&g, &x, &x.to_array().mapv(|v| v % 0.45));
    let bad = Graph::new(13, &[-1, 4])
        .init("c", &[1], &[0.45])
        .node(node("Mod", &["x", "c"], &["y"], "mod", vec![]))
        .output("y", &[]);
    let m = bad.model();
    assert!(matches!(m.forward_t(&x, false), Err(Error::BadFile { .. })), "fmod = 0 on floats is refused");
}

/// Range with integer bounds from the shape (ascending and descending) and with float bounds; Not of Equal.
#[test]
fn range_and_not() {
    // Range(1, dim 1, 2) and Range(dim 1, 0, −3), concatenated: [1, 3, 5, 7, 4, 1] for a dim of 7.
    let g = Graph::new(11, &[-1, 7])
        .init_i("one", &[], &[1])
        .init_i("zero", &[], &[0])
        .init_i("two", &[], &[2])
        .init_i("m3", &[], &[-3])
        .node(node("Shape", &["x"], &["s"], "shape", vec![]))
        .node(node("Gather", &["s", "one"], &["d"], "dim", vec![attr_i("axis", 0)]))
        .node(node("Range", &["one", "d", "two"], &["up"], "up", vec![]))
        .node(node("Range", &["d", "zero", "m3"], &["down"], "down", vec![]))
        .node(node("Concat", &["up", "down"], &["y"], "cat", vec![attr_i("axis", 0)]))
        .output("y", &[]);
    assert_eq!(forward(&g.model(), &Tensor::zeros(&[2, 7])), [1.0, 3.0, 5.0, 7.0, 4.0, 1.0]);
    // Float bounds fold at load: x + Range(0.5, 2.0, 0.5) = x + [0.5, 1.0, 1.5].
    let g = Graph::new(13, &[-1, 3])
        .node(node("Constant", &[], &["a"], "a", vec![super::build::attr_f("value_float", 0.5)]))
        .node(node("Constant", &[], &["b"], "b", vec![super::build::attr_f("value_float", 2.0)]))
        .node(node("Range", &["a", "b", "a"], &["r"], "range", vec![]))
        .node(node("Add", &["x", "r"], &["y"], "add", vec![]))
        .output("y", &[]);
    let x = spaced(&[2, 3], 44);
    let xv = x.to_vec();
    check(&g, &x, &arr(&[2, 3], (0..6).map(|i| xv[i] + 0.5 * (1 + i % 3) as f32).collect()));
    assert_eq!(g.model().num_nodes(), 1, "the range folds at load");
    // Not(Shape(x) == [2, 5]) is [N ≠ 2, 1].
    let g = Graph::new(13, &[-1, 7])
        .init_i("ref", &[2], &[2, 5])
        .node(node("Shape", &["x"], &["s"], "shape", vec![]))
        .node(node("Equal", &["s", "ref"], &["e"], "eq", vec![]))
        .node(node("Not", &["e"], &["y"], "not", vec![]))
        .output("y", &[]);
    let m = g.model();
    assert_eq!(forward(&m, &Tensor::zeros(&[2, 7])), [0.0, 1.0]);
    assert_eq!(forward(&m, &Tensor::zeros(&[3, 7])), [1.0, 1.0], "folded again for batch 3");
}

/// ScatterND onto the data: single entries (a repeated index: the later update wins, the earlier gets no
/// gradient) and whole rows, at opset 13 and with opset 16's `reduction = none`; other reductions are refused;
/// and on shape arithmetic.
#[test]
fn scatter_nd_onto_data_and_shapes() {
    let x = spaced(&[2, 3], 45);
    let xv = x.to_vec();
    let u = [0.3f32, -0.7, 0.9];
    for (opset, attrs) in [(13, vec![]), (16, vec![attr_s("reduction", "none")])] {
        let g = Graph::new(opset, &[2, 3])
            .init_i("idx", &[3, 2], &[1, 0, 0, 2, 1, 0])
            .init("u", &[3], &u)
            .node(node("ScatterND", &["x", "idx", "u"], &["y"], "scatter", attrs))
            .output("y", &[]);
        let mut want = xv.clone();
        want[2] = u[1];
        want[3] = u[2];
        check(&g, &x, &arr(&[2, 3], want));
    }
    let g = Graph::new(13, &[2, 3])
        .init_i("idx", &[1, 1], &[1])
        .init("u", &[1, 3], &u)
        .node(node("ScatterND", &["x", "idx", "u"], &["y"], "scatter", vec![]))
        .output("y", &[]);
    check(&g, &x, &arr(&[2, 3], xv[..3].iter().chain(&u).copied().collect()));
    let g = Graph::new(16, &[2, 3])
        .init_i("idx", &[1, 1], &[1])
        .init("u", &[1, 3], &u)
        .node(node("ScatterND", &["x", "idx", "u"], &["y"], "scatter", vec![attr_s("reduction", "add")]))
        .output("y", &[]);
    let err = OnnxModel::from_bytes(&g.bytes()).expect_err("reduction add is not supported");
    assert!(matches!(&err, Error::UnsupportedOnnx { op, .. } if op == "ScatterND"), "{err}");
    // Shape(x) = [2, 3] with both entries replaced: x reshaped to [3, 2].
    let g = Graph::new(13, &[2, 3])
        .init_i("idx", &[2, 1], &[0, 1])
        .init_i("dims", &[2], &[3, 2])
        .node(node("Shape", &["x"], &["s"], "shape", vec![]))
        .node(node("ScatterND", &["s", "idx", "dims"], &["t"], "scatter", vec![]))
        .node(node("Reshape", &["x", "t"], &["y"], "reshape", vec![]))
        .output("y", &[]);
    check(&g, &x, &arr(&[3, 2], xv.clone()));
    assert_eq!(g.model().num_nodes_for(&[2, 3]), 1, "only the Reshape runs");
}
