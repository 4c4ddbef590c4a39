//! The layers, each a [`Module`] with PyTorch's parameter names and default initialisation.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ndarray::{ArrayD, IxDyn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Layer, Module, Param};
use crate::ops::batch_norm::{batch_norm, batch_norm_running, Stats};
use crate::ops::{Conv2dParams, Pool2dParams};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// PyTorch's default initialisation: U(−1/√fan_in, 1/√fan_in) (kaiming_uniform with a = √5, and the bias rule).
fn torch_uniform(shape: &[usize], fan_in: usize, seed: u64) -> ArrayD<f32> {
    let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
    Tensor::uniform(shape, -bound, bound, seed).to_array()
}

/// Fully connected: y = x·Wᵀ + b with W [out, in].
pub struct Linear {
    /// `weight` [out, in].
    pub weight: Param,
    /// `bias` [out].
    pub bias: Option<Param>,
}

impl Linear {
    /// PyTorch-initialised from `seed` (the weight uses `seed`, the bias `seed + 1`).
    pub fn new(inputs: usize, outputs: usize, bias: bool, seed: u64) -> Linear {
        Linear {
            weight: Param::new(torch_uniform(&[outputs, inputs], inputs, seed)),
            bias: bias.then(|| Param::new(torch_uniform(&[outputs], inputs, seed.wrapping_add(1)))),
        }
    }
}

impl Module for Linear {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let w = self.weight.tensor();
        let (_, inputs) = w.dims2("linear")?;
        let (_, got) = x.dims2("linear")?;
        if got != inputs {
            return Err(Error::ShapeMismatch {
                op: "linear",
                expected: vec![x.shape()[0], inputs],
                got: x.shape().to_vec(),
            });
        }
        // x·wᵀ with wᵀ's packed form kept with the weight (the same values as `x.matmul(&w.t()?)`).
        let y = x.matmul_transposed(&w)?;
        match &self.bias {
            Some(b) => y.add(&b.tensor()),
            None => Ok(y),
        }
    }

    fn describe(&self) -> Layer {
        Layer::Linear { weight: self.weight.tensor(), bias: self.bias.as_ref().map(Param::tensor) }
    }

    fn mode_independent(&self) -> bool {
        true
    }
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        f(&format!("{prefix}weight"), &self.weight);
        if let Some(b) = &self.bias {
            f(&format!("{prefix}bias"), b);
        }
    }
}

/// 2-D convolution with weight [O, C/groups, kh, kw].
pub struct Conv2d {
    /// `weight` [O, C/groups, kh, kw].
    pub weight: Param,
    /// `bias` [O].
    pub bias: Option<Param>,
    /// Stride, padding, dilation, groups.
    pub params: Conv2dParams,
}

impl Conv2d {
    /// A square-kernel convolution, PyTorch-initialised from `seed`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        params: Conv2dParams,
        bias: bool,
        seed: u64,
    ) -> Result<Conv2d> {
        let groups = params.groups.max(1);
        if !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
            return Err(Error::invalid(
                "Conv2d::new",
                format!("{in_channels}→{out_channels} channels do not split into {groups} groups"),
            ));
        }
        let fan_in = in_channels / groups * kernel * kernel;
        let shape = [out_channels, in_channels / groups, kernel, kernel];
        Ok(Conv2d {
            weight: Param::new(torch_uniform(&shape, fan_in, seed)),
            bias: bias.then(|| Param::new(torch_uniform(&[out_channels], fan_in, seed.wrapping_add(1)))),
            params,
        })
    }
}

impl Module for Conv2d {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let b = self.bias.as_ref().map(Param::tensor);
        x.conv2d(&self.weight.tensor(), b.as_ref(), self.params)
    }

    fn describe(&self) -> Layer {
        Layer::Conv { weight: self.weight.tensor(), bias: self.bias.as_ref().map(Param::tensor), params: self.params }
    }

    fn mode_independent(&self) -> bool {
        true
    }
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        f(&format!("{prefix}weight"), &self.weight);
        if let Some(b) = &self.bias {
            f(&format!("{prefix}bias"), b);
        }
    }
}

/// Max pooling.
pub struct MaxPool2d(pub Pool2dParams);

impl Module for MaxPool2d {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        x.max_pool2d(self.0)
    }
    fn describe(&self) -> Layer {
        Layer::MaxPool(self.0)
    }
    fn mode_independent(&self) -> bool {
        true
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
}

/// Average pooling.
pub struct AvgPool2d(pub Pool2dParams);

impl Module for AvgPool2d {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        x.avg_pool2d(self.0)
    }
    fn mode_independent(&self) -> bool {
        true
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
}

/// Flattens everything after the batch axis (row-major over C, H, W).
pub struct Flatten;

impl Module for Flatten {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        if x.rank() < 2 {
            return Err(x.rank_error("flatten", 2));
        }
        x.flatten_from(1)
    }
    fn mode_independent(&self) -> bool {
        true
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
}

macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, |$x:ident| $body:expr, $describe:expr) => {
        $(#[$doc])*
        pub struct $name;
        impl Module for $name {
            fn forward_t(&self, $x: &Tensor, _train: bool) -> Result<Tensor> {
                Ok($body)
            }
            fn mode_independent(&self) -> bool {
                true
            }
            fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
            fn describe(&self) -> Layer {
                $describe
            }
        }
    };
}

activation!(/// max(x, 0).
    ReLU, |x| x.relu(), Layer::Relu);
activation!(/// The logistic sigmoid.
    Sigmoid, |x| x.sigmoid(), Layer::Sigmoid);
activation!(/// SiLU (swish) `x·σ(x)`, PyTorch's `nn.SiLU`: after a convolution, fused into it in evaluation passes.
    SiLU, |x| x.silu(), Layer::Silu);
activation!(/// tanh.
    Tanh, |x| x.tanh(), Layer::Opaque);

/// x for x > 0, else slope·x.
pub struct LeakyReLU(pub f32);

impl Module for LeakyReLU {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        Ok(x.leaky_relu(self.0))
    }
    fn mode_independent(&self) -> bool {
        true
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
}

/// Softmax along an axis.
pub struct Softmax(pub usize);

impl Module for Softmax {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        x.softmax(self.0)
    }
    fn mode_independent(&self) -> bool {
        true
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
}

/// Batch normalisation over axis 1 of [N, C] (BatchNorm1d) or [N, C, H, W] (BatchNorm2d).
///
/// Training: normalise with the batch mean and biased variance, and update the running statistics with
/// `momentum` (the running variance uses the unbiased estimate, as PyTorch). Evaluation: use the running ones.
pub struct BatchNorm {
    /// `weight` (γ) [C].
    pub weight: Param,
    /// `bias` (β) [C].
    pub bias: Param,
    /// `running_mean` [C] (buffer).
    pub running_mean: Param,
    /// `running_var` [C] (buffer).
    pub running_var: Param,
    /// `num_batches_tracked` (buffer, a scalar).
    pub num_batches_tracked: Param,
    /// Added to the variance.
    pub eps: f32,
    /// Weight of the new batch in the running statistics.
    pub momentum: f32,
    training: AtomicBool,
}

impl BatchNorm {
    /// γ = 1, β = 0, running mean 0 and variance 1; eps 1e-5, momentum 0.1 (PyTorch's defaults).
    pub fn new(channels: usize) -> BatchNorm {
        BatchNorm {
            weight: Param::new(ArrayD::ones(IxDyn(&[channels]))),
            bias: Param::new(ArrayD::zeros(IxDyn(&[channels]))),
            running_mean: Param::buffer(ArrayD::zeros(IxDyn(&[channels]))),
            running_var: Param::buffer(ArrayD::ones(IxDyn(&[channels]))),
            num_batches_tracked: Param::buffer(ArrayD::zeros(IxDyn(&[]))),
            eps: 1e-5,
            momentum: 0.1,
            training: AtomicBool::new(false),
        }
    }
}

impl Module for BatchNorm {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let c = self.weight.shape()[0];
        if x.rank() < 2 || x.shape()[1] != c {
            return Err(Error::ShapeMismatch {
                op: "batch_norm",
                expected: vec![x.shape().first().copied().unwrap_or(0), c],
                got: x.shape().to_vec(),
            });
        }
        let (gamma, beta) = (self.weight.tensor(), self.bias.tensor());
        if !train {
            let stats = (&self.running_mean.tensor(), &self.running_var.tensor());
            return batch_norm_running(x, (&gamma, &beta), stats, self.eps, false);
        }
        let count: usize = x.shape().iter().enumerate().filter(|&(a, _)| a != 1).map(|(_, &d)| d).product();
        if count < 2 {
            return Err(Error::invalid("batch_norm", "training needs more than one value per channel"));
        }
        let (y, mean, var) = batch_norm(x, Stats::Batch, &gamma, &beta, self.eps)?;
        let m = self.momentum;
        let unbias = count as f32 / (count - 1) as f32;
        let batch = |v: Vec<f32>| ArrayD::from_shape_vec(IxDyn(&[c]), v).expect("C values");
        let new_mean = &self.running_mean.value() * (1.0 - m) + &batch(mean).mapv(|v| v * m);
        let new_var = &self.running_var.value() * (1.0 - m) + &batch(var).mapv(|v| v * m * unbias);
        self.running_mean.set(new_mean)?;
        self.running_var.set(new_var)?;
        self.num_batches_tracked.set(self.num_batches_tracked.value().mapv(|v| v + 1.0))?;
        Ok(y)
    }

    /// Its evaluation-mode affine map, which the fuser folds into the convolution before it.
    fn describe(&self) -> Layer {
        Layer::BatchNorm {
            weight: self.weight.tensor(),
            bias: self.bias.tensor(),
            running_mean: self.running_mean.tensor(),
            running_var: self.running_var.tensor(),
            eps: self.eps,
        }
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        f(&format!("{prefix}weight"), &self.weight);
        f(&format!("{prefix}bias"), &self.bias);
        f(&format!("{prefix}running_mean"), &self.running_mean);
        f(&format!("{prefix}running_var"), &self.running_var);
        f(&format!("{prefix}num_batches_tracked"), &self.num_batches_tracked);
    }

    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed)
    }

    fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }

    /// Batch statistics couple the samples of a batch in training mode.
    fn batch_independent(&self, train: bool) -> bool {
        !train
    }
}

/// BatchNorm over [N, C] (PyTorch's `BatchNorm1d`): the same layer as [`BatchNorm`].
pub type BatchNorm1d = BatchNorm;

/// BatchNorm over [N, C, H, W] (PyTorch's `BatchNorm2d`): the same layer as [`BatchNorm`].
pub type BatchNorm2d = BatchNorm;

/// Inverted dropout: in training, zero each value with probability `p` and scale the rest by 1/(1−p).
/// Masks come from ChaCha8 seeded by (`seed`, call number), so a run is reproducible.
pub struct Dropout {
    p: f32,
    seed: u64,
    calls: AtomicU64,
    training: AtomicBool,
}

impl Dropout {
    /// Dropout with probability `p` in [0, 1).
    pub fn new(p: f32, seed: u64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid("Dropout::new", format!("p = {p} must be in [0, 1)")));
        }
        Ok(Dropout { p, seed, calls: AtomicU64::new(0), training: AtomicBool::new(false) })
    }
}

impl Module for Dropout {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if !train || self.p == 0.0 {
            return Ok(x.clone());
        }
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let keep = 1.0 / (1.0 - self.p);
        let mask =
            ArrayD::from_shape_simple_fn(IxDyn(x.shape()), || if rng.random::<f32>() < self.p { 0.0 } else { keep });
        x.mul(&Tensor::new(mask))
    }

    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}

    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed)
    }

    fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }

    /// In training mode each call draws its masks from the next state of one generator: split a batch and the
    /// masks depend on the order the pieces run in.
    fn batch_independent(&self, train: bool) -> bool {
        !train || self.p == 0.0
    }
}
