//! A coverage-guided robustness fuzzer (DeepHunter, Xie et al. 2019): seeds from a data set are mutated
//! (pixel-value changes, affine transformations, attacks: [`mutate`], configured as data: [`config`]), every
//! mutant goes through the model, and a mutant that raises neuron coverage ([`crate::coverage`]) by more than a
//! threshold joins the corpus; a valid mutant of a correctly classified seed that the model gets wrong is a
//! failure, which is then shrunk towards its seed ([`shrink`]).
//!
//! - **Power schedule.** Each round draws `seeds_per_round` corpus entries on two levels: a seed's family (the
//!   seed and its descendants) with probability ∝ `(1 + 2 · recent) / √(1 + drawn)`, then an entry of the family
//!   with probability ∝ `(1 + 2 · recent) / (1 + fuzzed)`: `recent` is how many mutants joined the corpus the
//!   last time the family (entry) was drawn — 1 for a new entry, which just raised coverage —, `drawn` and
//!   `fuzzed` how often it was drawn. The family level keeps every seed in play however large one lineage
//!   grows (with one level, a few prolific lineages took most draws and failures came from half the seeds).
//! - **DeepHunter's rules.** A lineage holds at most one affine or adversarial mutation; once it has one, only
//!   pixel-value mutations follow. Validity is measured against the *reference* of the lineage — its original
//!   seed, or for an affine lineage the seed under that affine transformation alone — and holds when at most a
//!   fraction `l0_fraction` of the elements changed (any amount) or every element changed by at most
//!   `linf_fraction` of the input range ([`Validity`]; defaults α = 0.02, β = 0.2 as in DeepHunter, taken relative
//!   to the model's bounds, so they reject on [0, 1] images — MindArmour compares [0, 1] images with
//!   β · 255 and rejects nothing). Optionally, a mutant must also keep an SSIM of at least `min_ssim` with
//!   its reference ([`crate::metrics::ssim`]).
//! - **Gain threshold.** A mutant joins the corpus when the chosen metric rises by *more than* `gain_threshold`
//!   (in the metric's units); with 0, any gain counts (MindArmour's threshold is never applied).
//! - **Batched and reproducible.** A round's mutants are made in parallel, each from its own seed
//!   ([`crate::seed::derive`] of the run's seed, the round and the slot), go through the model as one batch, and
//!   update coverage one after the other in slot order; so a run is bit-identical whatever the thread count.
//! - **Success rate** is failures / valid mutants of correctly classified seeds, overall and per strategy group
//!   (the group of the step that made the mutant); it is defined at 100% too (MindArmour's is not).

pub mod config;
pub mod mutate;
mod retrain;
mod round;
pub mod shrink;

pub use retrain::{retrain, Retrain, RetrainConfig};

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::coverage::{Bounds, CoverageConfig, CoverageValues, Metric, NeuronTaps, Tracker};
use crate::{Attack, Classifier, Error, Result, Tensor};
use config::MutationConfig;
use mutate::{Group, Step};

/// DeepHunter's validity rule, relative to the input range.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Validity {
    /// A mutant with at most this fraction of its elements changed is valid whatever the change (α, 0.02).
    pub l0_fraction: f32,
    /// Otherwise it is valid when no element changed by more than this fraction of the range (β, 0.2).
    pub linf_fraction: f32,
    /// Optionally, also require at least this SSIM with the reference ([`crate::metrics::ssim`], Wang et al.
    /// 2004; images of at least 11 × 11). Off by default.
    #[serde(default)]
    pub min_ssim: Option<f32>,
}

impl Default for Validity {
    fn default() -> Self {
        Validity { l0_fraction: 0.02, linf_fraction: 0.2, min_ssim: None }
    }
}

impl Validity {
    /// Whether `mutant` is a valid change of `reference` for inputs of range `range` under the L0 / L∞ rule
    /// (SSIM not checked).
    pub fn check(&self, reference: &[f32], mutant: &[f32], range: f32) -> bool {
        let (l0, linf) = l0_linf(reference, mutant);
        l0 as f32 <= self.l0_fraction * reference.len() as f32 || linf <= self.linf_fraction * range
    }

    /// The whole rule: [`Validity::check`], and the SSIM floor when set, for images of shape [C, H, W]. An
    /// image SSIM cannot score (smaller than 11 × 11) is invalid; [`Fuzzer::new`] refuses such a set-up.
    pub fn check_image(&self, reference: &[f32], mutant: &[f32], range: f32, shape: [usize; 3]) -> bool {
        self.check(reference, mutant, range)
            && self.min_ssim.is_none_or(|s| {
                crate::metrics::ssim_slices(reference, mutant, shape, f64::from(range)).is_ok_and(|v| v >= f64::from(s))
            })
    }
}

/// L0 (elements that differ) and L∞ of `b − a`.
pub fn l0_linf(a: &[f32], b: &[f32]) -> (usize, f32) {
    a.iter().zip(b).fold((0, 0.0f32), |(l0, linf), (x, y)| {
        let d = (y - x).abs();
        (l0 + usize::from(d > 0.0), linf.max(d))
    })
}

/// The fuzzer's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FuzzConfig {
    /// Mutants made from each drawn seed (20).
    pub mutants_per_seed: usize,
    /// Corpus entries drawn per round; a round's mutants go through the model as one batch (16).
    pub seeds_per_round: usize,
    /// A mutant joins the corpus when the metric rises by more than this (0).
    pub gain_threshold: f64,
    /// The metric that guides the search (KMNC).
    pub metric: Metric,
    /// The criteria's parameters.
    pub coverage: CoverageConfig,
    /// Stop after this many seed draws (iterations).
    pub max_iterations: Option<usize>,
    /// Stop after this many mutants.
    pub max_mutants: Option<usize>,
    /// Stop after this many seconds (the only budget that makes a run depend on the machine).
    pub max_seconds: Option<f64>,
    /// Stop once the metric reaches this value.
    pub target_coverage: Option<f64>,
    /// The validity rule.
    pub validity: Validity,
    /// Shrink every failure.
    pub shrink: bool,
    /// The run's seed.
    pub seed: u64,
}

impl Default for FuzzConfig {
    fn default() -> Self {
        FuzzConfig {
            mutants_per_seed: 20,
            seeds_per_round: 16,
            gain_threshold: 0.0,
            metric: Metric::Kmnc,
            coverage: CoverageConfig::default(),
            max_iterations: Some(900),
            max_mutants: None,
            max_seconds: None,
            target_coverage: None,
            validity: Validity::default(),
            shrink: true,
            seed: 0,
        }
    }
}

impl FuzzConfig {
    fn validate(&self) -> Result<()> {
        self.coverage.validate()?;
        if self.mutants_per_seed == 0 || self.seeds_per_round == 0 {
            return Err(Error::invalid("fuzz", "mutants_per_seed and seeds_per_round must be at least 1"));
        }
        if !self.gain_threshold.is_finite() || self.gain_threshold < 0.0 {
            return Err(Error::invalid("fuzz", format!("gain_threshold {} is not ≥ 0", self.gain_threshold)));
        }
        let v = self.validity;
        if !(0.0..=1.0).contains(&v.l0_fraction) || !(0.0..=1.0).contains(&v.linf_fraction) {
            return Err(Error::invalid("fuzz", "validity fractions must be in [0, 1]"));
        }
        let budgets = [self.max_iterations.is_some(), self.max_mutants.is_some(), self.max_seconds.is_some()];
        if !budgets.contains(&true) && self.target_coverage.is_none() {
            return Err(Error::invalid("fuzz", "no budget: set max_iterations, max_mutants, max_seconds or target"));
        }
        Ok(())
    }
}

/// One failure: a valid mutant of a correctly classified seed that the model misclassifies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// Index of its seed.
    pub seed: usize,
    /// The seed's label.
    pub label: usize,
    /// The model's prediction on the mutant.
    pub prediction: usize,
    /// The mutation steps from the seed, in order.
    pub chain: Vec<Step>,
    /// The group of the last step.
    pub group: Group,
    /// The mutant [C·H·W].
    pub image: Vec<f32>,
    /// L∞ of mutant − seed.
    pub linf: f32,
    /// Elements that differ from the seed.
    pub l0: usize,
    /// L∞ of mutant − the lineage's reference (the seed, or the seed under the lineage's affine step): what the
    /// validity rule bounds. For an affine lineage `linf` is large by nature (a shifted edge), this is not.
    pub reference_linf: f32,
    /// The shrunk mutant, when shrinking ran.
    pub shrunk: Option<shrink::Shrunk>,
}

/// `a / b`, 0 when `b` is 0.
fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Per strategy group: mutants made, valid ones, valid ones of correctly classified seeds, failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    /// Mutants made.
    pub mutants: usize,
    /// Mutants that passed the validity rule.
    pub valid: usize,
    /// Valid mutants of correctly classified seeds (the success rate's denominator).
    pub valid_from_correct: usize,
    /// Failures.
    pub failures: usize,
}

impl GroupStats {
    /// Failures / valid mutants of correctly classified seeds (0 when there is none).
    pub fn success_rate(&self) -> f64 {
        ratio(self.failures, self.valid_from_correct)
    }
}

/// What a run found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FuzzReport {
    /// Seeds given.
    pub seeds: usize,
    /// Seeds the model classifies correctly.
    pub seeds_correct: usize,
    /// Seed draws made.
    pub iterations: usize,
    /// Rounds run.
    pub rounds: usize,
    /// Mutants made (valid or not).
    pub mutants: usize,
    /// Mutants that joined the corpus.
    pub kept: usize,
    /// Corpus size at the end (seeds included).
    pub corpus: usize,
    /// The guiding metric.
    pub metric: Metric,
    /// Coverage of the seeds alone.
    pub seed_coverage: CoverageValues,
    /// Coverage of the final corpus.
    pub final_coverage: CoverageValues,
    /// (mutants made, the metric's value) after each round, starting at (0, the seeds' value).
    pub curve: Vec<(usize, f64)>,
    /// Every failure, in the order found.
    pub failures: Vec<Failure>,
    /// Per strategy group (`pixel`, `affine`, `adversarial`).
    pub groups: BTreeMap<Group, GroupStats>,
    /// The attack names, indexed by [`Step::attack`].
    pub attacks: Vec<String>,
    /// Wall time of the fuzzing loop, in seconds (shrinking excluded).
    pub seconds: f64,
    /// Wall time of shrinking, in seconds.
    pub shrink_seconds: f64,
}

impl FuzzReport {
    /// Valid mutants of correctly classified seeds, over every group.
    pub fn valid_from_correct(&self) -> usize {
        self.groups.values().map(|g| g.valid_from_correct).sum()
    }

    /// Failures / valid mutants of correctly classified seeds (defined at 100%; 0 with no valid mutant).
    pub fn success_rate(&self) -> f64 {
        ratio(self.failures.len(), self.valid_from_correct())
    }

    /// The model's accuracy on the valid mutants of correctly classified seeds: 1 − success rate.
    pub fn accuracy(&self) -> f64 {
        1.0 - self.success_rate()
    }

    /// Distinct seeds with at least one failure.
    pub fn failing_seeds(&self) -> usize {
        let mut s: Vec<usize> = self.failures.iter().map(|f| f.seed).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    }

    /// Mutants per second of the fuzzing loop.
    pub fn mutants_per_second(&self) -> f64 {
        self.mutants as f64 / self.seconds.max(1e-9)
    }
}

/// A corpus entry of a checkpoint: its seed, its mutation chain and its power-schedule counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedEntry {
    /// Index of its seed.
    pub origin: usize,
    /// The steps from the seed (empty for a seed).
    pub chain: Vec<Step>,
    /// Times drawn.
    pub fuzzed: u32,
    /// Mutants that joined the corpus the last time it was drawn.
    pub recent: u32,
}

/// What a run has found and done so far: the running state's counts, saved as they are in its [`Checkpoint`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// Failures so far (unshrunk).
    pub failures: Vec<Failure>,
    /// Per strategy group.
    pub groups: BTreeMap<Group, GroupStats>,
    /// The coverage curve so far.
    pub curve: Vec<(usize, f64)>,
    /// Mutants made.
    pub mutants: usize,
    /// Seed draws made.
    pub iterations: usize,
    /// Rounds run.
    pub rounds: usize,
    /// Mutants kept.
    pub kept: usize,
}

/// What a run needs to continue where it stopped ([`Fuzzer::run_from`]): the corpus as mutation chains (images
/// are replayed, so the file stays small), the power schedule's counts, the failures found (unshrunk), and the
/// counters. Saved and read as JSON ([`Checkpoint::save`], [`Checkpoint::load`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The run's seed.
    pub seed: u64,
    /// Number of seeds.
    pub seeds: usize,
    /// Every corpus entry, the seeds first.
    pub entries: Vec<SavedEntry>,
    /// Per seed family: times drawn, and entries kept the last time.
    pub families: Vec<(u32, u32)>,
    /// What the run found and did so far.
    #[serde(flatten)]
    pub tally: Tally,
}

impl Checkpoint {
    /// Writes the checkpoint as JSON, atomically.
    pub fn save(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let text = serde_json::to_vec(self).map_err(|e| Error::invalid("checkpoint", e.to_string()))?;
        crate::io::write_atomic(path.as_ref(), &text)
    }

    /// Reads a checkpoint written by [`Checkpoint::save`].
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_slice(&text).map_err(|e| Error::bad_file(path, format!("not a fuzz checkpoint: {e}")))
    }
}

/// Progress after a round, for a progress bar.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Mutants made so far.
    pub mutants: usize,
    /// Seed draws so far.
    pub iterations: usize,
    /// The metric's value.
    pub coverage: f64,
    /// Failures so far.
    pub failures: usize,
}

/// The fuzzer: a model, its neurons and their training bounds, the mutations and the attacks they name.
pub struct Fuzzer<'a> {
    model: &'a dyn Classifier,
    taps: NeuronTaps,
    bounds: Bounds,
    mutations: MutationConfig,
    attacks: Vec<(String, Box<dyn Attack>)>,
    config: FuzzConfig,
}

impl<'a> Fuzzer<'a> {
    /// A fuzzer. `attacks` gives, by name, every attack the mutation configuration names (extra ones are
    /// unused); a name the configuration uses without an attack here is an error.
    pub fn new(
        model: &'a dyn Classifier,
        taps: NeuronTaps,
        bounds: Bounds,
        mutations: MutationConfig,
        attacks: Vec<(String, Box<dyn Attack>)>,
        config: FuzzConfig,
    ) -> Result<Fuzzer<'a>> {
        config.validate()?;
        image_shape(model)?;
        if mutations.methods.is_empty() {
            return Err(Error::invalid("fuzz", "no mutation method"));
        }
        for name in mutations.attack_names() {
            if !attacks.iter().any(|(n, _)| *n == name) {
                return Err(Error::invalid("fuzz", format!("the configuration names attack '{name}', not given")));
            }
        }
        Tracker::new(&bounds, config.coverage)?;
        if let Some(s) = config.validity.min_ssim {
            let [_, h, w] = image_shape(model)?;
            if !(s.is_finite() && s <= 1.0) || h < crate::metrics::SSIM_WINDOW || w < crate::metrics::SSIM_WINDOW {
                return Err(Error::invalid(
                    "fuzz",
                    format!("min_ssim {s} needs a value ≤ 1 and images of 11 × 11 or more"),
                ));
            }
        }
        Ok(Fuzzer { model, taps, bounds, mutations, attacks, config })
    }

    /// The settings.
    pub fn config(&self) -> &FuzzConfig {
        &self.config
    }

    /// Fuzzes from `seeds` [N, C, H, W] with their `labels`, calling `progress` after every round.
    pub fn run(&self, seeds: &Tensor, labels: &[usize], progress: &mut dyn FnMut(&Progress)) -> Result<FuzzReport> {
        Ok(self.run_from(seeds, labels, None, progress)?.0)
    }

    /// Like [`Fuzzer::run`], continuing from a [`Checkpoint`] of an earlier run with the same seeds, model,
    /// mutations and seed (its corpus is replayed from the saved mutation chains, coverage rebuilt from it),
    /// until this fuzzer's budgets; also returns the checkpoint at the end. A run stopped at a round boundary (N
    /// iterations, N a multiple of `seeds_per_round`) and resumed to M gives the report of one run to M (a
    /// shorter last round before the stop shifts the later rounds' draws).
    pub fn run_from(
        &self,
        seeds: &Tensor,
        labels: &[usize],
        from: Option<&Checkpoint>,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(FuzzReport, Checkpoint)> {
        let n = self.model.check_input(seeds)?;
        if labels.len() != n {
            return Err(Error::invalid("fuzz", format!("{} labels for {n} seeds", labels.len())));
        }
        if let Some(&l) = labels.iter().find(|&&l| l >= self.model.num_classes()) {
            return Err(Error::LabelOutOfRange { op: "fuzz", label: l, num_classes: self.model.num_classes() });
        }
        let start = Instant::now();
        let mut state = round::State::new(self, seeds, labels)?;
        let seed_coverage = state.tracker.values();
        if let Some(cp) = from {
            state.restore(self, cp)?;
        }
        while !state.done(self, start.elapsed().as_secs_f64()) {
            state.round(self)?;
            progress(&Progress {
                mutants: state.tally.mutants,
                iterations: state.tally.iterations,
                coverage: state.tracker.value(self.config.metric),
                failures: state.tally.failures.len(),
            });
        }
        let seconds = start.elapsed().as_secs_f64();
        let t = Instant::now();
        let checkpoint = state.checkpoint(self);
        let mut failures = std::mem::take(&mut state.tally.failures);
        if self.config.shrink && !failures.is_empty() {
            shrink::shrink_all(self, seeds, &mut failures)?;
        }
        let report = FuzzReport {
            seeds: n,
            seeds_correct: state.correct.iter().filter(|&&c| c).count(),
            iterations: state.tally.iterations,
            rounds: state.tally.rounds,
            mutants: state.tally.mutants,
            kept: state.tally.kept,
            corpus: state.corpus.len(),
            metric: self.config.metric,
            seed_coverage,
            final_coverage: state.tracker.values(),
            curve: state.tally.curve,
            failures,
            groups: state.tally.groups,
            attacks: self.attacks.iter().map(|(n, _)| n.clone()).collect(),
            seconds,
            shrink_seconds: t.elapsed().as_secs_f64(),
        };
        Ok((report, checkpoint))
    }

    fn attack_index(&self, name: &str) -> Option<usize> {
        self.attacks.iter().position(|(n, _)| n == name)
    }

    fn range(&self) -> f32 {
        let (lo, hi) = self.model.bounds();
        hi - lo
    }

    fn image_shape(&self) -> Result<[usize; 3]> {
        image_shape(self.model)
    }

    /// The validity rule for a mutant of a lineage with this reference.
    fn valid(&self, reference: &[f32], mutant: &[f32]) -> bool {
        let shape = self.image_shape().expect("checked by Fuzzer::new");
        self.config.validity.check_image(reference, mutant, self.range(), shape)
    }
}

fn image_shape(model: &dyn Classifier) -> Result<[usize; 3]> {
    match model.input_shape() {
        &[c, h, w] => Ok([c, h, w]),
        s => Err(Error::invalid("fuzz", format!("input shape {s:?} is not [C, H, W]"))),
    }
}
