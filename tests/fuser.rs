//! The one fuser (`armoury::nn::plan`) on both front ends: the plan holds the fused steps (BatchNorm folded into
//! the convolution before it, the ReLU and 2×2 pooling fused after), the fused forward equals the layer-by-layer
//! one within rounding in logits and input gradients, a tap inside a fused step gets the layer-by-layer value, and
//! training mode never folds.

use std::sync::Arc;

use armoury::nn::plan::{Fused, Fusion};
use armoury::nn::{BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ModuleExt, ReLU};
use armoury::{Conv2dParams, Module, Pool2dParams, Sequential, Tensor};

/// A BatchNorm with statistics far from the defaults (so a fold that did not happen, or went wrong, shows).
pub(crate) fn batch_norm(c: usize, seed: u64) -> BatchNorm2d {
    let bn = BatchNorm2d::new(c);
    bn.weight.set(Tensor::uniform(&[c], 0.5, 1.5, seed).to_array()).expect("shape");
    bn.bias.set(Tensor::uniform(&[c], -0.5, 0.5, seed + 1).to_array()).expect("shape");
    bn.running_mean.set(Tensor::uniform(&[c], -0.3, 0.3, seed + 2).to_array()).expect("shape");
    bn.running_var.set(Tensor::uniform(&[c], 0.2, 2.0, seed + 3).to_array()).expect("shape");
    bn
}

/// conv1 (3→6, 3×3, pad 1, bias) → bn1 → relu1 → pool1 (2×2) → conv2 (6→4, 3×3, no bias; boxed behind an `Arc`) →
/// bn2 (boxed) → relu2, on 8×8 RGB inputs.
fn convolutional() -> Sequential {
    let same = Conv2dParams { padding: (1, 1), ..Conv2dParams::default() };
    let conv2 = Arc::new(Conv2d::new(6, 4, 3, Conv2dParams::default(), false, 11).expect("conv2"));
    Sequential::new()
        .add("conv1", Conv2d::new(3, 6, 3, same, true, 10).expect("conv1"))
        .add("bn1", batch_norm(6, 20))
        .add("relu1", ReLU)
        .add("pool1", MaxPool2d(Pool2dParams::square(2)))
        .add("conv2", conv2)
        .add("bn2", Box::new(batch_norm(4, 30)) as Box<dyn Module>)
        .add("relu2", ReLU)
}

/// [`convolutional`] → flatten → fc (4·2·2 → 5).
fn net() -> Sequential {
    convolutional().add("flatten", Flatten).add("fc", Linear::new(4 * 2 * 2, 5, true, 12))
}

fn fusion(fused: Fused, layers: &[&str]) -> Fusion {
    Fusion { fused, layers: layers.iter().map(|s| s.to_string()).collect() }
}

fn conv(bn: bool, relu: bool, pool: bool) -> Fused {
    Fused::Conv { bn, relu, pool }
}

pub(crate) fn close(what: &str, a: &Tensor, b: &Tensor, tol: f32) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    let (a, b) = (a.to_vec(), b.to_vec());
    let worst = a.iter().zip(&b).map(|(u, v)| (u - v).abs() / (1.0 + v.abs())).fold(0.0f32, f32::max);
    assert!(worst <= tol, "{what}: differs by {worst} (relative) > {tol}");
}

/// ∂(Σ out·r)/∂x for a fixed random r.
pub(crate) fn input_gradient(out: impl Fn(&Tensor) -> Tensor, x: &Tensor, seed: u64) -> Tensor {
    let xv = x.variable();
    let y = out(&xv);
    let r = Tensor::uniform(y.shape(), -1.0, 1.0, seed);
    let g = y.mul(&r).expect("same shape").sum_all().grad_wrt(&[&xv]).expect("gradient");
    g.into_iter().next().expect("one gradient")
}

#[test]
fn native_plan_folds_batchnorm_and_fuses_relu_and_pool_also_through_box_and_arc() {
    let net = net();
    let plan = net.plan(false);
    assert_eq!(
        plan,
        vec![
            fusion(conv(true, true, true), &["conv1", "bn1", "relu1", "pool1"]),
            fusion(conv(true, true, false), &["conv2", "bn2", "relu2"]),
            fusion(Fused::Single, &["flatten"]),
            fusion(Fused::Single, &["fc"]),
        ]
    );
    // The fused forward is the layer-by-layer one within rounding, and it did fold (some bit differs).
    let x = Tensor::uniform(&[6, 3, 8, 8], -1.0, 1.0, 1);
    let fused = net.forward_t(&x, false).expect("forward");
    let layered = net.forward_collect(&x, false).expect("layer by layer").pop().expect("output").1;
    close("logits", &fused, &layered, 1e-5);
    assert_ne!(fused.to_vec(), layered.to_vec(), "folded weights round differently somewhere");
    let gf = input_gradient(|x| net.forward_t(x, false).expect("forward"), &x, 2);
    let gl = input_gradient(|x| net.forward_collect(x, false).expect("forward").pop().expect("out").1, &x, 2);
    close("input gradient", &gf, &gl, 1e-4);
}

/// A pre-activation network's BatchNorm + ReLU, which no convolution takes (it comes before one), runs as one
/// step in evaluation mode, with the bits of the two layers — forward, the input gradient (masked inside the
/// scaling loop) and the gradients of the BatchNorm's scale and shift (masked first) — and as the two layers in
/// training.
#[test]
fn a_batchnorm_before_its_relu_fuses_with_it() {
    let net = Sequential::new()
        .add("bn0", batch_norm(3, 40))
        .add("relu0", ReLU)
        .add("conv", Conv2d::new(3, 4, 3, Conv2dParams::default(), true, 41).expect("conv"))
        .add("bn1", batch_norm(4, 42))
        .add("relu1", ReLU);
    assert_eq!(
        net.plan(false),
        vec![
            fusion(Fused::BatchNormRelu, &["bn0", "relu0"]),
            fusion(conv(true, true, false), &["conv", "bn1", "relu1"])
        ]
    );
    assert_eq!(net.plan(true).len(), 5, "training: batch statistics, nothing fused across a BatchNorm");
    let pre = Sequential::new().add("bn0", batch_norm(3, 40)).add("relu0", ReLU);
    assert_eq!(pre.plan(false), vec![fusion(Fused::BatchNormRelu, &["bn0", "relu0"])]);
    let x = Tensor::uniform(&[5, 3, 7, 6], -2.0, 2.0, 43);
    let fused = pre.forward_t(&x, false).expect("forward");
    let layered = pre.forward_collect(&x, false).expect("layer by layer").pop().expect("output").1;
    assert!(fused.to_vec().contains(&0.0) && fused.to_vec().iter().any(|&v| v > 0.0), "both sides of the ReLU");
    let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&fused), bits(&layered));
    let gf = input_gradient(|x| pre.forward_t(x, false).expect("forward"), &x, 44);
    let gl = input_gradient(|x| pre.forward_collect(x, false).expect("forward").pop().expect("out").1, &x, 44);
    assert_eq!(bits(&gf), bits(&gl));
    // The parameters' gradients too (the masked-first branch), against the layers'.
    let params = |y: Tensor| {
        let r = Tensor::uniform(y.shape(), -1.0, 1.0, 45);
        y.mul(&r).expect("same shape").sum_all().backward().expect("backward")
    };
    let (pf, pl) = (params(pre.forward_t(&x, false).expect("forward")), params(layered_output(&pre, &x)));
    let named: Vec<_> = pre.named_params().into_iter().filter(|(_, p)| p.is_trainable()).collect();
    assert_eq!(named.len(), 2, "the BatchNorm's scale and shift");
    for (name, p) in &named {
        let t = p.tensor();
        let (a, b) = (pf.get(&t).expect("fused gradient"), pl.get(&t).expect("layered gradient"));
        assert_eq!(a, b, "{name}");
    }
}

fn layered_output(net: &Sequential, x: &Tensor) -> Tensor {
    net.forward_collect(x, false).expect("layer by layer").pop().expect("output").1
}

#[test]
fn training_mode_never_folds() {
    let net = net();
    let plan = net.plan(true);
    assert!(plan.iter().all(|f| !matches!(f.fused, Fused::Conv { bn: true, .. })), "{plan:?}");
    assert_eq!(plan.len(), 9, "no BatchNorm folds, and nothing fuses across one: {plan:?}");
    // Every step is the layer's own op: the same bits as layer by layer (batch statistics in both).
    let x = Tensor::uniform(&[6, 3, 8, 8], -1.0, 1.0, 3);
    let a = net.forward_t(&x, true).expect("forward");
    let b = net.forward_collect(&x, true).expect("layer by layer").pop().expect("output").1;
    assert_eq!(a.to_vec(), b.to_vec());
    // A convolution → ReLU → pooling still fuses in training (the kernel is exact there).
    let plain = Sequential::new()
        .add("conv", Conv2d::new(3, 4, 3, Conv2dParams::default(), true, 4).expect("conv"))
        .add("relu", ReLU)
        .add("pool", MaxPool2d(Pool2dParams::square(2)));
    assert_eq!(plain.plan(true), vec![fusion(conv(false, true, true), &["conv", "relu", "pool"])]);
}

/// A tap inside a fused step ends the step there: the convolution's and the BatchNorm's outputs are the
/// layer-by-layer values exactly (a tapped BatchNorm runs itself, not folded); a tap after a fold is within
/// rounding; the output stays the fused forward's within rounding.
#[test]
fn native_taps_inside_fused_steps_are_the_layer_by_layer_values() {
    let net = net();
    let x = Tensor::uniform(&[4, 3, 8, 8], -1.0, 1.0, 5);
    let reference = net.forward_collect(&x, false).expect("layer by layer");
    let at = |name: &str| reference.iter().find(|(n, _)| n == name).expect("a child").1.clone();
    let logits = net.forward_t(&x, false).expect("forward");
    for name in ["conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2"] {
        let (y, taps) = net.forward_taps(&x, false, &[name]).expect("taps");
        close(name, &taps[0], &at(name), 1e-5);
        if ["conv1", "bn1"].contains(&name) {
            assert_eq!(taps[0].to_vec(), at(name).to_vec(), "{name} exactly");
        }
        close(&format!("logits tapping {name}"), &y, &logits, 1e-5);
    }
    let all = ["conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2", "flatten", "fc"];
    let (y, taps) = net.forward_taps(&x, false, &all).expect("every tap");
    for (name, t) in all.iter().zip(&taps) {
        assert_eq!(t.to_vec(), at(name).to_vec(), "{name}: every output asked for is the layer-by-layer run");
    }
    assert_eq!(y.to_vec(), at("fc").to_vec());
}

/// [`convolutional`] as an ONNX graph written here with the same weights: node names `conv1` … `relu2`, values
/// `c1`, `b1`, `r1`, `p1`, `c2`, `b2`, `y`.
fn convolutional_onnx() -> armoury::onnx::OnnxModel {
    use crate::onnx::build::{attr_f, attr_ints, node, Graph};
    use armoury::ModuleExt;
    let mut g = Graph::new(13, &[-1, 3, 8, 8]);
    for (name, p) in convolutional().named_params().iter().filter(|(n, _)| !n.ends_with("num_batches_tracked")) {
        g = g.init(name, &p.shape(), &p.value().iter().copied().collect::<Vec<f32>>());
    }
    let k3 = || attr_ints("kernel_shape", &[3, 3]);
    let bn = |i: &str, n: &str, o: &str| {
        let stats = ["weight", "bias", "running_mean", "running_var"].map(|s| format!("{n}.{s}"));
        let ins = [i, &stats[0], &stats[1], &stats[2], &stats[3]];
        node("BatchNormalization", &ins, &[o], n, vec![attr_f("epsilon", 1e-5)])
    };
    let pool = vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[2, 2])];
    g.node(node("Conv", &["x", "conv1.weight", "conv1.bias"], &["c1"], "conv1", vec![k3(), attr_ints("pads", &[1; 4])]))
        .node(bn("c1", "bn1", "b1"))
        .node(node("Relu", &["b1"], &["r1"], "relu1", vec![]))
        .node(node("MaxPool", &["r1"], &["p1"], "pool1", pool))
        .node(node("Conv", &["p1", "conv2.weight"], &["c2"], "conv2", vec![k3()]))
        .node(bn("c2", "bn2", "b2"))
        .node(node("Relu", &["b2"], &["y"], "relu2", vec![]))
        .output("y", &[])
        .model()
}

/// The gap this closes: the importer had its own fuser, which folded no BatchNorm, so an imported network ran
/// other kernels than the same network built natively. Now one planner plans both: the same plan, and the same
/// logits and input gradients bit for bit.
#[test]
fn an_imported_network_runs_the_native_kernels() {
    let (native, imported) = (convolutional(), convolutional_onnx());
    let names = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let want = vec![
        Fusion { fused: conv(true, true, true), layers: names(&["conv1", "bn1", "relu1", "pool1"]) },
        Fusion { fused: conv(true, true, false), layers: names(&["conv2", "bn2", "relu2"]) },
    ];
    assert_eq!(native.plan(false), want);
    assert_eq!(imported.plan(), want);
    let x = Tensor::uniform(&[5, 3, 8, 8], -1.0, 1.0, 7);
    let a = imported.forward_t(&x, false).expect("imported");
    let b = native.forward_t(&x, false).expect("native");
    assert_eq!(a.to_vec(), b.to_vec(), "the same kernels on the same weights");
    let ga = input_gradient(|x| imported.forward_t(x, false).expect("imported"), &x, 8);
    let gb = input_gradient(|x| native.forward_t(x, false).expect("native"), &x, 8);
    assert_eq!(ga.to_vec(), gb.to_vec());
    // The graph always runs in inference mode: a training-mode call plans and computes the same.
    assert_eq!(imported.forward_t(&x, true).expect("train").to_vec(), a.to_vec());
}

/// The imported graph's fused forward against its own layer-by-layer run (every value tapped ends every step):
/// within rounding in values and input gradients, folded (some bit differs), and a tap inside a fused step is
/// the layer-by-layer value — exactly for the convolution's and the BatchNorm's own outputs.
#[test]
fn imported_taps_inside_fused_steps_are_the_layer_by_layer_values() {
    let model = convolutional_onnx();
    let x = Tensor::uniform(&[4, 3, 8, 8], -1.0, 1.0, 9);
    let every = ["c1", "b1", "r1", "p1", "c2", "b2"];
    let layered = |x: &Tensor| model.forward_taps(x, false, &every).expect("every tap");
    let (y_layered, reference) = layered(&x);
    let y = model.forward_t(&x, false).expect("forward");
    close("imported logits", &y, &y_layered, 1e-5);
    assert_ne!(y.to_vec(), y_layered.to_vec(), "the fused forward folded");
    let g = input_gradient(|x| model.forward_t(x, false).expect("forward"), &x, 10);
    let gl = input_gradient(|x| layered(x).0, &x, 10);
    close("imported input gradient", &g, &gl, 1e-4);
    for (i, name) in every.iter().enumerate() {
        let (out, taps) = model.forward_taps(&x, false, &[name]).expect("one tap");
        close(name, &taps[0], &reference[i], 1e-5);
        if ["c1", "b1"].contains(name) {
            assert_eq!(taps[0].to_vec(), reference[i].to_vec(), "{name} exactly");
        }
        close(&format!("output tapping {name}"), &out, &y, 1e-5);
    }
}

/// A Conv → BatchNorm, the residual add after it and the ReLU run as one step (the BatchNorm folded, the sum in the
/// convolution's store), as the layers would — also where the add's first operand is the residual; and the legacy
/// exporter's fixture (`zoo_opset13.onnx`: BatchNormalization nodes) folds its BatchNorms.
#[test]
fn imported_residual_add_relu_and_the_legacy_fixture_fold() {
    use crate::onnx::build::{attr_ints, node, Graph};
    let w = Tensor::uniform(&[3, 3, 3, 3], -0.5, 0.5, 11).to_vec();
    let stats: Vec<Vec<f32>> = (0..4).map(|i| Tensor::uniform(&[3], 0.2, 1.2, 12 + i).to_vec()).collect();
    let mut g = Graph::new(13, &[-1, 3, 6, 6]).init("w", &[3, 3, 3, 3], &w);
    for (name, v) in ["s", "b", "m", "v"].iter().zip(&stats) {
        g = g.init(name, &[3], v);
    }
    let k3 = vec![attr_ints("kernel_shape", &[3, 3]), attr_ints("pads", &[1; 4])];
    let g = g
        .node(node("Conv", &["x", "w"], &["c"], "conv", k3))
        .node(node("BatchNormalization", &["c", "s", "b", "m", "v"], &["n"], "bn", vec![]))
        .node(node("Add", &["x", "n"], &["a"], "add", vec![]))
        .node(node("Relu", &["a"], &["y"], "relu", vec![]))
        .output("y", &[]);
    let model = g.model();
    let plan: Vec<(Fused, Vec<String>)> = model.plan().into_iter().map(|f| (f.fused, f.layers)).collect();
    let names = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(plan, vec![(Fused::ConvAdd { bn: true, relu: true }, names(&["conv", "bn", "add", "relu"]))]);
    let x = Tensor::uniform(&[2, 3, 6, 6], -1.0, 1.0, 16);
    let (layered, _) = model.forward_taps(&x, false, &["c", "n", "a"]).expect("layer by layer");
    close("residual", &model.forward_t(&x, false).expect("forward"), &layered, 1e-5);

    let zoo = armoury::onnx::OnnxModel::load(crate::common::fixture("zoo_opset13.onnx")).expect("loads");
    let folded: Vec<Fusion> =
        zoo.plan().into_iter().filter(|f| matches!(f.fused, Fused::Conv { bn: true, .. })).collect();
    assert_eq!(folded.len(), 2, "the stem's and the block's BatchNorm fold: {folded:?}");
}

/// A Sigmoid and the Mul of its input by it (how the exporters write EfficientNet's SiLU) run as one SiLU — in the
/// convolution's store when a convolution makes its input (the convolution's output read by the two nodes alone); a
/// Mul by the sigmoid of another value (a squeeze-and-excitation gate) is planned the same way but runs as the two
/// ops. Values and input gradients match the layer-by-layer run; a tap of the convolution's output or of the
/// sigmoid ends the fused step there, and the convolution's output read elsewhere keeps the convolution apart; the
/// EfficientNet-B0 export plans its SiLUs.
#[test]
fn imported_sigmoid_times_input_is_one_silu() {
    use crate::onnx::build::{attr_i, attr_ints, node, Graph};
    let w = Tensor::uniform(&[3, 1, 3, 3], -0.5, 0.5, 21).to_vec();
    let dw = || vec![attr_ints("kernel_shape", &[3, 3]), attr_ints("pads", &[1; 4]), attr_i("group", 3)];
    let graph = |extra: bool| {
        let g = Graph::new(13, &[-1, 3, 6, 6])
            .init("w", &[3, 1, 3, 3], &w)
            .node(node("Conv", &["x", "w"], &["c"], "conv", dw()))
            .node(node("Sigmoid", &["c"], &["s"], "sig", vec![]))
            .node(node("Mul", &["c", "s"], &["m"], "mul", vec![]))
            .node(node("Sigmoid", &["x"], &["gx"], "gate", vec![]))
            .node(node("Mul", &["gx", "m"], &["y"], "scale", vec![]));
        let g = if extra { g.node(node("Add", &["y", "c"], &["z"], "again", vec![])) } else { g };
        g.output(if extra { "z" } else { "y" }, &[]).model()
    };
    let model = graph(false);
    let planned = |m: &armoury::onnx::OnnxModel| -> Vec<(Fused, Vec<String>)> {
        m.plan().into_iter().filter(|f| f.fused != Fused::Single).map(|f| (f.fused, f.layers)).collect()
    };
    let names = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let conv_silu = Fused::ConvSilu { bn: false };
    let want = vec![(conv_silu, names(&["conv", "sig", "mul"])), (Fused::Silu, names(&["gate", "scale"]))];
    assert_eq!(planned(&model), want);
    // The convolution's output read by a third node: the convolution runs alone, the SiLU after it.
    let read_again = planned(&graph(true));
    assert_eq!(read_again[0], (Fused::Silu, names(&["sig", "mul"])), "{read_again:?}");
    let x = Tensor::uniform(&[2, 3, 6, 6], -2.0, 2.0, 22);
    let every = ["c", "s", "m", "gx"];
    let (y_layered, reference) = model.forward_taps(&x, false, &every).expect("layer by layer");
    let layered = |x: &Tensor| model.forward_taps(x, false, &every).expect("layer by layer").0;
    let y = model.forward_t(&x, false).expect("forward");
    close("silu", &y, &y_layered, 1e-6);
    // The fused SiLU is the convolution's output through `Tensor::silu`, bit for bit.
    let (_, c) = model.forward_taps(&x, false, &["c"]).expect("the convolution");
    let (_, m) = model.forward_taps(&x, false, &["m"]).expect("the product");
    assert_eq!(m[0].to_vec(), c[0].silu().to_vec(), "a tap after the step: the fused op's value");
    let g = input_gradient(|x| model.forward_t(x, false).expect("forward"), &x, 23);
    close("silu input gradient", &g, &input_gradient(layered, &x, 23), 1e-5);
    for (i, name) in every.iter().enumerate() {
        let (out, taps) = model.forward_taps(&x, false, &[name]).expect("one tap");
        close(name, &taps[0], &reference[i], 1e-6);
        close(&format!("output tapping {name}"), &out, &y, 1e-6);
    }

    let zoo = armoury::onnx::OnnxModel::load(crate::common::fixture("zoo/efficientnet_b0_ts17.onnx")).expect("loads");
    let plan = zoo.plan();
    let in_convs = plan.iter().filter(|f| matches!(f.fused, Fused::ConvSilu { .. })).count();
    let alone = plan.iter().filter(|f| f.fused == Fused::Silu).count();
    assert!(in_convs >= 16, "EfficientNet-B0's SiLUs run in its convolutions' stores: {in_convs} ({alone} alone)");
}

/// A native convolution, its BatchNorm and a `SiLU` run as one step in evaluation mode (the BatchNorm folded, the
/// SiLU in the convolution's store), within rounding of the layers in values and input gradients; a tap inside
/// the step is the layer-by-layer value; in training nothing folds and the SiLU runs on its own.
#[test]
fn native_conv_batchnorm_silu_is_one_step() {
    use armoury::nn::SiLU;
    let same = Conv2dParams { padding: (1, 1), ..Conv2dParams::default() };
    let net = Sequential::new()
        .add("conv", Conv2d::new(3, 5, 3, same, true, 40).expect("conv"))
        .add("bn", batch_norm(5, 41))
        .add("silu", SiLU)
        .add("conv2", Conv2d::new(5, 4, 3, same, false, 42).expect("conv2"))
        .add("silu2", SiLU);
    let conv_silu = |bn| Fused::ConvSilu { bn };
    assert_eq!(
        net.plan(false),
        vec![fusion(conv_silu(true), &["conv", "bn", "silu"]), fusion(conv_silu(false), &["conv2", "silu2"])]
    );
    let train = net.plan(true);
    let alone = |name| fusion(Fused::Single, &[name]);
    assert_eq!(train[..3], [alone("conv"), alone("bn"), alone("silu")]);
    let x = Tensor::uniform(&[3, 3, 7, 7], -2.0, 2.0, 43);
    let reference = net.forward_collect(&x, false).expect("layer by layer");
    let at = |name: &str| reference.iter().find(|(n, _)| n == name).expect("a child").1.clone();
    let y = net.forward_t(&x, false).expect("forward");
    close("conv-bn-silu", &y, &at("silu2"), 1e-5);
    let g = input_gradient(|x| net.forward_t(x, false).expect("forward"), &x, 44);
    let layered = |x: &Tensor| net.forward_collect(x, false).expect("layer by layer").pop().expect("last").1;
    close("conv-bn-silu input gradient", &g, &input_gradient(layered, &x, 44), 1e-4);
    for name in ["conv", "bn", "silu", "conv2"] {
        let (_, taps) = net.forward_taps(&x, false, &[name]).expect("taps");
        close(name, &taps[0], &at(name), 1e-5);
        if ["conv", "bn"].contains(&name) {
            assert_eq!(taps[0].to_vec(), at(name).to_vec(), "{name} exactly");
        }
    }
}

/// The exact GELU as PyTorch's exporter writes it (`x / √2 → Erf → + 1 → · x → · ½`) runs as one GELU; the same
/// five nodes with another divisor are planned alike but run as the five ops; with a MatMul and an Add after it,
/// the three are one step. Values and input gradients match the layer-by-layer run; the (reduced) ConvNeXt-T
/// export plans every block's GELU with its second linear layer.
#[test]
fn imported_erf_chain_is_one_gelu() {
    use crate::onnx::build::{attr_t, node, Graph};
    use armoury::onnx::float_tensor;
    // The exporter writes the three scalars as Constant nodes (an initialiser is a parameter, whose gradient a
    // fused op could not give: those chains run as the five ops).
    let constant =
        |name: &str, v: f32| node("Constant", &[], &[name], name, vec![attr_t("value", float_tensor(name, &[], &[v]))]);
    let chain = |g: Graph, x: &str, sfx: &str, div: &str, out: &str| {
        let n = |s: &str| format!("{s}{sfx}");
        g.node(node("Div", &[x, div], &[&n("d")], &n("div"), vec![]))
            .node(node("Erf", &[&n("d")], &[&n("e")], &n("erf"), vec![]))
            .node(node("Add", &[&n("e"), "one"], &[&n("a")], &n("add"), vec![]))
            .node(node("Mul", &[x, &n("a")], &[&n("m")], &n("mul"), vec![]))
            .node(node("Mul", &[&n("m"), "half"], &[out], &n("half"), vec![]))
    };
    let consts = || {
        Graph::new(13, &[-1, 3, 5])
            .node(constant("sqrt2", std::f32::consts::SQRT_2))
            .node(constant("two", 2.0))
            .node(constant("one", 1.0))
            .node(constant("half", 0.5))
    };
    let model = chain(chain(consts(), "x", "", "sqrt2", "g"), "g", "2", "two", "y").output("y", &[]).model();
    let fused: Vec<(Fused, Vec<String>)> =
        model.plan().into_iter().filter(|f| f.fused != Fused::Single).map(|f| (f.fused, f.layers)).collect();
    let names = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        fused,
        vec![
            (Fused::Gelu, names(&["div", "erf", "add", "mul", "half"])),
            (Fused::Gelu, names(&["div2", "erf2", "add2", "mul2", "half2"]))
        ]
    );
    let x = Tensor::uniform(&[2, 3, 5], -3.0, 3.0, 31);
    let every = ["d", "e", "a", "m", "g", "d2", "e2", "a2", "m2"];
    let layered = |x: &Tensor| model.forward_taps(x, false, &every).expect("layer by layer").0;
    close("gelu", &model.forward_t(&x, false).expect("forward"), &layered(&x), 1e-6);
    let g = input_gradient(|x| model.forward_t(x, false).expect("forward"), &x, 32);
    close("gelu input gradient", &g, &input_gradient(layered, &x, 32), 1e-5);
    // The chain alone is the fused op itself: the same bits as Tensor::gelu.
    let alone = chain(consts(), "x", "", "sqrt2", "y").output("y", &[]).model();
    assert_eq!(alone.forward_t(&x, false).expect("forward").to_vec(), x.gelu(false).to_vec());

    // The GELU and the product with a bias that alone reads it (an MLP's second layer) are one step; its value
    // and input gradient match the layer-by-layer run's.
    let w = Tensor::uniform(&[5, 4], -0.5, 0.5, 33).to_vec();
    let mlp = chain(consts(), "x", "", "sqrt2", "g")
        .init("w", &[5, 4], &w)
        .init("b", &[4], &[0.1, -0.2, 0.3, -0.4])
        .node(node("MatMul", &["g", "w"], &["p"], "matmul", vec![]))
        .node(node("Add", &["p", "b"], &["y"], "bias", vec![]))
        .output("y", &[])
        .model();
    let fused: Vec<Fused> = mlp.plan().into_iter().map(|f| f.fused).filter(|f| *f != Fused::Single).collect();
    assert_eq!(fused, vec![Fused::GeluMatMulBias]);
    let every = ["d", "e", "a", "m", "g", "p"];
    let layered = |x: &Tensor| mlp.forward_taps(x, false, &every).expect("layer by layer").0;
    close("gelu, matmul, bias", &mlp.forward_t(&x, false).expect("forward"), &layered(&x), 1e-5);
    let g = input_gradient(|x| mlp.forward_t(x, false).expect("forward"), &x, 34);
    close("gelu, matmul, bias input gradient", &g, &input_gradient(layered, &x, 34), 1e-5);

    let zoo = armoury::onnx::OnnxModel::load(crate::common::fixture("zoo/convnext_t_ts17.onnx")).expect("loads");
    let gelu = zoo.plan().into_iter().filter(|f| f.fused == Fused::GeluMatMulBias).count();
    assert_eq!(gelu, 5, "the small ConvNeXt's five Erf nodes are each one planned GELU with the product after it");
}

/// A convolution and the Clip after it (MobileNets' ReLU6, bounds as constant inputs; an absent bound is
/// infinite) run as one clamped convolution: values and input gradients match the layer-by-layer run; the
/// (reduced) MobileNetV2 export plans each of its convolutions with a ReLU6 so.
#[test]
fn imported_conv_then_clip_is_one_clamped_conv() {
    use crate::onnx::build::{attr_i, attr_ints, node, Graph};
    let w = Tensor::uniform(&[4, 3, 3, 3], -0.5, 0.5, 41).to_vec();
    let dw = Tensor::uniform(&[4, 1, 3, 3], -0.5, 0.5, 42).to_vec();
    let pad = || attr_ints("pads", &[1; 4]);
    let model = Graph::new(13, &[-1, 3, 6, 6])
        .init("w", &[4, 3, 3, 3], &w)
        .init("dw", &[4, 1, 3, 3], &dw)
        .init("lo", &[], &[0.0])
        .init("hi", &[], &[0.5])
        .node(node("Conv", &["x", "w"], &["c"], "conv", vec![attr_ints("kernel_shape", &[3, 3]), pad()]))
        .node(node("Clip", &["c", "lo", "hi"], &["r"], "relu6", vec![]))
        .node(node(
            "Conv",
            &["r", "dw"],
            &["c2"],
            "dwconv",
            vec![attr_ints("kernel_shape", &[3, 3]), pad(), attr_i("group", 4)],
        ))
        .node(node("Clip", &["c2", "lo"], &["y"], "floor", vec![]))
        .output("y", &[])
        .model();
    let fused: Vec<(Fused, Vec<String>)> =
        model.plan().into_iter().filter(|f| f.fused != Fused::Single).map(|f| (f.fused, f.layers)).collect();
    let names = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let clip = Fused::ConvClip { bn: false };
    assert_eq!(fused, vec![(clip, names(&["conv", "relu6"])), (clip, names(&["dwconv", "floor"]))]);
    let x = Tensor::uniform(&[2, 3, 6, 6], -2.0, 2.0, 43);
    let layered = |x: &Tensor| model.forward_taps(x, false, &["c", "r", "c2"]).expect("layer by layer").0;
    let y = model.forward_t(&x, false).expect("forward");
    assert_eq!(y.to_vec(), layered(&x).to_vec(), "the same values, bit for bit");
    let g = input_gradient(|x| model.forward_t(x, false).expect("forward"), &x, 44);
    close("clip input gradient", &g, &input_gradient(layered, &x, 44), 1e-6);

    let zoo = armoury::onnx::OnnxModel::load(crate::common::fixture("zoo/mobilenet_v2_ts17.onnx")).expect("loads");
    let clips = zoo.plan().into_iter().filter(|f| matches!(f.fused, Fused::ConvClip { .. })).count();
    assert!(clips >= 10, "MobileNetV2's ReLU6 convolutions are planned as one op each: {clips}");
}

/// PyTorch exports a linear layer on more than two axes as `MatMul` then `Add(bias, product)` — the bias first.
/// Each runs as one product starting at its bias (the importer had come to plan an Add whose first operand is a
/// parameter as no layer at all, and these ran as two ops again): every MatMul of the (reduced) ConvNeXt-T export,
/// and the (reduced) ViT-B/16 export's MLP layers and attention input projections; each MLP's second layer with
/// the GELU before it.
#[test]
fn imported_linear_layers_with_the_bias_first_are_one_product() {
    for (file, want, mlps) in [("zoo/convnext_t_ts17.onnx", 10, 5), ("zoo/vit_b_16_ts17.onnx", 6, 2)] {
        let zoo = armoury::onnx::OnnxModel::load(crate::common::fixture(file)).expect("loads");
        // A product after a GELU is planned with it (`GeluMatMulBias`), still one product with its bias.
        let plan = zoo.plan();
        let fused = plan.iter().filter(|f| matches!(f.fused, Fused::MatMulBias | Fused::GeluMatMulBias)).count();
        assert_eq!(fused, want, "{file}: linear layers planned as one product with their bias");
        let after_gelu = plan.iter().filter(|f| f.fused == Fused::GeluMatMulBias).count();
        assert_eq!(after_gelu, mlps, "{file}: each MLP's second layer planned with the GELU before it");
    }
}
