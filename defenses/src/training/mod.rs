//! Adversarial training: a [`Method`] says how one batch is trained (which adversarial inputs, which loss); the
//! [`AdversarialTrainer`] runs epochs over a data set with seeded shuffling, a learning-rate schedule, progress
//! callbacks, per-epoch clean and robust evaluation on held-out data, and checkpoints that resume bit for bit.
//!
//! Methods: MindArmour's set, corrected — [`AdversarialDefense`] (a step on given adversarial inputs),
//! [`AdversarialDefenseWithAttacks`] (replace a ratio of each batch, split across attacks),
//! [`NaturalAdversarialDefense`] (FGSM), [`ProjectedAdversarialDefense`] (Madry et al. 2018, PGD from a random
//! start, all-adversarial batches by default), [`EnsembleAdversarialDefense`] (Tramèr et al. 2018, attacks on
//! other fixed models) — and beyond it [`Trades`] (Zhang et al. 2019), [`Mart`] (Wang et al. 2020), [`FastAt`]
//! (Wong et al. 2020) and [`FreeAt`] (Shafahi et al. 2019).

mod checkpoint;
mod methods;
mod robust;
mod trades;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use armoury::data::Dataset;
use armoury::nn::Module;
use armoury::optim::{LrSchedule, Optimizer};
use armoury::seed::shuffled;
use armoury::{Error, ModuleClassifier, Result, Tensor};

pub use checkpoint::{load_checkpoint, save_checkpoint};
pub use methods::{
    AdversarialDefense, AdversarialDefenseWithAttacks, EnsembleAdversarialDefense, FastAt, FreeAt,
    NaturalAdversarialDefense, ProjectedAdversarialDefense, Standard,
};
pub use robust::{robust_evaluation, RobustEvaluation, RobustnessConfig};
pub use trades::{Mart, Trades};

/// What a training step sees: the model (shared with the attack view), an evaluation-mode classifier over the
/// same parameters for generating attacks, the optimiser, and where in training it is.
pub struct StepContext<'a> {
    /// The model being trained.
    pub model: &'a dyn Module,
    /// The same model as a classifier in evaluation mode (attacks run against it, SPEC §3.6).
    pub classifier: &'a ModuleClassifier,
    /// The optimiser.
    pub optimizer: &'a mut dyn Optimizer,
    /// Epoch (0-based).
    pub epoch: usize,
    /// Batch within the epoch.
    pub batch: usize,
    /// The trainer's seed.
    pub seed: u64,
}

impl StepContext<'_> {
    /// A seed for random choices of this step (the same on a resumed run).
    pub fn step_seed(&self) -> u64 {
        armoury::seed::sample_seed(self.seed, ((self.epoch as u64) << 32) | self.batch as u64, &[])
    }
}

/// What one step did.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepReport {
    /// The training loss of the batch.
    pub loss: f32,
    /// Correct predictions on the inputs trained on (adversarial where the method uses them).
    pub correct: usize,
    /// Samples trained on.
    pub size: usize,
}

/// How a batch is trained.
pub trait Method: Send + Sync {
    /// A name with the main settings.
    fn name(&self) -> String;
    /// One training step (or several, for replay methods) on the batch `x`, `y`.
    fn step(&self, ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport>;
    /// Passes over the data per configured epoch: free training replays each batch `m` times, so it runs
    /// `epochs / m` passes to keep the cost comparable (Shafahi et al.).
    fn epoch_divisor(&self) -> usize {
        1
    }
    /// State carried between steps (free training's perturbation), for checkpoints.
    fn state(&self) -> Vec<(String, ndarray::ArrayD<f32>)> {
        Vec::new()
    }
    /// Restores [`Method::state`].
    fn load_state(&self, _state: &[(String, ndarray::ArrayD<f32>)]) -> Result<()> {
        Ok(())
    }
}

/// Settings of an [`AdversarialTrainer`].
#[derive(Clone)]
pub struct TrainerConfig {
    /// Epochs.
    pub epochs: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Seed of shuffling and of the methods' random choices.
    pub seed: u64,
    /// Learning rate per (fractional) epoch relative to the optimiser's initial rate; evaluated every step.
    pub schedule: LrSchedule,
    /// Input shape (C, H, W), classes and bounds of the model as a classifier.
    pub input_shape: Vec<usize>,
    /// Number of classes.
    pub num_classes: usize,
    /// Input bounds.
    pub bounds: (f32, f32),
    /// Save a checkpoint here after every epoch.
    pub checkpoint: Option<PathBuf>,
}

impl TrainerConfig {
    /// 10 epochs, batch 128, seed 0, constant rate, for 1×28×28 images with 10 classes in [0, 1].
    pub fn mnist_like() -> Self {
        TrainerConfig {
            epochs: 10,
            batch_size: 128,
            seed: 0,
            schedule: LrSchedule::Constant,
            input_shape: vec![1, 28, 28],
            num_classes: 10,
            bounds: (0.0, 1.0),
            checkpoint: None,
        }
    }
}

/// One epoch's figures.
#[derive(Clone, Debug)]
pub struct EpochSummary {
    /// Epoch (0-based).
    pub epoch: usize,
    /// Mean training loss.
    pub loss: f32,
    /// Accuracy on the inputs trained on.
    pub train_accuracy: f32,
    /// Seconds of training (without evaluation).
    pub seconds: f64,
    /// Clean and robust accuracy on held-out data, when configured.
    pub eval: Option<RobustEvaluation>,
}

/// Progress hooks.
pub trait TrainerCallback {
    /// After each step: epoch, batch, batches per epoch, the step's report.
    fn on_step(&mut self, _epoch: usize, _batch: usize, _batches: usize, _report: &StepReport) {}
    /// After each epoch.
    fn on_epoch(&mut self, _summary: &EpochSummary) {}
}

impl TrainerCallback for () {}

/// Runs a [`Method`] over epochs.
pub struct AdversarialTrainer {
    /// Settings.
    pub config: TrainerConfig,
    /// Robust evaluation after each epoch (held-out data and attacks), if any.
    pub evaluation: Option<RobustnessConfig>,
}

impl AdversarialTrainer {
    /// Trains `model` with `method` from `start_epoch` (0, or the epoch after a loaded checkpoint).
    pub fn fit(
        &self,
        model: Arc<dyn Module>,
        optimizer: &mut dyn Optimizer,
        method: &dyn Method,
        train: &Dataset,
        start_epoch: usize,
        callback: &mut dyn TrainerCallback,
    ) -> Result<Vec<EpochSummary>> {
        let c = &self.config;
        if c.batch_size == 0 || train.is_empty() {
            return Err(Error::invalid("AdversarialTrainer::fit", "empty training set or batch size 0"));
        }
        let classifier = ModuleClassifier::new(model.clone(), &c.input_shape, c.num_classes, c.bounds)?;
        let divisor = method.epoch_divisor().max(1);
        let epochs = c.epochs / divisor;
        if c.epochs > 0 && epochs == 0 {
            let why = format!(
                "{} makes epochs / {divisor} passes over the data: {} epochs make none",
                method.name(),
                c.epochs
            );
            return Err(Error::invalid("AdversarialTrainer::fit", why));
        }
        let base_lr = optimizer.lr();
        let n = train.len();
        let batches = n.div_ceil(c.batch_size);
        let mut out = Vec::new();
        for epoch in start_epoch..epochs {
            let start = Instant::now();
            let order = shuffled(n, c.seed, epoch as u64);
            let (mut loss, mut correct, mut seen) = (0.0f64, 0usize, 0usize);
            for (b, idx) in order.chunks(c.batch_size).enumerate() {
                optimizer.set_lr(c.schedule.lr_at(base_lr, epoch as f32 + b as f32 / batches as f32));
                let x = train.images().index_select(0, idx)?;
                let y: Vec<usize> = idx.iter().map(|&i| train.labels()[i]).collect();
                let mut ctx = StepContext {
                    model: model.as_ref(),
                    classifier: &classifier,
                    optimizer,
                    epoch,
                    batch: b,
                    seed: c.seed,
                };
                let r = method.step(&mut ctx, &x, &y)?;
                loss += r.loss as f64 * r.size as f64;
                correct += r.correct;
                seen += r.size;
                callback.on_step(epoch, b, batches, &r);
            }
            optimizer.set_lr(base_lr);
            let seconds = start.elapsed().as_secs_f64();
            let eval = match &self.evaluation {
                Some(cfg) => Some(robust_evaluation(&classifier, cfg)?),
                None => None,
            };
            if let Some(path) = &c.checkpoint {
                save_checkpoint(path, model.as_ref(), &*optimizer, method, epoch)?;
            }
            let summary = EpochSummary {
                epoch,
                loss: (loss / seen.max(1) as f64) as f32,
                train_accuracy: correct as f32 / seen.max(1) as f32,
                seconds,
                eval,
            };
            callback.on_epoch(&summary);
            out.push(summary);
        }
        Ok(out)
    }
}

/// One optimiser step on a loss that is a mean over the batch, built and differentiated a piece of samples at a
/// time in parallel ([`armoury::train::backward_in_pieces`]): `f(range)` returns the piece's summed loss
/// (divided by the batch size here) and its correct predictions. Returns the mean loss and the correct count.
pub(crate) fn optimise_pieces(
    model: &dyn Module,
    optimizer: &mut dyn Optimizer,
    n: usize,
    f: impl Fn(std::ops::Range<usize>) -> Result<(Tensor, usize)> + Sync,
) -> Result<(f32, usize)> {
    let scale = 1.0 / n.max(1) as f32;
    let (grads, loss, correct) = armoury::train::backward_in_pieces(model, n, |r| {
        let (loss, correct) = f(r)?;
        Ok((loss.mul_scalar(scale), correct))
    })?;
    optimizer.step(&grads)?;
    Ok((loss, correct.iter().sum()))
}

/// Correct predictions of logits `z` [N, K] against `y`.
pub(crate) fn correct(z: &Tensor, y: &[usize]) -> usize {
    let z2 = z.value().to_owned().into_dimensionality::<ndarray::Ix2>().expect("logits are a matrix");
    armoury::classifier::argmax_rows(&z2).iter().zip(y).filter(|(p, l)| p == l).count()
}
