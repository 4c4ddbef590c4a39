//! Training: one loop for every training method. The [`Trainer`] runs epochs over a data set — seeded shuffling
//! ([`crate::seed::shuffled`]), mini-batches, a learning-rate schedule given in epochs, gradient clipping,
//! progress callbacks, clean evaluation and clean/robust evaluation ([`crate::robustness`]) after each epoch,
//! and checkpoints that resume bit for bit — while a [`Method`] says what one step does to a batch: plain
//! cross-entropy ([`Standard`], the default) or an adversarial-training method (the defenses crate's Madry
//! PGD-AT, TRADES, MART, fast, free and ensemble adversarial training, MindArmour's set).
//!
//! Every step gets a fresh seed ([`step_seed`]: the run's seed, the epoch and the batch through
//! [`crate::seed::derive`]), so an attack's random start differs at every step and every epoch, and the whole run
//! is reproducible bit for bit whatever the thread count.
//!
//! [`fit`] is plain training in one call; [`train_step`], [`backward_in_pieces`] and [`evaluate`] are the
//! pieces, for custom loops.

mod checkpoint;
mod method;
mod step;

use std::path::{Path, PathBuf};
use std::time::Instant;

pub use checkpoint::{load_checkpoint, save_checkpoint};
pub use method::{step_seed, Method, ModelView, Standard, StepContext, StepReport};
pub use step::{backward_in_pieces, correct, evaluate, optimise_pieces, piece_ranges, train_step, Evaluation, PIECE};

use crate::data::Dataset;
use crate::nn::Module;
use crate::optim::{LrSchedule, Optimizer};
use crate::robustness::{robust_evaluation, RobustEvaluation, RobustnessConfig};
use crate::{Error, Result};

/// Settings of a training run.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Epochs (a replaying method makes ⌈epochs / replays⌉ passes over the data).
    pub epochs: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Seed of the per-epoch shuffles and of every step's random choices.
    pub seed: u64,
    /// Learning rate per epoch, relative to the optimiser's rate when training starts.
    pub schedule: LrSchedule,
    /// Evaluate the schedule at every step, at the fractional epoch reached (a cyclic schedule as in fast
    /// adversarial training), rather than once per epoch.
    pub lr_per_step: bool,
    /// Clip the global gradient norm of every update to this value.
    pub clip_grad_norm: Option<f32>,
    /// Batch size of the clean evaluation after each epoch.
    pub eval_batch_size: usize,
    /// Input bounds of the model as a classifier (what attacks may perturb within).
    pub bounds: (f32, f32),
    /// Save a checkpoint here after every epoch.
    pub checkpoint: Option<PathBuf>,
}

impl Default for TrainConfig {
    /// 3 epochs of batch 128, seed 0, constant rate, inputs in [0, 1], no clipping, no checkpoint.
    fn default() -> Self {
        TrainConfig {
            epochs: 3,
            batch_size: 128,
            seed: 0,
            schedule: LrSchedule::Constant,
            lr_per_step: false,
            clip_grad_norm: None,
            eval_batch_size: 1000,
            bounds: (0.0, 1.0),
            checkpoint: None,
        }
    }
}

/// What one epoch (one pass over the data) did.
#[derive(Clone, Debug)]
pub struct EpochReport {
    /// Pass over the data (0-based).
    pub epoch: usize,
    /// Mean training loss over the pass.
    pub train_loss: f32,
    /// Training accuracy over the pass (of the model as it was at each batch, on the inputs trained on).
    pub train_accuracy: f32,
    /// Clean evaluation on the held-out set, if one was given.
    pub test: Option<Evaluation>,
    /// Clean and robust accuracy under attack, if configured.
    pub robust: Option<RobustEvaluation>,
    /// Wall time of the training part of the pass (without evaluation).
    pub seconds: f64,
    /// Learning rate at the start of the pass.
    pub lr: f32,
}

/// Hooks called during training (for progress bars and logs). Both default to doing nothing.
pub trait TrainCallback {
    /// After each step.
    fn on_step(&mut self, _report: &StepReport) {}
    /// After each epoch (and its evaluation).
    fn on_epoch(&mut self, _report: &EpochReport) {}
}

impl TrainCallback for () {}

/// The training loop: a [`TrainConfig`], a [`Method`] ([`Standard`] unless set), and optionally held-out data
/// for clean evaluation, a robust evaluation and a checkpoint to resume from.
pub struct Trainer<'a> {
    config: TrainConfig,
    method: &'a dyn Method,
    test: Option<&'a Dataset>,
    robustness: Option<&'a RobustnessConfig>,
    resume: Option<&'a Path>,
}

impl<'a> Trainer<'a> {
    /// Standard training with `config`.
    pub fn new(config: TrainConfig) -> Trainer<'a> {
        Trainer { config, method: &Standard, test: None, robustness: None, resume: None }
    }

    /// Trains with `method`.
    pub fn method(mut self, method: &'a dyn Method) -> Self {
        self.method = method;
        self
    }

    /// Evaluates on `test` after each epoch ([`evaluate`]: accuracy, loss, confusion matrix).
    pub fn test(mut self, test: Option<&'a Dataset>) -> Self {
        self.test = test;
        self
    }

    /// Runs [`robust_evaluation`] after each epoch.
    pub fn robustness(mut self, cfg: &'a RobustnessConfig) -> Self {
        self.robustness = Some(cfg);
        self
    }

    /// Resumes from the checkpoint at `path` ([`load_checkpoint`]: it must come from a run with the same seed,
    /// batch size, method and settings), continuing bit for bit as if the run had not stopped.
    pub fn resume(mut self, path: &'a Path) -> Self {
        self.resume = Some(path);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Trains `model` on `train`, returning a report per pass run.
    pub fn fit(
        &self,
        model: &dyn Module,
        optimizer: &mut dyn Optimizer,
        train: &Dataset,
        callback: &mut dyn TrainCallback,
    ) -> Result<Vec<EpochReport>> {
        let (c, method) = (&self.config, self.method);
        if c.batch_size == 0 || c.eval_batch_size == 0 {
            return Err(Error::invalid("fit", "batch sizes must be positive"));
        }
        if train.is_empty() {
            return Err(Error::invalid("fit", "empty training set"));
        }
        method.validate()?;
        let replays = method.replays();
        if replays == 0 {
            return Err(Error::invalid("fit", format!("{}: a method replays each batch at least once", method.name())));
        }
        // The classes are the model's output width, never the data's largest label; a model whose output is not
        // one score per class (an auto-encoder under a reconstruction method) keeps the data's count.
        let classes = match crate::nn::output_shape(model, train.image_shape())?[..] {
            [1, k] => {
                train.check_labels(k, "training")?;
                k
            }
            _ => train.num_classes(),
        };
        let view = ModelView::new(model, &train.image_shape(), classes, c.bounds)?;
        let start = match self.resume {
            Some(path) => load_checkpoint(path, model, optimizer, method, c)?,
            None => 0,
        };
        let base_lr = optimizer.lr();
        let (n, passes) = (train.len(), c.epochs.div_ceil(replays));
        let batches = n.div_ceil(c.batch_size);
        // The schedule is in epochs: pass p, batch b of a method replaying each batch m times is epoch
        // (p + b / batches)·m — so an m-replay method reaches the milestones given in epochs.
        let lr_at = |pass: usize, b: usize| {
            let at = if c.lr_per_step { pass as f32 + b as f32 / batches as f32 } else { pass as f32 };
            c.schedule.lr_at(base_lr, at * replays as f32)
        };
        let mut reports = Vec::with_capacity(passes.saturating_sub(start));
        for epoch in start..passes {
            let lr = lr_at(epoch, 0);
            optimizer.set_lr(lr);
            let timer = Instant::now();
            let order = crate::seed::shuffled(n, c.seed, epoch as u64);
            let (mut loss_sum, mut correct, mut seen) = (0.0f64, 0usize, 0usize);
            for (b, idx) in order.chunks(c.batch_size).enumerate() {
                let step_lr = if c.lr_per_step { lr_at(epoch, b) } else { lr };
                optimizer.set_lr(step_lr);
                let x = train.images().index_select(0, idx)?;
                let y: Vec<usize> = idx.iter().map(|&i| train.labels()[i]).collect();
                let mut ctx = StepContext {
                    model,
                    classifier: &view,
                    optimizer: &mut *optimizer,
                    clip_grad_norm: c.clip_grad_norm,
                    epoch,
                    batch: b,
                    seed: step_seed(c.seed, epoch, b),
                };
                let r = StepReport { epoch, batch: b, batches, lr: step_lr, ..method.step(&mut ctx, &x, &y)? };
                loss_sum += r.loss as f64 * r.size as f64;
                correct += r.correct;
                seen += r.size;
                callback.on_step(&r);
            }
            let seconds = timer.elapsed().as_secs_f64();
            optimizer.set_lr(base_lr);
            let test = self.test.map(|t| evaluate(model, t, c.eval_batch_size)).transpose()?;
            let robust = self.robustness.map(|r| robust_evaluation(&view, r)).transpose()?;
            if let Some(path) = &c.checkpoint {
                save_checkpoint(path, model, &*optimizer, method, c, epoch)?;
            }
            let seen = seen.max(1);
            let report = EpochReport {
                epoch,
                train_loss: (loss_sum / seen as f64) as f32,
                train_accuracy: correct as f32 / seen as f32,
                test,
                robust,
                seconds,
                lr,
            };
            callback.on_epoch(&report);
            reports.push(report);
        }
        Ok(reports)
    }
}

/// Standard training ([`Standard`]: cross-entropy) of `model` on `train` for `cfg.epochs` epochs, evaluating on
/// `test` after each epoch: [`Trainer`] in one call.
pub fn fit(
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    train: &Dataset,
    test: Option<&Dataset>,
    cfg: &TrainConfig,
    callback: &mut dyn TrainCallback,
) -> Result<Vec<EpochReport>> {
    Trainer::new(cfg.clone()).test(test).fit(model, opt, train, callback)
}
