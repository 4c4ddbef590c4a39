//! The stateful query detector (Chen, Carlini & Wagner 2020) as the `detect` and `evaluate` examples run it:
//! calibrated on benign streams of shuffled training images, checked on benign streams of shuffled test images,
//! and watching query attacks run one sample at a time, each from an empty history.

use std::sync::Arc;

use armoury::{Attack, Classifier, Goal, Tensor};
use armoury_defenses::detectors::{IndexConfig, Monitored, QueryBlinding, StatefulDetector, TapEncoder};
use serde::{Deserialize, Serialize};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Queries per benign stream.
pub const STREAM: usize = 100;

/// Streams of `len` images in the order `order`.
pub fn streams(images: &Tensor, order: &[usize], len: usize) -> Res<Vec<Tensor>> {
    Ok(order.chunks_exact(len).map(|c| images.index_select(0, c)).collect::<Result<_, _>>()?)
}

/// The detector on the classifier's layer `layer` with `k` neighbours, calibrated at `fpr` on benign streams of
/// [`STREAM`] shuffled training images; with its threshold and the number of calibration streams.
pub fn calibrated(
    clf: &Arc<dyn Classifier>,
    train: &armoury::data::Dataset,
    layer: &str,
    k: usize,
    fpr: f32,
    seed: u64,
) -> Res<(StatefulDetector, f32, usize)> {
    let encoder = Arc::new(TapEncoder::new(clf.clone(), layer)?);
    let mut d = StatefulDetector::new(encoder, k, IndexConfig::default())?;
    let calib = streams(train.images(), &armoury::seed::shuffled(train.len(), seed, 1), STREAM)?;
    let tau = d.calibrate(&calib, fpr)?;
    Ok((d, tau, calib.len()))
}

/// How many of `count` benign streams of [`STREAM`] shuffled test images (a fresh shuffle for each pass over the
/// test set), each from an empty history, the detector flags; with the number of streams run.
pub fn benign_flagged(
    d: &mut StatefulDetector,
    test: &armoury::data::Dataset,
    count: usize,
    seed: u64,
) -> Res<(usize, usize)> {
    let mut benign = Vec::new();
    for pass in 0.. {
        if benign.len() >= count {
            break;
        }
        let order = armoury::seed::shuffled(test.len(), seed, 2 + pass);
        benign.extend(streams(test.images(), &order, STREAM)?);
        if benign.is_empty() {
            return Err(format!("fewer than {STREAM} test images: no benign stream").into());
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

/// `attack` run on each sample of `x` alone against `clf` watched by `d` (reset before each sample), through
/// query blinding (radius, seed) `blind` when given (the adaptive attacker); samples the model misclassifies are not
/// attacked. Sample i's attack gets the seed `seed(i)`, and its result depends on that and its own values only. Gives the detector
/// back, reset.
pub fn watch(
    clf: &Arc<dyn Classifier>,
    d: StatefulDetector,
    attack: &dyn Attack,
    (x, y): (&Tensor, &[usize]),
    blind: Option<(f32, u64)>,
    seed: &dyn Fn(usize) -> u64,
) -> Res<(Vec<Watched>, StatefulDetector)> {
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
    let mut d = Arc::try_unwrap(watched).map_err(|_| "the watched model is still shared")?.into_detector()?;
    d.reset();
    Ok((out, d))
}
