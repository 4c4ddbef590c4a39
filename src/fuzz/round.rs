//! One fuzzing round: draw seeds by the power schedule, make their mutants in parallel, run them through the
//! model as one batch, and update coverage, the corpus and the failures in slot order.

use std::sync::Arc;

use rand::Rng;
use rayon::prelude::*;

use super::mutate::{apply, Group, Method, Step};
use super::{l0_linf, Checkpoint, Failure, Fuzzer, SavedEntry, Tally};
use crate::coverage::Tracker;
use crate::{seed, Goal, Result, Tensor};

/// An index in `0..n` drawn with probability ∝ `w(i)` (sums in index order, so the draw is reproducible).
fn weighted(rng: &mut impl Rng, n: usize, w: impl Fn(usize) -> f64) -> usize {
    let total: f64 = (0..n).map(&w).sum();
    let mut u = rng.random::<f64>() * total;
    for i in 0..n {
        u -= w(i);
        if u < 0.0 {
            return i;
        }
    }
    n - 1
}

/// A corpus entry.
pub(super) struct Entry {
    pub image: Arc<Vec<f32>>,
    /// What validity is measured against: the seed, or the seed under the lineage's affine step.
    pub reference: Arc<Vec<f32>>,
    pub origin: usize,
    pub chain: Vec<Step>,
    /// The lineage already has its affine or adversarial step.
    pub locked: bool,
    pub fuzzed: u32,
    pub recent: u32,
}

/// A mutant of a round, before the model saw it.
struct Mutant {
    parent: usize,
    step: Step,
    image: Vec<f32>,
    reference: Arc<Vec<f32>>,
}

pub(super) struct State {
    pub seeds: Vec<Arc<Vec<f32>>>,
    pub labels: Vec<usize>,
    pub correct: Vec<bool>,
    pub corpus: Vec<Entry>,
    /// Per seed, its corpus entries (the seed first).
    families: Vec<Vec<usize>>,
    family_draws: Vec<u32>,
    family_recent: Vec<u32>,
    pub tracker: Tracker,
    pub tally: Tally,
}

impl State {
    /// The seeds as the first corpus entries, their coverage, and which the model classifies correctly.
    pub fn new(f: &Fuzzer<'_>, seeds: &Tensor, labels: &[usize]) -> Result<State> {
        let (batch, logits) = f.taps.read(f.model, seeds)?;
        let mut tracker = Tracker::new(&f.bounds, f.config.coverage)?;
        tracker.add(&batch)?;
        let predictions = crate::classifier::argmax_rows(&logits);
        let n = labels.len();
        let per = seeds.numel() / n;
        let data = seeds.to_vec();
        let images: Vec<Arc<Vec<f32>>> = (0..n).map(|i| Arc::new(data[i * per..(i + 1) * per].to_vec())).collect();
        let corpus = (0..n)
            .map(|i| Entry {
                image: images[i].clone(),
                reference: images[i].clone(),
                origin: i,
                chain: Vec::new(),
                locked: false,
                fuzzed: 0,
                recent: 1,
            })
            .collect();
        let curve = vec![(0, tracker.value(f.config.metric))];
        Ok(State {
            seeds: images,
            labels: labels.to_vec(),
            correct: predictions.iter().zip(labels).map(|(p, l)| p == l).collect(),
            corpus,
            families: (0..n).map(|i| vec![i]).collect(),
            family_draws: vec![0; n],
            family_recent: vec![0; n],
            tracker,
            tally: Tally {
                failures: Vec::new(),
                groups: [Group::Pixel, Group::Affine, Group::Adversarial]
                    .into_iter()
                    .map(|g| (g, Default::default()))
                    .collect(),
                curve,
                mutants: 0,
                iterations: 0,
                rounds: 0,
                kept: 0,
            },
        })
    }

    /// The checkpoint of this state.
    pub fn checkpoint(&self, f: &Fuzzer<'_>) -> Checkpoint {
        Checkpoint {
            seed: f.config.seed,
            seeds: self.seeds.len(),
            entries: self
                .corpus
                .iter()
                .map(|e| SavedEntry { origin: e.origin, chain: e.chain.clone(), fuzzed: e.fuzzed, recent: e.recent })
                .collect(),
            families: self.family_draws.iter().copied().zip(self.family_recent.iter().copied()).collect(),
            tally: self.tally.clone(),
        }
    }

    /// Continues from a checkpoint: replays its corpus entries from their seeds, adds them to coverage, and
    /// takes its counts. Errors when it belongs to another run (seed, number of seeds, a bad entry).
    pub fn restore(&mut self, f: &Fuzzer<'_>, cp: &Checkpoint) -> Result<()> {
        let n = self.seeds.len();
        if cp.seed != f.config.seed || cp.seeds != n || cp.entries.len() < n || cp.families.len() != n {
            return Err(crate::Error::invalid("fuzz checkpoint", "made by a run with another seed or other seeds"));
        }
        if let Some(e) = cp
            .entries
            .iter()
            .find(|e| e.origin >= n || e.chain.iter().any(|s| s.attack.is_some_and(|a| a >= f.attacks.len())))
        {
            return Err(crate::Error::invalid(
                "fuzz checkpoint",
                format!("entry of seed {} does not fit this fuzzer", e.origin),
            ));
        }
        let replayed: Vec<(Vec<f32>, Vec<f32>)> = cp.entries[n..]
            .par_iter()
            .map(|e| super::shrink::replay(f, &self.seeds[e.origin], self.labels[e.origin], &e.chain))
            .collect::<Result<_>>()?;
        let shape = f.image_shape()?;
        for chunk in replayed.chunks(512) {
            let flat: Vec<f32> = chunk.iter().flat_map(|(im, _)| im.iter().copied()).collect();
            let x = Tensor::from_vec(flat, &[chunk.len(), shape[0], shape[1], shape[2]])?;
            self.tracker.add(&f.taps.read(f.model, &x)?.0)?;
        }
        for (e, (image, reference)) in cp.entries[n..].iter().zip(replayed) {
            self.families[e.origin].push(self.corpus.len());
            self.corpus.push(Entry {
                image: Arc::new(image),
                reference: Arc::new(reference),
                origin: e.origin,
                locked: e.chain.iter().any(|s| s.method.group() != Group::Pixel),
                chain: e.chain.clone(),
                fuzzed: 0,
                recent: 0,
            });
        }
        for (entry, saved) in self.corpus.iter_mut().zip(&cp.entries) {
            (entry.fuzzed, entry.recent) = (saved.fuzzed, saved.recent);
        }
        (self.family_draws, self.family_recent) = cp.families.iter().copied().unzip();
        self.tally = cp.tally.clone();
        Ok(())
    }

    /// Whether a budget is spent.
    pub fn done(&self, f: &Fuzzer<'_>, elapsed: f64) -> bool {
        let c = &f.config;
        c.max_iterations.is_some_and(|m| self.tally.iterations >= m)
            || c.max_mutants.is_some_and(|m| self.tally.mutants >= m)
            || c.max_seconds.is_some_and(|s| elapsed >= s)
            || c.target_coverage.is_some_and(|t| self.tracker.value(c.metric) >= t)
    }

    /// Seed draws this round: `seeds_per_round`, fewer when an iteration or mutant budget ends sooner.
    fn draws(&self, f: &Fuzzer<'_>) -> usize {
        let c = &f.config;
        let mut k = c.seeds_per_round;
        if let Some(m) = c.max_iterations {
            k = k.min(m.saturating_sub(self.tally.iterations));
        }
        if let Some(m) = c.max_mutants {
            k = k.min(m.saturating_sub(self.tally.mutants).div_ceil(c.mutants_per_seed));
        }
        k.max(1)
    }

    /// The power schedule, on two levels: a seed's family (the seed and every corpus entry descended from it)
    /// with probability ∝ (1 + 2·recent) / √(1 + drawn), where `recent` counts the family's entries that joined
    /// the corpus the last time it was drawn; then an entry of the family with probability ∝
    /// (1 + 2·recent) / (1 + fuzzed). Families keep every seed in play however large one lineage grows.
    fn pick(&self, rng: &mut impl Rng) -> usize {
        let fam =
            |f: usize| (1.0 + 2.0 * f64::from(self.family_recent[f])) / (1.0 + f64::from(self.family_draws[f])).sqrt();
        let f = weighted(rng, self.families.len(), fam);
        let members = &self.families[f];
        let w = |k: usize| {
            let e = &self.corpus[members[k]];
            (1.0 + 2.0 * f64::from(e.recent)) / (1.0 + f64::from(e.fuzzed))
        };
        members[weighted(rng, members.len(), w)]
    }

    /// One round.
    pub fn round(&mut self, f: &Fuzzer<'_>) -> Result<()> {
        let round_seed = seed::derive(f.config.seed, self.tally.rounds as u64);
        let mut rng = seed::rng(round_seed);
        let draws = self.draws(f);
        let picks: Vec<usize> = (0..draws).map(|_| self.pick(&mut rng)).collect();
        let steps = self.plan(f, &picks, round_seed, &mut rng);
        let mutants = self.make(f, steps)?;
        self.tally.iterations += draws;
        self.tally.rounds += 1;
        self.tally.mutants += mutants.len();
        for &p in &picks {
            let origin = self.corpus[p].origin;
            self.corpus[p].fuzzed += 1;
            self.corpus[p].recent = 0;
            self.family_draws[origin] += 1;
            self.family_recent[origin] = 0;
        }
        self.evaluate(f, mutants)?;
        self.tally.curve.push((self.tally.mutants, self.tracker.value(f.config.metric)));
        Ok(())
    }

    /// Each slot's step: a method among those the lineage may still use (only pixel-value ones once it has its
    /// affine or adversarial step), its parameters, and a seed of its own.
    fn plan(&self, f: &Fuzzer<'_>, picks: &[usize], round_seed: u64, rng: &mut impl Rng) -> Vec<(usize, Step)> {
        let mut out = Vec::with_capacity(picks.len() * f.config.mutants_per_seed);
        for &p in picks {
            let allowed: Vec<&super::config::MethodSpec> = f
                .mutations
                .methods
                .iter()
                .filter(|m| !self.corpus[p].locked || m.method.group() == Group::Pixel)
                .collect();
            if allowed.is_empty() {
                continue;
            }
            for _ in 0..f.config.mutants_per_seed {
                let spec = allowed[rng.random_range(0..allowed.len())];
                let step = Step {
                    method: spec.method,
                    params: spec.draw(rng),
                    attack: spec.attack.as_deref().and_then(|a| f.attack_index(a)),
                    seed: seed::derive(round_seed, 1 + out.len() as u64),
                };
                out.push((p, step));
            }
        }
        out
    }

    /// The mutants' images: image steps in parallel, then each attack once on the batch of its slots.
    fn make(&self, f: &Fuzzer<'_>, steps: Vec<(usize, Step)>) -> Result<Vec<Mutant>> {
        let shape = f.image_shape()?;
        let bounds = f.model.bounds();
        let mut mutants: Vec<Mutant> = steps
            .into_par_iter()
            .map(|(parent, step)| {
                let e = &self.corpus[parent];
                let image = apply(&step, &e.image, shape, bounds);
                let reference = match step.method.group() {
                    Group::Affine => Arc::new(apply(&step, &self.seeds[e.origin], shape, bounds)),
                    _ => e.reference.clone(),
                };
                Mutant { parent, step, image, reference }
            })
            .collect();
        for (a, (_, attack)) in f.attacks.iter().enumerate() {
            let slots: Vec<usize> = (0..mutants.len())
                .filter(|&i| mutants[i].step.method == Method::Adversarial && mutants[i].step.attack == Some(a))
                .collect();
            if slots.is_empty() {
                continue;
            }
            let call_seed = mutants[slots[0]].step.seed;
            let flat: Vec<f32> =
                slots.iter().flat_map(|&i| self.corpus[mutants[i].parent].image.iter().copied()).collect();
            let mut dims = vec![slots.len()];
            dims.extend_from_slice(&shape);
            let x = Tensor::from_vec(flat, &dims)?;
            let labels: Vec<usize> =
                slots.iter().map(|&i| self.labels[self.corpus[mutants[i].parent].origin]).collect();
            let adv = attack.generate(f.model, &x, &labels, &Goal::Untargeted, call_seed)?.to_vec();
            let per = adv.len() / slots.len();
            for (k, &i) in slots.iter().enumerate() {
                mutants[i].image = adv[k * per..(k + 1) * per].to_vec();
                mutants[i].step.seed = call_seed;
            }
        }
        Ok(mutants)
    }

    /// Validity, one forward pass over the valid mutants, then coverage, failures and the corpus in slot order.
    fn evaluate(&mut self, f: &Fuzzer<'_>, mutants: Vec<Mutant>) -> Result<()> {
        let valid: Vec<bool> = mutants.par_iter().map(|m| f.valid(&m.reference, &m.image)).collect();
        for (m, &v) in mutants.iter().zip(&valid) {
            let g = self.tally.groups.entry(m.step.method.group()).or_default();
            g.mutants += 1;
            g.valid += usize::from(v);
        }
        let mutants: Vec<Mutant> = mutants.into_iter().zip(valid).filter(|(_, v)| *v).map(|(m, _)| m).collect();
        if mutants.is_empty() {
            return Ok(());
        }
        let shape = f.image_shape()?;
        let flat: Vec<f32> = mutants.iter().flat_map(|m| m.image.iter().copied()).collect();
        let x = Tensor::from_vec(flat, &[mutants.len(), shape[0], shape[1], shape[2]])?;
        let (batch, logits) = f.taps.read(f.model, &x)?;
        let predictions = crate::classifier::argmax_rows(&logits);
        for (i, m) in mutants.into_iter().enumerate() {
            let origin = self.corpus[m.parent].origin;
            let (label, group) = (self.labels[origin], m.step.method.group());
            if self.correct[origin] {
                self.tally.groups.entry(group).or_default().valid_from_correct += 1;
            }
            let mut chain = self.corpus[m.parent].chain.clone();
            chain.push(m.step);
            if self.correct[origin] && predictions[i] != label {
                self.tally.groups.entry(group).or_default().failures += 1;
                let (l0, linf) = l0_linf(&self.seeds[origin], &m.image);
                let reference_linf = l0_linf(&m.reference, &m.image).1;
                self.tally.failures.push(Failure {
                    seed: origin,
                    label,
                    prediction: predictions[i],
                    chain,
                    group,
                    image: m.image,
                    linf,
                    l0,
                    reference_linf,
                    shrunk: None,
                });
                continue;
            }
            let gain = self.tracker.gain(&batch, i)?;
            if self.tracker.delta(&gain, f.config.metric) > f.config.gain_threshold {
                self.tracker.commit(&batch, i)?;
                self.tally.kept += 1;
                self.corpus[m.parent].recent += 1;
                self.family_recent[origin] += 1;
                self.families[origin].push(self.corpus.len());
                let locked = self.corpus[m.parent].locked || group != Group::Pixel;
                self.corpus.push(Entry {
                    image: Arc::new(m.image),
                    reference: m.reference,
                    origin,
                    chain,
                    locked,
                    fuzzed: 0,
                    recent: 1,
                });
            }
        }
        Ok(())
    }
}
