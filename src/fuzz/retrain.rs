//! Retraining on what the fuzzer found: fine-tune the model on the clean training images plus the failures of
//! half the seeds, and measure the failures of the other half (held out: their seeds were never trained on) and
//! the clean test images, before and after.

use std::sync::Arc;

use super::{Failure, FuzzReport};
use crate::data::{Dataset, TrainTest};
use crate::nn::{Module, ModuleExt};
use crate::optim::{Adam, AdamConfig};
use crate::train::train_step;
use crate::{Classifier, Result, Tensor};

/// What retraining on fuzzed failures did.
#[derive(Clone, Debug, PartialEq)]
pub struct Retrain {
    /// Fuzzed inputs trained on (failures and shrunk failures of the even-numbered seeds).
    pub train_fuzzed: usize,
    /// Held-out failures measured (those of the odd-numbered seeds).
    pub held_out: usize,
    /// Accuracy on the held-out failures before retraining.
    pub fuzzed_before: f64,
    /// The same after.
    pub fuzzed_after: f64,
    /// Accuracy on the clean test images after the seeds, before retraining.
    pub clean_before: f64,
    /// The same after.
    pub clean_after: f64,
}

/// How to retrain: Adam at `lr`, batches of `batch_size`, `epochs` passes, shuffled with `seed`.
#[derive(Clone, Debug, PartialEq)]
pub struct RetrainConfig {
    /// Passes over the data.
    pub epochs: usize,
    /// Adam's learning rate.
    pub lr: f32,
    /// Samples per step.
    pub batch_size: usize,
    /// The shuffles' seed.
    pub seed: u64,
}

impl Default for RetrainConfig {
    /// One epoch of Adam at lr 1e-4, batch 128, seed 0.
    fn default() -> Self {
        RetrainConfig { epochs: 1, lr: 1e-4, batch_size: 128, seed: 0 }
    }
}

fn accuracy(clf: &dyn Classifier, x: &Tensor, y: &[usize]) -> Result<f64> {
    if y.is_empty() {
        return Ok(0.0);
    }
    let p = clf.predict(x)?;
    Ok(p.iter().zip(y).filter(|(a, b)| a == b).count() as f64 / y.len() as f64)
}

fn stack(images: &[&[f32]], shape: &[usize]) -> Result<Tensor> {
    let flat: Vec<f32> = images.iter().flat_map(|v| v.iter().copied()).collect();
    let mut dims = vec![images.len()];
    dims.extend_from_slice(shape);
    Tensor::from_vec(flat, &dims)
}

/// Fine-tunes `module` (which `clf` classifies with) by cross-entropy steps ([`train_step`]) on every clean
/// training image of `set` plus the failures (and shrunk failures, repeated to about a sixth of the data) of the
/// even-numbered seeds of `report`, and measures the failures of the odd-numbered seeds and the clean test
/// images after the first `seeds` (the fuzzer's seeds), before and after.
pub fn retrain(
    module: &Arc<dyn Module>,
    clf: &dyn Classifier,
    report: &FuzzReport,
    set: &TrainTest,
    seeds: usize,
    cfg: &RetrainConfig,
) -> Result<Retrain> {
    let shape = clf.input_shape().to_vec();
    let (train_f, held_f): (Vec<&Failure>, Vec<&Failure>) = report.failures.iter().partition(|f| f.seed % 2 == 0);
    let mut fuzz_imgs: Vec<&[f32]> = train_f.iter().map(|f| f.image.as_slice()).collect();
    fuzz_imgs.extend(train_f.iter().filter_map(|f| f.shrunk.as_ref()).map(|s| s.image.as_slice()));
    let mut fuzz_labels: Vec<usize> = train_f.iter().map(|f| f.label).collect();
    fuzz_labels.extend(train_f.iter().filter(|f| f.shrunk.is_some()).map(|f| f.label));
    let held_x = stack(&held_f.iter().map(|f| f.image.as_slice()).collect::<Vec<_>>(), &shape)?;
    let held_y: Vec<usize> = held_f.iter().map(|f| f.label).collect();
    let (clean_x, clean_y) = set.test.batch(seeds.min(set.test.len().saturating_sub(1))..set.test.len())?;
    let (fuzzed_before, clean_before) = (accuracy(clf, &held_x, &held_y)?, accuracy(clf, &clean_x, &clean_y)?);
    let clean = set.training("retraining on fuzzed failures")?;
    let mut x = vec![clean.images().clone()];
    let mut y = clean.labels().to_vec();
    if !fuzz_imgs.is_empty() {
        // Repeated so that the fuzzed inputs are about a sixth of what each epoch sees.
        let repeat = (clean.len() / (5 * fuzz_imgs.len())).max(1);
        let fx = stack(&fuzz_imgs, &shape)?;
        for _ in 0..repeat {
            x.push(fx.clone());
            y.extend(&fuzz_labels);
        }
    }
    let data = Dataset::new(Tensor::concat(&x, 0)?, y, clf.num_classes())?;
    let mut opt = Adam::new(module.parameters(), AdamConfig { lr: cfg.lr, ..AdamConfig::default() })?;
    for epoch in 0..cfg.epochs {
        let order = crate::seed::shuffled(data.len(), cfg.seed, epoch as u64);
        for chunk in order.chunks(cfg.batch_size.max(1)) {
            let b = data.subset(chunk)?;
            train_step(module.as_ref(), &mut opt, b.images(), b.labels(), None)?;
        }
    }
    Ok(Retrain {
        train_fuzzed: fuzz_imgs.len(),
        held_out: held_y.len(),
        fuzzed_before,
        fuzzed_after: accuracy(clf, &held_x, &held_y)?,
        clean_before,
        clean_after: accuracy(clf, &clean_x, &clean_y)?,
    })
}
