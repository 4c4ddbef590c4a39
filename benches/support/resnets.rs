//! The two CIFAR ResNets of the adversarial-training literature, at full size, for `benches/adv_train.rs`:
//! PreAct-ResNet-18 (He et al. 2016, identity mappings; Rice et al. 2020's `preactresnet.py`) and ResNet-18
//! (He et al. 2016 with the 3×3 stem of CIFAR code, as Madry et al.'s and Rice et al.'s `resnet.py`), both with
//! blocks [2, 2, 2, 2] of widths 64–512 on 32×32 RGB and 10 classes. `benches/reference/adv_train_step.py` defines
//! the same modules with the same parameter names.

use armoury::nn::{AvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, ReLU, Sequential};
use armoury::{Conv2dParams, Pool2dParams};

use crate::bench::Residual;

/// A bias-free k×k convolution with padding k/2 and the given stride.
fn conv(cin: usize, cout: usize, k: usize, stride: usize, seed: u64) -> Conv2d {
    let p = Conv2dParams { stride: (stride, stride), padding: (k / 2, k / 2), ..Conv2dParams::default() };
    Conv2d::new(cin, cout, k, p, false, seed).expect("one group always divides")
}

/// A pre-activation block (Rice et al.'s `PreActBlock`): `pre` = bn1 → ReLU, `body` = conv1 → bn2 → ReLU → conv2
/// (in evaluation mode the planner folds bn2 into conv1), the shortcut `x` or a 1×1 convolution of `pre(x)`.
fn preact(cin: usize, cout: usize, stride: usize, seed: u64) -> Residual {
    Residual {
        pre: Some(Sequential::new().add("bn1", BatchNorm2d::new(cin)).add("relu", ReLU)),
        body: Sequential::new()
            .add("conv1", conv(cin, cout, 3, stride, seed))
            .add("bn2", BatchNorm2d::new(cout))
            .add("relu", ReLU)
            .add("conv2", conv(cout, cout, 3, 1, seed + 1)),
        shortcut: (stride != 1 || cin != cout)
            .then(|| Sequential::new().add("0", conv(cin, cout, 1, stride, seed + 2))),
    }
}

const WIDTHS: [usize; 4] = [64, 128, 256, 512];

/// PreAct-ResNet-18: conv1 (3→64), layer1–layer4 (two pre-activation blocks each, the first of layer2–4 of stride 2),
/// bn, ReLU, 4×4 average pool, flatten, linear (512→10).
pub fn preact_resnet18(seed: u64) -> Sequential {
    let mut net = Sequential::new().add("conv1", conv(3, 64, 3, 1, seed));
    let mut cin = 64;
    for (l, &w) in WIDTHS.iter().enumerate() {
        let stride = if l == 0 { 1 } else { 2 };
        let s = seed + 10 * (l as u64 + 1);
        let layer = Sequential::new().add("0", preact(cin, w, stride, s)).add("1", preact(w, w, 1, s + 5));
        net = net.add(format!("layer{}", l + 1), layer);
        cin = w;
    }
    net.add("bn", BatchNorm2d::new(512))
        .add("relu", ReLU)
        .add("pool", AvgPool2d(Pool2dParams::square(4)))
        .add("flatten", Flatten)
        .add("linear", Linear::new(512, 10, true, seed + 100))
}

/// A basic block `relu(body(x) + shortcut(x))`: body conv1 → bn1 → ReLU → conv2 → bn2, shortcut the identity
/// or a 1×1 convolution and BatchNorm (`shortcut.0`, `shortcut.1`); the ReLU after the sum is the next child.
fn basic(cin: usize, cout: usize, stride: usize, seed: u64) -> Residual {
    Residual {
        pre: None,
        body: Sequential::new()
            .add("conv1", conv(cin, cout, 3, stride, seed))
            .add("bn1", BatchNorm2d::new(cout))
            .add("relu", ReLU)
            .add("conv2", conv(cout, cout, 3, 1, seed + 1))
            .add("bn2", BatchNorm2d::new(cout)),
        shortcut: (stride != 1 || cin != cout)
            .then(|| Sequential::new().add("0", conv(cin, cout, 1, stride, seed + 2)).add("1", BatchNorm2d::new(cout))),
    }
}

/// ResNet-18 (CIFAR): conv1 (3→64), bn1, ReLU, layer1–layer4 (two basic blocks each, each followed by a ReLU, the
/// first of layer2–4 of stride 2), 4×4 average pool, flatten, linear (512→10).
pub fn resnet18(seed: u64) -> Sequential {
    let mut net =
        Sequential::new().add("conv1", conv(3, 64, 3, 1, seed)).add("bn1", BatchNorm2d::new(64)).add("relu", ReLU);
    let mut cin = 64;
    for (l, &w) in WIDTHS.iter().enumerate() {
        let stride = if l == 0 { 1 } else { 2 };
        let s = seed + 10 * (l as u64 + 1);
        let layer = Sequential::new()
            .add("0", basic(cin, w, stride, s))
            .add("0_relu", ReLU)
            .add("1", basic(w, w, 1, s + 5))
            .add("1_relu", ReLU);
        net = net.add(format!("layer{}", l + 1), layer);
        cin = w;
    }
    net.add("pool", AvgPool2d(Pool2dParams::square(4)))
        .add("flatten", Flatten)
        .add("linear", Linear::new(512, 10, true, seed + 100))
}
