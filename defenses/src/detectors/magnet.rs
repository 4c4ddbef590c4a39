//! MagNet (Meng & Chen 2017, "MagNet: a two-pronged defense against adversarial examples"): denoising
//! auto-encoders trained on clean data, the error-based and divergence-based detectors built on them, the
//! reformer, and the whole pipeline ([`MagNet`]: detectors combined with [`Policy::Any`] and the reformer as the
//! purifying transform, which [`armoury::Guarded`] turns into a classifier with a rejection class).
//!
//! MindArmour's MagNet threshold is the `⌊N·fpr⌋`-th largest clean score with no guard, which collapses to the
//! smallest score when `N·fpr < 1` (fitted on 50 images at 1% it flags almost every clean input); here every
//! threshold is [`armoury::calibrate_threshold`]'s order statistic, which never flags more than the target.

use std::sync::Arc;

use armoury::nn::{AvgPool2d, Conv2d, Module, Param, Sequential, Sigmoid};
use armoury::train::{Method, StepContext, StepReport, TrainConfig};
use armoury::{no_grad, Classifier, Conv2dParams, Detector, Error, Pool2dParams, Reduction, Result, Tensor};

use super::ensemble::{Ensemble, Policy};
use super::{check_batch, in_pieces, train_unlabelled};

/// Nearest-neighbour 2× upsampling of a batch `[N, C, H, W]` to `[N, C, 2H, 2W]` (MagNet's `UpSampling2D`),
/// as two index selections, so it is differentiable.
pub struct Upsample2x;

impl Module for Upsample2x {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4("Upsample2x")?;
        let rows: Vec<usize> = (0..2 * h).map(|i| i / 2).collect();
        let cols: Vec<usize> = (0..2 * w).map(|j| j / 2).collect();
        x.index_select(2, &rows)?.index_select(3, &cols)
    }
    fn mode_independent(&self) -> bool {
        true
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
}

/// The auto-encoders of Meng & Chen (2017, Table 1), for `channels`-channel images; every convolution is 3×3
/// with "same" padding and a sigmoid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// MNIST detector I and reformer: conv 3 → average pool 2×2 → conv 3 → conv 3 → upsample 2×2 → conv 3 →
    /// conv C. Needs even height and width (28×28).
    MnistI,
    /// MNIST detector II: conv 3 → conv 3 → conv C.
    MnistII,
    /// CIFAR-10 (32×32) detector and reformer: conv 3 → conv 3 → conv C.
    Cifar,
}

/// Builds the auto-encoder `arch` for `channels`-channel inputs, PyTorch-initialised from `seed`.
pub fn autoencoder(arch: Architecture, channels: usize, seed: u64) -> Result<Sequential> {
    let same = Conv2dParams { padding: (1, 1), ..Default::default() };
    let conv = |i, o, s| Conv2d::new(i, o, 3, same, true, s);
    let pool = Pool2dParams::square(2);
    Ok(match arch {
        Architecture::MnistI => Sequential::new()
            .add("conv1", conv(channels, 3, seed)?)
            .add("sig1", Sigmoid)
            .add("pool", AvgPool2d(pool))
            .add("conv2", conv(3, 3, seed + 2)?)
            .add("sig2", Sigmoid)
            .add("conv3", conv(3, 3, seed + 4)?)
            .add("sig3", Sigmoid)
            .add("up", Upsample2x)
            .add("conv4", conv(3, 3, seed + 6)?)
            .add("sig4", Sigmoid)
            .add("conv5", conv(3, channels, seed + 8)?)
            .add("sig5", Sigmoid),
        Architecture::MnistII | Architecture::Cifar => Sequential::new()
            .add("conv1", conv(channels, 3, seed)?)
            .add("sig1", Sigmoid)
            .add("conv2", conv(3, 3, seed + 2)?)
            .add("sig2", Sigmoid)
            .add("conv3", conv(3, channels, seed + 4)?)
            .add("sig3", Sigmoid),
    })
}

/// How [`train_autoencoder`] trains: Meng & Chen's recipe (mean squared reconstruction error of inputs with
/// Gaussian noise of standard deviation `noise` added, Adam, an L2 penalty) for `epochs` epochs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoencoderTraining {
    /// Epochs over the clean images (the paper trains 100 on MNIST; a few suffice on Fashion-MNIST's sample).
    pub epochs: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Adam's learning rate.
    pub lr: f32,
    /// Standard deviation of the training noise, in units of the input range (the paper's "volume" 0.1).
    pub noise: f32,
    /// L2 penalty (weight decay) on every parameter (the paper's 1e-9).
    pub weight_decay: f32,
    /// Seed of the shuffles and the noise.
    pub seed: u64,
}

impl Default for AutoencoderTraining {
    fn default() -> Self {
        AutoencoderTraining { epochs: 20, batch_size: 128, lr: 1e-3, noise: 0.1, weight_decay: 1e-9, seed: 0 }
    }
}

/// The reconstruction objective as a training [`Method`] for the core's [`Trainer`]: the labels are ignored.
struct Reconstruction {
    noise: f32,
    bounds: (f32, f32),
}

impl Method for Reconstruction {
    fn kind(&self) -> &'static str {
        "magnet-autoencoder"
    }
    fn name(&self) -> String {
        format!("magnet-autoencoder(noise={})", self.noise)
    }
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let (lo, hi) = self.bounds;
        let unit = x.affine(1.0 / (hi - lo), -lo / (hi - lo));
        let noisy = unit.add(&Tensor::normal(x.shape(), 0.0, self.noise, ctx.seed))?.clamp(0.0, 1.0);
        let model = ctx.model;
        let (loss, _) = ctx.optimise_pieces(y.len(), |r| {
            let out = model.forward_t(&noisy.narrow(0, r.start, r.len())?, true)?;
            let target = unit.narrow(0, r.start, r.len())?;
            let per = out.mse_loss(&target, Reduction::None)?.mean(&[1, 2, 3], false)?;
            Ok((per.sum_all(), 0))
        })?;
        Ok(StepReport::of(loss, 0, y.len()))
    }
}

/// Trains `ae` to reconstruct the clean `images` (within `bounds`) with the core's [`Trainer`] and Adam;
/// returns the mean training loss of each epoch.
pub fn train_autoencoder(
    ae: &dyn Module,
    images: &Tensor,
    bounds: (f32, f32),
    cfg: &AutoencoderTraining,
) -> Result<Vec<f32>> {
    train_autoencoder_with(ae, images, bounds, cfg, &mut ())
}

/// [`train_autoencoder`], reporting every step and epoch to `callback` (a progress bar's hook).
pub fn train_autoencoder_with(
    ae: &dyn Module,
    images: &Tensor,
    bounds: (f32, f32),
    cfg: &AutoencoderTraining,
    callback: &mut dyn armoury::train::TrainCallback,
) -> Result<Vec<f32>> {
    check_batch("train_autoencoder", images)?;
    if !(cfg.noise >= 0.0 && cfg.noise.is_finite()) {
        return Err(Error::invalid("train_autoencoder", format!("noise {} must be finite and ≥ 0", cfg.noise)));
    }
    let tc =
        TrainConfig { epochs: cfg.epochs, batch_size: cfg.batch_size, seed: cfg.seed, bounds, ..Default::default() };
    let method = Reconstruction { noise: cfg.noise, bounds };
    train_unlabelled(ae, images, &method, tc, cfg.lr, cfg.weight_decay, callback)
}

/// A trained auto-encoder over inputs within `bounds`: inputs are mapped to [0, 1] for the network (whose
/// sigmoid output is in [0, 1]) and back.
#[derive(Clone)]
pub struct Autoencoder {
    module: Arc<dyn Module>,
    bounds: (f32, f32),
}

impl Autoencoder {
    /// `module` (e.g. from [`autoencoder`], trained with [`train_autoencoder`]) over inputs within `bounds`.
    pub fn new(module: Arc<dyn Module>, bounds: (f32, f32)) -> Result<Autoencoder> {
        if !(bounds.0.is_finite() && bounds.1.is_finite() && bounds.0 < bounds.1) {
            return Err(Error::invalid("Autoencoder::new", format!("bounds {bounds:?} must be finite with min < max")));
        }
        Ok(Autoencoder { module, bounds })
    }

    /// The reconstruction of `x` (on the graph when `x` is tracked), same shape and bounds.
    pub fn reconstruct(&self, x: &Tensor) -> Result<Tensor> {
        let (lo, hi) = self.bounds;
        let unit = x.affine(1.0 / (hi - lo), -lo / (hi - lo));
        Ok(self.module.forward_t(&unit, false)?.affine(hi - lo, lo))
    }

    /// The network.
    pub fn module(&self) -> &Arc<dyn Module> {
        &self.module
    }
}

/// MagNet's error-based detector: the reconstruction error `mean_i |x_i − AE(x)_i|^p` with p = 1 or 2 (the
/// paper's L1 and L2 detectors; the mean rather than the sum so scores do not scale with the image size).
#[derive(Clone)]
pub struct ErrorDetector {
    ae: Autoencoder,
    p: u32,
    threshold: Option<f32>,
}

impl ErrorDetector {
    /// The Lᵖ reconstruction-error detector of `ae`, p ∈ {1, 2}.
    pub fn new(ae: Autoencoder, p: u32) -> Result<ErrorDetector> {
        if p != 1 && p != 2 {
            return Err(Error::invalid("ErrorDetector::new", format!("p = {p}: the error is L1 or L2")));
        }
        Ok(ErrorDetector { ae, p, threshold: None })
    }

    fn error(&self, x: &Tensor) -> Result<Tensor> {
        check_batch("ErrorDetector", x)?;
        let d = x.sub(&self.ae.reconstruct(x)?)?;
        let e = if self.p == 1 { d.abs() } else { d.mul(&d)? };
        e.flatten_from(1)?.mean(&[1], false)
    }
}

impl Detector for ErrorDetector {
    fn name(&self) -> &str {
        if self.p == 1 {
            "magnet-error-l1"
        } else {
            "magnet-error-l2"
        }
    }
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        in_pieces(x, |xc| no_grad(|| self.error(xc)).map(|t| t.to_vec()))
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.threshold = Some(threshold);
    }
    fn score_tensor(&self, x: &Tensor) -> Option<Result<Tensor>> {
        Some(self.error(x))
    }
}

/// MagNet's divergence-based detector: the Jensen–Shannon divergence between the classifier's softmax at
/// temperature T of the input and of its reconstruction, `JSD(softmax(z(x)/T) ‖ softmax(z(AE(x))/T))` in nats.
#[derive(Clone)]
pub struct DivergenceDetector {
    ae: Autoencoder,
    classifier: Arc<dyn Classifier>,
    temperature: f32,
    threshold: Option<f32>,
    name: String,
}

impl DivergenceDetector {
    /// The detector of `ae` over `classifier` at `temperature` (> 0; the paper uses 10 and 40).
    pub fn new(ae: Autoencoder, classifier: Arc<dyn Classifier>, temperature: f32) -> Result<DivergenceDetector> {
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(Error::invalid("DivergenceDetector::new", format!("temperature {temperature} must be > 0")));
        }
        let name = format!("magnet-jsd-t{temperature}");
        Ok(DivergenceDetector { ae, classifier, temperature, threshold: None, name })
    }

    fn divergence(&self, x: &Tensor) -> Result<Tensor> {
        self.classifier.check_input(x)?;
        let t = 1.0 / self.temperature;
        let lp = self.classifier.forward(x)?.mul_scalar(t).log_softmax(1)?;
        let lq = self.classifier.forward(&self.ae.reconstruct(x)?)?.mul_scalar(t).log_softmax(1)?;
        jensen_shannon(&lp, &lq)
    }
}

/// The Jensen–Shannon divergence (nats) per row between the distributions with log-probabilities `lp`, `lq`
/// [N, K]: ½ Σ p (log p − log m) + ½ Σ q (log q − log m), m = (p + q)/2.
pub fn jensen_shannon(lp: &Tensor, lq: &Tensor) -> Result<Tensor> {
    let (p, q) = (lp.exp(), lq.exp());
    // m is at least half of p and of q; the clamp only keeps log m finite where both underflow to 0.
    let lm = p.add(&q)?.mul_scalar(0.5).clamp(1e-30, f32::MAX).log();
    let kp = p.mul(&lp.sub(&lm)?)?.sum(&[1], false)?;
    let kq = q.mul(&lq.sub(&lm)?)?.sum(&[1], false)?;
    Ok(kp.add(&kq)?.mul_scalar(0.5))
}

impl Detector for DivergenceDetector {
    fn name(&self) -> &str {
        &self.name
    }
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        in_pieces(x, |xc| no_grad(|| self.divergence(xc)).map(|t| t.to_vec()))
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.threshold = Some(threshold);
    }
    fn score_tensor(&self, x: &Tensor) -> Option<Result<Tensor>> {
        Some(self.divergence(x))
    }
}

/// The MagNet pipeline: its detectors, any of which flagging rejects the input ([`Policy::Any`] of an
/// [`Ensemble`]), and the reformer, the auto-encoder whose reconstruction the classifier sees
/// ([`Detector::purify`]). In front of the classifier with [`armoury::Guarded`] it is MagNet as a classifier with
/// a rejection class; the whole of it is differentiable, so an adaptive attack sees every part.
pub struct MagNet {
    detectors: Ensemble,
    reformer: Option<Autoencoder>,
}

impl MagNet {
    /// The pipeline of `detectors` (unfitted or fitted) and `reformer`.
    pub fn new(detectors: Vec<Box<dyn Detector>>, reformer: Option<Autoencoder>) -> Result<MagNet> {
        Ok(MagNet { detectors: Ensemble::new(detectors, Policy::Any)?.named("magnet"), reformer })
    }

    /// The combined detectors.
    pub fn detectors(&self) -> &Ensemble {
        &self.detectors
    }
}

impl Detector for MagNet {
    fn name(&self) -> &str {
        "magnet"
    }
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        self.detectors.score(x)
    }
    fn threshold(&self) -> Option<f32> {
        self.detectors.threshold()
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.detectors.set_threshold(threshold)
    }
    /// Fits every detector at `target_fpr` and then the combined score at `target_fpr` ([`Ensemble`]'s fit), so
    /// the pipeline as a whole flags at most that fraction of `clean`.
    fn fit(&mut self, clean: &Tensor, target_fpr: f32) -> Result<f32> {
        self.detectors.fit(clean, target_fpr)
    }
    fn purify(&self, x: &Tensor) -> Option<Result<Tensor>> {
        self.reformer.as_ref().map(|r| r.reconstruct(x))
    }
    fn score_tensor(&self, x: &Tensor) -> Option<Result<Tensor>> {
        self.detectors.score_tensor(x)
    }
}
