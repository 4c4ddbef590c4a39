//! MagNet (Meng & Chen 2017) assembled from a configuration: auto-encoders trained on the training images (and
//! cached, so runs with the same settings reuse them), a detector per part and auto-encoder I as the reformer.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use armoury::data::TrainTest;
use armoury::train::{EpochReport, StepReport, TrainCallback};
use armoury::{Classifier, Detector, Error, Result};

use super::magnet::{
    autoencoder, train_autoencoder_with, Architecture, Autoencoder, AutoencoderTraining, DivergenceDetector,
    ErrorDetector, MagNet,
};

/// How MagNet's auto-encoders are trained and which detectors it combines.
#[derive(Clone, Debug, PartialEq)]
pub struct MagnetConfig {
    /// Auto-encoder I: training images, epochs.
    pub ae1: (usize, usize),
    /// Auto-encoder II: training images, epochs.
    pub ae2: (usize, usize),
    /// Adam's learning rate.
    pub lr: f32,
    /// The parts (`l1-ii`, `jsd10-ii`, …): `l1`/`l2` (the reconstruction error) or `jsd10`/`jsd40` (the
    /// divergence at T = 10 / 40) on auto-encoder `i` or `ii`.
    pub parts: Vec<String>,
    /// Initialisation and training seed.
    pub seed: u64,
    /// Where trained auto-encoders are cached (and reused by runs with the same settings).
    pub cache: PathBuf,
}

impl Default for MagnetConfig {
    /// Auto-encoder I on 20,000 images for 10 epochs, II on 60,000 for 20, lr 1e-2, the parts l1-ii, jsd10-ii
    /// and jsd40-ii, seed 0, cached in `out/`.
    fn default() -> Self {
        MagnetConfig {
            ae1: (20_000, 10),
            ae2: (60_000, 20),
            lr: 1e-2,
            parts: ["l1-ii", "jsd10-ii", "jsd40-ii"].map(String::from).to_vec(),
            seed: 0,
            cache: PathBuf::from("out"),
        }
    }
}

/// `N,E`: N training images, E epochs.
pub fn images_epochs(v: &str) -> Result<(usize, usize)> {
    let bad = || Error::invalid("MagNet", format!("'{v}': IMAGES,EPOCHS"));
    let (n, e) = v.split_once(',').ok_or_else(bad)?;
    Ok((n.trim().parse().map_err(|_| bad())?, e.trim().parse().map_err(|_| bad())?))
}

/// What [`magnet_pipeline`] reports while it assembles MagNet: its `Display` is a line for people.
#[derive(Clone, Debug)]
pub enum MagnetProgress<'a> {
    /// An auto-encoder was loaded from the cache.
    Loaded {
        /// Which one.
        arch: Architecture,
        /// The cache file.
        path: &'a Path,
    },
    /// A training step of an auto-encoder.
    Step(&'a StepReport),
    /// A training epoch of an auto-encoder.
    Epoch(&'a EpochReport),
    /// An auto-encoder was trained (and saved to the cache).
    Trained {
        /// Which one.
        arch: Architecture,
        /// Training images.
        images: usize,
        /// Epochs.
        epochs: usize,
        /// Mean loss of the first and of the last epoch.
        loss: (f32, f32),
        /// Wall-clock seconds.
        seconds: f64,
    },
}

impl fmt::Display for MagnetProgress<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MagnetProgress::Loaded { arch, path } => {
                write!(f, "MagNet auto-encoder {arch:?} loaded from {}", path.display())
            }
            MagnetProgress::Step(r) => write!(f, "MagNet auto-encoder: epoch {} step {}/{}", r.epoch + 1, r.batch + 1, r.batches),
            MagnetProgress::Epoch(r) => write!(f, "MagNet auto-encoder: epoch {}, loss {:.5}", r.epoch + 1, r.train_loss),
            MagnetProgress::Trained { arch, images, epochs, loss, seconds } => write!(
                f,
                "trained MagNet auto-encoder {arch:?}: {epochs} epochs on {images} images, loss {:.5} → {:.5}, {seconds:.1} s \
                 ({:.0} images/s)",
                loss.0,
                loss.1,
                (images * epochs) as f64 / seconds
            ),
        }
    }
}

/// Forwards the trainer's reports to a progress hook.
struct Forward<'a>(&'a (dyn Fn(&MagnetProgress<'_>) + Sync));

impl TrainCallback for Forward<'_> {
    fn on_step(&mut self, r: &StepReport) {
        (self.0)(&MagnetProgress::Step(r));
    }
    fn on_epoch(&mut self, r: &EpochReport) {
        (self.0)(&MagnetProgress::Epoch(r));
    }
}

/// MagNet's auto-encoder `arch` trained on the first `n` training images for `epochs` (Meng & Chen's recipe:
/// Gaussian noise 0.1, Adam, L2 1e-9), cached in `cfg.cache` and reused by runs with the same settings.
fn trained_autoencoder(
    cfg: &MagnetConfig,
    clf: &Arc<dyn Classifier>,
    set: &TrainTest,
    arch: Architecture,
    (n, epochs): (usize, usize),
    progress: &(dyn Fn(&MagnetProgress<'_>) + Sync),
) -> Result<Autoencoder> {
    let train = set.training("training MagNet's auto-encoders")?;
    let n = train.len().min(n);
    let channels = train.image_shape()[0];
    let k = u64::from(arch == Architecture::MnistII);
    let ae = autoencoder(arch, channels, cfg.seed + 10 * k)?;
    let training = AutoencoderTraining { epochs, lr: cfg.lr, seed: cfg.seed, ..Default::default() };
    let cache = cache_file(&cfg.cache, arch, n, &training);
    if cache.exists() {
        armoury::io::load_module(&ae, &cache)?;
        progress(&MagnetProgress::Loaded { arch, path: &cache });
    } else {
        let (x, _) = train.batch(0..n)?;
        let t = Instant::now();
        let losses = train_autoencoder_with(&ae, &x, clf.bounds(), &training, &mut Forward(progress))?;
        let loss = (losses.first().copied().unwrap_or(f32::NAN), losses.last().copied().unwrap_or(f32::NAN));
        progress(&MagnetProgress::Trained { arch, images: n, epochs, loss, seconds: t.elapsed().as_secs_f64() });
        std::fs::create_dir_all(&cfg.cache).map_err(|e| Error::io(&cfg.cache, e))?;
        armoury::io::save_module(&ae, &cache)?;
    }
    Autoencoder::new(Arc::new(ae), clf.bounds())
}

/// The cache file of an auto-encoder: its architecture, images, epochs, learning rate and seed in the name.
pub fn cache_file(dir: &Path, arch: Architecture, n: usize, t: &AutoencoderTraining) -> PathBuf {
    dir.join(format!("magnet-{arch:?}-n{n}-e{}-lr{}-s{}.safetensors", t.epochs, t.lr, t.seed))
}

/// The MagNet pipeline of `cfg.parts` over `clf` with auto-encoder I as the reformer, its auto-encoders trained
/// on `set.train` (or loaded from `cfg.cache`); `progress` hears of every loaded or trained auto-encoder and of
/// every training step and epoch.
pub fn magnet_pipeline(
    cfg: &MagnetConfig,
    clf: &Arc<dyn Classifier>,
    set: &TrainTest,
    progress: &(dyn Fn(&MagnetProgress<'_>) + Sync),
) -> Result<MagNet> {
    let (mut ae1, mut ae2) = (None, None);
    let mut detectors: Vec<Box<dyn Detector>> = Vec::new();
    let bad = |part: &str, why: String| Error::invalid("MagNet", format!("part '{part}': {why}"));
    for part in &cfg.parts {
        let (kind, which) = part.split_once('-').ok_or_else(|| bad(part, "KIND-i or KIND-ii".into()))?;
        let ae = match which {
            "i" => match &ae1 {
                Some(a) => Autoencoder::clone(a),
                None => {
                    ae1.insert(trained_autoencoder(cfg, clf, set, Architecture::MnistI, cfg.ae1, progress)?).clone()
                }
            },
            "ii" => match &ae2 {
                Some(a) => Autoencoder::clone(a),
                None => {
                    ae2.insert(trained_autoencoder(cfg, clf, set, Architecture::MnistII, cfg.ae2, progress)?).clone()
                }
            },
            other => return Err(bad(part, format!("auto-encoder '{other}' is i or ii"))),
        };
        detectors.push(match kind {
            "l1" => Box::new(ErrorDetector::new(ae, 1)?),
            "l2" => Box::new(ErrorDetector::new(ae, 2)?),
            "jsd10" => Box::new(DivergenceDetector::new(ae, clf.clone(), 10.0)?),
            "jsd40" => Box::new(DivergenceDetector::new(ae, clf.clone(), 40.0)?),
            other => return Err(bad(part, format!("'{other}' is l1, l2, jsd10 or jsd40"))),
        });
    }
    let reformer = match ae1 {
        Some(a) => a,
        None => trained_autoencoder(cfg, clf, set, Architecture::MnistI, cfg.ae1, progress)?,
    };
    MagNet::new(detectors, Some(reformer))
}
