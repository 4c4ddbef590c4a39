//! Detectors in an evaluation, each in the two phases of [`super`] (per-sample results of the run's samples,
//! then the figures of all of them):
//!
//! - per-input detectors (`squeeze`, `lid`, `mahalanobis`, `ensemble`, `magnet[:IMAGES,EPOCHS]`, `magnet-PART`):
//!   fitted on clean training images at 1% FPR, scored against the cascade's adversarial examples (ROC AUC, TPR
//!   at 1% / 5% FPR), and the protected pipeline (model + rejection) measured on clean images, on the cascade's
//!   inputs (non-adaptive) and under `AdaptivePgd` (adaptive, L∞ threat models);
//! - `region`: Cao & Gong's region classifier, a defense that changes the prediction, reported as a defense —
//!   clean and robust accuracy, non-adaptive on the cascade's worst-case inputs, adaptive under `AdaptivePgd`
//!   through the region classifier with EOT over its noisy copies;
//! - `similarity`: the stateful query detector ([`super::stateful`]).

use std::sync::Arc;
use std::time::Instant;

use armoury::attack::budget::Norm;
use armoury::eval::{self, AttackSpec};
use armoury::metrics::{defense_metrics, wilson, Z95};
use armoury::report::{AttackSummary, DefenseReport, DetectorReport};
use armoury::{Classifier, Detector, Error, Goal, Guarded, Result, Tensor};
use serde::{Deserialize, Serialize};

use super::stateful::{self, StatefulSlice};
use super::{probabilities, same, share, survived_all, worst_case_words, Context};
use crate::detectors::{
    images_epochs, protected_correct, AdaptivePgd, DetectionMetrics, MagnetConfig, RegionClassifier,
};
use crate::registry::{self, DetectorBuild};

/// The false-positive rate per-input detectors are fitted at.
pub const TARGET_FPR: f64 = 0.01;
/// Noisy copies the adaptive attacker on the region classifier differentiates per step (EOT).
pub const REGION_EOT: usize = 8;

/// A detector's per-sample results on the run's samples.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DetectorSlice {
    /// A per-input detector.
    Guard(GuardSlice),
    /// The region classifier.
    Region(RegionSlice),
    /// The stateful query detector.
    Stateful(StatefulSlice),
}

/// A per-input detector in front of the model.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GuardSlice {
    /// The detector's name.
    pub name: String,
    /// Its fitted threshold.
    pub threshold: f32,
    /// Clean training images it was fitted on.
    pub fit_samples: usize,
    /// Scores of the clean images.
    pub clean_scores: Vec<f32>,
    /// Scores of the cascade's adversarial examples of the samples it broke.
    pub adversarial_scores: Vec<f32>,
    /// Per sample: the protected pipeline right on the clean image.
    pub clean_ok: Vec<bool>,
    /// Per sample: right or rejecting on the cascade's worst-case input.
    pub non_adaptive_ok: Vec<bool>,
    /// Per sample: right or rejecting under the adaptive attack (`None`: not run).
    pub adaptive_ok: Option<Vec<bool>>,
    /// The adaptive attack with its settings.
    pub adaptive_attack: String,
}

/// The region classifier.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RegionSlice {
    /// Its name with radius and copies.
    pub name: String,
    /// Per sample: right on the clean image.
    pub clean_ok: Vec<bool>,
    /// Per sample: right on the cascade's worst-case input.
    pub non_adaptive_ok: Vec<bool>,
    /// Per sample: right under the adaptive attack (`None`: not run).
    pub adaptive_ok: Option<Vec<bool>>,
    /// The adaptive attack with its settings.
    pub adaptive_attack: String,
    /// The adaptive attack's model gradients per sample: each of its steps differentiates [`REGION_EOT`] noisy
    /// copies.
    pub adaptive_gradients: usize,
    /// Undefended probabilities on the worst-case inputs, row-major.
    pub raw: Vec<f32>,
    /// The region classifier's vote fractions on them.
    pub region: Vec<f32>,
    /// Seconds of the adaptive attack (wall clock: summed over shards).
    pub seconds: f64,
}

impl DetectorSlice {
    /// Appends the next shard's samples, checking that the shard-invariant fields agree.
    pub fn append(&mut self, next: DetectorSlice) -> Result<()> {
        match (self, next) {
            (DetectorSlice::Guard(a), DetectorSlice::Guard(b)) => {
                same("a detector", &(&a.name, a.threshold, a.fit_samples), &(&b.name, b.threshold, b.fit_samples))?;
                same("the adaptive attack", &a.adaptive_attack, &b.adaptive_attack)?;
                a.clean_scores.extend(b.clean_scores);
                a.adversarial_scores.extend(b.adversarial_scores);
                a.clean_ok.extend(b.clean_ok);
                a.non_adaptive_ok.extend(b.non_adaptive_ok);
                extend(&mut a.adaptive_ok, b.adaptive_ok)
            }
            (DetectorSlice::Region(a), DetectorSlice::Region(b)) => {
                same("a detector", &(&a.name, &a.adaptive_attack), &(&b.name, &b.adaptive_attack))?;
                a.clean_ok.extend(b.clean_ok);
                a.non_adaptive_ok.extend(b.non_adaptive_ok);
                a.raw.extend(b.raw);
                a.region.extend(b.region);
                a.seconds += b.seconds;
                extend(&mut a.adaptive_ok, b.adaptive_ok)
            }
            (DetectorSlice::Stateful(a), DetectorSlice::Stateful(b)) => a.append(b),
            _ => Err(Error::invalid("merge", "shards disagree on the detectors")),
        }
    }
}

fn extend(a: &mut Option<Vec<bool>>, b: Option<Vec<bool>>) -> Result<()> {
    match (a, b) {
        (Some(a), Some(b)) => a.extend(b),
        (None, None) => {}
        _ => return Err(Error::invalid("merge", "shards disagree on whether the adaptive attack ran")),
    }
    Ok(())
}

/// The per-sample results of detector `spec` ([`registry::check_detector`]) on the run's samples.
pub fn detector_slice(cx: &Context<'_>, spec: &str) -> Result<DetectorSlice> {
    registry::check_detector(spec)?;
    match spec {
        "region" => region_slice(cx),
        "similarity" => stateful::slice(cx),
        _ => guard_slice(cx, spec),
    }
}

/// The adaptive PGD at the headline ε (L∞ threat models only): 40 steps of ε/10, λ = 1, random start.
fn adaptive_pgd(cx: &Context<'_>) -> Result<Option<AdaptivePgd>> {
    let eps = cx.eps()? as f32;
    let pgd = AdaptivePgd { eps, steps: 40, step_size: eps / 10.0, lambda: 1.0, random_start: true };
    Ok((cx.threat.norm == "linf").then_some(pgd))
}

fn pgd_words(cx: &Context<'_>, pgd: Option<AdaptivePgd>, through: &str) -> Result<String> {
    let eps = cx.eps()? as f32;
    Ok(match pgd {
        Some(p) => format!(
            "AdaptivePgd(ε = {eps}, {} steps of {}, λ = {}, random start){through}",
            p.steps, p.step_size, p.lambda
        ),
        None => format!("AdaptivePgd(ε = {eps}): not run (L∞ only)"),
    })
}

/// `magnet[:IMAGES,EPOCHS]`: both auto-encoders trained on IMAGES images for EPOCHS (default: MagNet's
/// defaults), cached in the output directory.
fn magnet_config(cx: &Context<'_>, spec: &str) -> Result<MagnetConfig> {
    let mut cfg = MagnetConfig { seed: cx.threat.seed, cache: cx.out.to_path_buf(), ..MagnetConfig::default() };
    if let Some(p) = spec.strip_prefix("magnet:") {
        cfg.ae1 = images_epochs(p)?;
        cfg.ae2 = cfg.ae1;
    }
    Ok(cfg)
}

/// The clean images and labels of the run's samples, and the cascade's worst-case inputs with which were broken.
pub(super) fn inputs(cx: &Context<'_>) -> Result<(Tensor, Vec<usize>, Tensor, Vec<bool>)> {
    let (clean, labels) = cx.set.test.batch(cx.ledger.range.0..cx.ledger.range.1)?;
    let (worst, _, broken) = eval::worst_case_inputs(cx.ledger, &cx.set.test)?;
    Ok((clean, labels, worst, broken))
}

/// The rejection logit's scale for [`Guarded::with_scale`]: one logit per (τ − median clean score), so that the
/// adaptive attack's loss sees the detector's margin on the classifier's scale; 1 when that margin is not a
/// positive finite number (`clean_scores`: the detector's scores of clean images; `tau`: its threshold).
pub fn rejection_scale(clean_scores: &[f32], tau: f32) -> f32 {
    let mut s = clean_scores.to_vec();
    if s.is_empty() {
        return 1.0;
    }
    let mid = s.len() / 2;
    let margin = tau - *s.select_nth_unstable_by(mid, f32::total_cmp).1;
    if margin.is_finite() && margin > 0.0 {
        1.0 / margin
    } else {
        1.0
    }
}

fn guard_slice(cx: &Context<'_>, spec: &str) -> Result<DetectorSlice> {
    let eps = cx.eps()? as f32;
    // LID's and Mahalanobis' combiners are fitted on training images attacked by PGD-40 at the headline ε.
    let attack = |x: &Tensor, y: &[usize]| -> Result<Tensor> {
        let pgd = (cx.build)(&AttackSpec { steps: Some(40), ..AttackSpec::named("pgd") }, Norm::Linf, eps)?;
        Ok(pgd.run(cx.model.as_ref(), x, y, &Goal::Untargeted, cx.threat.seed)?.adversarial)
    };
    let magnet_progress = |p: &crate::detectors::MagnetProgress<'_>| {
        if !matches!(p, crate::detectors::MagnetProgress::Step(_)) {
            (cx.notify)(&p.to_string());
        }
    };
    let layers = registry::default_layers(cx.model.as_ref());
    let layers: Vec<&str> = layers.iter().map(String::as_str).collect();
    let b = DetectorBuild {
        model: cx.model,
        set: cx.set,
        fit: cx.fit,
        layers: &layers,
        attack: &attack,
        magnet: magnet_config(cx, spec)?,
        magnet_progress: &magnet_progress,
    };
    let name = spec.split(':').next().unwrap_or(spec);
    let mut d = registry::detector(&b, name)?;
    let train = cx.set.training("fitting the detectors")?;
    let (fit_x, _) = train.batch(0..cx.fit.min(train.len() / 2))?;
    let tau = d.fit(&fit_x, TARGET_FPR as f32)?;
    let scale = rejection_scale(&d.score(&fit_x)?, tau);

    let (clean, labels, worst, broken) = inputs(cx)?;
    let fooled: Vec<usize> = (0..broken.len()).filter(|&i| broken[i]).collect();
    let adversarial_scores = if fooled.is_empty() { Vec::new() } else { d.score(&worst.index_select(0, &fooled)?)? };
    let clean_scores = d.score(&clean)?;
    let d: Arc<dyn Detector> = Arc::from(d);
    let guarded = Guarded::new(cx.model.clone(), d.clone())?.with_scale(scale)?;
    let pgd = adaptive_pgd(cx)?;
    let adaptive_ok = match pgd {
        Some(p) => {
            Some(protected_correct(&guarded, &p.run(&guarded, &clean, &labels, cx.threat.seed)?, &labels, true)?)
        }
        None => None,
    };
    Ok(DetectorSlice::Guard(GuardSlice {
        name: d.name().to_string(),
        threshold: tau,
        fit_samples: fit_x.shape()[0],
        clean_scores,
        adversarial_scores,
        clean_ok: protected_correct(&guarded, &clean, &labels, false)?,
        non_adaptive_ok: protected_correct(&guarded, &worst, &labels, true)?,
        adaptive_ok,
        adaptive_attack: pgd_words(cx, pgd, "")?,
    }))
}

impl GuardSlice {
    /// The detector's figures: detection (ROC AUC, TPR at 1% / 5% FPR) and the protected pipeline's accuracy —
    /// clean, per attack, and under every attack together (per sample: right or rejecting under the
    /// non-adaptive *and* the adaptive attack).
    pub fn report(&self) -> Result<DetectorReport> {
        if self.adversarial_scores.is_empty() {
            return Err(Error::invalid(
                "detector report",
                format!("detector {}: the cascade broke no sample, nothing to detect", self.name),
            ));
        }
        let m = DetectionMetrics::from_scores(&self.clean_scores, &self.adversarial_scores)?;
        let every = match &self.adaptive_ok {
            Some(a) => survived_all(&[&self.non_adaptive_ok, a])?,
            None => self.non_adaptive_ok.clone(),
        };
        Ok(DetectorReport {
            name: self.name.clone(),
            target_fpr: TARGET_FPR,
            threshold: f64::from(self.threshold),
            fit_samples: self.fit_samples,
            clean_scored: self.clean_scores.len(),
            adversarial_scored: self.adversarial_scores.len(),
            auc: m.auc,
            tpr_at_1fpr: m.tpr_at_1fpr,
            tpr_at_5fpr: m.tpr_at_5fpr,
            protected_clean_accuracy: share(&self.clean_ok),
            protected_robust_non_adaptive: share(&self.non_adaptive_ok),
            adaptive_attack: self.adaptive_attack.clone(),
            protected_robust_adaptive: self.adaptive_ok.as_deref().map(share),
            protected_robust_accuracy: share(&every),
        })
    }
}

fn region_slice(cx: &Context<'_>) -> Result<DetectorSlice> {
    let seed = cx.threat.seed;
    let r = registry::region(cx.model, cx.set, seed)?;
    (cx.notify)(&format!("region radius fitted: {}", r.radius()));
    let (clean, labels, worst, _) = inputs(cx)?;
    let t = Instant::now();
    let pgd = adaptive_pgd(cx)?;
    let adaptive_ok = match pgd {
        Some(p) => {
            // The attacker votes over 10 copies and differentiates 8 (EOT); the defense answers with its 100.
            let attacker =
                RegionClassifier::new(cx.model.clone(), r.radius(), 10, seed + 1)?.with_eot_samples(REGION_EOT)?;
            Some(protected_correct(&r, &p.run(&attacker, &clean, &labels, seed)?, &labels, false)?)
        }
        None => None,
    };
    Ok(DetectorSlice::Region(RegionSlice {
        name: format!("RegionClassifier(r = {}, {} copies)", r.radius(), r.samples()),
        clean_ok: protected_correct(&r, &clean, &labels, false)?,
        non_adaptive_ok: protected_correct(&r, &worst, &labels, false)?,
        adaptive_ok,
        adaptive_attack: pgd_words(cx, pgd, &format!(" through 10 copies, EOT over {REGION_EOT}"))?,
        adaptive_gradients: pgd.map_or(0, |p| p.steps * REGION_EOT),
        raw: cx.model.probabilities(&worst)?.iter().copied().collect(),
        region: r.logits(&worst)?.iter().copied().collect(),
        seconds: t.elapsed().as_secs_f64(),
    }))
}

impl RegionSlice {
    /// The region classifier as a defense at the headline ε `eps` (`labels`: the samples' true labels; `classes`:
    /// the model's): clean accuracy, then robust accuracy after the non-adaptive inputs and after the adaptive
    /// attack (cumulative per sample, as the cascade's), transfer accuracy = the non-adaptive one.
    pub fn report(&self, eps: f64, labels: &[usize], classes: usize) -> Result<DefenseReport> {
        let n = self.clean_ok.len();
        let adaptive = self.adaptive_ok.as_ref().map_or(n, Vec::len);
        if self.non_adaptive_ok.len() != n || adaptive != n || labels.len() != n {
            return Err(Error::invalid(
                "region report",
                format!("{}: per-sample results of different lengths", self.name),
            ));
        }
        let count = |f: &dyn Fn(usize) -> bool| (0..n).filter(|&i| f(i)).count();
        let after_non = |i: usize| self.clean_ok[i] && self.non_adaptive_ok[i];
        let robust_non = count(&after_non);
        let mut per_attack = vec![AttackSummary {
            attack: "the cascade's worst-case inputs (non-adaptive)".into(),
            robust_accuracy_after: wilson(robust_non, n, Z95)?,
            broken: count(&|i| self.clean_ok[i]) - robust_non,
            mean_gradients: 0.0,
            mean_queries: 1.0,
            seconds: 0.0,
        }];
        if let Some(a) = &self.adaptive_ok {
            let robust = count(&|i| after_non(i) && a[i]);
            per_attack.push(AttackSummary {
                attack: self.adaptive_attack.clone(),
                robust_accuracy_after: wilson(robust, n, Z95)?,
                broken: robust_non - robust,
                mean_gradients: self.adaptive_gradients as f64,
                mean_queries: 1.0,
                seconds: self.seconds,
            });
        }
        Ok(DefenseReport {
            name: self.name.clone(),
            clean_accuracy: wilson(count(&|i| self.clean_ok[i]), n, Z95)?,
            robust_accuracy: per_attack.last().expect("one attack at least").robust_accuracy_after,
            eps,
            per_attack,
            transfer_accuracy: wilson(count(&|i| self.non_adaptive_ok[i]), n, Z95)?,
            metrics: defense_metrics(
                &probabilities(&self.raw, classes)?,
                &probabilities(&self.region, classes)?,
                labels,
            )?,
            metrics_inputs: worst_case_words(eps, n),
        })
    }
}
