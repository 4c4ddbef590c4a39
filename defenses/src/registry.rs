//! Defenses and detectors by name, as the command lines take them (the attacks crate's `registry` does the same
//! for attacks). An unknown name is an error that lists the known ones — never a near match.
//!
//! ```
//! use armoury_defenses::registry;
//! assert!(registry::transform("median:5")?.name().starts_with("MedianFilter"));
//! assert!(registry::transform("medain").err().expect("unknown").to_string().contains("median[:SIZE]"));
//! assert!(registry::check_detector("magnett").is_err());
//! # Ok::<(), armoury::Error>(())
//! ```

use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::{Classifier, Detector, Error, Result, Tensor};

use crate::detectors::{
    magnet_pipeline, Ensemble, FeatureSqueezing, Lid, LogisticTraining, MagnetConfig, MagnetProgress, Mahalanobis,
    Policy, RegionClassifier,
};
use crate::transforms::{
    BitDepth, GaussianFilter, GaussianNoise, Jpeg, MeanFilter, MedianFilter, TotalVariation, Transform,
};

/// The defenses [`transform`] knows, with their parameter: `bit-depth[:BITS]`, `median[:SIZE]`, `mean[:SIZE]`,
/// `gaussian[:SIGMA]`, `jpeg[:QUALITY]`, `tv[:WEIGHT]` (random pixel dropout: EOT), `noise[:SIGMA]` (EOT).
pub const DEFENSES: [&str; 7] = [
    "bit-depth[:BITS]",
    "median[:SIZE]",
    "mean[:SIZE]",
    "gaussian[:SIGMA]",
    "jpeg[:QUALITY]",
    "tv[:WEIGHT]",
    "noise[:SIGMA]",
];

/// The per-input detectors [`detector`] builds: `magnet-PART` is MagNet with that one part (`magnet-l2-i`, …).
pub const PER_INPUT: [&str; 6] = ["squeeze", "lid", "mahalanobis", "ensemble", "magnet", "magnet-PART"];

/// Every detector an evaluation knows ([`check_detector`]): the per-input ones (`magnet:IMAGES,EPOCHS` sets
/// MagNet's training), the region classifier and the stateful query detector.
pub const DETECTORS: [&str; 8] =
    ["squeeze", "lid", "mahalanobis", "ensemble", "magnet[:IMAGES,EPOCHS]", "magnet-PART", "region", "similarity"];

fn parse<T: std::str::FromStr>(spec: &str, p: Option<&str>, default: T) -> Result<T> {
    match p {
        None => Ok(default),
        Some(v) => {
            v.parse().map_err(|_| Error::invalid("defense", format!("'{spec}': '{v}' is not a valid parameter")))
        }
    }
}

/// The input transformation of a defense spec `NAME[:PARAM]` (one of [`DEFENSES`]), validated.
pub fn transform(spec: &str) -> Result<Arc<dyn Transform>> {
    let (name, p) = match spec.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (spec, None),
    };
    let t: Arc<dyn Transform> = match name {
        "bit-depth" => Arc::new(BitDepth { bits: parse(spec, p, BitDepth::default().bits)? }),
        "median" => Arc::new(MedianFilter { size: parse(spec, p, 3)? }),
        "mean" => Arc::new(MeanFilter { size: parse(spec, p, 3)? }),
        "gaussian" => Arc::new(GaussianFilter::new(parse(spec, p, 1.0)?)),
        "jpeg" => Arc::new(Jpeg { quality: parse(spec, p, Jpeg::default().quality)? }),
        "tv" => {
            Arc::new(TotalVariation { weight: parse(spec, p, TotalVariation::default().weight)?, ..Default::default() })
        }
        "noise" => Arc::new(GaussianNoise { sigma: parse(spec, p, GaussianNoise::default().sigma)?, clip: true }),
        other => {
            return Err(Error::invalid(
                "defense",
                format!("unknown defense '{other}' (known: {})", DEFENSES.join(", ")),
            ))
        }
    };
    t.validate()?;
    Ok(t)
}

/// Whether `name` (without parameters) is a per-input detector [`detector`] builds.
fn is_per_input(name: &str) -> bool {
    matches!(name, "squeeze" | "lid" | "mahalanobis" | "ensemble" | "magnet") || name.starts_with("magnet-")
}

/// Checks an evaluation's detector spec (one of [`DETECTORS`]) before anything runs: an unknown name is an
/// error listing the known ones.
pub fn check_detector(spec: &str) -> Result<()> {
    let (name, param) = match spec.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (spec, None),
    };
    let known = matches!(name, "region" | "similarity") || is_per_input(name);
    if !known {
        return Err(Error::invalid("detector", format!("unknown detector '{name}' (known: {})", DETECTORS.join(", "))));
    }
    match param {
        Some(p) if name == "magnet" => crate::detectors::images_epochs(p).map(drop),
        Some(p) => Err(Error::invalid("detector", format!("'{spec}': {name} takes no parameter ('{p}')"))),
        None => Ok(()),
    }
}

/// The reference cnn's layers LID and Mahalanobis read: both post-ReLU convolutions, the post-ReLU hidden layer
/// and the logits.
pub const CNN_LAYERS: [&str; 4] = ["conv1_relu", "conv2_relu", "fc1_relu", "fc2"];

/// The layers LID and Mahalanobis read when none are named: the reference cnn's [`CNN_LAYERS`]; for another model
/// (an ONNX graph's taps are its node outputs) the activations a quarter, half and three quarters of the way
/// through its taps, and its output — LID (Ma et al.) and Mahalanobis (Lee et al.) read features spread over the
/// depth. Empty when the model taps nothing.
pub fn default_layers(model: &dyn Classifier) -> Vec<String> {
    let names: Vec<String> = model.layer_names().into_iter().filter(|n| n != "input").collect();
    if CNN_LAYERS.iter().all(|l| names.iter().any(|n| n == l)) {
        return CNN_LAYERS.map(String::from).to_vec();
    }
    let Some(last) = names.len().checked_sub(1) else { return Vec::new() };
    let mut picked: Vec<String> = (1..=3).map(|k| names[k * last / 4].clone()).collect();
    picked.push(names[last].clone());
    picked.dedup();
    picked
}

/// What a per-input detector is built from.
pub struct DetectorBuild<'a> {
    /// The model it protects.
    pub model: &'a Arc<dyn Classifier>,
    /// The data: training images fit it.
    pub set: &'a TrainTest,
    /// Clean training images: the first `fit` fit the threshold (by the caller), the next `fit` are LID's and
    /// Mahalanobis' reference set.
    pub fit: usize,
    /// The layers of LID and Mahalanobis.
    pub layers: &'a [&'a str],
    /// Adversarial examples of clean training images, for the supervised combiners of LID and Mahalanobis.
    pub attack: &'a (dyn Fn(&Tensor, &[usize]) -> Result<Tensor> + 'a),
    /// MagNet's auto-encoders and parts.
    pub magnet: MagnetConfig,
    /// Hears of MagNet's auto-encoders being loaded or trained.
    pub magnet_progress: &'a (dyn Fn(&MagnetProgress<'_>) + Sync),
}

/// Layer detectors' logistic combiners are fitted on the last 500 training images and their adversarial
/// examples (Ma et al., Lee et al.).
fn supervised(b: &DetectorBuild<'_>, fit_combiner: &mut dyn FnMut(&Tensor, &Tensor) -> Result<()>) -> Result<()> {
    let train = b.set.training("fitting a detector's combiner")?;
    let len = train.len();
    let (x, y) = train.batch(len - 500.min(len)..len)?;
    let adv = (b.attack)(&x, &y)?;
    fit_combiner(&x, &adv)
}

/// The per-input detector `name` (one of [`PER_INPUT`]; `magnet-PART` is MagNet with that one part), its
/// threshold not fitted yet.
pub fn detector(b: &DetectorBuild<'_>, name: &str) -> Result<Box<dyn Detector>> {
    if !is_per_input(name) {
        return Err(Error::invalid(
            "detector",
            format!("unknown per-input detector '{name}' (known: {})", PER_INPUT.join(", ")),
        ));
    }
    let train = b.set.training("fitting a detector")?;
    let fit = b.fit.min(train.len() / 2);
    let (reference, ref_y) = train.batch(fit..2 * fit)?;
    let (clf, layers) = (b.model, b.layers);
    Ok(match name {
        "magnet" => Box::new(magnet_pipeline(&b.magnet, clf, b.set, b.magnet_progress)?),
        m if m.starts_with("magnet-") => {
            let cfg = MagnetConfig { parts: vec![m["magnet-".len()..].to_string()], ..b.magnet.clone() };
            Box::new(magnet_pipeline(&cfg, clf, b.set, b.magnet_progress)?)
        }
        "squeeze" => Box::new(FeatureSqueezing::with_defaults(clf.clone(), 4)?),
        "lid" => {
            let mut d = Lid::new(clf.clone(), layers, 20, &reference)?;
            supervised(b, &mut |c, a| d.fit_combiner(c, a, &LogisticTraining::default()).map(drop))?;
            Box::new(d)
        }
        "mahalanobis" => {
            let mut d = Mahalanobis::new(clf.clone(), layers, &reference, &ref_y, 1e-3)?;
            supervised(b, &mut |c, a| d.fit_combiner(c, a, &LogisticTraining::default()).map(drop))?;
            Box::new(d)
        }
        _ => {
            let members: Vec<Box<dyn Detector>> = vec![
                Box::new(FeatureSqueezing::with_defaults(clf.clone(), 4)?),
                Box::new(Mahalanobis::new(clf.clone(), layers, &reference, &ref_y, 1e-3)?),
                Box::new(Lid::new(clf.clone(), layers, 20, &reference)?),
            ];
            Box::new(Ensemble::new(members, Policy::Vote)?)
        }
    })
}

/// Cao & Gong's region classifier over `model`, voting over 100 copies, with the radius fitted on the first 500
/// training images: the largest of 0.02 … 0.3 that costs at most 1% of clean accuracy.
pub fn region(model: &Arc<dyn Classifier>, set: &TrainTest, seed: u64) -> Result<RegionClassifier> {
    let mut r = RegionClassifier::new(model.clone(), 0.0, 100, seed)?;
    let train = set.training("fitting the region classifier's radius")?;
    let (x, y) = train.batch(0..500.min(train.len()))?;
    r.fit_radius(&x, &y, &[0.02, 0.05, 0.1, 0.15, 0.2, 0.3], 0.01)?;
    Ok(r)
}
