//! Generated graphs for the shape and reduction operators: Flatten, Reshape, Transpose, Concat, Squeeze,
//! Unsqueeze, Gather, Slice, Pad, ReduceMean, ReduceSum, Dropout, Shape and Cast.

use armoury::onnx::proto::AttributeProto;
use armoury::{ModuleExt, Tensor};
use ndarray::{ArrayD, Axis, IxDyn, Slice};

use super::build::{attr_f, attr_i, attr_ints, attr_s, node, Graph};
use super::ops::{check, spaced};

fn op1(opset: i64, dims: &[i64], op: &str, attrs: Vec<AttributeProto>) -> Graph {
    Graph::new(opset, dims).node(node(op, &["x"], &["y"], op, attrs)).output("y", &[])
}

fn reshaped(x: &Tensor, shape: &[usize]) -> ArrayD<f32> {
    x.to_array().into_shape_with_order(IxDyn(shape)).expect("same size")
}

#[test]
fn flatten_reshape_transpose() {
    let x = spaced(&[2, 3, 2, 2], 30);
    check(&op1(13, &[-1, 3, 2, 2], "Flatten", vec![attr_i("axis", 2)]), &x, &reshaped(&x, &[6, 4]));
    check(&op1(13, &[-1, 3, 2, 2], "Flatten", vec![]), &x, &reshaped(&x, &[2, 12]));
    check(&op1(13, &[-1, 3, 2, 2], "Flatten", vec![attr_i("axis", -1)]), &x, &reshaped(&x, &[12, 2]));
    // Reshape with 0 (copy the batch) and −1 (infer).
    let g = Graph::new(14, &[-1, 3, 2, 2])
        .init_i("shape", &[3], &[0, -1, 2])
        .node(node("Reshape", &["x", "shape"], &["y"], "reshape", vec![]))
        .output("y", &[]);
    check(&g, &x, &reshaped(&x, &[2, 6, 2]));
    // Transpose with a permutation and with the default (reversed axes).
    let perm = x.to_array().permuted_axes(IxDyn(&[0, 2, 3, 1])).as_standard_layout().to_owned();
    check(&op1(13, &[-1, 3, 2, 2], "Transpose", vec![attr_ints("perm", &[0, 2, 3, 1])]), &x, &perm);
    let rev = x.to_array().reversed_axes().as_standard_layout().to_owned();
    check(&op1(13, &[-1, 3, 2, 2], "Transpose", vec![]), &x, &rev);
}

#[test]
fn concat_squeeze_unsqueeze() {
    let x = spaced(&[2, 3], 31);
    let c = [0.5f32, -0.25, 0.75, 0.125];
    let g = Graph::new(13, &[-1, 3])
        .init("c", &[2, 2], &c)
        .node(node("Concat", &["x", "c", "x"], &["y"], "cat", vec![attr_i("axis", -1)]))
        .output("y", &[]);
    let xv = x.to_array();
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 8]), |i| match i[1] {
        j @ 0..=2 => xv[[i[0], j]],
        j @ 3..=4 => c[i[0] * 2 + j - 3],
        j => xv[[i[0], j - 5]],
    });
    check(&g, &x, &want);
    assert_eq!(g.model().parameters().len(), 1, "a concatenated initialiser is a parameter");
    // Unsqueeze then Squeeze back, in the input form (opset 13) and the attribute form (opset 11).
    let g = Graph::new(13, &[-1, 3])
        .init_i("axes", &[2], &[1, -1])
        .node(node("Unsqueeze", &["x", "axes"], &["u"], "unsq", vec![]))
        .output("u", &[]);
    check(&g, &x, &reshaped(&x, &[2, 1, 3, 1]));
    let g = g.init_i("sq", &[1], &[3]).node(node("Squeeze", &["u", "sq"], &["y"], "sq", vec![])).output("y", &[]);
    check(&g, &x, &reshaped(&x, &[2, 1, 3]));
    let g = Graph::new(11, &[-1, 3])
        .node(node("Unsqueeze", &["x"], &["u"], "unsq", vec![attr_ints("axes", &[0, 2])]))
        .node(node("Squeeze", &["u"], &["y"], "sq", vec![attr_ints("axes", &[2])]))
        .output("y", &[]);
    check(&g, &x, &reshaped(&x, &[1, 2, 3]));
    // Squeeze without axes drops every axis of size 1.
    let g = Graph::new(13, &[-1, 1, 3, 1]).node(node("Squeeze", &["x"], &["y"], "sq", vec![])).output("y", &[]);
    let x4 = spaced(&[2, 1, 3, 1], 32);
    check(&g, &x4, &reshaped(&x4, &[2, 3]));
}

#[test]
fn gather_with_constant_indices() {
    let x = spaced(&[2, 4, 3], 33);
    let xv = x.to_array();
    let g = Graph::new(13, &[-1, 4, 3])
        .init_i("idx", &[2, 2], &[3, -4, 1, 1])
        .node(node("Gather", &["x", "idx"], &["y"], "gather", vec![attr_i("axis", 1)]))
        .output("y", &[]);
    let picks = [3usize, 0, 1, 1];
    let want = ArrayD::from_shape_fn(IxDyn(&[2, 2, 2, 3]), |i| xv[[i[0], picks[i[1] * 2 + i[2]], i[3]]]);
    check(&g, &x, &want);
    // A scalar index removes the axis.
    let g = Graph::new(13, &[-1, 4, 3])
        .init_i("idx", &[], &[-1])
        .node(node("Gather", &["x", "idx"], &["y"], "gather", vec![attr_i("axis", 2)]))
        .output("y", &[]);
    check(&g, &x, &xv.index_axis(Axis(2), 2).to_owned());
}

#[test]
fn slice_with_steps_negative_indices_and_attribute_form() {
    let x = spaced(&[2, 5, 6], 34);
    let xv = x.to_array();
    let g = Graph::new(13, &[-1, 5, 6])
        .init_i("starts", &[2], &[1, -1])
        .init_i("ends", &[2], &[100, 0])
        .init_i("axes", &[2], &[1, 2])
        .init_i("steps", &[2], &[2, -2])
        .node(node("Slice", &["x", "starts", "ends", "axes", "steps"], &["y"], "slice", vec![]))
        .output("y", &[]);
    let want = xv.slice_each_axis(|ax| match ax.axis.index() {
        1 => Slice::new(1, None, 2),
        2 => Slice::new(1, None, -2), // indices 5, 3, 1
        _ => Slice::new(0, None, 1),
    });
    check(&g, &x, &want.to_owned());
    // Unit steps (a view), default axes.
    let g = Graph::new(13, &[-1, 5, 6])
        .init_i("starts", &[3], &[0, 1, 2])
        .init_i("ends", &[3], &[i64::MAX, -1, 5])
        .node(node("Slice", &["x", "starts", "ends"], &["y"], "slice", vec![]))
        .output("y", &[]);
    check(&g, &x, &xv.slice(ndarray::s![.., 1..4, 2..5]).to_owned().into_dyn());
    // Opset 9: attributes.
    let a = vec![attr_ints("starts", &[1]), attr_ints("ends", &[3]), attr_ints("axes", &[2])];
    check(&op1(9, &[-1, 5, 6], "Slice", a), &x, &xv.slice(ndarray::s![.., .., 1..3]).to_owned().into_dyn());
}

#[test]
fn pad_constant_reflect_edge_and_crop() {
    let x = spaced(&[1, 2, 3, 4], 35);
    let xv = x.to_array();
    // Constant 0.5 with begins (0, 0, 1, 0), ends (0, 0, 2, −1): rows padded, the last column cropped.
    let g = Graph::new(13, &[-1, 2, 3, 4])
        .init_i("pads", &[8], &[0, 0, 1, 0, 0, 0, 2, -1])
        .init("v", &[], &[0.5])
        .node(node("Pad", &["x", "pads", "v"], &["y"], "pad", vec![]))
        .output("y", &[]);
    let want = ArrayD::from_shape_fn(IxDyn(&[1, 2, 6, 3]), |i| {
        if (1..4).contains(&i[2]) {
            xv[[i[0], i[1], i[2] - 1, i[3]]]
        } else {
            0.5
        }
    });
    check(&g, &x, &want);
    // Reflect and edge on the last two axes (the opset 18 `axes` input).
    for (mode, map) in [("reflect", reflect as fn(i64, i64) -> i64), ("edge", edge)] {
        let g = Graph::new(18, &[-1, 2, 3, 4])
            .init_i("pads", &[4], &[2, 1, 1, 3])
            .init_i("axes", &[2], &[2, -1])
            .node(node("Pad", &["x", "pads", "", "axes"], &["y"], "pad", vec![attr_s("mode", mode)]))
            .output("y", &[]);
        let want = ArrayD::from_shape_fn(IxDyn(&[1, 2, 6, 8]), |i| {
            let r = map(i[2] as i64 - 2, 3) as usize;
            let c = map(i[3] as i64 - 1, 4) as usize;
            xv[[i[0], i[1], r, c]]
        });
        check(&g, &x, &want);
    }
    // Opset 2 attribute form.
    let a = vec![attr_ints("pads", &[0, 0, 0, 1, 0, 0, 0, 1]), attr_f("value", -1.0)];
    let want = ArrayD::from_shape_fn(IxDyn(&[1, 2, 3, 6]), |i| {
        if (1..5).contains(&i[3]) {
            xv[[i[0], i[1], i[2], i[3] - 1]]
        } else {
            -1.0
        }
    });
    check(&op1(10, &[-1, 2, 3, 4], "Pad", a), &x, &want);
}

fn reflect(j: i64, d: i64) -> i64 {
    if j < 0 {
        -j
    } else if j >= d {
        2 * (d - 1) - j
    } else {
        j
    }
}

fn edge(j: i64, d: i64) -> i64 {
    j.clamp(0, d - 1)
}

#[test]
fn reduce_mean_and_sum_attribute_and_input_axes() {
    let x = spaced(&[2, 3, 4], 36);
    let xv = x.to_array();
    let mean12 = xv.mean_axis(Axis(2)).expect("non-empty").mean_axis(Axis(1)).expect("non-empty");
    let a = vec![attr_ints("axes", &[1, -1]), attr_i("keepdims", 0)];
    check(&op1(13, &[-1, 3, 4], "ReduceMean", a), &x, &mean12);
    let g = Graph::new(18, &[-1, 3, 4])
        .init_i("axes", &[2], &[-1, 1])
        .node(node("ReduceMean", &["x", "axes"], &["y"], "mean", vec![]))
        .output("y", &[]);
    check(&g, &x, &mean12.clone().into_shape_with_order(IxDyn(&[2, 1, 1])).expect("same size"));
    let g = Graph::new(13, &[-1, 3, 4])
        .init_i("axes", &[1], &[1])
        .node(node("ReduceSum", &["x", "axes"], &["y"], "sum", vec![attr_i("keepdims", 1)]))
        .output("y", &[]);
    check(&g, &x, &xv.sum_axis(Axis(1)).insert_axis(Axis(1)));
    // No axes: every axis (keepdims 0 gives a scalar); noop_with_empty_axes: the identity.
    check(
        &op1(13, &[-1, 3, 4], "ReduceSum", vec![attr_i("keepdims", 0)]),
        &x,
        &ArrayD::from_elem(IxDyn(&[]), xv.sum()),
    );
    check(&op1(13, &[-1, 3, 4], "ReduceSum", vec![attr_i("noop_with_empty_axes", 1)]), &x, &xv);
    check(
        &op1(11, &[-1, 3, 4], "ReduceSum", vec![attr_ints("axes", &[0])]),
        &x,
        &xv.sum_axis(Axis(0)).insert_axis(Axis(0)),
    );
}

#[test]
fn dropout_identity_shape_and_cast() {
    let x = spaced(&[2, 3], 37);
    let g = Graph::new(13, &[-1, 3])
        .init("ratio", &[], &[0.5])
        .node(node("Dropout", &["x", "ratio"], &["d", "mask"], "drop", vec![attr_i("seed", 3)]))
        .node(node("Identity", &["d"], &["y"], "id", vec![]))
        .output("y", &[]);
    check(&g, &x, &x.to_array());
    let g = Graph::new(10, &[-1, 3])
        .node(node("Dropout", &["x"], &["y"], "drop", vec![attr_f("ratio", 0.3)]))
        .output("y", &[]);
    check(&g, &x, &x.to_array());
    // Shape with start/end, cast to float, multiplied into the data: y = x · dims[1].
    let g = Graph::new(15, &[-1, 3])
        .node(node("Shape", &["x"], &["s"], "shape", vec![attr_i("start", -1)]))
        .node(node("Cast", &["s"], &["sf"], "cast", vec![attr_i("to", 1)]))
        .node(node("Mul", &["x", "sf"], &["y"], "mul", vec![]))
        .output("y", &[]);
    check(&g, &x, &x.to_array().mapv(|v| 3.0 * v));
    // Cast of the data to float is the identity (and keeps the gradient).
    check(&op1(13, &[-1, 3], "Cast", vec![attr_i("to", 1)]), &x, &x.to_array());
}
