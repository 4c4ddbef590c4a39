//! The reference models `mlp` (a multilayer perceptron) and `cnn` (a small LeNet-style CNN, LeCun et al.
//! 1998) of docs/reference.md, with PyTorch's parameter names and child names.

use std::str::FromStr;

use super::{Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential};
use crate::ops::{Conv2dParams, Pool2dParams};
use crate::{Error, Result};

/// `mlp`: Flatten → fc1 Linear(784,256) → ReLU → fc2 Linear(256,256) → ReLU → fc3 Linear(256,10).
/// 269,322 parameters; layer `i` is initialised from `seed + 2i`.
pub fn mlp(seed: u64) -> Sequential {
    Sequential::new()
        .add("flatten", Flatten)
        .add("fc1", Linear::new(784, 256, true, seed))
        .add("fc1_relu", ReLU)
        .add("fc2", Linear::new(256, 256, true, seed + 2))
        .add("fc2_relu", ReLU)
        .add("fc3", Linear::new(256, 10, true, seed + 4))
}

/// `cnn`: conv1 Conv2d(1,16,5) → ReLU → MaxPool2d(2) → conv2 Conv2d(16,32,5) → ReLU → MaxPool2d(2) → Flatten →
/// fc1 Linear(512,128) → ReLU → fc2 Linear(128,10). 80,202 parameters.
pub fn cnn(seed: u64) -> Sequential {
    let conv = |i, o, s| Conv2d::new(i, o, 5, Conv2dParams::default(), true, s).expect("one group always divides");
    Sequential::new()
        .add("conv1", conv(1, 16, seed))
        .add("conv1_relu", ReLU)
        .add("pool1", MaxPool2d(Pool2dParams::square(2)))
        .add("conv2", conv(16, 32, seed + 2))
        .add("conv2_relu", ReLU)
        .add("pool2", MaxPool2d(Pool2dParams::square(2)))
        .add("flatten", Flatten)
        .add("fc1", Linear::new(512, 128, true, seed + 4))
        .add("fc1_relu", ReLU)
        .add("fc2", Linear::new(128, 10, true, seed + 6))
}

/// Which reference model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReferenceModel {
    /// The multilayer perceptron.
    Mlp,
    /// The small convolutional network.
    Cnn,
}

impl ReferenceModel {
    /// Builds it, PyTorch-initialised from `seed`.
    pub fn build(self, seed: u64) -> Sequential {
        match self {
            ReferenceModel::Mlp => mlp(seed),
            ReferenceModel::Cnn => cnn(seed),
        }
    }

    /// Its name (`mlp` or `cnn`).
    pub fn name(self) -> &'static str {
        match self {
            ReferenceModel::Mlp => "mlp",
            ReferenceModel::Cnn => "cnn",
        }
    }

    /// Multiply-adds of one forward pass of one image.
    pub fn macs_per_image(self) -> u64 {
        match self {
            ReferenceModel::Mlp => 268_800,
            ReferenceModel::Cnn => 1_116_416,
        }
    }
}

impl FromStr for ReferenceModel {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mlp" => Ok(ReferenceModel::Mlp),
            "cnn" => Ok(ReferenceModel::Cnn),
            _ => Err(Error::invalid("model", format!("unknown model '{s}' (expected mlp or cnn)"))),
        }
    }
}
