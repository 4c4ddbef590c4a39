//! Layers and models: the [`Module`] trait, trainable [`Param`]s, [`Sequential`], the reference models, and the
//! one fuser ([`plan`]): a layer says what it is ([`Module::describe`]) and the planner fuses runs of layers, for
//! native containers and imported ONNX graphs alike.

mod layers;
mod models;
mod normalize;
pub mod plan;
mod sequential;

use std::sync::{Arc, RwLock};

use crate::tensor::{Array, Tensor};
use crate::{Error, Result};

pub use layers::{
    AvgPool2d, BatchNorm, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Flatten, LeakyReLU, Linear, MaxPool2d, ReLU, SiLU,
    Sigmoid, Softmax, Tanh,
};
pub use models::{cnn, mlp, ReferenceModel};
pub use normalize::{Normalize, Normalized};
pub use plan::Layer;
pub use sequential::Sequential;

/// The shape of `module`'s output on one `[c, h, w]` input of zeros, in evaluation mode and without a graph:
/// `[1, classes]` for a classifier.
pub fn output_shape(module: &dyn Module, [c, h, w]: [usize; 3]) -> Result<Vec<usize>> {
    let out = crate::no_grad(|| module.forward_t(&Tensor::zeros(&[1, c, h, w]), false))?;
    Ok(out.shape().to_vec())
}

/// The number of classes of `module` on inputs of shape `[c, h, w]`: the width of its output — never the
/// largest label of some data. An error when the output is not `[1, classes]`.
pub fn output_classes(module: &dyn Module, shape: [usize; 3]) -> Result<usize> {
    match output_shape(module, shape)?[..] {
        [1, k] => Ok(k),
        ref other => Err(Error::invalid(
            "output_classes",
            format!("the model's output on one {shape:?} input has shape {other:?}, not [1, classes]"),
        )),
    }
}

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

    /// What this layer is, for the fuser ([`plan`]): a layer the planner can fuse with its neighbours (a
    /// convolution, a BatchNorm, a ReLU, a max pooling, …) returns its [`Layer`], which must compute what
    /// `forward_t` computes in evaluation mode; anything else is [`Layer::Opaque`] (the default) and runs through
    /// its own forward. The one fusion hook: containers never ask a layer anything else.
    fn describe(&self) -> Layer {
        Layer::Opaque
    }

    /// The names of the intermediate values (taps) [`Module::forward_taps`] can return, in the order a forward
    /// pass computes them. A [`Sequential`] names its children as PyTorch's `named_modules` does (`conv1`,
    /// `conv1_relu`, …; `block.conv` inside a nested container); an [`crate::onnx::OnnxModel`] names the graph's
    /// values. Empty for a module that cannot tap (the leaf layers: their only value is their output).
    fn tap_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// One forward pass in the given mode that returns the output and the intermediate values named in `names`
    /// (each one of [`Module::tap_names`]; in the order asked, repeats allowed), with the values of the unfused
    /// layer-by-layer computation: the fuser ([`plan`]) ends a fused step at every value asked for, so a value is
    /// exact up to the rounding of BatchNorms folded before it, and the output is `forward_t`'s to that rounding.
    /// The values are on the graph like the output:
    /// differentiable with respect to a tracked input when gradients are enabled, constants under
    /// [`crate::no_grad`].
    ///
    /// An unknown name is an [`Error::InvalidArgument`] listing the valid ones. The default (a module that
    /// cannot tap) runs `forward_t` when nothing is asked and rejects any name.
    fn forward_taps(&self, x: &Tensor, train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        match names.first() {
            None => Ok((self.forward_t(x, train)?, Vec::new())),
            Some(name) => Err(unknown_layer("Module::forward_taps", name, &self.tap_names())),
        }
    }
}

/// The error for a tap name that is not one of `valid`: lists the valid names, or says that there are none.
pub(crate) fn unknown_layer(op: &'static str, name: &str, valid: &[String]) -> Error {
    if valid.is_empty() {
        return Error::invalid(op, format!("no layer '{name}': this model exposes no intermediate activations"));
    }
    Error::invalid(op, format!("unknown layer '{name}'; valid layers: {}", valid.join(", ")))
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
    fn tap_names(&self) -> Vec<String> {
        (**self).tap_names()
    }
    fn forward_taps(&self, x: &Tensor, train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        (**self).forward_taps(x, train, names)
    }
    fn describe(&self) -> Layer {
        (**self).describe()
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
    fn tap_names(&self) -> Vec<String> {
        (**self).tap_names()
    }
    fn forward_taps(&self, x: &Tensor, train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        (**self).forward_taps(x, train, names)
    }
    fn describe(&self) -> Layer {
        (**self).describe()
    }
}
