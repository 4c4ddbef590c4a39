//! One detector evaluated on its own, outside a threat model's cascade (what the `detect` example runs): a
//! per-input detector or the region classifier against one attack's adversarial examples ([`evaluate`]), or the
//! stateful query detector watching one query attack ([`similarity`]).
//!
//! A per-input detector is fitted on clean training images at 1% FPR ([`super::guard::TARGET_FPR`]); detection
//! (ROC AUC, TPR at 1% / 5% FPR) is measured on the adversarial examples that fool the classifier against all
//! clean images; the protected pipeline (model + rejection, or the region classifier, which classifies instead of
//! rejecting) is measured on clean images, on the attack's examples (non-adaptive) and, when asked, under
//! [`AdaptivePgd`] on the detector in front of the model (BPDA through squeezers, EOT through the region
//! classifier's noise).

use std::sync::Arc;
use std::time::Instant;

use armoury::{Attack, Classifier, Detector, Guarded, Result, Tensor};

use super::guard::{rejection_scale, REGION_EOT, TARGET_FPR};
use super::stateful::{self, Watched};
use super::{share, survived_all};
use crate::detectors::{
    choose_tap, detection_metrics, gaussian_encodings, measure_index, protected_correct, AdaptivePgd, DetectionMetrics,
    IndexConfig, IndexMeasurement, RegionClassifier,
};
use crate::registry::{self, DetectorBuild};

/// Test samples attacked per call of the attack (bounding memory).
pub const ATTACK_BATCH: usize = 250;

/// What [`evaluate`] runs.
pub struct DetectRun<'a> {
    /// The detector's name: `region`, or a per-input one of [`registry::PER_INPUT`].
    pub detector: &'a str,
    /// How a per-input detector is built (model, data, fit images, layers, the combiners' attack, MagNet); its
    /// `fit` clean training images also fit the threshold.
    pub build: DetectorBuild<'a>,
    /// The first `limit` test images are evaluated.
    pub limit: usize,
    /// Adversarial examples of test images (`x`, true labels) against the bare model.
    pub attack: &'a (dyn Fn(&Tensor, &[usize]) -> Result<Tensor> + 'a),
    /// The adaptive attack on the protected pipeline (`None`: not run).
    pub adaptive: Option<AdaptivePgd>,
    /// Seed of the region classifier's noise and of the adaptive attack.
    pub seed: u64,
    /// Lines for people: the region radius and the threshold once fitted.
    pub notify: &'a dyn Fn(&str),
}

/// The figures of [`evaluate`].
#[derive(Clone, Debug)]
pub struct DetectEvaluation {
    /// The detector's name.
    pub name: String,
    /// Its threshold, fitted at 1% FPR.
    pub threshold: f32,
    /// Clean training images it was fitted on.
    pub fit_samples: usize,
    /// Detection of the adversarial examples that fool the model against every clean image.
    pub metrics: DetectionMetrics,
    /// Adversarial examples scored (those that fool the model).
    pub fooled: usize,
    /// The bare model's accuracy on the clean images.
    pub undefended_clean: f64,
    /// The bare model's accuracy on the attack's examples.
    pub undefended_robust: f64,
    /// The protected pipeline right on the clean images.
    pub protected_clean: f64,
    /// The protected pipeline right or rejecting on the attack's examples.
    pub protected_robust_non_adaptive: f64,
    /// The same under the adaptive attack (`None`: not run).
    pub protected_robust_adaptive: Option<f64>,
    /// The figure a defender can claim: per sample, right or rejecting under every attack run.
    pub protected_robust_accuracy: f64,
    /// Clean training images fitted per second.
    pub fit_per_second: f64,
    /// Images (clean and adversarial) scored per second.
    pub score_per_second: f64,
}

/// The detector of `run`, and the fitted radius when it is the region classifier.
fn build(run: &DetectRun<'_>) -> Result<(Box<dyn Detector>, Option<f32>)> {
    if run.detector == "region" {
        let r = registry::region(run.build.model, run.build.set, run.seed)?;
        let radius = r.radius();
        (run.notify)(&format!("region radius fitted: {radius}"));
        return Ok((Box::new(r), Some(radius)));
    }
    Ok((registry::detector(&run.build, run.detector)?, None))
}

/// Builds and fits the detector of `run`, attacks the first `run.limit` test images, and measures detection and
/// the protected pipeline (see the module's description).
pub fn evaluate(run: &DetectRun<'_>) -> Result<DetectEvaluation> {
    let (clf, set) = (run.build.model, run.build.set);
    let n = run.limit.min(set.test.len());
    let (x, y) = set.test.batch(0..n)?;
    let (mut detector, radius) = build(run)?;
    let train = set.training("fitting the detector")?;
    let (fit_x, _) = train.batch(0..run.build.fit.min(train.len() / 2))?;
    let fit_samples = fit_x.shape()[0];
    let t = Instant::now();
    let tau = detector.fit(&fit_x, TARGET_FPR as f32)?;
    let fit_per_second = fit_samples as f64 / t.elapsed().as_secs_f64();
    let scale = rejection_scale(&detector.score(&fit_x)?, tau);
    (run.notify)(&format!(
        "detector {}: threshold {tau} at 1% FPR on {fit_samples} clean training images",
        detector.name()
    ));

    let correct = |pred: Vec<usize>| pred.iter().zip(&y).map(|(p, l)| p == l).collect::<Vec<_>>();
    let undefended_clean = share(&correct(clf.predict(&x)?));
    let adv = (run.attack)(&x, &y)?;
    let adv_pred = clf.predict(&adv)?;
    let undefended_robust = share(&correct(adv_pred.clone()));
    // Detection is measured on the adversarial examples that fool the classifier, against all clean images.
    let fooled: Vec<usize> = (0..n).filter(|&i| adv_pred[i] != y[i]).collect();
    let t = Instant::now();
    let metrics = detection_metrics(detector.as_ref(), &x, &adv.index_select(0, &fooled)?)?;
    let score_per_second = (n + fooled.len()) as f64 / t.elapsed().as_secs_f64();

    let detector: Arc<dyn Detector> = Arc::from(detector);
    let guarded = Guarded::new(clf.clone(), detector.clone())?.with_scale(scale)?;
    // The region classifier is its own protected pipeline (it classifies; it does not reject).
    let region_clf = radius.map(|r| RegionClassifier::new(clf.clone(), r, 100, run.seed)).transpose()?;
    let pipeline: &dyn Classifier = match &region_clf {
        Some(r) => r,
        None => &guarded,
    };
    let protected_clean = share(&protected_correct(pipeline, &x, &y, false)?);
    let non_adaptive_ok = protected_correct(pipeline, &adv, &y, true)?;
    let adaptive_ok = match (run.adaptive, &region_clf) {
        (None, _) => None,
        (Some(pgd), Some(r)) => {
            // The attacker votes over 10 copies and differentiates 8 (EOT); the defense answers with its 100.
            let attacker =
                RegionClassifier::new(clf.clone(), r.radius(), 10, run.seed + 1)?.with_eot_samples(REGION_EOT)?;
            Some(protected_correct(pipeline, &pgd.run(&attacker, &x, &y, run.seed)?, &y, true)?)
        }
        (Some(pgd), None) => Some(protected_correct(pipeline, &pgd.run(&guarded, &x, &y, run.seed)?, &y, true)?),
    };
    let every = match &adaptive_ok {
        Some(a) => survived_all(&[&non_adaptive_ok, a])?,
        None => non_adaptive_ok.clone(),
    };
    Ok(DetectEvaluation {
        name: detector.name().to_string(),
        threshold: tau,
        fit_samples,
        metrics,
        fooled: fooled.len(),
        undefended_clean,
        undefended_robust,
        protected_clean,
        protected_robust_non_adaptive: share(&non_adaptive_ok),
        protected_robust_adaptive: adaptive_ok.as_deref().map(share),
        protected_robust_accuracy: share(&every),
        fit_per_second,
        score_per_second,
    })
}

/// What [`similarity`] runs.
pub struct SimilarityRun<'a> {
    /// The model the detector watches.
    pub model: &'a Arc<dyn Classifier>,
    /// The data: training images calibrate, test images make the benign streams and are attacked.
    pub set: &'a armoury::data::TrainTest,
    /// The activation encoded ([`choose_tap`]; `None`: the input of the model's head).
    pub tap: Option<&'a str>,
    /// The k nearest stored queries compared with.
    pub k: usize,
    /// The share of benign calibration streams the threshold may flag.
    pub fpr: f32,
    /// Benign test streams the false-positive rate is measured on.
    pub benign: usize,
    /// The first `limit` test images are attacked, one at a time.
    pub limit: usize,
    /// The query attack.
    pub attack: &'a dyn Attack,
    /// Seed of the streams and of the attacks (sample i's attack: `seed + i`).
    pub seed: u64,
    /// Lines for people: the activation encoded and the threshold once calibrated.
    pub notify: &'a dyn Fn(&str),
}

/// The figures of [`similarity`].
#[derive(Clone, Debug)]
pub struct SimilarityEvaluation {
    /// The activation encoded.
    pub tap: String,
    /// The calibrated threshold (minus the mean k-NN distance).
    pub threshold: f32,
    /// Benign calibration streams of [`stateful::STREAM`] training images.
    pub calibration_streams: usize,
    /// Calibration queries per second.
    pub calibration_per_second: f64,
    /// Benign test streams run.
    pub benign_streams: usize,
    /// Benign test streams flagged.
    pub benign_flagged: usize,
    /// Per test image under the query attack.
    pub watched: Vec<Watched>,
    /// Seconds of the query attacks.
    pub attack_seconds: f64,
}

impl SimilarityEvaluation {
    /// Images attacked (those the model classifies correctly).
    pub fn attacked(&self) -> usize {
        self.watched.iter().filter(|w| w.attacked).count()
    }

    /// The share of the attacked images whose attack was flagged within its first `queries` queries (0 when none
    /// was attacked).
    pub fn flagged_within(&self, queries: usize) -> f64 {
        let n = self.watched.iter().filter(|w| w.first_flag.is_some_and(|f| f < queries)).count();
        n as f64 / self.attacked().max(1) as f64
    }

    /// The share of the attacked images whose attack was flagged at all (0 when none was attacked).
    pub fn flagged(&self) -> f64 {
        self.flagged_within(usize::MAX)
    }

    /// The share of the benign test streams flagged.
    pub fn benign_flag_rate(&self) -> f64 {
        self.benign_flagged as f64 / self.benign_streams as f64
    }

    /// The mean number of queries to the first flag of the flagged attacks (`None`: none flagged).
    pub fn mean_queries_to_flag(&self) -> Option<f64> {
        stateful::mean_queries_to_flag(&self.watched)
    }
}

/// The stateful query detector of `run`: calibrated on benign streams of training images, its false-positive
/// rate measured on benign streams of test images, and watching the query attack on each of the first
/// `run.limit` test images alone ([`stateful::watch`]).
pub fn similarity(run: &SimilarityRun<'_>) -> Result<SimilarityEvaluation> {
    let t = Instant::now();
    let tap = choose_tap(run.model.as_ref(), run.tap)?;
    (run.notify)(&format!("similarity: encoding the activation '{tap}'"));
    let (mut d, tau, calib) = stateful::calibrated(
        run.model,
        run.set.training("calibrating the stateful detector")?,
        &tap,
        run.k,
        run.fpr,
        run.seed,
    )?;
    let calibration_per_second = (calib * stateful::STREAM) as f64 / t.elapsed().as_secs_f64();
    (run.notify)(&format!(
        "similarity: threshold {tau} (mean {}-NN distance {:.3}) at {} of {calib} benign streams of {} training images",
        run.k,
        -tau,
        run.fpr,
        stateful::STREAM
    ));
    let (benign_flagged, benign_streams) = stateful::benign_flagged(&mut d, &run.set.test, run.benign, run.seed)?;
    // Only the images the model classifies correctly are attacked (an attack stops at once on the others).
    let n = run.limit.min(run.set.test.len());
    let (x, y) = run.set.test.batch(0..n)?;
    let t = Instant::now();
    let (watched, _) = stateful::watch(run.model, d, run.attack, (&x, &y), None, &|i| run.seed + i as u64)?;
    Ok(SimilarityEvaluation {
        tap,
        threshold: tau,
        calibration_streams: calib,
        calibration_per_second,
        benign_streams,
        benign_flagged,
        watched,
        attack_seconds: t.elapsed().as_secs_f64(),
    })
}

/// The stateful index's cost per query (score + insert of a 128-value encoding) once its history holds 1k, 10k
/// and 100k encodings (random Gaussian ones drawn from `seed`), and its recall against the exact 20 nearest
/// (`cargo bench --bench similarity` has the same on the cnn's encodings of Fashion-MNIST).
pub fn index_costs(seed: u64) -> Result<Vec<IndexMeasurement>> {
    let history = gaussian_encodings(100_000, 128, seed);
    let probes = gaussian_encodings(1050, 128, seed + 1);
    measure_index(20, IndexConfig::default(), &history, &probes, &[1_000, 10_000, 100_000])
}
