//! Layers and models: the [`Module`] trait, trainable [`Param`]s, [`Sequential`] and the reference models.

mod layers;
mod models;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::tensor::{Array, Tensor};
use crate::{Error, Result};

pub use layers::{
    AvgPool2d, BatchNorm, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Flatten, LeakyReLU, Linear, MaxPool2d, ReLU,
    Sigmoid, Softmax, Tanh,
};
pub use models::{cnn, mlp, ReferenceModel};

struct ParamInner {
    tensor: RwLock<Tensor>,
    trainable: bool,
}

/// A named slot holding a parameter (trainable) or a buffer (e.g. BatchNorm running statistics).
///
/// Clones share the slot. Each read returns the current value as a leaf tensor; an optimiser step or a load
/// replaces it with a new leaf, so gradients taken before the update stay valid for the old value.
#[derive(Clone)]
pub struct Param(Arc<ParamInner>);

impl Param {
    /// A trainable parameter.
    pub fn new(value: impl Into<Array>) -> Param {
        let value = value.into();
        Param(Arc::new(ParamInner { tensor: RwLock::new(Tensor::parameter(value)), trainable: true }))
    }

    /// A non-trainable buffer.
    pub fn buffer(value: impl Into<Array>) -> Param {
        Param(Arc::new(ParamInner { tensor: RwLock::new(Tensor::new(value.into())), trainable: false }))
    }

    /// The current value as a tensor (a tracked leaf for parameters, a constant for buffers).
    pub fn tensor(&self) -> Tensor {
        self.0.tensor.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The current value.
    pub fn value(&self) -> Array {
        self.tensor().value().clone()
    }

    /// The shape.
    pub fn shape(&self) -> Vec<usize> {
        self.tensor().shape().to_vec()
    }

    /// Whether optimisers update it and `backward` reports its gradient.
    pub fn is_trainable(&self) -> bool {
        self.0.trainable
    }

    /// Replaces the value; the shape must not change.
    pub fn set(&self, value: impl Into<Array>) -> Result<()> {
        let value = value.into();
        let mut slot = self.0.tensor.write().unwrap_or_else(|e| e.into_inner());
        if value.shape() != slot.shape() {
            return Err(Error::ShapeMismatch {
                op: "Param::set",
                expected: slot.shape().to_vec(),
                got: value.shape().to_vec(),
            });
        }
        *slot = if self.0.trainable { Tensor::parameter(value) } else { Tensor::new(value) };
        Ok(())
    }

    /// Whether two handles share one slot.
    pub fn same(&self, other: &Param) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A layer or a model: a differentiable function with named parameters and buffers.
pub trait Module: Send + Sync {
    /// The forward pass in the given mode (`train`: dropout active, BatchNorm on batch statistics).
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor>;

    /// Calls `f` with the full PyTorch-style name (`prefix` + own name) of every parameter and buffer.
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param));

    /// The forward pass in the module's current mode.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_t(x, self.is_training())
    }

    /// Switches between training and evaluation mode (containers pass it on).
    fn set_training(&self, _training: bool) {}

    /// Whether the module is in training mode.
    fn is_training(&self) -> bool {
        false
    }

    /// Whether each sample's output depends on that sample alone in the given mode, so a batch may be split
    /// into pieces with the same result ([`crate::train::backward_in_pieces`]). Not so for BatchNorm on batch
    /// statistics or for dropout drawing its masks per call.
    fn batch_independent(&self, _train: bool) -> bool {
        true
    }

    /// Whether `forward_t` computes the same function in training and in evaluation mode (no dropout, no
    /// BatchNorm), so that a training-mode forward may stand in for an evaluation-mode one. `false` unless the
    /// module says so.
    fn mode_independent(&self) -> bool {
        false
    }

    /// `relu(self.forward_t(x, train))` computed as one fused op, when the module has one (`Conv2d` does);
    /// containers use it for a module followed by a [`ReLU`](crate::nn::ReLU).
    fn forward_relu(&self, _x: &Tensor, _train: bool) -> Option<Result<Tensor>> {
        None
    }

    /// Whether this module is exactly max(x, 0) (lets a container fuse it into the module before).
    fn is_relu(&self) -> bool {
        false
    }

    /// `max_pool2d(relu(self.forward_t(x, train)), 2×2, stride 2)` computed as one fused op, when the module has
    /// one (`Conv2d` does); containers use it for a module followed by a `ReLU` and a [`MaxPool2d`] of
    /// [`Pool2dParams::square(2)`](crate::ops::Pool2dParams::square).
    fn forward_relu_max_pool2(&self, _x: &Tensor, _train: bool) -> Option<Result<Tensor>> {
        None
    }

    /// The window of this module if it is a max pooling (lets a container fuse it into the modules before).
    fn max_pool(&self) -> Option<crate::ops::Pool2dParams> {
        None
    }
}

/// Conveniences over [`Module::visit`].
pub trait ModuleExt: Module {
    /// Every parameter and buffer with its name, in definition order.
    fn named_params(&self) -> Vec<(String, Param)> {
        let mut out = Vec::new();
        self.visit("", &mut |name, p| out.push((name.to_string(), p.clone())));
        out
    }

    /// The trainable parameters, in definition order.
    fn parameters(&self) -> Vec<Param> {
        self.named_params().into_iter().map(|(_, p)| p).filter(Param::is_trainable).collect()
    }

    /// The number of trainable scalars.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|p| p.shape().iter().product::<usize>()).sum()
    }

    /// Training mode.
    fn train(&self) {
        self.set_training(true)
    }

    /// Evaluation mode.
    fn eval(&self) {
        self.set_training(false)
    }
}

impl<M: Module + ?Sized> ModuleExt for M {}

impl<M: Module + ?Sized> Module for Arc<M> {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        (**self).forward_t(x, train)
    }
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        (**self).visit(prefix, f)
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn set_training(&self, training: bool) {
        (**self).set_training(training)
    }
    fn is_training(&self) -> bool {
        (**self).is_training()
    }
    fn batch_independent(&self, train: bool) -> bool {
        (**self).batch_independent(train)
    }
    fn mode_independent(&self) -> bool {
        (**self).mode_independent()
    }
    fn forward_relu(&self, x: &Tensor, train: bool) -> Option<Result<Tensor>> {
        (**self).forward_relu(x, train)
    }
    fn is_relu(&self) -> bool {
        (**self).is_relu()
    }
    fn forward_relu_max_pool2(&self, x: &Tensor, train: bool) -> Option<Result<Tensor>> {
        (**self).forward_relu_max_pool2(x, train)
    }
    fn max_pool(&self) -> Option<crate::ops::Pool2dParams> {
        (**self).max_pool()
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        (**self).forward_t(x, train)
    }
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        (**self).visit(prefix, f)
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn set_training(&self, training: bool) {
        (**self).set_training(training)
    }
    fn is_training(&self) -> bool {
        (**self).is_training()
    }
    fn batch_independent(&self, train: bool) -> bool {
        (**self).batch_independent(train)
    }
    fn mode_independent(&self) -> bool {
        (**self).mode_independent()
    }
    fn forward_relu(&self, x: &Tensor, train: bool) -> Option<Result<Tensor>> {
        (**self).forward_relu(x, train)
    }
    fn is_relu(&self) -> bool {
        (**self).is_relu()
    }
    fn forward_relu_max_pool2(&self, x: &Tensor, train: bool) -> Option<Result<Tensor>> {
        (**self).forward_relu_max_pool2(x, train)
    }
    fn max_pool(&self) -> Option<crate::ops::Pool2dParams> {
        (**self).max_pool()
    }
}

/// Children run in order; parameter names are `child.param` as in a PyTorch `nn.Sequential` with named children.
#[derive(Default)]
pub struct Sequential {
    children: Vec<(String, Box<dyn Module>)>,
    training: AtomicBool,
}

impl Sequential {
    /// An empty container.
    pub fn new() -> Self {
        Sequential::default()
    }

    /// Appends a named child.
    pub fn add(mut self, name: impl Into<String>, m: impl Module + 'static) -> Self {
        self.children.push((name.into(), Box::new(m)));
        self
    }

    /// The children with their names.
    pub fn children(&self) -> impl Iterator<Item = (&str, &dyn Module)> {
        self.children.iter().map(|(n, m)| (n.as_str(), m.as_ref()))
    }

    /// Runs the children up to and including the one named `last`, returning every named intermediate output.
    pub fn forward_collect(&self, x: &Tensor, train: bool) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::with_capacity(self.children.len());
        let mut h = x.clone();
        for (name, m) in &self.children {
            h = m.forward_t(&h, train)?;
            out.push((name.clone(), h.clone()));
        }
        Ok(out)
    }
}

impl Module for Sequential {
    /// Runs the children in order; a child followed by a `ReLU` (and a 2×2 max pooling of stride 2) runs as one
    /// fused op when it has one (the same values and gradients; [`Sequential::forward_collect`] keeps every
    /// intermediate separate).
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut h = x.clone();
        let mut i = 0;
        while i < self.children.len() {
            let m = &self.children[i].1;
            let next_is_relu = self.children.get(i + 1).is_some_and(|(_, r)| r.is_relu());
            let then_pool = self.children.get(i + 2).and_then(|(_, p)| p.max_pool());
            if next_is_relu && then_pool == Some(crate::ops::Pool2dParams::square(2)) {
                if let Some(fused) = m.forward_relu_max_pool2(&h, train) {
                    h = fused?;
                    i += 3;
                    continue;
                }
            }
            if next_is_relu {
                if let Some(fused) = m.forward_relu(&h, train) {
                    h = fused?;
                    i += 2;
                    continue;
                }
            }
            h = m.forward_t(&h, train)?;
            i += 1;
        }
        Ok(h)
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        for (name, m) in &self.children {
            m.visit(&format!("{prefix}{name}."), f);
        }
    }

    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
        for (_, m) in &self.children {
            m.set_training(training);
        }
    }

    fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }

    fn batch_independent(&self, train: bool) -> bool {
        self.children.iter().all(|(_, m)| m.batch_independent(train))
    }

    fn mode_independent(&self) -> bool {
        self.children.iter().all(|(_, m)| m.mode_independent())
    }
}
