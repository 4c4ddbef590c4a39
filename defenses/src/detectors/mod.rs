//! Adversarial-example detectors, each behind the core's [`armoury::Detector`] trait, and their honest
//! evaluation.
//!
//! | detector | paper | score (higher = more suspicious) |
//! |---|---|---|
//! | [`ErrorDetector`], [`DivergenceDetector`], [`MagNet`] | Meng & Chen 2017 | auto-encoder reconstruction error (L1/L2); Jensen–Shannon divergence of the softmax at temperature T of x and its reconstruction; the pipeline with the reformer |
//! | [`RegionClassifier`] | Cao & Gong 2017 | the fraction of noisy copies in the hypercube of radius r whose label differs from x's |
//! | [`FeatureSqueezing`] | Xu, Evans & Qi 2018 | the largest L1 change of the probability vector over the squeezers |
//! | [`Ensemble`] | — | any / all / strict majority of its members |
//! | [`StatefulDetector`] | Chen, Carlini & Wagner 2020 | minus the mean distance of a query's encoding to its k nearest previous queries |
//! | [`Lid`], [`Mahalanobis`] | Ma et al. 2018; Lee et al. 2018 | a logistic regression over per-layer local intrinsic dimensionality / Mahalanobis distance |
//!
//! Thresholds come from [`armoury::calibrate_threshold`] on clean data: an order statistic that flags at most
//! the target fraction of the clean inputs for every N, never the collapse to the smallest score of
//! MindArmour's MagNet when N·fpr < 1. [`detection_metrics`] and [`protected_accuracy`] measure a detector the way it is deployed and attacked:
//! ROC AUC, true-positive rates at fitted 1% and 5% false-positive rates, the protected pipeline's clean
//! accuracy, and its robust accuracy under the non-adaptive attack and under [`AdaptivePgd`] (PGD on
//! [`armoury::Guarded`] against the classifier's loss plus λ·the detector's score, with BPDA through
//! non-differentiable squeezers and EOT through the region classifier's noise).

mod adaptive;
mod blinding;
mod ensemble;
mod features;
mod logistic;
mod magnet;
mod magnet_pipeline;
mod region;
mod similarity;
mod squeeze;

use armoury::{Error, Result, Tensor};
use rayon::prelude::*;

pub use adaptive::{detection_metrics, protected_accuracy, protected_correct, AdaptivePgd, DetectionMetrics};
pub use blinding::QueryBlinding;
pub use ensemble::{Ensemble, Policy};
pub use features::{
    local_intrinsic_dimensionality, spd_inverse, LayerDetector, LayerStatistic, Lid, LidStatistic, Mahalanobis,
    MahalanobisStatistic,
};
pub use logistic::{Logistic, LogisticTraining};
pub use magnet::{
    autoencoder, jensen_shannon, train_autoencoder, train_autoencoder_with, Architecture, Autoencoder,
    AutoencoderTraining, DivergenceDetector, ErrorDetector, MagNet, Upsample2x,
};
pub use magnet_pipeline::{cache_file, images_epochs, magnet_pipeline, MagnetConfig, MagnetProgress};
pub use region::RegionClassifier;
pub use similarity::{
    choose_tap, default_tap, gaussian_encodings, measure_index, train_similarity_encoder, Encoder, IndexConfig,
    IndexMeasurement, ModuleEncoder, Monitored, SimilarityTraining, StatefulDetector, TapEncoder,
};
pub use squeeze::FeatureSqueezing;

/// Samples per piece when a detector scores a batch: pieces run in parallel, as the classifier's do.
pub const PIECE: usize = armoury::classifier::CHUNK;

/// Checks that `x` is a non-empty finite batch `[N, C, H, W]`.
pub(crate) fn check_batch(op: &'static str, x: &Tensor) -> Result<(usize, usize, usize, usize)> {
    let dims = x.dims4(op)?;
    if dims.0 == 0 {
        return Err(Error::invalid(op, "empty batch"));
    }
    if !x.all_finite() {
        return Err(Error::NonFinite { op });
    }
    Ok(dims)
}

/// `f` on pieces of [`PIECE`] samples of `x` in parallel, the per-sample values concatenated in order.
pub(crate) fn in_pieces(x: &Tensor, f: impl Fn(&Tensor) -> Result<Vec<f32>> + Sync) -> Result<Vec<f32>> {
    let n = x.shape().first().copied().unwrap_or(0);
    if n <= PIECE {
        return f(&x.detach());
    }
    let starts: Vec<usize> = (0..n).step_by(PIECE).collect();
    let parts: Vec<Vec<f32>> =
        starts.into_par_iter().map(|s| f(&x.detach().narrow(0, s, PIECE.min(n - s))?)).collect::<Result<_>>()?;
    Ok(parts.concat())
}

/// Trains `module` on unlabelled `images` with the core's [`armoury::train::Trainer`] running `method`, and Adam
/// at rate `lr` with weight decay `weight_decay`; returns each epoch's mean loss.
pub(crate) fn train_unlabelled(
    module: &dyn armoury::Module,
    images: &Tensor,
    method: &dyn armoury::train::Method,
    config: armoury::train::TrainConfig,
    lr: f32,
    weight_decay: f32,
    callback: &mut dyn armoury::train::TrainCallback,
) -> Result<Vec<f32>> {
    use armoury::optim::{Adam, AdamConfig};
    use armoury::ModuleExt;
    let n = check_batch("train_unlabelled", images)?.0;
    let data = armoury::data::Dataset::new(images.clone(), vec![0; n], 2)?;
    let mut opt = Adam::new(module.parameters(), AdamConfig { lr, weight_decay, ..Default::default() })?;
    let reports = armoury::train::Trainer::new(config).method(method).fit(module, &mut opt, &data, callback)?;
    Ok(reports.iter().map(|r| r.train_loss).collect())
}

/// A tensor whose value is `values` exactly and whose gradient is that of `t` (`values + (t − t.detach())`):
/// a differentiable score that agrees bit for bit with the detector's `score`.
pub(crate) fn with_value(t: &Tensor, values: Vec<f32>) -> Result<Tensor> {
    let shape = t.shape().to_vec();
    Tensor::from_vec(values, &shape)?.add(&t.sub(&t.detach())?)
}
