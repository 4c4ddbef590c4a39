//! Defenses and detectors evaluated beside the core's cascade ([`armoury::eval`]), with shards and merge, into
//! the core report's [`DefenseReport`], [`DetectorReport`] and [`StatefulReport`].
//!
//! Each is evaluated in two phases, so that shards and the unsharded run share one code path: [`run_slice`]
//! computes the per-sample results of the run's samples (a shard's, or all) into a [`Slice`] — the side file
//! `protect[-i-of-n].json` next to the ledger —, [`merge_slices`] concatenates the shards' slices in sample
//! order, and [`finalise`] turns the whole evaluation's slice into the figures. Fitting on training images is
//! deterministic and repeated in every shard; every attack seeds each sample from its own values. A slice
//! carries the evaluation's [`Identity`] (model and data hashes, kernel path, version) and the threat model's
//! hash: a merge refuses a slice of anything else, as the cascade's [`armoury::eval::merge`] does.
//!
//! - a defense (`NAME[:PARAM]`, [`crate::registry::transform`]): an input transformation in front of the model,
//!   used as a classifier with its BPDA/EOT gradients; the threat model's cascade attacks the defended model
//!   adaptively at the headline ε, and DefenseEvaluate's metrics compare the undefended and defended models on
//!   the undefended cascade's worst-case inputs. Its robust accuracy counts a sample only if it survives every
//!   attack run against the defense: the adaptive cascade *and* the transferred worst-case input.
//! - a detector ([`crate::registry::DETECTORS`]): per-input detectors and the region classifier ([`guard`]) and
//!   the stateful query detector ([`stateful`]).
//! - one detector on its own against one attack, outside a cascade ([`detect`], the `detect` example).
//!
//! The attacks come from the caller as the cascade's [`Builder`] (the attacks crate's `registry::from_spec`),
//! so this crate needs no attack's concrete type.

mod defense;
pub mod detect;
pub mod guard;
pub mod stateful;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::eval::{self, Builder, Identity, Ledger, ThreatModel};
use armoury::report::{DefenseReport, DetectorReport, StatefulReport};
use armoury::{Classifier, Error, Result};
use serde::{Deserialize, Serialize};

pub use defense::{defense_threat, worst_case_words, DefenseSlice};
pub use guard::{DetectorSlice, GuardSlice, RegionSlice};
pub use stateful::{StatefulSlice, Watched};

/// What defenses and detectors are evaluated with: the model, the data, the threat model and the undefended
/// cascade's ledger of the run's samples (a shard's, or all).
pub struct Context<'a> {
    /// The undefended model.
    pub model: &'a Arc<dyn Classifier>,
    /// The data: test samples are evaluated, training images fit detectors.
    pub set: &'a TrainTest,
    /// The threat model; its headline ε is the last.
    pub threat: &'a ThreatModel,
    /// The undefended cascade's ledger of the run's samples (its identity is the evaluation's).
    pub ledger: &'a Ledger,
    /// The attacks by spec (the attacks crate's `registry::from_spec`).
    pub build: &'a Builder<'a>,
    /// The directory of state files and cached auto-encoders.
    pub out: &'a Path,
    /// The run's shard (`None`: unsharded), for the names of its state files.
    pub shard: Option<(usize, usize)>,
    /// EOT draws of random transforms.
    pub eot: usize,
    /// Clean training images detectors are fitted on.
    pub fit: usize,
    /// Where the running cascade is (steps, the step that finished, robust accuracy so far).
    pub progress: &'a (dyn Fn(&armoury::eval::Progress) + Sync),
    /// Lines for people: what ran, how long it took, auto-encoders trained.
    pub notify: &'a (dyn Fn(&str) + Sync),
}

impl Context<'_> {
    /// The headline ε.
    pub fn eps(&self) -> Result<f64> {
        self.threat.eps.last().copied().ok_or_else(|| Error::invalid("evaluation", "the threat model has no ε"))
    }

    /// `stem.json`, or `stem-i-of-n.json` in a shard.
    pub fn file(&self, stem: &str) -> PathBuf {
        side_file(self.out, stem, self.shard)
    }

    /// The true labels of the ledger's samples.
    pub fn labels(&self) -> Vec<usize> {
        self.ledger.records.iter().map(|r| r.label).collect()
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
    /// What was measured: model and data hashes, kernel path, version (the ledger's).
    pub identity: Identity,
    /// The threat model's hash.
    pub threat_model_hash: String,
    /// The samples covered.
    pub range: (usize, usize),
    /// Samples in the whole evaluation.
    pub total_samples: usize,
    /// Per defense.
    pub defenses: Vec<DefenseSlice>,
    /// Per detector.
    pub detectors: Vec<DetectorSlice>,
}

/// `a` and `b` agree on a shard-invariant field, else an error naming it.
pub(crate) fn same<T: PartialEq + std::fmt::Debug>(what: &str, a: &T, b: &T) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(Error::invalid("merge", format!("shards disagree on {what}: {a:?} and {b:?}")))
    }
}

/// The share of `true` (0 for none).
pub(crate) fn share(ok: &[bool]) -> f64 {
    ok.iter().filter(|&&c| c).count() as f64 / ok.len().max(1) as f64
}

/// Per sample, whether it survived every attack: the AND of each attack's per-sample results (all of the same
/// length, else an error).
pub fn survived_all(per_attack: &[&[bool]]) -> Result<Vec<bool>> {
    let n = per_attack.first().map_or(0, |a| a.len());
    if let Some(a) = per_attack.iter().find(|a| a.len() != n) {
        return Err(Error::invalid("survived_all", format!("per-sample results of {} and {n} samples", a.len())));
    }
    Ok((0..n).map(|i| per_attack.iter().all(|a| a[i])).collect())
}

/// Checks every defense spec ([`crate::registry::transform`]) and detector spec
/// ([`crate::registry::check_detector`]): an unknown name is an error listing the known ones.
pub fn check_specs(defenses: &[String], detectors: &[String]) -> Result<()> {
    for spec in defenses {
        crate::registry::transform(spec)?;
    }
    for spec in detectors {
        crate::registry::check_detector(spec)?;
    }
    Ok(())
}

/// Runs every defense (`defenses`, specs of [`crate::registry::transform`]) and detector (`detectors`, specs of
/// [`crate::registry::check_detector`]) on the run's samples and saves the side file [`Context::file`]
/// (`protect`). Every spec is checked before anything runs.
pub fn run_slice(cx: &Context<'_>, defenses: &[String], detectors: &[String]) -> Result<Slice> {
    check_specs(defenses, detectors)?;
    let mut slice = Slice {
        identity: cx.ledger.identity.clone(),
        threat_model_hash: cx.threat.hash(),
        range: cx.ledger.range,
        total_samples: cx.ledger.total_samples,
        defenses: Vec::new(),
        detectors: Vec::new(),
    };
    let n = cx.ledger.records.len();
    for (k, spec) in defenses.iter().enumerate() {
        let t = std::time::Instant::now();
        slice.defenses.push(defense::slice(cx, k, spec)?);
        (cx.notify)(&format!("defense {spec}: {n} samples, {:.1} s", t.elapsed().as_secs_f64()));
    }
    for spec in detectors {
        let t = std::time::Instant::now();
        slice.detectors.push(guard::detector_slice(cx, spec)?);
        (cx.notify)(&format!("detector {spec}: {n} samples, {:.1} s", t.elapsed().as_secs_f64()));
    }
    let bytes = serde_json::to_vec(&slice).map_err(|e| Error::invalid("side file", e.to_string()))?;
    armoury::io::write_atomic(&cx.file("protect"), &bytes)?;
    Ok(slice)
}

/// Reads a side file.
pub fn load_slice(path: &Path) -> Result<Slice> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::bad_file(path, format!("side file: {e}")))
}

/// The shards' slices as one, in sample order. Every slice must be of the evaluation `identity` (this command's
/// model, data, kernel path and version) and of the threat model `tm`, share the defenses and detectors, and the
/// slices must cover every sample exactly once.
pub fn merge_slices(tm: &ThreatModel, identity: &Identity, mut slices: Vec<Slice>) -> Result<Slice> {
    slices.sort_by_key(|s| s.range.0);
    for s in &slices {
        if let Some(why) = identity.difference(&s.identity) {
            return Err(Error::invalid(
                "merge",
                format!("side file {:?} is of another evaluation than this command's: {why}", s.range),
            ));
        }
        same("the threat model", &s.threat_model_hash, &tm.hash())?;
    }
    let mut it = slices.into_iter();
    let mut all = it.next().ok_or_else(|| Error::invalid("merge", "no side files to merge"))?;
    let mut ledgers: Vec<Vec<Ledger>> = all.defenses.iter().map(|d| vec![d.ledger.clone()]).collect();
    for s in it {
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
        d.ledger = eval::merge(&defense_threat(tm, &d.name)?, identity, l)?;
    }
    Ok(all)
}

/// The figures of the whole evaluation's slice (`cx.ledger`: the undefended cascade of every sample): the
/// defenses (and the region classifier, a defense), the per-input detectors and the stateful ones.
pub fn finalise(cx: &Context<'_>, slice: &Slice) -> Result<Figures> {
    let (labels, classes, eps) = (cx.labels(), cx.model.num_classes(), cx.eps()?);
    let mut defenses = Vec::new();
    for d in &slice.defenses {
        defenses.push(d.report(cx.threat, &labels, classes)?);
    }
    let (mut detectors, mut stateful) = (Vec::new(), Vec::new());
    for d in &slice.detectors {
        match d {
            DetectorSlice::Guard(g) => detectors.push(g.report()?),
            DetectorSlice::Region(r) => defenses.push(r.report(eps, &labels, classes)?),
            DetectorSlice::Stateful(s) => stateful.push(s.report()),
        }
    }
    Ok((defenses, detectors, stateful))
}

/// The reports of the defenses (the region classifier among them), the per-input detectors and the stateful
/// detectors.
pub type Figures = (Vec<DefenseReport>, Vec<DetectorReport>, Vec<StatefulReport>);

/// The figures of the defenses and detectors beside the cascade, as one call: run on the context's samples (a
/// shard writes its side file and gets `None`: its `--merge` step reports), or, with `merge = Some(n)`, read from
/// the n shards' side files; then merged (identity-checked) and finalised.
pub fn evaluate(
    cx: &Context<'_>,
    defenses: &[String],
    detectors: &[String],
    merge: Option<usize>,
) -> Result<Option<Figures>> {
    let slices = match merge {
        Some(k) => (0..k).map(|i| load_slice(&side_file(cx.out, "protect", Some((i, k))))).collect::<Result<_>>()?,
        None => vec![run_slice(cx, defenses, detectors)?],
    };
    if cx.shard.is_some() && merge.is_none() {
        return Ok(None);
    }
    finalise(cx, &merge_slices(cx.threat, &cx.ledger.identity, slices)?).map(Some)
}

/// `[rows, classes]` probabilities of a slice.
pub(crate) fn probabilities(values: &[f32], classes: usize) -> Result<ndarray::Array2<f32>> {
    ndarray::Array2::from_shape_vec((values.len() / classes.max(1), classes), values.to_vec())
        .map_err(|e| Error::invalid("side file", format!("probabilities: {e}")))
}
