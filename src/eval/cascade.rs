//! The cascade (AutoAttack's protocol): for each ε in ascending order, each attack of the threat model in turn
//! attacks only the samples that every earlier attack (and every smaller ε) left robust; a sample's worst case
//! over the list decides it. A per-sample ledger records which attack at which ε first broke each sample, the
//! final margin, and the gradients and queries it cost; a state file, written atomically after every step (a
//! chunk of samples × one attack at one ε), lets an interrupted run continue with the same result.
//!
//! Every attack seeds each sample from its own values (`armoury::seed`), so a sample's fate depends neither on
//! the chunk it is in nor on which samples are still robust beside it: chunks, resumed runs and shards all give
//! the ledger of the one uninterrupted run, bit for bit.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::identity::Identity;
use super::threat::{AttackSpec, ThreatModel};
use crate::attack::budget::{box_diameter, exact_norm, rows, unrows};
use crate::attack::{Attack, Budget, Goal, Norm, Resolved};
use crate::classifier::{argmax_rows, Classifier};
use crate::data::Dataset;
use crate::{Error, Result};

/// Builds an attack of the threat model at budget ε (the examples pass `armoury_attacks::registry::from_spec`).
pub type Builder<'a> = dyn Fn(&AttackSpec, Norm, f32) -> Result<Box<dyn Attack>> + Sync + 'a;

/// The first break of a sample.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Break {
    /// Index into the threat model's ε grid.
    pub eps_index: usize,
    /// Index into the threat model's attacks.
    pub attack_index: usize,
    /// The model's prediction on the adversarial input.
    pub prediction: usize,
}

/// One sample's line of the ledger.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SampleRecord {
    /// Index of the sample in the data set.
    pub index: usize,
    /// Its true label.
    pub label: usize,
    /// The model's prediction on the clean input.
    pub clean_prediction: usize,
    /// Which attack at which ε broke it first (`None`: robust at every ε, or misclassified when clean).
    pub broken: Option<Break>,
    /// z_y − max_{j≠y} z_j at the worst point found (the breaking point, or the smallest margin of any attack's
    /// output): negative when broken.
    pub margin: f32,
    /// Gradient evaluations spent on it by the cascade.
    pub gradients: u64,
    /// Model queries spent on it by the cascade.
    pub queries: u64,
    /// Gradient evaluations that were all zero or not finite.
    pub gradient_faults: u64,
    /// The adversarial input that broke it (row-major), if broken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adversarial: Option<Vec<f32>>,
    /// Per minimum-norm attack: the norm of the smallest adversarial perturbation found (`None`: not found).
    pub minimal_norms: Vec<Option<f64>>,
}

impl SampleRecord {
    /// Whether the sample was correctly classified when clean.
    pub fn clean_correct(&self) -> bool {
        self.clean_prediction == self.label
    }

    /// Whether it is still correctly classified after the cascade at ε grid index `k` (through attack `j`).
    pub fn robust_at(&self, k: usize, through: Option<usize>) -> bool {
        self.clean_correct()
            && match &self.broken {
                None => true,
                Some(b) => b.eps_index > k || (b.eps_index == k && through.is_some_and(|j| b.attack_index > j)),
            }
    }
}

/// Work totals of one attack of the cascade (all ε).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AttackWork {
    /// Samples attacked (summed over ε).
    pub attacked: u64,
    /// Gradient evaluations.
    pub gradients: u64,
    /// Queries.
    pub queries: u64,
    /// Wall-clock seconds (not part of the result: it differs between runs).
    pub seconds: f64,
}

/// The ledger of one run over a slice of the data: its state file while running, its output when done.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ledger {
    /// The threat model's hash.
    pub threat_model_hash: String,
    /// The model's description (for people; [`Ledger::identity`] is what is compared).
    pub model: String,
    /// What the ledger measured: model and data hashes, kernel path, version (empty in ledgers written before
    /// Armoury recorded it: those are never resumed or merged).
    #[serde(default)]
    pub identity: Identity,
    /// Samples in the whole evaluation (all shards).
    pub total_samples: usize,
    /// The slice of sample indices this ledger covers.
    pub range: (usize, usize),
    /// Samples per step.
    pub chunk: usize,
    /// Steps done (a step: one chunk's clean pass, one attack at one ε, or one minimum-norm attack).
    pub steps_done: usize,
    /// Every sample whose chunk has started, by index.
    pub records: Vec<SampleRecord>,
    /// Work per cascade attack.
    pub work: Vec<AttackWork>,
}

impl Ledger {
    /// Whether every step ran.
    pub fn is_complete(&self, tm: &ThreatModel) -> bool {
        self.steps_done == self.steps_total(tm)
    }

    /// How many steps its slice takes under `tm`.
    pub fn steps_total(&self, tm: &ThreatModel) -> usize {
        steps_per_chunk(tm) * chunks(self.range, self.chunk)
    }

    /// Reads a ledger file.
    pub fn load(path: &Path) -> Result<Ledger> {
        let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_slice(&text).map_err(|e| Error::bad_file(path, format!("ledger: {e}")))
    }

    /// Writes it atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = serde_json::to_vec(self).map_err(|e| Error::invalid("ledger", e.to_string()))?;
        crate::io::write_atomic(path, &bytes)
    }
}

/// Where a cascade is, for a progress display or a log line.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Steps done (of this ledger: a shard's, or the whole run's).
    pub done: usize,
    /// Steps in all.
    pub total: usize,
    /// The step that just finished (`None` on the first call), e.g. `apgd-ce(steps=100) at ε = 0.1`.
    pub finished: Option<String>,
    /// The step that runs next (`None` when all are done).
    pub next: Option<String>,
    /// Samples whose clean pass ran.
    pub started: usize,
    /// Of those, correctly classified.
    pub correct: usize,
    /// Of those, not broken by any attack so far at the largest ε (the chunk in progress counts what its
    /// attacks have done so far).
    pub robust: usize,
}

impl Progress {
    /// `robust / started` (0 before any sample started).
    pub fn robust_accuracy(&self) -> f64 {
        if self.started == 0 {
            0.0
        } else {
            self.robust as f64 / self.started as f64
        }
    }
}

/// The name of step `step` of a chunk (0: the clean pass; then each ε of the grid with each cascade attack; then
/// the minimum-norm attacks), as [`Progress`] shows it.
pub fn step_name(tm: &ThreatModel, step: usize) -> String {
    let cascade_steps = tm.eps.len() * tm.attacks.len();
    if step == 0 {
        "clean pass".to_string()
    } else if step <= cascade_steps {
        let (k, j) = ((step - 1) / tm.attacks.len(), (step - 1) % tm.attacks.len());
        format!("{} at ε = {}", tm.attacks[j].label(), tm.eps[k])
    } else {
        format!("{} (minimal norms)", tm.minimal[step - 1 - cascade_steps].label())
    }
}

fn progress_of(tm: &ThreatModel, ledger: &Ledger, total: usize, first: bool) -> Progress {
    let per = steps_per_chunk(tm);
    let k = tm.eps.len().saturating_sub(1);
    let correct = ledger.records.iter().filter(|r| r.clean_correct()).count();
    Progress {
        done: ledger.steps_done,
        total,
        finished: (!first && ledger.steps_done > 0).then(|| step_name(tm, (ledger.steps_done - 1) % per)),
        next: (ledger.steps_done < total).then(|| step_name(tm, ledger.steps_done % per)),
        started: ledger.records.len(),
        correct,
        robust: ledger.records.iter().filter(|r| r.robust_at(k, None)).count(),
    }
}

fn steps_per_chunk(tm: &ThreatModel) -> usize {
    1 + tm.eps.len() * tm.attacks.len() + tm.minimal.len()
}

fn chunks(range: (usize, usize), chunk: usize) -> usize {
    (range.1 - range.0).div_ceil(chunk.max(1))
}

/// Where and how a cascade runs.
pub struct CascadeRun<'a> {
    /// The threat model.
    pub threat: &'a ThreatModel,
    /// Builds its attacks.
    pub build: &'a Builder<'a>,
    /// A description of the model (recorded in the ledger, for people).
    pub model_name: String,
    /// The evaluation's identity ([`Identity::new`]): a state file or shard of another model, other data, another
    /// kernel path or another version is refused.
    pub identity: Identity,
    /// Samples `range.0..range.1` of the data (a shard, or everything).
    pub range: (usize, usize),
    /// Samples in the whole evaluation.
    pub total_samples: usize,
    /// Samples per step (each step is saved).
    pub chunk: usize,
    /// The state file: read if present (resume), written after every step.
    pub state: Option<PathBuf>,
    /// Stop after this many steps of this call (tests of interruption); `None` runs to the end.
    pub max_steps: Option<usize>,
    /// Called once before the first step and after every step with where the run is ([`Progress`]): a first
    /// call with steps done > 0 means a resumed run.
    pub progress: Option<&'a (dyn Fn(&Progress) + Sync)>,
}

/// Runs (or resumes) the cascade of `run` on `data` with `model`; returns the ledger, complete unless
/// `max_steps` stopped it.
pub fn run_cascade(model: &dyn Classifier, data: &Dataset, run: &CascadeRun<'_>) -> Result<Ledger> {
    let tm = run.threat;
    tm.check()?;
    tm.check_bounds(model.bounds())?;
    let (s, e) = run.range;
    if run.total_samples == 0 {
        return Err(Error::invalid("cascade", "no samples to evaluate (a limit of 0?): nothing would be measured"));
    }
    if s > e || e > data.len() || e > run.total_samples || run.chunk == 0 {
        return Err(Error::invalid(
            "cascade",
            format!("samples {s}..{e} of {} (data {}), chunk {}", run.total_samples, data.len(), run.chunk),
        ));
    }
    check_data_in_bounds(model, data, (s, e))?;
    check_eps_in_box(tm, model)?;
    check_attacks(tm, run.build)?;
    let fresh = Ledger {
        threat_model_hash: tm.hash(),
        model: run.model_name.clone(),
        identity: run.identity.clone(),
        total_samples: run.total_samples,
        range: run.range,
        chunk: run.chunk,
        steps_done: 0,
        records: Vec::new(),
        work: vec![AttackWork::default(); tm.attacks.len()],
    };
    let mut ledger = match &run.state {
        Some(p) if p.exists() => resume(Ledger::load(p)?, &fresh)?,
        _ => fresh,
    };
    let per = steps_per_chunk(tm);
    let total = per * chunks(run.range, run.chunk);
    let mut this_call = 0;
    if let Some(f) = run.progress {
        f(&progress_of(tm, &ledger, total, true));
    }
    while ledger.steps_done < total {
        if run.max_steps.is_some_and(|m| this_call >= m) {
            break;
        }
        let (c, step) = (ledger.steps_done / per, ledger.steps_done % per);
        let lo = s + c * run.chunk;
        let hi = (lo + run.chunk).min(e);
        run_step(model, data, tm, run.build, &mut ledger, (lo, hi), step)?;
        ledger.steps_done += 1;
        this_call += 1;
        if let Some(p) = &run.state {
            ledger.save(p)?;
        }
        if let Some(f) = run.progress {
            f(&progress_of(tm, &ledger, total, false));
        }
    }
    Ok(ledger)
}

/// A saved ledger continues only the run that wrote it.
fn resume(saved: Ledger, fresh: &Ledger) -> Result<Ledger> {
    if let Some(why) = fresh.identity.difference(&saved.identity) {
        return Err(Error::invalid(
            "cascade state",
            format!(
                "the saved ledger (state file) is of another evaluation: {why}; remove it or use another output \
                 directory to evaluate afresh"
            ),
        ));
    }
    let same = saved.threat_model_hash == fresh.threat_model_hash
        && saved.range == fresh.range
        && saved.total_samples == fresh.total_samples
        && saved.chunk == fresh.chunk
        && saved.work.len() == fresh.work.len();
    if !same {
        return Err(Error::invalid(
            "cascade state",
            "the state file belongs to another run (threat model, samples or chunk differ); remove it or use \
             another output directory",
        ));
    }
    Ok(saved)
}

/// The margin z_y − max_{j≠y} z_j of each row.
fn margins(z: &ndarray::Array2<f32>, labels: &[usize]) -> Result<Vec<f32>> {
    let best = crate::attack::best_other(z, labels)?;
    Ok(best.iter().zip(labels).enumerate().map(|(i, ((_, o), &y))| z[[i, y]] - o).collect())
}

/// The seed of attack `j` at ε index `k`.
fn step_seed(seed: u64, k: usize, j: usize) -> u64 {
    crate::seed::derive(seed, ((k as u64) << 32) | j as u64)
}

/// One chunk of samples: its inputs as rows, labels, and where its records start in the ledger.
struct Chunk {
    shape: Vec<usize>,
    rows: ndarray::Array2<f32>,
    y: Vec<usize>,
    first: usize,
    /// The data set index of the chunk's first sample.
    first_index: usize,
}

impl Chunk {
    /// The inputs of the chunk's samples `who`.
    fn inputs(&self, who: &[usize]) -> crate::Tensor {
        let mut shape = self.shape.clone();
        shape[0] = who.len();
        unrows(self.rows.select(ndarray::Axis(0), who), &shape)
    }
}

fn run_step(
    model: &dyn Classifier,
    data: &Dataset,
    tm: &ThreatModel,
    build: &Builder<'_>,
    ledger: &mut Ledger,
    (lo, hi): (usize, usize),
    step: usize,
) -> Result<()> {
    let (x, y) = data.batch(lo..hi)?;
    if step == 0 {
        let z = model.logits(&x)?;
        let preds = argmax_rows(&z);
        let m = margins(&z, &y)?;
        for i in 0..y.len() {
            ledger.records.push(SampleRecord {
                index: lo + i,
                label: y[i],
                clean_prediction: preds[i],
                broken: None,
                margin: m[i],
                gradients: 0,
                queries: 0,
                gradient_faults: 0,
                adversarial: None,
                minimal_norms: vec![None; tm.minimal.len()],
            });
        }
        return Ok(());
    }
    let chunk = Chunk {
        shape: x.shape().to_vec(),
        rows: rows(&x),
        y,
        first: ledger.records.len() - (hi - lo),
        first_index: lo,
    };
    let cascade_steps = tm.eps.len() * tm.attacks.len();
    if step <= cascade_steps {
        let (k, j) = ((step - 1) / tm.attacks.len(), (step - 1) % tm.attacks.len());
        attack_step(model, tm, build, ledger, &chunk, (k, j))
    } else {
        minimal_step(model, tm, build, ledger, &chunk, step - 1 - cascade_steps)
    }
}

/// Attack `j` at ε index `k` on the chunk's samples still robust there.
fn attack_step(
    model: &dyn Classifier,
    tm: &ThreatModel,
    build: &Builder<'_>,
    ledger: &mut Ledger,
    c: &Chunk,
    (k, j): (usize, usize),
) -> Result<()> {
    let recs = &ledger.records[c.first..c.first + c.y.len()];
    let who: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].robust_at(k, Some(j))).collect();
    if who.is_empty() {
        return Ok(());
    }
    let eps = tm.eps[k] as f32;
    let attack = build(&tm.attacks[j], tm.norm()?, eps)?;
    let start = Instant::now();
    let mut results = Vec::new();
    for part in who.chunks(tm.batch_size) {
        let ys: Vec<usize> = part.iter().map(|&i| c.y[i]).collect();
        let r = attack.sweep(model, &c.inputs(part), &ys, &Goal::Untargeted, &[eps], step_seed(tm.seed, k, j))?;
        results.push((part, ys, r.into_iter().next().expect("one ε, one result")));
    }
    let w = &mut ledger.work[j];
    w.seconds += start.elapsed().as_secs_f64();
    w.attacked += who.len() as u64;
    let norm = tm.norm()?;
    let label = tm.attacks[j].label();
    for (part, ys, r) in results {
        let z = model.logits(&r.adversarial)?;
        let m = margins(&z, &ys)?;
        let preds = argmax_rows(&z);
        let advs = rows(&r.adversarial);
        for (t, &i) in part.iter().enumerate() {
            if r.success[t] {
                let b = BreakCheck { model, norm, eps, attack: &label, index: c.first_index + i };
                b.verify(c.rows.row(i).as_slice().expect("standard rows"), advs.row(t), c.y[i], preds[t])?;
            }
            let rec = &mut ledger.records[c.first + i];
            rec.gradients += r.gradients[t];
            rec.queries += r.queries[t];
            rec.gradient_faults += r.gradient_faults[t].zero + r.gradient_faults[t].non_finite;
            w.gradients += r.gradients[t];
            w.queries += r.queries[t];
            if r.success[t] {
                rec.broken = Some(Break { eps_index: k, attack_index: j, prediction: r.predictions[t] });
                rec.adversarial = Some(advs.row(t).to_vec());
                rec.margin = m[t];
            } else {
                rec.margin = rec.margin.min(m[t]);
            }
        }
    }
    Ok(())
}

/// Minimum-norm attack `mi` on every correctly classified sample of the chunk.
fn minimal_step(
    model: &dyn Classifier,
    tm: &ThreatModel,
    build: &Builder<'_>,
    ledger: &mut Ledger,
    c: &Chunk,
    mi: usize,
) -> Result<()> {
    let recs = &ledger.records[c.first..c.first + c.y.len()];
    let who: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].clean_correct()).collect();
    let norm = tm.norm()?;
    let attack = build(&tm.minimal[mi], norm, *tm.eps.last().expect("checked non-empty") as f32)?;
    for part in who.chunks(tm.batch_size) {
        let ys: Vec<usize> = part.iter().map(|&i| c.y[i]).collect();
        let seed = step_seed(tm.seed, usize::MAX >> 32, mi);
        let r = attack.run(model, &c.inputs(part), &ys, &Goal::Untargeted, seed)?;
        for (t, &i) in part.iter().enumerate() {
            ledger.records[c.first + i].minimal_norms[mi] = r.success[t].then_some(r.norms[t].get(norm) as f64);
        }
    }
    Ok(())
}

/// Combines complete shard ledgers into the ledger of the whole run: the same records, in index order, and the
/// same work totals as one unsharded run (seconds add up). The shards must cover the samples exactly once, and
/// every one must be of the evaluation `identity` (this command's model, data, kernel path and version).
pub fn merge(tm: &ThreatModel, identity: &Identity, mut shards: Vec<Ledger>) -> Result<Ledger> {
    if shards.is_empty() {
        return Err(Error::invalid("merge", "no shard ledgers"));
    }
    shards.sort_by_key(|l| l.range.0);
    let hash = tm.hash();
    let first = &shards[0];
    let mut next = 0;
    for l in &shards {
        if let Some(why) = identity.difference(&l.identity) {
            return Err(Error::invalid(
                "merge",
                format!("shard {:?} is of another evaluation than this command's: {why}", l.range),
            ));
        }
        if l.threat_model_hash != hash || l.total_samples != first.total_samples {
            return Err(Error::invalid(
                "merge",
                format!("shard {:?} was run with another threat model or sample count", l.range),
            ));
        }
        if l.range.0 != next {
            return Err(Error::invalid("merge", format!("samples {next}..{} are in no shard", l.range.0)));
        }
        if !l.is_complete(tm) {
            return Err(Error::invalid("merge", format!("shard {:?} has not finished", l.range)));
        }
        next = l.range.1;
    }
    if next != first.total_samples {
        return Err(Error::invalid("merge", format!("samples {next}..{} are in no shard", first.total_samples)));
    }
    let mut work = vec![AttackWork::default(); tm.attacks.len()];
    let mut records = Vec::with_capacity(first.total_samples);
    for l in &shards {
        for (w, s) in work.iter_mut().zip(&l.work) {
            w.attacked += s.attacked;
            w.gradients += s.gradients;
            w.queries += s.queries;
            w.seconds += s.seconds;
        }
        records.extend(l.records.iter().cloned());
    }
    Ok(Ledger {
        threat_model_hash: hash,
        model: first.model.clone(),
        identity: identity.clone(),
        total_samples: first.total_samples,
        range: (0, first.total_samples),
        chunk: first.chunk,
        steps_done: steps_per_chunk(tm) * chunks((0, first.total_samples), first.chunk),
        records,
        work,
    })
}

/// Shard `i` of `n` (0-based) of `total` samples: a contiguous slice, the same for every caller.
pub fn shard_range(total: usize, i: usize, n: usize) -> Result<(usize, usize)> {
    if n == 0 || i >= n {
        return Err(Error::invalid("shard", format!("shard {i}/{n}: need 0 ≤ i < n")));
    }
    Ok((total * i / n, total * (i + 1) / n))
}

/// Refuses samples outside the classifier's input bounds: an attack clipped to a box the data are not in
/// measures nothing (0–255 images on a [0, 1] model leave PGD almost powerless and the "adversarial" images at
/// 254.9).
fn check_data_in_bounds(model: &dyn Classifier, data: &Dataset, (s, e): (usize, usize)) -> Result<()> {
    let (lo, hi) = model.bounds();
    let (mut min, mut max, mut first_out) = (f32::INFINITY, f32::NEG_INFINITY, None);
    let mut at = s;
    while at < e {
        let end = (at + 256).min(e);
        let (x, _) = data.batch(at..end)?;
        for (k, row) in rows(&x).rows().into_iter().enumerate() {
            for &v in row {
                if v.is_nan() {
                    return Err(Error::invalid("data", format!("sample {} has a NaN value", at + k)));
                }
                min = min.min(v);
                max = max.max(v);
                if first_out.is_none() && !(lo..=hi).contains(&v) {
                    first_out = Some(at + k);
                }
            }
        }
        at = end;
    }
    match first_out {
        None => Ok(()),
        Some(i) => Err(Error::invalid(
            "data",
            format!(
                "the samples' values span [{min}, {max}] (first outside: sample {i}), but the model's input bounds \
                 are [{lo}, {hi}]; pixels in 0–255? scale them to [0, 1], or declare the model's bounds (--bounds) \
                 to match the data"
            ),
        )),
    }
}

/// Refuses an ε beyond the box: every input of the box is then within ε, and the figure says nothing of ε.
fn check_eps_in_box(tm: &ThreatModel, model: &dyn Classifier) -> Result<()> {
    let norm = tm.norm()?;
    let d: usize = model.input_shape().iter().product();
    let most = box_diameter(norm, model.bounds(), d);
    match tm.eps.iter().position(|&e| e > most) {
        None => Ok(()),
        Some(k) => Err(Error::invalid(
            "threat model",
            format!(
                "field `eps[{k}]`: ε = {} is larger than the whole input box in {} ({most} for {d} values in [{}, {}]): \
                 every input would be within reach",
                tm.eps[k],
                tm.norm,
                model.bounds().0,
                model.bounds().1
            ),
        )),
    }
}

/// Refuses attacks that cannot answer the threat model: a cascade attack must work to a budget in the threat
/// model's norm (fixed, or minimum-norm clipped to ε); a `minimal` attack must be a minimum-norm attack in it.
fn check_attacks(tm: &ThreatModel, build: &Builder<'_>) -> Result<()> {
    let norm = tm.norm()?;
    let eps = tm.eps[0] as f32;
    for (list, specs, minimal) in [("attacks", &tm.attacks, false), ("minimal", &tm.minimal, true)] {
        for (i, spec) in specs.iter().enumerate() {
            let a = build(spec, norm, eps)
                .map_err(|e| Error::invalid("threat model", format!("field `{list}[{i}]` ({}): {e}", spec.name)))?;
            let ok = match a.budget_kind() {
                Some(Budget::Fixed { norm: n, .. }) => !minimal && n == norm,
                Some(Budget::Minimal { norm: n }) => n == norm,
                Some(Budget::Unbounded) | None => false,
            };
            if !ok {
                let what = match a.budget_kind() {
                    Some(Budget::Fixed { norm: n, .. }) => format!("a fixed-budget attack in {n:?}"),
                    Some(Budget::Minimal { norm: n }) => format!("a minimum-norm attack in {n:?}"),
                    Some(Budget::Unbounded) => "an attack with no norm budget".to_string(),
                    None => "an attack that does not declare its budget".to_string(),
                };
                let need = if minimal { "a minimum-norm attack in" } else { "an attack with a budget in" };
                return Err(Error::invalid(
                    "threat model",
                    format!("field `{list}[{i}]`: {} is {what}; this list needs {need} {}", a.name(), tm.norm),
                ));
            }
        }
    }
    Ok(())
}

/// Relative slack on ε when a recorded break is checked (the template enforces ε exactly, measured in f64).
pub const BREAK_NORM_TOLERANCE: f64 = 1e-5;

/// What a recorded break is checked against.
struct BreakCheck<'a> {
    model: &'a dyn Classifier,
    norm: Norm,
    eps: f32,
    attack: &'a str,
    index: usize,
}

impl BreakCheck<'_> {
    /// A break is recorded only if the perturbation is within ε in the threat norm (relative slack
    /// [`BREAK_NORM_TOLERANCE`]), the input inside the bounds, and the model's own prediction on it a success by
    /// the core's rule; anything else is an error naming the attack — a bug to fix, never a figure.
    fn verify(&self, x: &[f32], adv: ndarray::ArrayView1<f32>, label: usize, prediction: usize) -> Result<()> {
        let adv = adv.to_vec();
        let n = exact_norm(self.norm, x, &adv);
        let fail = |what: String| {
            Err(Error::invalid(
                "cascade",
                format!("{} reported sample {} broken at ε = {}, but {what}", self.attack, self.index, self.eps),
            ))
        };
        if n > self.eps as f64 * (1.0 + BREAK_NORM_TOLERANCE) {
            return fail(format!(
                "its perturbation's {:?} norm is {n} (an attack outside the threat model)",
                self.norm
            ));
        }
        let (lo, hi) = self.model.bounds();
        if let Some(v) = adv.iter().find(|v| !(lo..=hi).contains(*v)) {
            return fail(format!("its input holds {v}, outside the model's bounds [{lo}, {hi}]"));
        }
        if !Resolved::Untargeted.fulfilled_by(self.model, 0, label, prediction) {
            return fail(format!("the model predicts {prediction} on it (label {label}): not a success"));
        }
        Ok(())
    }
}
