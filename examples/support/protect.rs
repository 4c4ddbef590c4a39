//! `evaluate`'s defenses and detectors (armoury-defenses), wired here so that the core's evaluator and report
//! stay free of the defenses crate: the report only takes their figures.
//!
//! - `--defense NAME[:PARAM]`: an input transformation in front of the model, used as a classifier with its
//!   BPDA/EOT gradients; the threat model's cascade attacks the defended model adaptively at the headline ε,
//!   and DefenseEvaluate's metrics compare the undefended and defended models on the undefended cascade's
//!   worst-case inputs.
//! - `--detector NAME`: fitted on clean training images at 1% FPR, scored against the cascade's adversarial
//!   examples (ROC AUC, TPR at 1% / 5% FPR), and the protected pipeline (model + rejection) measured on clean
//!   images, on the cascade's inputs (non-adaptive) and under `AdaptivePgd` (adaptive, L∞ threat models).

use std::path::Path;
use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::eval::{self, CascadeRun, Ledger, ThreatModel};
use armoury::metrics::{defense_metrics, wilson, Z95};
use armoury::report::{DefenseReport, DetectorReport};
use armoury::{Classifier, Detector, Guarded, Tensor};
use armoury_attacks::registry::{self, from_spec, AttackParams};
use armoury_defenses::detectors::{
    detection_metrics, protected_accuracy, AdaptivePgd, FeatureSqueezing, Lid, LogisticTraining, Mahalanobis,
};
use armoury_defenses::transforms::{
    BitDepth, Defended, GaussianFilter, GaussianNoise, Jpeg, MeanFilter, MedianFilter, TotalVariation, Transform,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The false-positive rate detectors are fitted at.
pub const TARGET_FPR: f64 = 0.01;

/// The defenses `--defense` knows, with their parameter: `bit-depth[:BITS]`, `median[:SIZE]`, `mean[:SIZE]`,
/// `gaussian[:SIGMA]`, `jpeg[:QUALITY]`, `tv[:WEIGHT]` (random pixel dropout: EOT), `noise[:SIGMA]` (EOT).
pub const DEFENSES: &str = "bit-depth[:BITS], median[:SIZE], mean[:SIZE], gaussian[:SIGMA], jpeg[:QUALITY], \
                            tv[:WEIGHT], noise[:SIGMA]";

/// The transform of a `--defense` spec.
pub fn transform(spec: &str) -> Res<Arc<dyn Transform>> {
    let (name, param) = match spec.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (spec, None),
    };
    fn or<T: std::str::FromStr>(p: Option<&str>, default: T) -> Res<T>
    where
        T::Err: std::error::Error + 'static,
    {
        Ok(p.map(str::parse).transpose()?.unwrap_or(default))
    }
    let t: Arc<dyn Transform> = match name {
        "bit-depth" => Arc::new(BitDepth { bits: or(param, BitDepth::default().bits)? }),
        "median" => Arc::new(MedianFilter { size: or(param, 3)? }),
        "mean" => Arc::new(MeanFilter { size: or(param, 3)? }),
        "gaussian" => Arc::new(GaussianFilter::new(or(param, 1.0)?)),
        "jpeg" => Arc::new(Jpeg { quality: or(param, Jpeg::default().quality)? }),
        "tv" => Arc::new(TotalVariation { weight: or(param, TotalVariation::default().weight)?, ..Default::default() }),
        "noise" => Arc::new(GaussianNoise { sigma: or(param, GaussianNoise::default().sigma)?, clip: true }),
        other => return Err(format!("unknown defense '{other}' (known: {DEFENSES})").into()),
    };
    t.validate()?;
    Ok(t)
}

/// What a defense or detector is evaluated with: the model, the data, the threat model and the undefended
/// cascade's ledger.
pub struct Context<'a> {
    pub model: &'a Arc<dyn Classifier>,
    pub set: &'a TrainTest,
    pub threat: &'a ThreatModel,
    pub ledger: &'a Ledger,
    pub out: &'a Path,
    /// EOT draws of random transforms.
    pub eot: usize,
    /// Clean training images detectors are fitted on.
    pub fit: usize,
    pub progress: &'a (dyn Fn(usize, usize) + Sync),
}

/// The defended model attacked by the cascade at the headline ε (resumable: `defense-K.json` in the output
/// directory), and DefenseEvaluate's metrics on the undefended cascade's worst-case inputs.
pub fn evaluate_defense(cx: &Context<'_>, k: usize, spec: &str) -> Res<DefenseReport> {
    let t = transform(spec)?;
    let name = t.name();
    let defended = Defended::shared(cx.model.clone(), t)?.with_eot(cx.eot, cx.threat.seed)?;
    let eps = *cx.threat.eps.last().ok_or("the threat model has no ε")?;
    let tm = ThreatModel {
        name: format!("{} + {name}", cx.threat.name),
        eps: vec![eps],
        minimal: Vec::new(),
        ..cx.threat.clone()
    };
    let n = cx.ledger.records.len();
    let run = CascadeRun {
        threat: &tm,
        build: &from_spec,
        model_name: format!("{} behind {name}", cx.ledger.model),
        range: (0, n),
        total_samples: n,
        chunk: tm.batch_size,
        state: Some(cx.out.join(format!("defense-{k}.json"))),
        max_steps: None,
        progress: Some(cx.progress),
    };
    let ledger = eval::run_cascade(&defended, &cx.set.test, &run)?;
    let summary = eval::summarise(&tm, &ledger, defended.num_classes());
    let (x, y, _) = eval::worst_case_inputs(cx.ledger, &cx.set.test)?;
    let (raw, def) = (cx.model.probabilities(&x)?, defended.probabilities(&x)?);
    let correct = armoury::classifier::argmax_rows(&def).iter().zip(&y).filter(|(p, l)| p == l).count();
    Ok(DefenseReport {
        name,
        clean_accuracy: summary.clean_accuracy,
        robust_accuracy: summary.headline(),
        eps,
        per_attack: eval::attack_summaries(&summary, 0),
        transfer_accuracy: wilson(correct, y.len(), Z95)?,
        metrics: defense_metrics(&raw, &def, &y)?,
        metrics_inputs: format!(
            "the undefended cascade's worst-case inputs at ε ≤ {eps} ({} samples: the adversarial example where \
             the cascade broke the undefended model, the clean image elsewhere)",
            y.len()
        ),
    })
}

/// The detector named `name`, before fitting. Layer detectors (`lid`, `mahalanobis`) read the reference cnn's
/// layers and fit their logistic combiner on 500 training images attacked with PGD-40 at the headline ε.
fn detector(cx: &Context<'_>, name: &str) -> Res<Box<dyn Detector>> {
    let layers = ["conv1_relu", "conv2_relu", "fc1_relu", "fc2"];
    let fit = cx.fit.min(cx.set.train.len() / 2);
    let (reference, ref_y) = cx.set.train.batch(fit..2 * fit)?;
    let combiner_data = || -> Res<(Tensor, Tensor)> {
        let len = cx.set.train.len();
        let (x, y) = cx.set.train.batch(len - 500.min(len)..len)?;
        let eps = *cx.threat.eps.last().unwrap_or(&0.1) as f32;
        let pgd = registry::by_name("pgd", &AttackParams { eps, steps: Some(40), ..AttackParams::default() })?;
        let adv = pgd.run(cx.model.as_ref(), &x, &y, &armoury::Goal::Untargeted, cx.threat.seed)?.adversarial;
        Ok((x, adv))
    };
    Ok(match name {
        "squeeze" => Box::new(FeatureSqueezing::with_defaults(cx.model.clone(), 4)?),
        "lid" => {
            let mut d = Lid::new(cx.model.clone(), &layers, 20, &reference)?;
            let (c, a) = combiner_data()?;
            d.fit_combiner(&c, &a, &LogisticTraining::default())?;
            Box::new(d)
        }
        "mahalanobis" => {
            let mut d = Mahalanobis::new(cx.model.clone(), &layers, &reference, &ref_y, 1e-3)?;
            let (c, a) = combiner_data()?;
            d.fit_combiner(&c, &a, &LogisticTraining::default())?;
            Box::new(d)
        }
        other => return Err(format!("unknown detector '{other}' (known: squeeze, lid, mahalanobis)").into()),
    })
}

/// The detector fitted on clean training images, its detection of the cascade's adversarial examples against
/// the clean test images, and the protected pipeline's accuracies (clean; the cascade's inputs; AdaptivePgd).
pub fn evaluate_detector(cx: &Context<'_>, name: &str) -> Res<DetectorReport> {
    let mut d = detector(cx, name)?;
    let (fit_x, _) = cx.set.train.batch(0..cx.fit.min(cx.set.train.len() / 2))?;
    let tau = d.fit(&fit_x, TARGET_FPR as f32)?;
    // The rejection logit's scale: one logit per (τ − median clean score), so that the adaptive attack's loss
    // sees the detector's margin on the classifier's scale.
    let mut clean_scores = d.score(&fit_x)?;
    let mid = clean_scores.len() / 2;
    let median = *clean_scores.select_nth_unstable_by(mid, f32::total_cmp).1;
    let scale = if tau - median > 0.0 && (tau - median).is_finite() { 1.0 / (tau - median) } else { 1.0 };

    // The ledger's records are its range's samples, in order.
    let (clean, labels) = cx.set.test.batch(cx.ledger.range.0..cx.ledger.range.1)?;
    let (worst, _, broken) = eval::worst_case_inputs(cx.ledger, &cx.set.test)?;
    let fooled: Vec<usize> = (0..broken.len()).filter(|&i| broken[i]).collect();
    let metrics = detection_metrics(d.as_ref(), &clean, &worst.index_select(0, &fooled)?)?;

    let d: Arc<dyn Detector> = Arc::from(d);
    let guarded = Guarded::new(cx.model.clone(), d.clone())?.with_scale(scale)?;
    let eps = *cx.threat.eps.last().unwrap_or(&0.1) as f32;
    let pgd = AdaptivePgd { eps, steps: 40, step_size: eps / 10.0, lambda: 1.0, random_start: true };
    let adaptive = if cx.threat.norm == "linf" {
        let adv = pgd.run(&guarded, &clean, &labels, cx.threat.seed)?;
        Some(protected_accuracy(&guarded, &adv, &labels, true)?)
    } else {
        None
    };
    Ok(DetectorReport {
        name: d.name().to_string(),
        target_fpr: TARGET_FPR,
        threshold: f64::from(tau),
        fit_samples: fit_x.shape()[0],
        clean_scored: labels.len(),
        adversarial_scored: fooled.len(),
        auc: metrics.auc,
        tpr_at_1fpr: metrics.tpr_at_1fpr,
        tpr_at_5fpr: metrics.tpr_at_5fpr,
        protected_clean_accuracy: protected_accuracy(&guarded, &clean, &labels, false)?,
        protected_robust_non_adaptive: protected_accuracy(&guarded, &worst, &labels, true)?,
        adaptive_attack: format!(
            "AdaptivePgd(ε = {eps}, {} steps of {}, λ = {}, random start){}",
            pgd.steps,
            pgd.step_size,
            pgd.lambda,
            if adaptive.is_none() { ": not run (L∞ only)" } else { "" }
        ),
        protected_robust_adaptive: adaptive,
    })
}
