//! The stateful query detector (Chen, Carlini & Wagner 2020) in an evaluation: calibrated on benign streams of
//! shuffled training images, checked on benign streams of shuffled test images, and watching query attacks run
//! one sample at a time, each from an empty history — the cascade's Square attack, and the same attack with
//! query blinding (the paper's adaptive attacker).

use std::sync::Arc;

use armoury::data::Dataset;
use armoury::eval::AttackSpec;
use armoury::report::{StatefulAttack, StatefulReport};
use armoury::{Attack, Classifier, Error, Goal, Result, Tensor};
use serde::{Deserialize, Serialize};

use super::guard::inputs;
use super::{same, Context};
use crate::detectors::{IndexConfig, Monitored, QueryBlinding, StatefulDetector, TapEncoder};

/// Queries per benign stream.
pub const STREAM: usize = 100;
/// The share of benign calibration streams the stateful detector may flag.
pub const SIMILARITY_FPR: f32 = 0.005;
/// Benign test streams the stateful detector's false-positive rate is measured on.
pub const BENIGN_STREAMS: usize = 500;

/// The stateful query detector's per-sample results.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StatefulSlice {
    /// Its name with its settings.
    pub name: String,
    /// Its calibrated threshold.
    pub threshold: f32,
    /// How it was calibrated, in words.
    pub calibration: String,
    /// Benign test streams run.
    pub benign_streams: usize,
    /// Benign test streams flagged.
    pub benign_flagged: usize,
    /// The non-adaptive attack, then the adaptive one: name, adaptive, per sample.
    pub attacks: Vec<(String, bool, Vec<Watched>)>,
}

/// One sample under a query attack against the watched model.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Watched {
    /// Whether it was attacked (the model classified it correctly).
    pub attacked: bool,
    /// The index of the first flagged query, if any.
    pub first_flag: Option<usize>,
    /// Whether the attack fooled the model.
    pub fooled: bool,
}

/// Streams of `len` images in the order `order`.
pub fn streams(images: &Tensor, order: &[usize], len: usize) -> Result<Vec<Tensor>> {
    order.chunks_exact(len).map(|c| images.index_select(0, c)).collect()
}

/// The detector on the classifier's layer `layer` with `k` neighbours, calibrated at `fpr` on benign streams of
/// [`STREAM`] shuffled training images; with its threshold and the number of calibration streams.
pub fn calibrated(
    clf: &Arc<dyn Classifier>,
    train: &Dataset,
    layer: &str,
    k: usize,
    fpr: f32,
    seed: u64,
) -> Result<(StatefulDetector, f32, usize)> {
    let encoder = Arc::new(TapEncoder::new(clf.clone(), layer)?);
    let mut d = StatefulDetector::new(encoder, k, IndexConfig::default())?;
    let calib = streams(train.images(), &armoury::seed::shuffled(train.len(), seed, 1), STREAM)?;
    let tau = d.calibrate(&calib, fpr)?;
    Ok((d, tau, calib.len()))
}

/// How many of `count` benign streams of [`STREAM`] shuffled test images (a fresh shuffle for each pass over the
/// test set), each from an empty history, the detector flags; with the number of streams run.
pub fn benign_flagged(d: &mut StatefulDetector, test: &Dataset, count: usize, seed: u64) -> Result<(usize, usize)> {
    let mut benign = Vec::new();
    for pass in 0.. {
        if benign.len() >= count {
            break;
        }
        let order = armoury::seed::shuffled(test.len(), seed, 2 + pass);
        benign.extend(streams(test.images(), &order, STREAM)?);
        if benign.is_empty() {
            return Err(Error::invalid("benign streams", format!("fewer than {STREAM} test images: no benign stream")));
        }
    }
    benign.truncate(count.max(1));
    let mut flagged = 0;
    for s in &benign {
        d.reset();
        flagged += usize::from(d.observe(s)?.iter().any(|&f| f));
    }
    d.reset();
    Ok((flagged, benign.len()))
}

/// `attack` run on each sample of `x` alone against `clf` watched by `d` (reset before each sample), through
/// query blinding (radius, seed) `blind` when given (the adaptive attacker); samples the model misclassifies are
/// not attacked. Sample i's attack gets the seed `seed(i)`, and its result depends on that and its own values
/// only. Gives the detector back, reset.
pub fn watch(
    clf: &Arc<dyn Classifier>,
    d: StatefulDetector,
    attack: &dyn Attack,
    (x, y): (&Tensor, &[usize]),
    blind: Option<(f32, u64)>,
    seed: &dyn Fn(usize) -> u64,
) -> Result<(Vec<Watched>, StatefulDetector)> {
    let watched = Arc::new(Monitored::new(clf.clone(), d));
    let attacker: Arc<dyn Classifier> = match blind {
        Some((r, s)) => Arc::new(QueryBlinding::new(watched.clone(), r, s)?),
        None => watched.clone(),
    };
    let clean = clf.predict(x)?;
    let mut out = Vec::with_capacity(y.len());
    for (i, &label) in y.iter().enumerate() {
        if clean[i] != label {
            out.push(Watched { attacked: false, first_flag: None, fooled: false });
            continue;
        }
        watched.with_detector(|d| d.reset())?;
        let r = attack.run(attacker.as_ref(), &x.narrow(0, i, 1)?, &y[i..i + 1], &Goal::Untargeted, seed(i))?;
        let first_flag = watched.with_detector(|d| d.detections().first().copied())?;
        // Judged by the bare model on the input the attacker ends with (not on a blinded copy of it).
        let fooled = clf.predict(&r.adversarial)?[0] != label;
        out.push(Watched { attacked: true, first_flag, fooled });
    }
    drop(attacker);
    let watched = Arc::try_unwrap(watched).map_err(|_| Error::invalid("watch", "the watched model is still shared"))?;
    let mut d = watched.into_detector()?;
    d.reset();
    Ok((out, d))
}

/// The mean number of queries up to and including the first flagged one, over the samples flagged (`None`:
/// none flagged).
pub fn mean_queries_to_flag(watched: &[Watched]) -> Option<f64> {
    let firsts: Vec<usize> = watched.iter().filter_map(|w| w.first_flag).collect();
    (!firsts.is_empty()).then(|| firsts.iter().map(|&f| (f + 1) as f64).sum::<f64>() / firsts.len() as f64)
}

/// The cascade's Square settings (its `square` entry, else Square's defaults) at the headline ε.
fn square(cx: &Context<'_>) -> Result<(Box<dyn Attack>, String)> {
    let spec =
        cx.threat.attacks.iter().find(|a| a.name == "square").cloned().unwrap_or_else(|| AttackSpec::named("square"));
    let eps = cx.eps()?;
    Ok(((cx.build)(&spec, cx.threat.norm()?, eps as f32)?, format!("{} at ε = {eps}", spec.label())))
}

pub(super) fn slice(cx: &Context<'_>) -> Result<super::DetectorSlice> {
    let seed = cx.threat.seed;
    // The input of the model's head (`fc1_relu` for the native cnn): a fixed name exists in one model only.
    let tap = crate::detectors::default_tap(cx.model.as_ref())?;
    let (mut d, tau, calib) =
        calibrated(cx.model, cx.set.training("calibrating the stateful detector")?, &tap, 20, SIMILARITY_FPR, seed)?;
    let (benign_flagged, benign_streams) = benign_flagged(&mut d, &cx.set.test, BENIGN_STREAMS, seed)?;
    let (clean, labels, _, _) = inputs(cx)?;
    let (attack, words) = square(cx)?;
    let eps = cx.eps()? as f32;
    let mut attacks = Vec::new();
    // Sample k of the data set (k = the run's first sample + i) is attacked with the seed seed + k, whatever its
    // shard; the blinding noise has its own seed, the same in every shard.
    let first = cx.ledger.range.0;
    let sample = |i: usize| seed + (first + i) as u64;
    for blind in [None, Some((eps, armoury::seed::derive(seed, 0xb11d)))] {
        let (samples, back) = watch(cx.model, d, attack.as_ref(), (&clean, &labels), blind, &|i| sample(i))?;
        d = back;
        let name = match blind {
            None => words.clone(),
            Some((r, _)) => format!("{words}, query blinding U[−{r}, {r}]"),
        };
        attacks.push((name, blind.is_some(), samples));
    }
    Ok(super::DetectorSlice::Stateful(StatefulSlice {
        name: format!("similarity ({tap} encodings, k = 20)"),
        threshold: tau,
        calibration: format!("{SIMILARITY_FPR} of {calib} benign streams of {STREAM} training images"),
        benign_streams,
        benign_flagged,
        attacks,
    }))
}

impl StatefulSlice {
    /// Appends the next shard's samples, checking that the shard-invariant fields agree.
    pub fn append(&mut self, b: StatefulSlice) -> Result<()> {
        let a = self;
        same("a detector", &(&a.name, a.threshold, &a.calibration), &(&b.name, b.threshold, &b.calibration))?;
        same("the benign streams", &(a.benign_streams, a.benign_flagged), &(b.benign_streams, b.benign_flagged))?;
        same("the attacks", &a.attacks.len(), &b.attacks.len())?;
        for (x, y) in a.attacks.iter_mut().zip(b.attacks) {
            same("an attack", &(&x.0, x.1), &(&y.0, y.1))?;
            x.2.extend(y.2);
        }
        Ok(())
    }

    /// The detector's figures: per attack, the samples attacked, flagged, the mean queries to the first flag and
    /// the attacker's wins; the benign streams flagged.
    pub fn report(&self) -> StatefulReport {
        let attacks = self
            .attacks
            .iter()
            .map(|(attack, adaptive, w)| StatefulAttack {
                attack: attack.clone(),
                adaptive: *adaptive,
                attacked: w.iter().filter(|w| w.attacked).count(),
                flagged: w.iter().filter(|w| w.first_flag.is_some()).count(),
                mean_queries_to_flag: mean_queries_to_flag(w),
                evaded: w.iter().filter(|w| w.attacked && w.fooled && w.first_flag.is_none()).count(),
            })
            .collect();
        StatefulReport {
            name: self.name.clone(),
            threshold: f64::from(self.threshold),
            calibration: self.calibration.clone(),
            benign_streams: self.benign_streams,
            benign_stream_len: STREAM,
            benign_flagged: self.benign_flagged,
            attacks,
        }
    }
}
