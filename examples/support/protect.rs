//! `evaluate`'s defenses and detectors (armoury-defenses), wired here so that the core's evaluator and report
//! stay free of the defenses crate: the report only takes their figures.
//!
//! Each is evaluated in two phases, so that shards and the unsharded run share one code path: [`run_slice`]
//! computes the per-sample results of the run's samples (a shard's, or all) into a [`Slice`] — the side file
//! `protect[-i-of-n].json` next to the ledger —, [`merge_slices`] concatenates the shards' slices in sample
//! order, and [`finalise`] turns the whole evaluation's slice into the report's figures. Fitting on training
//! images is deterministic and repeated in every shard; every attack seeds each sample from its own values.
//!
//! - `--defense NAME[:PARAM]`: an input transformation in front of the model, used as a classifier with its
//!   BPDA/EOT gradients; the threat model's cascade attacks the defended model adaptively at the headline ε,
//!   and DefenseEvaluate's metrics compare the undefended and defended models on the undefended cascade's
//!   worst-case inputs.
//! - `--detector NAME`: see `guard.rs` (per-input detectors, the region classifier) and `stateful.rs` (the
//!   query detector).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::eval::{self, CascadeRun, Ledger, ThreatModel};
use armoury::metrics::{defense_metrics, wilson, Z95};
use armoury::report::{DefenseReport, DetectorReport, StatefulReport};
use armoury::Classifier;
use armoury_attacks::registry::from_spec;
use serde::{Deserialize, Serialize};

use super::guard;
use armoury_defenses::transforms::{
    BitDepth, Defended, GaussianFilter, GaussianNoise, Jpeg, MeanFilter, MedianFilter, TotalVariation, Transform,
};

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

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
/// cascade's ledger of the run's samples (a shard's, or all).
pub struct Context<'a> {
    pub model: &'a Arc<dyn Classifier>,
    pub set: &'a TrainTest,
    pub threat: &'a ThreatModel,
    pub ledger: &'a Ledger,
    pub out: &'a Path,
    /// The run's shard (`None`: unsharded), for the names of its state files.
    pub shard: Option<(usize, usize)>,
    /// EOT draws of random transforms.
    pub eot: usize,
    /// Clean training images detectors are fitted on.
    pub fit: usize,
    pub progress: &'a (dyn Fn(&armoury::eval::Progress) + Sync),
}

impl Context<'_> {
    /// The headline ε.
    pub fn eps(&self) -> Res<f64> {
        Ok(*self.threat.eps.last().ok_or("the threat model has no ε")?)
    }

    /// `stem.json`, or `stem-i-of-n.json` in a shard.
    pub fn file(&self, stem: &str) -> PathBuf {
        side_file(self.out, stem, self.shard)
    }
}

/// `DIR/stem.json`, or `DIR/stem-i-of-n.json` for shard i of n.
pub fn side_file(out: &Path, stem: &str, shard: Option<(usize, usize)>) -> PathBuf {
    match shard {
        Some((i, n)) => out.join(format!("{stem}-{i}-of-{n}.json")),
        None => out.join(format!("{stem}.json")),
    }
}

/// The per-sample results of one run's defenses and detectors (the side file next to its ledger).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Slice {
    pub threat_model_hash: String,
    /// The samples covered.
    pub range: (usize, usize),
    pub total_samples: usize,
    pub defenses: Vec<DefenseSlice>,
    pub detectors: Vec<guard::DetectorSlice>,
}

/// A defense's per-sample results.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DefenseSlice {
    pub spec: String,
    pub name: String,
    /// The adaptive cascade's ledger on the defended model.
    pub ledger: Ledger,
    /// Whether the defended model classifies the undefended cascade's worst-case input correctly.
    pub transfer_ok: Vec<bool>,
    /// Undefended and defended probabilities on those inputs, row-major `[samples, classes]`.
    pub raw: Vec<f32>,
    pub defended: Vec<f32>,
}

/// `a` and `b` agree on a shard-invariant field, else an error naming it.
pub fn same<T: PartialEq + std::fmt::Debug>(what: &str, a: &T, b: &T) -> Res<()> {
    if a == b {
        Ok(())
    } else {
        Err(format!("shards disagree on {what}: {a:?} and {b:?}").into())
    }
}

/// Runs every defense and detector of the command line on the run's samples and saves the side file.
pub fn run_slice(cx: &Context<'_>, defenses: &[String], detectors: &[String]) -> Res<Slice> {
    let mut slice = Slice {
        threat_model_hash: cx.threat.hash(),
        range: cx.ledger.range,
        total_samples: cx.ledger.total_samples,
        defenses: Vec::new(),
        detectors: Vec::new(),
    };
    for (k, spec) in defenses.iter().enumerate() {
        let t = std::time::Instant::now();
        slice.defenses.push(defense_slice(cx, k, spec)?);
        println!("defense {spec}: {} samples, {:.1} s", cx.ledger.records.len(), t.elapsed().as_secs_f64());
    }
    for spec in detectors {
        let t = std::time::Instant::now();
        slice.detectors.push(guard::detector_slice(cx, spec)?);
        println!("detector {spec}: {} samples, {:.1} s", cx.ledger.records.len(), t.elapsed().as_secs_f64());
    }
    armoury::io::write_atomic(&cx.file("protect"), &serde_json::to_vec(&slice)?)?;
    Ok(slice)
}

/// Reads a side file.
pub fn load_slice(path: &Path) -> Res<Slice> {
    Ok(serde_json::from_slice(&std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?)?)
}

/// The shards' slices as one, in sample order: they must share the threat model and the defenses and detectors,
/// and cover every sample exactly once.
pub fn merge_slices(tm: &ThreatModel, mut slices: Vec<Slice>) -> Res<Slice> {
    slices.sort_by_key(|s| s.range.0);
    let mut it = slices.into_iter();
    let mut all = it.next().ok_or("no side files to merge")?;
    same("the threat model", &all.threat_model_hash, &tm.hash())?;
    let mut ledgers: Vec<Vec<Ledger>> = all.defenses.iter().map(|d| vec![d.ledger.clone()]).collect();
    for s in it {
        same("the threat model", &all.threat_model_hash, &s.threat_model_hash)?;
        same("the sample count", &all.total_samples, &s.total_samples)?;
        same("the next shard's first sample", &all.range.1, &s.range.0)?;
        same("the defenses", &all.defenses.len(), &s.defenses.len())?;
        same("the detectors", &all.detectors.len(), &s.detectors.len())?;
        for ((a, b), l) in all.defenses.iter_mut().zip(s.defenses).zip(&mut ledgers) {
            same("a defense", &a.spec, &b.spec)?;
            l.push(b.ledger);
            a.transfer_ok.extend(b.transfer_ok);
            a.raw.extend(b.raw);
            a.defended.extend(b.defended);
        }
        for (a, b) in all.detectors.iter_mut().zip(s.detectors) {
            a.append(b)?;
        }
        all.range.1 = s.range.1;
    }
    same("the samples covered", &all.range, &(0, all.total_samples))?;
    for (d, l) in all.defenses.iter_mut().zip(ledgers) {
        // Every shard of a defense must be of the same evaluation as the first (the undefended ledgers' merge
        // has already held them to this command's model and data).
        let identity = l.first().map(|l| l.identity.clone()).unwrap_or_default();
        d.ledger = eval::merge(&defense_threat(tm, &d.name)?, &identity, l)?;
    }
    Ok(all)
}

/// The report's figures of the whole evaluation's slice (`cx.ledger`: the undefended cascade of every sample).
pub fn finalise(
    cx: &Context<'_>,
    slice: &Slice,
) -> Res<(Vec<DefenseReport>, Vec<DetectorReport>, Vec<StatefulReport>)> {
    let mut defenses = Vec::new();
    for d in &slice.defenses {
        defenses.push(defense_report(cx, d)?);
    }
    let (mut detectors, mut stateful) = (Vec::new(), Vec::new());
    for d in &slice.detectors {
        guard::report(cx, d, &mut defenses, &mut detectors, &mut stateful)?;
    }
    Ok((defenses, detectors, stateful))
}

/// The threat model of a defense's adaptive cascade: the headline ε, no minimum-norm attacks.
fn defense_threat(tm: &ThreatModel, name: &str) -> Res<ThreatModel> {
    Ok(ThreatModel {
        name: format!("{} + {name}", tm.name),
        eps: vec![*tm.eps.last().ok_or("the threat model has no ε")?],
        minimal: Vec::new(),
        ..tm.clone()
    })
}

fn defended(cx: &Context<'_>, spec: &str) -> Res<Defended> {
    Ok(Defended::shared(cx.model.clone(), transform(spec)?)?.with_eot(cx.eot, cx.threat.seed)?)
}

/// The defended model attacked by the cascade at the headline ε on the run's samples (resumable:
/// `defense-K[-i-of-n].json` in the output directory), and both models on the undefended cascade's worst-case
/// inputs.
fn defense_slice(cx: &Context<'_>, k: usize, spec: &str) -> Res<DefenseSlice> {
    let defended = defended(cx, spec)?;
    let name = transform(spec)?.name();
    let tm = defense_threat(cx.threat, &name)?;
    let run = CascadeRun {
        threat: &tm,
        build: &from_spec,
        model_name: format!("{} behind {name}", cx.ledger.model),
        identity: cx.ledger.identity.clone(),
        range: cx.ledger.range,
        total_samples: cx.ledger.total_samples,
        chunk: tm.batch_size,
        state: Some(cx.file(&format!("defense-{k}"))),
        max_steps: None,
        progress: Some(cx.progress),
    };
    let ledger = eval::run_cascade(&defended, &cx.set.test, &run)?;
    let (x, y, _) = eval::worst_case_inputs(cx.ledger, &cx.set.test)?;
    let (raw, def) = (cx.model.probabilities(&x)?, defended.probabilities(&x)?);
    let pred = armoury::classifier::argmax_rows(&def);
    Ok(DefenseSlice {
        spec: spec.to_string(),
        name,
        ledger,
        transfer_ok: pred.iter().zip(&y).map(|(p, l)| p == l).collect(),
        raw: raw.iter().copied().collect(),
        defended: def.iter().copied().collect(),
    })
}

/// `[rows, classes]` probabilities of a slice.
pub fn probabilities(values: &[f32], classes: usize) -> Res<ndarray::Array2<f32>> {
    Ok(ndarray::Array2::from_shape_vec((values.len() / classes.max(1), classes), values.to_vec())?)
}

/// A defense's figures: clean and robust accuracy of its adaptive cascade, transfer accuracy and
/// DefenseEvaluate's metrics on the undefended cascade's worst-case inputs.
fn defense_report(cx: &Context<'_>, d: &DefenseSlice) -> Res<DefenseReport> {
    let tm = defense_threat(cx.threat, &d.name)?;
    let k = cx.model.num_classes();
    let summary = eval::summarise(&tm, &d.ledger, k);
    let y: Vec<usize> = cx.ledger.records.iter().map(|r| r.label).collect();
    let correct = d.transfer_ok.iter().filter(|&&c| c).count();
    let eps = cx.eps()?;
    Ok(DefenseReport {
        name: d.name.clone(),
        clean_accuracy: summary.clean_accuracy,
        robust_accuracy: summary.headline(),
        eps,
        per_attack: eval::attack_summaries(&summary, 0),
        transfer_accuracy: wilson(correct, y.len(), Z95)?,
        metrics: defense_metrics(&probabilities(&d.raw, k)?, &probabilities(&d.defended, k)?, &y)?,
        metrics_inputs: worst_case_words(eps, y.len()),
    })
}

/// The inputs DefenseEvaluate's metrics compare on, in words.
pub fn worst_case_words(eps: f64, n: usize) -> String {
    format!(
        "the undefended cascade's worst-case inputs at ε ≤ {eps} ({n} samples: the adversarial example where the \
         cascade broke the undefended model, the clean image elsewhere)"
    )
}
