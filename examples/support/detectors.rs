//! The per-input detectors the `detect` and `evaluate` examples build by name, before their threshold is fitted.

use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::{Classifier, Detector, Tensor};
use armoury_defenses::detectors::{
    Ensemble, FeatureSqueezing, Lid, LogisticTraining, Mahalanobis, Policy, RegionClassifier,
};

use super::magnet::{magnet, MagnetConfig};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The per-input detectors `build` knows.
pub const PER_INPUT: &str = "squeeze, lid, mahalanobis, ensemble, magnet";

/// What a detector is built from.
pub struct Build<'a> {
    pub model: &'a Arc<dyn Classifier>,
    pub set: &'a TrainTest,
    /// Clean training images: the first `fit` fit the threshold, the next `fit` are LID's and Mahalanobis'
    /// reference set.
    pub fit: usize,
    /// The layers of LID and Mahalanobis.
    pub layers: &'a [&'a str],
    /// Adversarial examples of clean training images, for the supervised combiners of LID and Mahalanobis.
    pub attack: &'a dyn Fn(&Tensor, &[usize]) -> Res<Tensor>,
    /// MagNet's auto-encoders and parts.
    pub magnet: MagnetConfig,
}

/// Layer detectors' logistic combiners are fitted on the last 500 training images and their adversarial
/// examples (Ma et al., Lee et al.).
fn supervised(b: &Build<'_>, fit_combiner: &mut dyn FnMut(&Tensor, &Tensor) -> Res<()>) -> Res<()> {
    let len = b.set.train.len();
    let (x, y) = b.set.train.batch(len - 500.min(len)..len)?;
    let adv = (b.attack)(&x, &y)?;
    fit_combiner(&x, &adv)
}

/// The per-input detector `name` (one of [`PER_INPUT`]; `magnet-PART` is MagNet with that one part).
pub fn build(b: &Build<'_>, name: &str) -> Res<Box<dyn Detector>> {
    let fit = b.fit.min(b.set.train.len() / 2);
    let (reference, ref_y) = b.set.train.batch(fit..2 * fit)?;
    let (clf, layers) = (b.model, b.layers);
    Ok(match name {
        m if m.starts_with("magnet") => Box::new(magnet(&b.magnet, clf, b.set)?),
        "squeeze" => Box::new(FeatureSqueezing::with_defaults(clf.clone(), 4)?),
        "lid" => {
            let mut d = Lid::new(clf.clone(), layers, 20, &reference)?;
            supervised(b, &mut |c, a| Ok(d.fit_combiner(c, a, &LogisticTraining::default())?))?;
            Box::new(d)
        }
        "mahalanobis" => {
            let mut d = Mahalanobis::new(clf.clone(), layers, &reference, &ref_y, 1e-3)?;
            supervised(b, &mut |c, a| Ok(d.fit_combiner(c, a, &LogisticTraining::default())?))?;
            Box::new(d)
        }
        "ensemble" => {
            let members: Vec<Box<dyn Detector>> = vec![
                Box::new(FeatureSqueezing::with_defaults(clf.clone(), 4)?),
                Box::new(Mahalanobis::new(clf.clone(), layers, &reference, &ref_y, 1e-3)?),
                Box::new(Lid::new(clf.clone(), layers, 20, &reference)?),
            ];
            Box::new(Ensemble::new(members, Policy::Vote)?)
        }
        other => return Err(format!("unknown detector '{other}' (known: {PER_INPUT}, region, similarity)").into()),
    })
}

/// Cao & Gong's region classifier over `model`, voting over 100 copies, with the radius fitted on the first 500
/// training images: the largest of 0.02 … 0.3 that costs at most 1% of clean accuracy.
pub fn region(model: &Arc<dyn Classifier>, set: &TrainTest, seed: u64) -> Res<RegionClassifier> {
    let mut r = RegionClassifier::new(model.clone(), 0.0, 100, seed)?;
    let (x, y) = set.train.batch(0..500.min(set.train.len()))?;
    let radius = r.fit_radius(&x, &y, &[0.02, 0.05, 0.1, 0.15, 0.2, 0.3], 0.01)?;
    println!("region radius fitted: {radius}");
    Ok(r)
}
