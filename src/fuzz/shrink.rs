//! Shrinking failures: each failing mutant is minimised towards its seed while it still fails and stays valid —
//! first by dropping mutation steps (one at a time, greedily), then by moving each step's parameters towards the
//! identity (a bisection on the fraction kept), then by interpolating the pixels towards the lineage's reference
//! (the seed, or for an affine lineage the seed under its affine step: a bisection on `t` in
//! `reference + t · (mutant − reference)`). All failures shrink in lockstep, so every proposal of a stage goes
//! through the model as one batch.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::mutate::{apply, Group, Method, Step};
use super::{l0_linf, Failure, Fuzzer};
use crate::{Goal, Result, Tensor};

/// Bisection steps for a parameter and for the pixel interpolation.
const BISECTIONS: u32 = 7;

/// A failure after shrinking.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shrunk {
    /// The remaining steps, with their reduced parameters.
    pub chain: Vec<Step>,
    /// The fraction of the way from the reference to the stepped image that the pixels keep (1: no interpolation).
    pub interpolation: f32,
    /// The shrunk mutant.
    pub image: Vec<f32>,
    /// The model's prediction on it.
    pub prediction: usize,
    /// L∞ of shrunk − seed.
    pub linf: f32,
    /// Elements that differ from the seed.
    pub l0: usize,
}

enum Stage {
    Drop { at: usize },
    Param { at: usize, original: Option<Step>, lo: f32, hi: f32, iter: u32 },
    Pixel { base: Vec<f32>, lo: f32, hi: f32, iter: u32 },
    Done,
}

struct Job {
    chain: Vec<Step>,
    image: Vec<f32>,
    reference: Vec<f32>,
    prediction: usize,
    interpolation: f32,
    stage: Stage,
}

/// A proposal: a chain to replay, or pixels ready to test.
enum Proposal {
    Chain(Vec<Step>),
    Pixels(Vec<f32>, f32),
}

impl Job {
    /// The next proposal, moving through the stages; `None` when done.
    fn propose(&mut self) -> Option<Proposal> {
        loop {
            match &mut self.stage {
                Stage::Drop { at } => {
                    if self.chain.len() <= 1 || *at >= self.chain.len() {
                        self.stage = Stage::Param { at: 0, original: None, lo: 0.0, hi: 1.0, iter: 0 };
                        continue;
                    }
                    let mut c = self.chain.clone();
                    c.remove(*at);
                    return Some(Proposal::Chain(c));
                }
                Stage::Param { at, original, lo, hi, iter } => {
                    if *at >= self.chain.len() {
                        self.stage = Stage::Pixel { base: self.image.clone(), lo: 0.0, hi: 1.0, iter: 0 };
                        continue;
                    }
                    if self.chain[*at].method == Method::Adversarial || *iter >= BISECTIONS {
                        self.stage = Stage::Param { at: *at + 1, original: None, lo: 0.0, hi: 1.0, iter: 0 };
                        continue;
                    }
                    let orig = original.get_or_insert_with(|| self.chain[*at].clone());
                    let mut c = self.chain.clone();
                    c[*at] = orig.scaled((*lo + *hi) / 2.0);
                    return Some(Proposal::Chain(c));
                }
                Stage::Pixel { base, lo, hi, iter } => {
                    if *iter >= BISECTIONS {
                        self.stage = Stage::Done;
                        continue;
                    }
                    let t = (*lo + *hi) / 2.0;
                    let px = self.reference.iter().zip(base.iter()).map(|(r, b)| r + t * (b - r)).collect();
                    return Some(Proposal::Pixels(px, t));
                }
                Stage::Done => return None,
            }
        }
    }

    /// Takes the result of the last proposal: `fails` when the candidate still fails and is valid.
    fn accept(&mut self, p: Proposal, image: Vec<f32>, reference: Vec<f32>, prediction: usize, fails: bool) {
        match (&mut self.stage, p) {
            (Stage::Drop { at }, Proposal::Chain(c)) => {
                if fails {
                    (self.chain, self.image, self.reference, self.prediction) = (c, image, reference, prediction);
                } else {
                    *at += 1;
                }
            }
            (Stage::Param { lo, hi, iter, .. }, Proposal::Chain(c)) => {
                let mid = (*lo + *hi) / 2.0;
                *iter += 1;
                if fails {
                    *hi = mid;
                    (self.chain, self.image, self.reference, self.prediction) = (c, image, reference, prediction);
                } else {
                    *lo = mid;
                }
            }
            (Stage::Pixel { lo, hi, iter, .. }, Proposal::Pixels(_, t)) => {
                *iter += 1;
                if fails {
                    *hi = t;
                    self.interpolation = t;
                    (self.image, self.prediction) = (image, prediction);
                } else {
                    *lo = t;
                }
            }
            _ => unreachable!("a proposal is answered in the stage that made it"),
        }
    }
}

/// The image of `chain` applied to `seed`, and its reference (the seed, or the seed under the affine step).
pub(super) fn replay(f: &Fuzzer<'_>, seed: &[f32], label: usize, chain: &[Step]) -> Result<(Vec<f32>, Vec<f32>)> {
    let shape = f.image_shape()?;
    let bounds = f.model.bounds();
    let mut image = seed.to_vec();
    let mut reference = seed.to_vec();
    for step in chain {
        match step.method.group() {
            Group::Adversarial => {
                let attack = step.attack.and_then(|a| f.attacks.get(a)).map(|(_, a)| a.as_ref());
                if let Some(attack) = attack {
                    let x = Tensor::from_vec(image, &[1, shape[0], shape[1], shape[2]])?;
                    image = attack.generate(f.model, &x, &[label], &Goal::Untargeted, step.seed)?.to_vec();
                } else {
                    return Err(crate::Error::invalid("shrink", "an adversarial step without its attack"));
                }
            }
            group => {
                if group == Group::Affine {
                    reference = apply(step, seed, shape, bounds);
                }
                image = apply(step, &image, shape, bounds);
            }
        }
    }
    Ok((image, reference))
}

/// Shrinks every failure in place (its `shrunk` field), in lockstep: one batch per round of proposals.
pub(super) fn shrink_all(f: &Fuzzer<'_>, seeds: &Tensor, failures: &mut [Failure]) -> Result<()> {
    let data = seeds.to_vec();
    let per = data.len() / seeds.shape()[0];
    let seed_of = |i: usize| &data[i * per..(i + 1) * per];
    let mut jobs: Vec<Job> = failures
        .par_iter()
        .map(|fl| {
            let (_, reference) = replay(f, seed_of(fl.seed), fl.label, &fl.chain)?;
            Ok(Job {
                chain: fl.chain.clone(),
                image: fl.image.clone(),
                reference,
                prediction: fl.prediction,
                interpolation: 1.0,
                stage: Stage::Drop { at: 0 },
            })
        })
        .collect::<Result<_>>()?;
    let shape = f.image_shape()?;
    loop {
        let proposals: Vec<(usize, Proposal)> =
            jobs.iter_mut().enumerate().filter_map(|(i, j)| j.propose().map(|p| (i, p))).collect();
        if proposals.is_empty() {
            break;
        }
        let made: Vec<(Vec<f32>, Vec<f32>)> = proposals
            .par_iter()
            .map(|(i, p)| match p {
                Proposal::Chain(c) => replay(f, seed_of(failures[*i].seed), failures[*i].label, c),
                Proposal::Pixels(px, _) => Ok((px.clone(), jobs[*i].reference.clone())),
            })
            .collect::<Result<_>>()?;
        let flat: Vec<f32> = made.iter().flat_map(|(im, _)| im.iter().copied()).collect();
        let x = Tensor::from_vec(flat, &[made.len(), shape[0], shape[1], shape[2]])?;
        let predictions = f.model.predict(&x)?;
        for (((i, p), (image, reference)), pred) in proposals.into_iter().zip(made).zip(predictions) {
            let fails = pred != failures[i].label && f.valid(&reference, &image);
            jobs[i].accept(p, image, reference, pred, fails);
        }
    }
    for (fl, j) in failures.iter_mut().zip(jobs) {
        let (l0, linf) = l0_linf(seed_of(fl.seed), &j.image);
        fl.shrunk = Some(Shrunk {
            chain: j.chain,
            interpolation: j.interpolation,
            image: j.image,
            prediction: j.prediction,
            linf,
            l0,
        });
    }
    Ok(())
}
