//! `evaluate --detector NAME`, each in the two phases of `protect.rs` (per-sample results of the run's samples,
//! then the figures of all of them):
//!
//! - per-input detectors (`squeeze`, `lid`, `mahalanobis`, `ensemble`, `magnet[:IMAGES,EPOCHS]`): fitted on
//!   clean training images at 1% FPR, scored against the cascade's adversarial examples (ROC AUC, TPR at 1% /
//!   5% FPR), and the protected pipeline (model + rejection) measured on clean images, on the cascade's inputs
//!   (non-adaptive) and under `AdaptivePgd` (adaptive, L∞ threat models);
//! - `region`: Cao & Gong's region classifier, a defense that changes the prediction, reported as a defense —
//!   clean and robust accuracy, non-adaptive on the cascade's worst-case inputs, adaptive under `AdaptivePgd`
//!   through the region classifier with EOT over its noisy copies;
//! - `similarity`: Chen et al.'s stateful query detector watching the cascade's Square attack, sample by
//!   sample, and the same attack with query blinding (the paper's adaptive attacker), with its false-positive
//!   rate on benign streams of clean test images.

use std::sync::Arc;
use std::time::Instant;

use armoury::eval::{self, AttackSpec};
use armoury::metrics::{defense_metrics, wilson, Z95};
use armoury::report::{AttackSummary, DefenseReport, DetectorReport, StatefulAttack, StatefulReport};
use armoury::{Classifier, Detector, Goal, Guarded, Tensor};
use armoury_attacks::registry::{self, from_spec, AttackParams};
use armoury_defenses::detectors::{protected_correct, AdaptivePgd, DetectionMetrics, RegionClassifier};
use serde::{Deserialize, Serialize};

use super::magnet::{images_epochs, MagnetConfig};
use super::protect::{probabilities, same, worst_case_words, Context, Res};
use super::{detectors, stateful};

/// The false-positive rate per-input detectors are fitted at.
pub const TARGET_FPR: f64 = 0.01;
/// The share of benign calibration streams the stateful detector may flag.
pub const SIMILARITY_FPR: f32 = 0.005;
/// Benign test streams the stateful detector's false-positive rate is measured on.
pub const BENIGN_STREAMS: usize = 500;
/// The reference cnn's layers LID and Mahalanobis read.
const LAYERS: [&str; 4] = ["conv1_relu", "conv2_relu", "fc1_relu", "fc2"];

/// A detector's per-sample results on the run's samples.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DetectorSlice {
    Guard(GuardSlice),
    Region(RegionSlice),
    Stateful(StatefulSlice),
}

/// A per-input detector in front of the model.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GuardSlice {
    pub name: String,
    pub threshold: f32,
    pub fit_samples: usize,
    /// Scores of the clean images, and of the cascade's adversarial examples of the samples it broke.
    pub clean_scores: Vec<f32>,
    pub adversarial_scores: Vec<f32>,
    /// Per sample: the protected pipeline right on the clean image; right or rejecting on the cascade's
    /// worst-case input; and under the adaptive attack.
    pub clean_ok: Vec<bool>,
    pub non_adaptive_ok: Vec<bool>,
    pub adaptive_ok: Option<Vec<bool>>,
    pub adaptive_attack: String,
}

/// The region classifier.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RegionSlice {
    pub name: String,
    /// Per sample: right on the clean image, on the cascade's worst-case input, under the adaptive attack.
    pub clean_ok: Vec<bool>,
    pub non_adaptive_ok: Vec<bool>,
    pub adaptive_ok: Option<Vec<bool>>,
    pub adaptive_attack: String,
    /// The adaptive attack's model gradients per sample: each of its steps differentiates [`REGION_EOT`] noisy
    /// copies.
    pub adaptive_gradients: usize,
    /// Undefended probabilities and the region classifier's vote fractions on the worst-case inputs.
    pub raw: Vec<f32>,
    pub region: Vec<f32>,
    /// Seconds of the adaptive attack (wall clock: summed over shards).
    pub seconds: f64,
}

/// The stateful query detector.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StatefulSlice {
    pub name: String,
    pub threshold: f32,
    pub calibration: String,
    pub benign_streams: usize,
    pub benign_flagged: usize,
    /// The non-adaptive attack, then the adaptive one: per sample.
    pub attacks: Vec<(String, bool, Vec<stateful::Watched>)>,
}

impl DetectorSlice {
    /// Appends the next shard's samples, checking that the shard-invariant fields agree.
    pub fn append(&mut self, next: DetectorSlice) -> Res<()> {
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
            (DetectorSlice::Stateful(a), DetectorSlice::Stateful(b)) => {
                same("a detector", &(&a.name, a.threshold, &a.calibration), &(&b.name, b.threshold, &b.calibration))?;
                same(
                    "the benign streams",
                    &(a.benign_streams, a.benign_flagged),
                    &(b.benign_streams, b.benign_flagged),
                )?;
                same("the attacks", &a.attacks.len(), &b.attacks.len())?;
                for (x, y) in a.attacks.iter_mut().zip(b.attacks) {
                    same("an attack", &(&x.0, x.1), &(&y.0, y.1))?;
                    x.2.extend(y.2);
                }
                Ok(())
            }
            _ => Err("shards disagree on the detectors".into()),
        }
    }
}

fn extend(a: &mut Option<Vec<bool>>, b: Option<Vec<bool>>) -> Res<()> {
    match (a, b) {
        (Some(a), Some(b)) => a.extend(b),
        (None, None) => {}
        _ => return Err("shards disagree on whether the adaptive attack ran".into()),
    }
    Ok(())
}

/// The per-sample results of detector `spec` on the run's samples.
pub fn detector_slice(cx: &Context<'_>, spec: &str) -> Res<DetectorSlice> {
    match spec {
        "region" => region_slice(cx),
        "similarity" => stateful_slice(cx),
        _ => guard_slice(cx, spec),
    }
}

/// The figures of a detector over all samples, added to the report's defenses, detectors or stateful ones.
pub fn report(
    cx: &Context<'_>,
    d: &DetectorSlice,
    defenses: &mut Vec<DefenseReport>,
    detectors: &mut Vec<DetectorReport>,
    stateful: &mut Vec<StatefulReport>,
) -> Res<()> {
    match d {
        DetectorSlice::Guard(g) => detectors.push(guard_report(g)?),
        DetectorSlice::Region(r) => defenses.push(region_report(cx, r)?),
        DetectorSlice::Stateful(s) => stateful.push(stateful_report(s)),
    }
    Ok(())
}

fn share(ok: &[bool]) -> f64 {
    ok.iter().filter(|&&c| c).count() as f64 / ok.len().max(1) as f64
}

/// The adaptive PGD at the headline ε (L∞ threat models only): 40 steps of ε/10, λ = 1, random start.
fn adaptive_pgd(cx: &Context<'_>) -> Res<Option<AdaptivePgd>> {
    let eps = cx.eps()? as f32;
    let pgd = AdaptivePgd { eps, steps: 40, step_size: eps / 10.0, lambda: 1.0, random_start: true };
    Ok((cx.threat.norm == "linf").then_some(pgd))
}

fn pgd_words(cx: &Context<'_>, pgd: Option<AdaptivePgd>, through: &str) -> Res<String> {
    let eps = cx.eps()? as f32;
    Ok(match pgd {
        Some(p) => format!(
            "AdaptivePgd(ε = {eps}, {} steps of {}, λ = {}, random start){through}",
            p.steps, p.step_size, p.lambda
        ),
        None => format!("AdaptivePgd(ε = {eps}): not run (L∞ only)"),
    })
}

/// `magnet[:IMAGES,EPOCHS]`: both auto-encoders trained on IMAGES images for EPOCHS (default: the detect
/// example's), cached in the output directory.
fn magnet_config(cx: &Context<'_>, spec: &str) -> Res<MagnetConfig> {
    let mut cfg = MagnetConfig { seed: cx.threat.seed, cache: cx.out.to_path_buf(), ..MagnetConfig::default() };
    if let Some(p) = spec.strip_prefix("magnet:") {
        cfg.ae1 = images_epochs(p)?;
        cfg.ae2 = cfg.ae1;
    }
    Ok(cfg)
}

/// The clean images and labels of the run's samples, and the cascade's worst-case inputs with which were broken.
fn inputs(cx: &Context<'_>) -> Res<(Tensor, Vec<usize>, Tensor, Vec<bool>)> {
    let (clean, labels) = cx.set.test.batch(cx.ledger.range.0..cx.ledger.range.1)?;
    let (worst, _, broken) = eval::worst_case_inputs(cx.ledger, &cx.set.test)?;
    Ok((clean, labels, worst, broken))
}

fn guard_slice(cx: &Context<'_>, spec: &str) -> Res<DetectorSlice> {
    let eps = cx.eps()? as f32;
    // LID's and Mahalanobis' combiners are fitted on training images attacked by PGD-40 at the headline ε.
    let attack = |x: &Tensor, y: &[usize]| -> Res<Tensor> {
        let pgd = registry::by_name("pgd", &AttackParams { eps, steps: Some(40), ..AttackParams::default() })?;
        Ok(pgd.run(cx.model.as_ref(), x, y, &Goal::Untargeted, cx.threat.seed)?.adversarial)
    };
    let b = detectors::Build {
        model: cx.model,
        set: cx.set,
        fit: cx.fit,
        layers: &LAYERS,
        attack: &attack,
        magnet: magnet_config(cx, spec)?,
    };
    let name = spec.split(':').next().unwrap_or(spec);
    let mut d = detectors::build(&b, name)?;
    let (fit_x, _) = cx.set.train.batch(0..cx.fit.min(cx.set.train.len() / 2))?;
    let tau = d.fit(&fit_x, TARGET_FPR as f32)?;
    // The rejection logit's scale: one logit per (τ − median clean score), so that the adaptive attack's loss
    // sees the detector's margin on the classifier's scale.
    let mut clean_scores = d.score(&fit_x)?;
    let mid = clean_scores.len() / 2;
    let median = *clean_scores.select_nth_unstable_by(mid, f32::total_cmp).1;
    let scale = if tau - median > 0.0 && (tau - median).is_finite() { 1.0 / (tau - median) } else { 1.0 };

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

fn guard_report(g: &GuardSlice) -> Res<DetectorReport> {
    if g.adversarial_scores.is_empty() {
        return Err(format!("detector {}: the cascade broke no sample, nothing to detect", g.name).into());
    }
    let m = DetectionMetrics::from_scores(&g.clean_scores, &g.adversarial_scores)?;
    Ok(DetectorReport {
        name: g.name.clone(),
        target_fpr: TARGET_FPR,
        threshold: f64::from(g.threshold),
        fit_samples: g.fit_samples,
        clean_scored: g.clean_scores.len(),
        adversarial_scored: g.adversarial_scores.len(),
        auc: m.auc,
        tpr_at_1fpr: m.tpr_at_1fpr,
        tpr_at_5fpr: m.tpr_at_5fpr,
        protected_clean_accuracy: share(&g.clean_ok),
        protected_robust_non_adaptive: share(&g.non_adaptive_ok),
        adaptive_attack: g.adaptive_attack.clone(),
        protected_robust_adaptive: g.adaptive_ok.as_deref().map(share),
    })
}

/// Noisy copies the adaptive attacker on the region classifier differentiates per step (EOT).
const REGION_EOT: usize = 8;

fn region_slice(cx: &Context<'_>) -> Res<DetectorSlice> {
    let seed = cx.threat.seed;
    let r = detectors::region(cx.model, cx.set, seed)?;
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

/// The region classifier as a defense: clean accuracy, then robust accuracy after the non-adaptive inputs and
/// after the adaptive attack (cumulative per sample, as the cascade's), transfer accuracy = the non-adaptive one.
fn region_report(cx: &Context<'_>, r: &RegionSlice) -> Res<DefenseReport> {
    let n = r.clean_ok.len();
    let count = |f: &dyn Fn(usize) -> bool| (0..n).filter(|&i| f(i)).count();
    let after_non = |i: usize| r.clean_ok[i] && r.non_adaptive_ok[i];
    let robust_non = count(&after_non);
    let mut per_attack = vec![AttackSummary {
        attack: "the cascade's worst-case inputs (non-adaptive)".into(),
        robust_accuracy_after: wilson(robust_non, n, Z95)?,
        broken: count(&|i| r.clean_ok[i]) - robust_non,
        mean_gradients: 0.0,
        mean_queries: 1.0,
        seconds: 0.0,
    }];
    if let Some(a) = &r.adaptive_ok {
        let robust = count(&|i| after_non(i) && a[i]);
        per_attack.push(AttackSummary {
            attack: r.adaptive_attack.clone(),
            robust_accuracy_after: wilson(robust, n, Z95)?,
            broken: robust_non - robust,
            mean_gradients: r.adaptive_gradients as f64,
            mean_queries: 1.0,
            seconds: r.seconds,
        });
    }
    let y: Vec<usize> = cx.ledger.records.iter().map(|r| r.label).collect();
    let k = cx.model.num_classes();
    let eps = cx.eps()?;
    Ok(DefenseReport {
        name: r.name.clone(),
        clean_accuracy: wilson(count(&|i| r.clean_ok[i]), n, Z95)?,
        robust_accuracy: per_attack.last().expect("one attack at least").robust_accuracy_after,
        eps,
        per_attack,
        transfer_accuracy: wilson(count(&|i| r.non_adaptive_ok[i]), n, Z95)?,
        metrics: defense_metrics(&probabilities(&r.raw, k)?, &probabilities(&r.region, k)?, &y)?,
        metrics_inputs: worst_case_words(eps, n),
    })
}

/// The cascade's Square settings (its `square` entry, else Square's defaults) at the headline ε.
fn square(cx: &Context<'_>) -> Res<(Box<dyn armoury::Attack>, String)> {
    let spec =
        cx.threat.attacks.iter().find(|a| a.name == "square").cloned().unwrap_or_else(|| AttackSpec::named("square"));
    let eps = cx.eps()?;
    Ok((from_spec(&spec, cx.threat.norm()?, eps as f32)?, format!("{} at ε = {eps}", spec.label())))
}

fn stateful_slice(cx: &Context<'_>) -> Res<DetectorSlice> {
    let seed = cx.threat.seed;
    // The input of the model's head (`fc1_relu` for the native cnn): a fixed name exists in one model only.
    let tap = armoury_defenses::detectors::default_tap(cx.model.as_ref())?;
    let (mut d, tau, calib) = stateful::calibrated(cx.model, &cx.set.train, &tap, 20, SIMILARITY_FPR, seed)?;
    let (benign_flagged, benign_streams) = stateful::benign_flagged(&mut d, &cx.set.test, BENIGN_STREAMS, seed)?;
    let (clean, labels, _, _) = inputs(cx)?;
    let (attack, words) = square(cx)?;
    let eps = cx.eps()? as f32;
    let mut attacks = Vec::new();
    // Sample k of the data set (k = the run's first sample + i) is attacked with the seed seed + k, whatever its
    // shard; the blinding noise has its own seed, the same in every shard.
    let first = cx.ledger.range.0;
    let sample = |i: usize| seed + (first + i) as u64;
    for blind in [None, Some((eps, armoury::seed::derive(seed, 0xb11d)))] {
        let (samples, back) = stateful::watch(cx.model, d, attack.as_ref(), (&clean, &labels), blind, &|i| sample(i))?;
        d = back;
        let name = match blind {
            None => words.clone(),
            Some((r, _)) => format!("{words}, query blinding U[−{r}, {r}]"),
        };
        attacks.push((name, blind.is_some(), samples));
    }
    Ok(DetectorSlice::Stateful(StatefulSlice {
        name: format!("similarity ({tap} encodings, k = 20)"),
        threshold: tau,
        calibration: format!("{SIMILARITY_FPR} of {calib} benign streams of {} training images", stateful::STREAM),
        benign_streams,
        benign_flagged,
        attacks,
    }))
}

fn stateful_report(s: &StatefulSlice) -> StatefulReport {
    let attacks = s
        .attacks
        .iter()
        .map(|(attack, adaptive, w)| {
            let firsts: Vec<usize> = w.iter().filter_map(|w| w.first_flag).collect();
            StatefulAttack {
                attack: attack.clone(),
                adaptive: *adaptive,
                attacked: w.iter().filter(|w| w.attacked).count(),
                flagged: firsts.len(),
                mean_queries_to_flag: (!firsts.is_empty())
                    .then(|| firsts.iter().map(|&f| (f + 1) as f64).sum::<f64>() / firsts.len() as f64),
                evaded: w.iter().filter(|w| w.attacked && w.fooled && w.first_flag.is_none()).count(),
            }
        })
        .collect();
    StatefulReport {
        name: s.name.clone(),
        threshold: f64::from(s.threshold),
        calibration: s.calibration.clone(),
        benign_streams: s.benign_streams,
        benign_stream_len: stateful::STREAM,
        benign_flagged: s.benign_flagged,
        attacks,
    }
}
