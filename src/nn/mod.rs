//! Layers and models: the [`Module`] trait, trainable [`Param`]s, [`Sequential`] and the reference models.

mod layers;
mod models;
mod normalize;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::tensor::{Array, Tensor};
use crate::{Error, Result};

pub use layers::{
    AvgPool2d, BatchNorm, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Flatten, LeakyReLU, Linear, MaxPool2d, ReLU,
    Sigmoid, Softmax, Tanh,
};
pub use models::{cnn, mlp, ReferenceModel};
pub use normalize::Normalize;

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

    /// `relu(self.forward_t(x, train))` computed as one fused op, when the module has one (`Conv2d` does);
    /// containers use it for a module followed by a [`ReLU`](crate::nn::ReLU).
    fn forward_relu(&self, _x: &Tensor, _train: bool) -> Option<Result<Tensor>> {
        None
    }

    /// The per-channel affine map `y = x·scale + shift` (channels on axis 1) this module computes in
    /// evaluation mode, when it is one (BatchNorm on its running statistics): lets a container fold it into
    /// the convolution before. The two tensors are built from the module's parameters, so gradients reach them.
    fn eval_affine(&self) -> Option<Result<(Tensor, Tensor)>> {
        None
    }

    /// `self.forward_t(x, false)` followed by the per-output-channel map `x·scale + shift` (and a ReLU with
    /// `relu`), computed with the map folded into the module's weights and bias, when the module can
    /// (`Conv2d` does): one convolution instead of a convolution and four element-wise passes.
    fn forward_folded(&self, _x: &Tensor, _scale: &Tensor, _shift: &Tensor, _relu: bool) -> Option<Result<Tensor>> {
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

    /// The names of the intermediate values (taps) [`Module::forward_taps`] can return, in the order a forward
    /// pass computes them. A [`Sequential`] names its children as PyTorch's `named_modules` does (`conv1`,
    /// `conv1_relu`, …; `block.conv` inside a nested container); an [`crate::onnx::OnnxModel`] names the graph's
    /// values. Empty for a module that cannot tap (the leaf layers: their only value is their output).
    fn tap_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// One forward pass in the given mode that returns the output and the intermediate values named in `names`
    /// (each one of [`Module::tap_names`]; in the order asked, repeats allowed), with the same values as
    /// `forward_t` and as the unfused layer-by-layer computation. The values are on the graph like the output:
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
    fn tap_names(&self) -> Vec<String> {
        (**self).tap_names()
    }
    fn forward_taps(&self, x: &Tensor, train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        (**self).forward_taps(x, train, names)
    }
    fn eval_affine(&self) -> Option<Result<(Tensor, Tensor)>> {
        (**self).eval_affine()
    }
    fn forward_folded(&self, x: &Tensor, scale: &Tensor, shift: &Tensor, relu: bool) -> Option<Result<Tensor>> {
        (**self).forward_folded(x, scale, shift, relu)
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
    fn tap_names(&self) -> Vec<String> {
        (**self).tap_names()
    }
    fn forward_taps(&self, x: &Tensor, train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        (**self).forward_taps(x, train, names)
    }
    fn eval_affine(&self) -> Option<Result<(Tensor, Tensor)>> {
        (**self).eval_affine()
    }
    fn forward_folded(&self, x: &Tensor, scale: &Tensor, shift: &Tensor, relu: bool) -> Option<Result<Tensor>> {
        (**self).forward_folded(x, scale, shift, relu)
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

    /// Runs every child on its own, without fusing any, and returns each child's output with its name: the
    /// layer-by-layer reference computation that [`Module::forward_taps`] (which keeps the fused ops wherever
    /// nothing is asked from inside them) agrees with.
    pub fn forward_collect(&self, x: &Tensor, train: bool) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::with_capacity(self.children.len());
        let mut h = x.clone();
        for (name, m) in &self.children {
            h = m.forward_t(&h, train)?;
            out.push((name.clone(), h.clone()));
        }
        Ok(out)
    }

    /// Runs the children in order, fusing a child with the `ReLU` (and 2×2 max pooling) after it where it has a
    /// fused op and `plan` asks for none of the outputs the fused op skips. Returns the output, the kept outputs
    /// of the children `plan` asks for, and what each child asked for by a nested name returned.
    fn run(&self, x: &Tensor, train: bool, plan: Option<&TapPlan>) -> Result<Tapped> {
        let len = self.children.len();
        let own = |i: usize| plan.is_some_and(|p| p.own.get(i).copied().unwrap_or(false));
        let deep = |i: usize| plan.and_then(|p| p.inner.get(i)).filter(|v| !v.is_empty());
        let (mut kept, mut nested) = match plan {
            Some(_) => (vec![None; len], vec![Vec::new(); len]),
            None => (Vec::new(), Vec::new()),
        };
        let mut h = x.clone();
        let mut i = 0;
        while i < len {
            let m = &self.children[i].1;
            // A fused op never produces the outputs it runs through: fuse only across outputs nobody asked for.
            let through = |j: usize| !own(j) && deep(j).is_none();
            let next_is_relu = through(i) && self.children.get(i + 1).is_some_and(|(_, r)| r.is_relu());
            let then_pool = self.children.get(i + 2).and_then(|(_, p)| p.max_pool()).filter(|_| through(i + 1));
            let mut step = 1;
            // A folded BatchNorm's output is asked for neither (it would differ from its own by rounding).
            if !train && through(i) && through(i + 1) {
                step = self.run_folded(i, &mut h, deep(i + 2).is_none())?;
            }
            if step == 1
                && next_is_relu
                && then_pool == Some(crate::ops::Pool2dParams::square(2))
                && deep(i + 2).is_none()
            {
                if let Some(fused) = m.forward_relu_max_pool2(&h, train) {
                    h = fused?;
                    step = 3;
                }
            }
            if step == 1 && next_is_relu && deep(i + 1).is_none() {
                if let Some(fused) = m.forward_relu(&h, train) {
                    h = fused?;
                    step = 2;
                }
            }
            if step == 1 {
                match deep(i) {
                    Some(names) => {
                        let (y, taps) = m.forward_taps(&h, train, names)?;
                        h = y;
                        nested[i] = taps;
                    }
                    None => h = m.forward_t(&h, train)?,
                }
            }
            i += step;
            if own(i - 1) {
                kept[i - 1] = Some(h.clone());
            }
        }
        Ok(Tapped { output: h, kept, nested })
    }
}

impl Sequential {
    /// Evaluation mode: child `i` with the affine map of child `i + 1` (BatchNorm) folded into its weights, and
    /// the ReLU of child `i + 2` fused when `relu_ok` (nothing is asked from inside); the number of children it
    /// ran (1: none, `h` untouched).
    fn run_folded(&self, i: usize, h: &mut Tensor, relu_ok: bool) -> Result<usize> {
        let Some(affine) = self.children.get(i + 1).and_then(|(_, bn)| bn.eval_affine()) else {
            return Ok(1);
        };
        let (scale, shift) = affine?;
        let relu = relu_ok && self.children.get(i + 2).is_some_and(|(_, r)| r.is_relu());
        match self.children[i].1.forward_folded(h, &scale, &shift, relu) {
            Some(y) => {
                *h = y?;
                Ok(if relu { 3 } else { 2 })
            }
            None => Ok(1),
        }
    }
}

/// What a tapped forward pass of a [`Sequential`] keeps: per child, whether its own output is asked for and the
/// names asked for inside it.
struct TapPlan<'a> {
    own: Vec<bool>,
    inner: Vec<Vec<&'a str>>,
}

/// What a tapped forward pass of a [`Sequential`] returns: the output, the kept outputs of the children (by
/// child), and the values each child returned for the names asked inside it (by child).
struct Tapped {
    output: Tensor,
    kept: Vec<Option<Tensor>>,
    nested: Vec<Vec<Tensor>>,
}

impl Module for Sequential {
    /// Runs the children in order; a child followed by a `ReLU` (and a 2×2 max pooling of stride 2) runs as one
    /// fused op when it has one (the same values and gradients; [`Sequential::forward_collect`] keeps every
    /// intermediate separate).
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        Ok(self.run(x, train, None)?.output)
    }

    /// Every child's name, each followed by the names inside it prefixed with `child.` (a nested container's).
    fn tap_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, m) in &self.children {
            out.push(name.clone());
            out.extend(m.tap_names().into_iter().map(|inner| format!("{name}.{inner}")));
        }
        out
    }

    /// A child's name is its output; `child.inner` asks the child for its tap `inner`. A fused conv → ReLU
    /// (→ pool) runs unfused exactly where an output inside it is asked for, so a tap has the layer-by-layer
    /// value and everything else runs as in `forward_t`.
    fn forward_taps(&self, x: &Tensor, train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        let len = self.children.len();
        let mut plan = TapPlan { own: vec![false; len], inner: vec![Vec::new(); len] };
        // Per request: the child, and the position of its nested name in `plan.inner[child]`.
        let mut wanted: Vec<(usize, Option<usize>)> = Vec::with_capacity(names.len());
        for &name in names {
            if let Some(i) = self.children.iter().position(|(n, _)| n == name) {
                plan.own[i] = true;
                wanted.push((i, None));
                continue;
            }
            let nested = self.children.iter().enumerate().find_map(|(i, (n, m))| {
                let rest = name.strip_prefix(n.as_str())?.strip_prefix('.')?;
                m.tap_names().iter().any(|t| t == rest).then_some((i, rest))
            });
            let Some((i, rest)) = nested else {
                return Err(unknown_layer("Sequential::forward_taps", name, &self.tap_names()));
            };
            wanted.push((i, Some(plan.inner[i].len())));
            plan.inner[i].push(rest);
        }
        let Tapped { output: y, kept, nested } = self.run(x, train, Some(&plan))?;
        let taps = wanted
            .into_iter()
            .map(|(i, k)| match k {
                None => kept[i].clone(),
                Some(k) => nested[i].get(k).cloned(),
            })
            .map(|t| {
                t.ok_or_else(|| Error::invalid("Sequential::forward_taps", "a child returned fewer taps than asked"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((y, taps))
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
