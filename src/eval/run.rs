//! The evaluation as one call on the tensors a user has (torchattacks' `AutoAttack(model, eps=…)(x, y)`), and a
//! builder with defaults for everything else: the state file for a resumable run, a shard, the chunk size, a
//! progress callback, the model's description and its identity.
//!
//! The core builds no attack itself (attacks → core): [`Evaluator::new`] takes the threat model and the
//! [`Builder`] that turns its names into attacks — `armoury_attacks::registry::from_spec` — and
//! `armoury_attacks::autoattack` wraps both into the one call:
//!
//! ```
//! use armoury::{data, eval, nn, ModuleClassifier};
//! let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
//! let (x, y) = data::sample()?.test.batch(0..4)?;
//! let mut tm = eval::ThreatModel::autoattack_linf(0.1);
//! tm.attacks.truncate(1); // APGD-CE alone, 100 steps
//! tm.minimal.clear();
//! let result = eval::Evaluator::new(tm, &armoury_attacks::registry::from_spec).run(&model, &x, &y)?;
//! assert_eq!(result.summary.samples, 4);
//! assert!(result.robust_accuracy() <= result.clean_accuracy());
//! # Ok::<(), armoury::Error>(())
//! ```

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::cascade::{run_cascade, shard_range, Builder, CascadeRun, Ledger, Progress};
use super::identity::Identity;
use super::summary::{summarise, Summary};
use super::threat::ThreatModel;
use crate::data::Dataset;
use crate::{Classifier, Result, Tensor};

/// What an evaluation measured: the per-sample ledger and its figures.
#[derive(Clone, Debug)]
pub struct Evaluation {
    /// Every sample's clean prediction, first break (attack, ε, prediction, adversarial input) and minimal norms.
    pub ledger: Ledger,
    /// The figures: clean and robust accuracy with Wilson intervals, per attack and per ε.
    pub summary: Summary,
}

impl Evaluation {
    /// Robust accuracy at the largest ε of the grid: the share of samples correctly classified and broken by no
    /// attack of the cascade (the per-sample worst case).
    pub fn robust_accuracy(&self) -> f64 {
        self.summary.headline().value
    }

    /// Clean accuracy.
    pub fn clean_accuracy(&self) -> f64 {
        self.summary.clean_accuracy.value
    }

    /// Per sample (in input order): whether it is correctly classified and unbroken at the largest ε.
    pub fn robust(&self) -> Vec<bool> {
        let k = self.summary.eps.len().saturating_sub(1);
        self.ledger.records.iter().map(|r| r.robust_at(k, None)).collect()
    }
}

/// An evaluation with its settings (see the module doc); [`Evaluator::run`] runs it on tensors,
/// [`Evaluator::run_dataset`] on a [`Dataset`].
pub struct Evaluator<'a> {
    threat: ThreatModel,
    build: &'a Builder<'a>,
    model_name: String,
    identity: Option<Identity>,
    chunk: Option<usize>,
    state: Option<PathBuf>,
    shard: Option<(usize, usize)>,
    progress: Option<&'a (dyn Fn(&Progress) + Sync)>,
}

impl<'a> Evaluator<'a> {
    /// An evaluation under `threat` whose attacks `build` makes; defaults: the threat model's batch size as the
    /// chunk, no state file (nothing saved), the whole data, no progress, the model described as "model", and an
    /// identity from the model's behaviour ([`Evaluator::identity`]).
    pub fn new(threat: ThreatModel, build: &'a Builder<'a>) -> Evaluator<'a> {
        Evaluator {
            threat,
            build,
            model_name: "model".to_string(),
            identity: None,
            chunk: None,
            state: None,
            shard: None,
            progress: None,
        }
    }

    /// Samples per step (each step is saved to the state file); default: the threat model's batch size.
    pub fn chunk(mut self, samples: usize) -> Self {
        self.chunk = Some(samples);
        self
    }

    /// A state file: read if present (the run resumes where it stopped), rewritten after every step.
    pub fn state(mut self, path: impl Into<PathBuf>) -> Self {
        self.state = Some(path.into());
        self
    }

    /// Evaluate shard `i` of `n` only (samples `[N·i/n, N·(i+1)/n)`); merge the shards' ledgers with
    /// [`super::merge`].
    pub fn shard(mut self, i: usize, n: usize) -> Self {
        self.shard = Some((i, n));
        self
    }

    /// Called before the first step and after every step with where the run is ([`Progress`]: steps, the step
    /// that finished and the next, robust accuracy so far).
    pub fn progress(mut self, f: &'a (dyn Fn(&Progress) + Sync)) -> Self {
        self.progress = Some(f);
        self
    }

    /// The model's description in the ledger and report (for people).
    pub fn model_name(mut self, name: impl Into<String>) -> Self {
        self.model_name = name.into();
        self
    }

    /// The evaluation's identity (compared before a resume or a merge). Default: the data's hash, and as the
    /// model's hash the SHA-256 of its input shape, bounds, class count and clean logits on the evaluated
    /// samples — the model's behaviour on these inputs, which any change of weights changes. Give
    /// [`super::identity::model_hash`] of the module for a hash of the weights themselves.
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Runs (or resumes) the evaluation of `model` on images `x` (N×C×H×W, inside the model's bounds) with
    /// labels `y`.
    ///
    /// Errors: shapes that disagree, a label outside the model's classes, data outside the model's bounds, an
    /// invalid threat model, an attack of another norm, a state file of another evaluation.
    pub fn run(&self, model: &dyn Classifier, x: &Tensor, y: &[usize]) -> Result<Evaluation> {
        // Declared with enough classes to hold every label; `run_dataset` checks them against the model's.
        let declared = y.iter().map(|&l| l + 1).max().unwrap_or(0).max(model.num_classes());
        let data = Dataset::new(x.detach(), y.to_vec(), declared)?;
        self.run_dataset(model, &data, "tensors")
    }

    /// Runs (or resumes) the evaluation of `model` on every sample of `data` (named `data_name` in the report).
    ///
    /// Errors: a label outside the model's classes (naming the sample), and [`Evaluator::run`]'s.
    pub fn run_dataset(&self, model: &dyn Classifier, data: &Dataset, data_name: &str) -> Result<Evaluation> {
        data.check_labels(model.num_classes(), "evaluation")?;
        let n = data.len();
        let identity = match &self.identity {
            Some(id) => id.clone(),
            None => Identity::new(behaviour_hash(model, data)?, data, n, data_name)?,
        };
        let (i, shards) = self.shard.unwrap_or((0, 1));
        let run = CascadeRun {
            threat: &self.threat,
            build: self.build,
            model_name: self.model_name.clone(),
            identity,
            range: shard_range(n, i, shards)?,
            total_samples: n,
            chunk: self.chunk.unwrap_or(self.threat.batch_size),
            state: self.state.clone(),
            max_steps: None,
            progress: self.progress,
        };
        let ledger = run_cascade(model, data, &run)?;
        let summary = summarise(&self.threat, &ledger, model.num_classes());
        Ok(Evaluation { ledger, summary })
    }
}

/// SHA-256 (hex) of what a classifier computes on `data`: its input shape, bounds, class count and the bits of
/// its logits on every sample.
fn behaviour_hash(model: &dyn Classifier, data: &Dataset) -> Result<String> {
    let mut h = Sha256::new();
    for &d in model.input_shape() {
        h.update((d as u64).to_le_bytes());
    }
    let (lo, hi) = model.bounds();
    h.update(lo.to_bits().to_le_bytes());
    h.update(hi.to_bits().to_le_bytes());
    h.update((model.num_classes() as u64).to_le_bytes());
    const STEP: usize = 256;
    let mut s = 0;
    while s < data.len() {
        let e = (s + STEP).min(data.len());
        let (x, _) = data.batch(s..e)?;
        for &v in model.forward(&x)?.value().iter() {
            h.update(v.to_bits().to_le_bytes());
        }
        s = e;
    }
    Ok(super::identity::hex(h.finalize()))
}
