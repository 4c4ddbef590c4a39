//! Training: seeded shuffling, mini-batches, epochs, learning-rate schedules, callbacks for progress, and
//! [`evaluate`] for accuracy, loss and the confusion matrix.

use std::time::Instant;

use ndarray::Array2;

use crate::classifier::argmax_rows;
use crate::data::Dataset;
use crate::nn::{Module, ModuleExt};
use crate::ops::Reduction;
use crate::optim::{clip_grad_norm, LrSchedule, Optimizer};
use crate::tensor::{no_grad, Tensor};
use crate::{Error, Result};

/// Settings of [`fit`].
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Passes over the training set.
    pub epochs: usize,
    /// Samples per optimiser step.
    pub batch_size: usize,
    /// Seed of the per-epoch shuffles.
    pub seed: u64,
    /// Learning rate per epoch, relative to the optimiser's rate when training starts.
    pub schedule: LrSchedule,
    /// Clip the global gradient norm to this value.
    pub clip_grad_norm: Option<f32>,
    /// Batch size of the evaluation after each epoch.
    pub eval_batch_size: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 3,
            batch_size: 128,
            seed: 0,
            schedule: LrSchedule::Constant,
            clip_grad_norm: None,
            eval_batch_size: 1000,
        }
    }
}

/// What one optimiser step did.
#[derive(Clone, Debug)]
pub struct BatchReport {
    /// Epoch (0-based).
    pub epoch: usize,
    /// Batch within the epoch (0-based).
    pub batch: usize,
    /// Batches per epoch.
    pub batches: usize,
    /// Mean loss of the batch.
    pub loss: f32,
    /// Correct predictions in the batch.
    pub correct: usize,
    /// Batch size.
    pub size: usize,
    /// Learning rate used.
    pub lr: f32,
}

/// What one epoch did.
#[derive(Clone, Debug)]
pub struct EpochReport {
    /// Epoch (0-based).
    pub epoch: usize,
    /// Mean training loss over the epoch.
    pub train_loss: f32,
    /// Training accuracy over the epoch (of the model as it was at each batch).
    pub train_accuracy: f32,
    /// Evaluation on the held-out set, if one was given.
    pub test: Option<Evaluation>,
    /// Wall time of the training part of the epoch.
    pub seconds: f64,
    /// Learning rate of the epoch.
    pub lr: f32,
}

/// Hooks called during training (for progress bars and logs). Both default to doing nothing.
pub trait TrainCallback {
    /// After each optimiser step.
    fn on_batch(&mut self, _report: &BatchReport) {}
    /// After each epoch (and its evaluation).
    fn on_epoch(&mut self, _report: &EpochReport) {}
}

impl TrainCallback for () {}

/// Accuracy, mean loss and confusion matrix of a model on a data set.
#[derive(Clone, Debug)]
pub struct Evaluation {
    /// Fraction classified correctly.
    pub accuracy: f32,
    /// Mean cross-entropy.
    pub loss: f32,
    /// `confusion[[true, predicted]]` counts.
    pub confusion: Array2<u64>,
    /// Samples evaluated.
    pub samples: usize,
}

/// One optimiser step on cross-entropy: forward in training mode, backward to the parameters, update.
/// Returns the mean loss and the number of correct predictions.
pub fn train_step(
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    x: &Tensor,
    labels: &[usize],
    clip: Option<f32>,
) -> Result<(f32, usize)> {
    let n = labels.len();
    if x.rank() == 0 || x.shape()[0] != n {
        return Err(Error::ShapeMismatch { op: "train_step", expected: vec![n], got: x.shape().to_vec() });
    }
    let (mut grads, loss, correct) = backward_in_pieces(model, n, |r| {
        let logits = model.forward_t(&x.narrow(0, r.start, r.len())?, true)?;
        // The piece's share of the batch mean.
        let loss = logits.cross_entropy(&labels[r.clone()], Reduction::Sum)?.mul_scalar(1.0 / n as f32);
        let z = logits.value().to_owned().into_dimensionality().expect("logits are a matrix");
        let correct = argmax_rows(&z).iter().zip(&labels[r]).filter(|(p, y)| p == y).count();
        Ok((loss, correct))
    })?;
    if let Some(max_norm) = clip {
        clip_grad_norm(&mut grads, &model.parameters(), max_norm)?;
    }
    opt.step(&grads)?;
    Ok((loss, correct.iter().sum()))
}

/// Samples per piece in [`backward_in_pieces`] (as [`crate::classifier::CHUNK`]: a piece's activations stay in
/// cache and its buffers are reused rather than page-faulted in afresh).
pub const PIECE: usize = crate::classifier::CHUNK;

/// The pieces [`backward_in_pieces`] splits a batch of `n` samples into: [`PIECE`] samples each, or the whole
/// batch for a model whose samples are coupled in training mode.
pub fn piece_ranges(model: &dyn Module, n: usize) -> Vec<std::ops::Range<usize>> {
    if model.batch_independent(true) && n > PIECE {
        (0..n).step_by(PIECE).map(|s| s..(s + PIECE).min(n)).collect()
    } else {
        std::iter::once(0..n).collect()
    }
}

/// The parameter gradients of a loss that is a sum over samples, computed on pieces of [`PIECE`] samples in
/// parallel and added in piece order — so the result does not depend on the thread count. `f(range)` builds the
/// loss of the samples in `range` (its share of the total: divide by the batch size for a mean) and anything else
/// the caller wants back from that piece. Returns the summed gradients, the total loss and the pieces' extras in
/// order. A model whose samples are coupled in training mode (BatchNorm on batch statistics, dropout) is run as
/// one piece.
pub fn backward_in_pieces<T: Send>(
    model: &dyn Module,
    n: usize,
    f: impl Fn(std::ops::Range<usize>) -> Result<(Tensor, T)> + Sync,
) -> Result<(crate::autograd::Gradients, f32, Vec<T>)> {
    use rayon::prelude::*;
    let ranges = piece_ranges(model, n);
    // enable_grad: a piece may be stolen by a worker waiting inside a no_grad scope.
    let parts: Vec<(crate::autograd::Gradients, f32, T)> = ranges
        .into_par_iter()
        .map(|r| {
            crate::tensor::enable_grad(|| {
                let (loss, extra) = f(r)?;
                let grads = loss.backward()?;
                Ok((grads, loss.item()?, extra))
            })
        })
        .collect::<Result<_>>()?;
    let mut total = crate::autograd::Gradients::default();
    let (mut loss, mut extras) = (0.0f64, Vec::with_capacity(parts.len()));
    for (g, l, e) in parts {
        total.accumulate(g);
        loss += l as f64;
        extras.push(e);
    }
    Ok((total, loss as f32, extras))
}

/// Trains `model` on `train` for `cfg.epochs` epochs, evaluating on `test` after each epoch.
pub fn fit(
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    train: &Dataset,
    test: Option<&Dataset>,
    cfg: &TrainConfig,
    callback: &mut dyn TrainCallback,
) -> Result<Vec<EpochReport>> {
    if cfg.batch_size == 0 || cfg.eval_batch_size == 0 {
        return Err(Error::invalid("fit", "batch sizes must be positive"));
    }
    if train.is_empty() {
        return Err(Error::invalid("fit", "empty training set"));
    }
    let base_lr = opt.lr();
    let n = train.len();
    let batches = n.div_ceil(cfg.batch_size);
    let mut reports = Vec::with_capacity(cfg.epochs);
    for epoch in 0..cfg.epochs {
        let lr = cfg.schedule.lr_at(base_lr, epoch as f32);
        opt.set_lr(lr);
        let start = Instant::now();
        let order = crate::seed::shuffled(n, cfg.seed, epoch as u64);
        let (mut loss_sum, mut correct) = (0.0f64, 0usize);
        for (b, idx) in order.chunks(cfg.batch_size).enumerate() {
            let x = train.images().index_select(0, idx)?;
            let y: Vec<usize> = idx.iter().map(|&i| train.labels()[i]).collect();
            let (loss, c) = train_step(model, opt, &x, &y, cfg.clip_grad_norm)?;
            loss_sum += loss as f64 * idx.len() as f64;
            correct += c;
            callback.on_batch(&BatchReport { epoch, batch: b, batches, loss, correct: c, size: idx.len(), lr });
        }
        let seconds = start.elapsed().as_secs_f64();
        let test = test.map(|t| evaluate(model, t, cfg.eval_batch_size)).transpose()?;
        let report = EpochReport {
            epoch,
            train_loss: (loss_sum / n as f64) as f32,
            train_accuracy: correct as f32 / n as f32,
            test,
            seconds,
            lr,
        };
        callback.on_epoch(&report);
        reports.push(report);
    }
    Ok(reports)
}

/// Accuracy, loss and confusion matrix of `model` (evaluation mode, no graph) on `data`.
pub fn evaluate(model: &dyn Module, data: &Dataset, batch_size: usize) -> Result<Evaluation> {
    if batch_size == 0 || data.is_empty() {
        return Err(Error::invalid("evaluate", "batch size and data set must be non-empty"));
    }
    let k = data.num_classes();
    let mut confusion = Array2::zeros((k, k));
    let mut loss_sum = 0.0f64;
    for (x, y) in data.batches(batch_size)? {
        let logits = no_grad(|| model.forward_t(&x, false))?;
        loss_sum += logits.cross_entropy(&y, Reduction::Sum)?.item()? as f64;
        let z = logits.value().to_owned().into_dimensionality().expect("logits are a matrix");
        for (p, &t) in argmax_rows(&z).into_iter().zip(&y) {
            confusion[[t, p.min(k - 1)]] += 1;
        }
    }
    let correct: u64 = (0..k).map(|i| confusion[[i, i]]).sum();
    Ok(Evaluation {
        accuracy: correct as f32 / data.len() as f32,
        loss: (loss_sum / data.len() as f64) as f32,
        confusion,
        samples: data.len(),
    })
}
