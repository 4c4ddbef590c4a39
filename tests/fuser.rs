//! The one fuser (`armoury::nn::plan`) on both front ends: the plan holds the fused steps (BatchNorm folded into
//! the convolution before it, the ReLU and 2×2 pooling fused after), the fused forward equals the layer-by-layer
//! one within rounding in logits and input gradients, a tap inside a fused step gets the layer-by-layer value, and
//! training mode never folds.

use std::sync::Arc;

use armoury::nn::plan::{Fused, Fusion};
use armoury::nn::{BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU};
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
/// bn2 (boxed) → relu2 → flatten → fc (4·3·3 → 5). 8×8 RGB inputs.
fn net() -> Sequential {
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
        .add("flatten", Flatten)
        .add("fc", Linear::new(4 * 2 * 2, 5, true, 12))
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
