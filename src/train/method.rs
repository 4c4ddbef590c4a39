//! What one training step does: a [`Method`] gets a batch and a [`StepContext`] (the model, the optimiser, an
//! evaluation-mode classifier view of the same parameters for attacks, where in training it is and a fresh
//! seed), and trains on it. [`Standard`] is plain cross-entropy training.

use ndarray::ArrayD;

use super::step::{optimise_pieces, train_step};
use crate::autograd::Gradients;
use crate::classifier::{Classifier, Counters};
use crate::nn::{Module, ModuleExt};
use crate::optim::{clip_grad_norm, Optimizer};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// What a training step sees.
pub struct StepContext<'a> {
    /// The model being trained (training-mode forwards for the loss).
    pub model: &'a dyn Module,
    /// The same parameters as a classifier in evaluation mode: attacks run against it, so dropout and batch
    /// statistics do not change the adversarial inputs (Madry et al. 2018 attack the model as deployed).
    pub classifier: &'a dyn Classifier,
    /// The optimiser.
    pub optimizer: &'a mut dyn Optimizer,
    /// Clip the global gradient norm of every update to this value.
    pub clip_grad_norm: Option<f32>,
    /// Pass over the data (0-based; an epoch, or a pass of `replays` epochs for a replaying method).
    pub epoch: usize,
    /// Batch within the pass (0-based).
    pub batch: usize,
    /// The seed of this step's random choices, [`step_seed`] of the run's seed: fresh at every step and every
    /// epoch, the same on a resumed run.
    pub seed: u64,
}

/// The seed of step `batch` of pass `epoch` of a run seeded with `seed` ([`crate::seed::derive`] twice).
pub fn step_seed(seed: u64, epoch: usize, batch: usize) -> u64 {
    crate::seed::derive(crate::seed::derive(seed, epoch as u64), batch as u64)
}

impl StepContext<'_> {
    /// One optimiser step on a loss that is a mean over the `n` samples of the batch, built a piece at a time
    /// ([`optimise_pieces`]), clipped as configured. Returns the mean loss and the correct predictions.
    pub fn optimise_pieces(
        &mut self,
        n: usize,
        f: impl Fn(std::ops::Range<usize>) -> Result<(Tensor, usize)> + Sync,
    ) -> Result<(f32, usize)> {
        optimise_pieces(self.model, self.optimizer, self.clip_grad_norm, n, f)
    }

    /// One optimiser step with `grads` (parameter gradients a method computed itself), clipped as configured.
    pub fn update(&mut self, mut grads: Gradients) -> Result<()> {
        if let Some(max_norm) = self.clip_grad_norm {
            clip_grad_norm(&mut grads, &self.model.parameters(), max_norm)?;
        }
        self.optimizer.step(&grads)
    }

    /// One cross-entropy step on `x` ([`train_step`]): plain training, or training on inputs a method made.
    pub fn cross_entropy_step(&mut self, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let (loss, correct) = train_step(self.model, self.optimizer, x, y, self.clip_grad_norm)?;
        Ok(StepReport::of(loss, correct, y.len()))
    }
}

/// What one step did. A method fills the loss, the correct count and the size; the trainer the rest.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepReport {
    /// Pass over the data (0-based).
    pub epoch: usize,
    /// Batch within the pass (0-based).
    pub batch: usize,
    /// Batches per pass.
    pub batches: usize,
    /// The training loss of the batch.
    pub loss: f32,
    /// Correct predictions on the inputs trained on (adversarial where the method uses them).
    pub correct: usize,
    /// Samples trained on.
    pub size: usize,
    /// The learning rate of the step.
    pub lr: f32,
}

impl StepReport {
    /// A method's report: loss, correct predictions, samples.
    pub fn of(loss: f32, correct: usize, size: usize) -> StepReport {
        StepReport { loss, correct, size, ..StepReport::default() }
    }
}

/// How a batch is trained: plain training ([`Standard`]) or an adversarial-training method.
pub trait Method: Send + Sync {
    /// A short stable identifier (`standard`, `pgd-at`, `trades`, …): checkpoints record it.
    fn kind(&self) -> &'static str;

    /// A name with the settings that change what the method computes: checkpoints record it, and resuming
    /// under another name is an error.
    fn name(&self) -> String;

    /// Checks the settings; the trainer calls it before anything runs.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// One training step (or several, for a replaying method) on the batch `x`, `y`.
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport>;

    /// Optimiser steps per batch: a method that replays each batch `m` times (free adversarial training) makes
    /// `m` epochs' worth of updates per pass, and the trainer runs ⌈epochs / m⌉ passes.
    fn replays(&self) -> usize {
        1
    }

    /// State carried between steps (free training's perturbation), for checkpoints.
    fn state(&self) -> Vec<(String, ArrayD<f32>)> {
        Vec::new()
    }

    /// Restores [`Method::state`].
    fn load_state(&self, _state: &[(String, ArrayD<f32>)]) -> Result<()> {
        Ok(())
    }
}

/// Standard training: cross-entropy on the clean batch ([`train_step`]), the baseline every defense is
/// compared with.
#[derive(Clone, Copy, Debug, Default)]
pub struct Standard;

impl Method for Standard {
    fn kind(&self) -> &'static str {
        "standard"
    }
    fn name(&self) -> String {
        "standard".into()
    }
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        ctx.cross_entropy_step(x, y)
    }
}

/// A borrowed module as a [`Classifier`] in evaluation mode: the view the trainer hands to methods and to the
/// robust evaluation (what [`crate::ModuleClassifier`] computes, without owning the module).
pub struct ModelView<'a> {
    module: &'a dyn Module,
    input_shape: Vec<usize>,
    num_classes: usize,
    bounds: (f32, f32),
    counters: Counters,
}

impl<'a> ModelView<'a> {
    /// `module` taking inputs of `input_shape` (C, H, W) into `num_classes` classes, inputs within `bounds`.
    pub fn new(
        module: &'a dyn Module,
        input_shape: &[usize],
        num_classes: usize,
        bounds: (f32, f32),
    ) -> Result<ModelView<'a>> {
        if !bounds.0.is_finite() || !bounds.1.is_finite() || bounds.0 >= bounds.1 {
            return Err(Error::invalid("ModelView::new", format!("bounds {bounds:?} must be finite with min < max")));
        }
        if num_classes < 2 || input_shape.is_empty() || input_shape.contains(&0) {
            return Err(Error::invalid(
                "ModelView::new",
                format!("{num_classes} classes, input shape {input_shape:?}"),
            ));
        }
        Ok(ModelView { module, input_shape: input_shape.to_vec(), num_classes, bounds, counters: Counters::default() })
    }
}

impl Classifier for ModelView<'_> {
    fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }
    fn num_classes(&self) -> usize {
        self.num_classes
    }
    fn bounds(&self) -> (f32, f32) {
        self.bounds
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.module.forward_t(x, false)
    }
    fn counters(&self) -> &Counters {
        &self.counters
    }
}
