//! The pieces of a training step: [`train_step`] (cross-entropy), [`backward_in_pieces`] and
//! [`optimise_pieces`] (a batch's gradient computed a piece at a time in parallel, summed in order), and
//! [`evaluate`] for accuracy, loss and the confusion matrix.

use ndarray::Array2;

use crate::classifier::argmax_rows;
use crate::data::Dataset;
use crate::nn::{Module, ModuleExt};
use crate::ops::Reduction;
use crate::optim::{clip_grad_norm, Optimizer};
use crate::tensor::{no_grad, Tensor};
use crate::{Error, Result};

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

/// One optimiser step on a loss that is a mean over the batch, built and differentiated a piece of samples at a
/// time in parallel ([`backward_in_pieces`]): `f(range)` returns the piece's summed loss (divided by the batch
/// size here) and its correct predictions. The gradient's global norm is clipped to `clip` when given. Returns
/// the mean loss and the correct count.
pub fn optimise_pieces(
    model: &dyn Module,
    optimizer: &mut dyn Optimizer,
    clip: Option<f32>,
    n: usize,
    f: impl Fn(std::ops::Range<usize>) -> Result<(Tensor, usize)> + Sync,
) -> Result<(f32, usize)> {
    let scale = 1.0 / n.max(1) as f32;
    let (mut grads, loss, correct) = backward_in_pieces(model, n, |r| {
        let (loss, correct) = f(r)?;
        Ok((loss.mul_scalar(scale), correct))
    })?;
    if let Some(max_norm) = clip {
        clip_grad_norm(&mut grads, &model.parameters(), max_norm)?;
    }
    optimizer.step(&grads)?;
    Ok((loss, correct.iter().sum()))
}

/// Correct predictions of logits `z` `[N, K]` against `y`.
pub fn correct(z: &Tensor, y: &[usize]) -> usize {
    match z.value().view().into_dimensionality::<ndarray::Ix2>() {
        Ok(z2) => argmax_rows(&z2.to_owned()).iter().zip(y).filter(|(p, l)| p == l).count(),
        Err(_) => 0,
    }
}

/// Accuracy, loss and confusion matrix of `model` (evaluation mode, no graph) on `data`.
pub fn evaluate(model: &dyn Module, data: &Dataset, batch_size: usize) -> Result<Evaluation> {
    if batch_size == 0 || data.is_empty() {
        return Err(Error::invalid("evaluate", "batch size and data set must be non-empty"));
    }
    // The model's classes (its output width), never the data's largest label.
    let k = crate::nn::output_classes(model, data.image_shape())?;
    data.check_labels(k, "evaluation")?;
    crate::limits::check_classes("evaluate: the model's class count", k)?;
    let cells = (k as u128) * (k as u128) * 8;
    crate::limits::check_bytes(|| format!("evaluate: a {k}×{k} confusion matrix"), cells, crate::limits::max_memory())?;
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
