//! Per-channel input normalisation as the first layer of a classifier (torchvision's `Normalize(mean, std)`
//! moved inside the model), so that data, bounds and every ε stay in pixel units ([0, 1]) and attacks see the
//! normalisation in their gradients — as RobustBench and the authors' AutoAttack wrap their models.

use ndarray::{ArrayD, IxDyn};

use super::{Module, Param};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// `(x − mean[c]) / std[c]` over axis 1 of [N, C, H, W] (or [N, C]); mean and std are buffers (`mean`, `std`),
/// so they are saved with the weights and part of the model's identity.
pub struct Normalize {
    /// Per-channel mean [C] (buffer).
    pub mean: Param,
    /// Per-channel standard deviation [C] (buffer).
    pub std: Param,
}

impl Normalize {
    /// Normalisation with these per-channel means and standard deviations (ImageNet's:
    /// `[0.485, 0.456, 0.406]`, `[0.229, 0.224, 0.225]`).
    ///
    /// Errors: lengths that differ or are zero, a standard deviation that is not finite and > 0, a mean that is
    /// not finite.
    pub fn new(mean: &[f32], std: &[f32]) -> Result<Normalize> {
        if mean.is_empty() || mean.len() != std.len() {
            return Err(Error::invalid(
                "Normalize",
                format!("{} means for {} standard deviations (one of each per channel)", mean.len(), std.len()),
            ));
        }
        if let Some(s) = std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(Error::invalid("Normalize", format!("standard deviation {s} must be finite and > 0")));
        }
        if mean.iter().any(|m| !m.is_finite()) {
            return Err(Error::invalid("Normalize", "means must be finite"));
        }
        let c = mean.len();
        let buffer = |v: &[f32]| Param::buffer(ArrayD::from_shape_vec(IxDyn(&[c]), v.to_vec()).expect("C values"));
        Ok(Normalize { mean: buffer(mean), std: buffer(std) })
    }
}

impl Module for Normalize {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let c = self.mean.shape()[0];
        if x.rank() < 2 || x.shape()[1] != c {
            return Err(Error::ShapeMismatch {
                op: "normalize",
                expected: vec![x.shape().first().copied().unwrap_or(0), c],
                got: x.shape().to_vec(),
            });
        }
        let mut shape = vec![1; x.rank()];
        shape[1] = c;
        let mean = self.mean.tensor().reshape(&shape)?;
        let inv_std = self.std.tensor().powf(-1.0).reshape(&shape)?;
        x.sub(&mean)?.mul(&inv_std)
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        f(&format!("{prefix}mean"), &self.mean);
        f(&format!("{prefix}std"), &self.std);
    }
}

/// A model behind per-channel normalisation: [`Normalize`] then the model, with the model's parameter names
/// unchanged (a weights file for the bare model still loads) plus `normalize.mean` and `normalize.std`, and the
/// model's taps (their `input` is the normalised input). What ART's `preprocessing=(mean, std)` and Foolbox's
/// `preprocessing=dict(mean=…, std=…)` do, inside the differentiable model.
pub struct Normalized {
    normalize: Normalize,
    model: std::sync::Arc<dyn Module>,
}

impl Normalized {
    /// `model` behind `normalize`.
    pub fn new(normalize: Normalize, model: std::sync::Arc<dyn Module>) -> Normalized {
        Normalized { normalize, model }
    }
}

impl Module for Normalized {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.model.forward_t(&self.normalize.forward_t(x, train)?, train)
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.model.visit(prefix, f);
        self.normalize.visit(&format!("{prefix}normalize."), f);
    }

    fn set_training(&self, training: bool) {
        self.model.set_training(training);
    }

    fn is_training(&self) -> bool {
        self.model.is_training()
    }

    fn batch_independent(&self, train: bool) -> bool {
        self.model.batch_independent(train)
    }

    fn mode_independent(&self) -> bool {
        self.model.mode_independent()
    }

    fn tap_names(&self) -> Vec<String> {
        self.model.tap_names()
    }

    fn forward_taps(&self, x: &Tensor, train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        self.model.forward_taps(&self.normalize.forward_t(x, train)?, train, names)
    }
}
