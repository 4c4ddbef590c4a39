//! MagNet (Meng & Chen 2017) as the `detect` and `evaluate` examples build it: auto-encoders trained here (and
//! cached), a detector per part and auto-encoder I as the reformer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use armoury::data::TrainTest;
use armoury::{Classifier, Detector};
use armoury_defenses::detectors::{
    autoencoder, train_autoencoder, Architecture, Autoencoder, AutoencoderTraining, DivergenceDetector, ErrorDetector,
    MagNet,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// How MagNet's auto-encoders are trained and which detectors it combines.
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
pub fn images_epochs(v: &str) -> Res<(usize, usize)> {
    let (n, e) = v.split_once(',').ok_or_else(|| format!("'{v}': IMAGES,EPOCHS"))?;
    Ok((n.trim().parse()?, e.trim().parse()?))
}

/// MagNet's auto-encoder `arch` trained on the first `n` training images for `epochs` (Meng & Chen's recipe:
/// Gaussian noise 0.1, Adam, L2 1e-9), cached in `cfg.cache` and reused by runs with the same settings.
fn trained_autoencoder(
    cfg: &MagnetConfig,
    clf: &Arc<dyn Classifier>,
    set: &TrainTest,
    arch: Architecture,
    (n, epochs): (usize, usize),
) -> Res<Autoencoder> {
    let n = set.train.len().min(n);
    let channels = set.train.image_shape()[0];
    let k = u64::from(arch == Architecture::MnistII);
    let ae = autoencoder(arch, channels, cfg.seed + 10 * k)?;
    let training = AutoencoderTraining { epochs, lr: cfg.lr, seed: cfg.seed, ..Default::default() };
    let cache = cache_file(&cfg.cache, arch, n, &training);
    if cache.exists() {
        armoury::io::load_module(&ae, &cache)?;
        println!("MagNet auto-encoder {arch:?} loaded from {}", cache.display());
    } else {
        let (x, _) = set.train.batch(0..n)?;
        let t = Instant::now();
        let losses = train_autoencoder(&ae, &x, clf.bounds(), &training)?;
        println!(
            "trained MagNet auto-encoder {arch:?}: {} epochs on {n} images, loss {:.5} → {:.5}, {:.1} s ({:.0} images/s)",
            training.epochs,
            losses[0],
            losses[losses.len() - 1],
            t.elapsed().as_secs_f64(),
            (n * training.epochs) as f64 / t.elapsed().as_secs_f64()
        );
        std::fs::create_dir_all(&cfg.cache)?;
        armoury::io::save_module(&ae, &cache)?;
    }
    Ok(Autoencoder::new(Arc::new(ae), clf.bounds())?)
}

fn cache_file(dir: &Path, arch: Architecture, n: usize, t: &AutoencoderTraining) -> PathBuf {
    dir.join(format!("magnet-{arch:?}-n{n}-e{}-lr{}-s{}.safetensors", t.epochs, t.lr, t.seed))
}

/// The pipeline of `cfg.parts` with auto-encoder I as the reformer.
pub fn magnet(cfg: &MagnetConfig, clf: &Arc<dyn Classifier>, set: &TrainTest) -> Res<MagNet> {
    let (mut ae1, mut ae2) = (None, None);
    let mut detectors: Vec<Box<dyn Detector>> = Vec::new();
    for part in &cfg.parts {
        let (kind, which) = part.split_once('-').ok_or_else(|| format!("MagNet part '{part}': KIND-i or KIND-ii"))?;
        let ae = match which {
            "i" => ae1.get_or_insert(trained_autoencoder(cfg, clf, set, Architecture::MnistI, cfg.ae1)?).clone(),
            "ii" => ae2.get_or_insert(trained_autoencoder(cfg, clf, set, Architecture::MnistII, cfg.ae2)?).clone(),
            other => return Err(format!("MagNet part '{part}': auto-encoder '{other}' is i or ii").into()),
        };
        detectors.push(match kind {
            "l1" => Box::new(ErrorDetector::new(ae, 1)?),
            "l2" => Box::new(ErrorDetector::new(ae, 2)?),
            "jsd10" => Box::new(DivergenceDetector::new(ae, clf.clone(), 10.0)?),
            "jsd40" => Box::new(DivergenceDetector::new(ae, clf.clone(), 40.0)?),
            other => return Err(format!("MagNet part '{part}': '{other}' is l1, l2, jsd10 or jsd40").into()),
        });
    }
    let reformer = match ae1 {
        Some(a) => a,
        None => trained_autoencoder(cfg, clf, set, Architecture::MnistI, cfg.ae1)?,
    };
    Ok(MagNet::new(detectors, Some(reformer))?)
}
