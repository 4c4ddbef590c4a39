//! The attack contract (Foolbox-style): one call takes a classifier, the inputs, their true labels and a
//! [`Goal`], and returns per-sample results whose success is re-evaluated on the returned inputs.
//!
//! It lives in the core so that defenses, detectors, the evaluator and the fuzzer can take any attack as
//! `&dyn Attack` without depending on the attack crate's concrete types. Every call takes a seed, so a trainer
//! can ask for a fresh random start at every step and a sweep or a shard can be reproduced alone.
//!
//! - [`budget`]: norms, budgets, the exact projections and [`budget::enforce`];
//! - [`template`]: the [`Algorithm`] trait behind which an attack writes its algorithm alone, and the blanket
//!   [`Attack`] implementation that validates, resolves the goal, enforces the budget, re-evaluates success,
//!   counts work and sweeps ε.

pub mod budget;
pub mod template;
#[cfg(test)]
mod tests;

pub use budget::{Epsilon, Norm};
pub use template::{Access, Algorithm, Budget, Problem};

use ndarray::{Array2, Axis};
use rand::Rng;

use crate::classifier::{argmax_rows, Classifier};
use crate::seed::sample_seed;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// What counts as success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Goal {
    /// Any prediction other than the true label.
    Untargeted,
    /// Exactly the given class for each sample.
    Targeted(Vec<usize>),
    /// A class drawn uniformly from those other than the true label (and the classifier's rejection class, if it
    /// has one), from a ChaCha8 generator per sample seeded by [`crate::seed::sample_seed`] — the same target for
    /// the same image whatever the batch or its order.
    RandomTarget {
        /// The seed.
        seed: u64,
    },
    /// The class the model finds least likely on the clean input (one counted query of the scores; refused for
    /// label-only attacks).
    LeastLikely,
}

/// The goal with every target resolved to a class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// Leave the true class.
    Untargeted,
    /// Reach these classes.
    Targeted(Vec<usize>),
}

/// The one success rule of every attack, evaluator and report (Foolbox's `Misclassification` and
/// `TargetedMisclassification`, with a rejection class): `prediction` is a success for a sample of true label
/// `label` when it is `target` (targeted) or any class other than `label` (untargeted) — and never the
/// classifier's `rejection` class, since a detector that flags the input has not been fooled.
pub fn is_success(rejection: Option<usize>, label: usize, target: Option<usize>, prediction: usize) -> bool {
    Some(prediction) != rejection
        && match target {
            Some(t) => prediction == t,
            None => prediction != label,
        }
}

impl Resolved {
    /// [`is_success`] for sample `i` of true label `label`, under a classifier whose rejection class is
    /// `rejection`; false for a sample beyond the targets (a goal built for another batch: [`Resolved::check`]
    /// refuses it).
    pub fn is_success(&self, rejection: Option<usize>, i: usize, label: usize, prediction: usize) -> bool {
        match self {
            Resolved::Untargeted => is_success(rejection, label, None, prediction),
            Resolved::Targeted(t) => t.get(i).is_some_and(|&t| is_success(rejection, label, Some(t), prediction)),
        }
    }

    /// [`Resolved::is_success`] with `model`'s rejection class.
    pub fn fulfilled_by(&self, model: &dyn Classifier, i: usize, label: usize, prediction: usize) -> bool {
        self.is_success(model.rejection_class(), i, label, prediction)
    }

    /// Checks that the goal fits a batch of `n` samples of a `num_classes`-class model: one target per sample,
    /// each a class.
    pub fn check(&self, n: usize, num_classes: usize) -> Result<()> {
        match self {
            Resolved::Untargeted => Ok(()),
            Resolved::Targeted(t) => check_labels("resolved targets", t, n, num_classes),
        }
    }

    /// Whether the goal is targeted.
    pub fn is_targeted(&self) -> bool {
        matches!(self, Resolved::Targeted(_))
    }

    /// The class whose loss an attack descends (target) or ascends (true label) for sample `i`; an error when
    /// sample `i` has no label or no target.
    pub fn class(&self, i: usize, labels: &[usize]) -> Result<usize> {
        let c = match self {
            Resolved::Untargeted => labels.get(i),
            Resolved::Targeted(t) => t.get(i),
        };
        c.copied().ok_or_else(|| {
            Error::invalid("Resolved::class", format!("sample {i} of a batch of {} labels has no class", labels.len()))
        })
    }
}

/// Checks inputs and labels against the classifier and resolves the goal's targets for an attack with `access`:
/// the least-likely class needs the scores, so a label-only attack refuses it.
pub fn resolve_goal_for(
    model: &dyn Classifier,
    x: &Tensor,
    labels: &[usize],
    goal: &Goal,
    access: Access,
) -> Result<Resolved> {
    let n = model.check_input(x)?;
    check_in_bounds(model, x)?;
    let k = model.num_classes();
    check_labels("attack labels", labels, n, k)?;
    let reject = model.rejection_class();
    Ok(match goal {
        Goal::Untargeted => Resolved::Untargeted,
        Goal::Targeted(t) => {
            check_labels("attack targets", t, n, k)?;
            if let Some(r) = reject.filter(|r| t.contains(r)) {
                return Err(Error::invalid("attack targets", format!("class {r} is the classifier's rejection class")));
            }
            Resolved::Targeted(t.clone())
        }
        Goal::RandomTarget { seed } => {
            // The classes a target may be: all but the rejection class; then all but the label.
            let allowed: Vec<usize> = (0..k).filter(|&c| Some(c) != reject).collect();
            if allowed.len() < 2 {
                return Err(Error::invalid("random target", format!("{k} classes leave no other class to target")));
            }
            Resolved::Targeted(
                labels
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| {
                        let mut rng = crate::seed::rng(sample_seed(*seed, 0, &sample(x, i)?));
                        let others: Vec<usize> = allowed.iter().copied().filter(|&c| c != l).collect();
                        if others.is_empty() {
                            return Err(Error::invalid("random target", format!("no class other than {l} to target")));
                        }
                        // Without a rejection class: a draw from 0..k−1, shifted past the label.
                        Ok(others[rng.random_range(0..others.len())])
                    })
                    .collect::<Result<_>>()?,
            )
        }
        Goal::LeastLikely => {
            if access == Access::Labels {
                return Err(Error::invalid(
                    "least-likely target",
                    "a label-only attack cannot see which class is least likely (it needs the scores)",
                ));
            }
            let z = model.logits(x)?;
            let least = |r: ndarray::ArrayView1<f32>| {
                argmin(r.iter().enumerate().map(|(c, &v)| if Some(c) == reject { f32::INFINITY } else { v }))
            };
            Resolved::Targeted(z.rows().into_iter().map(least).collect())
        }
    })
}

/// The values of sample `i` of a batch `[N, …]`, in row-major order (any layout); an error for a scalar or for
/// `i ≥ N`.
pub fn sample(x: &Tensor, i: usize) -> Result<Vec<f32>> {
    match x.shape().first() {
        Some(&n) if i < n => Ok(x.value().index_axis(Axis(0), i).iter().copied().collect()),
        _ => Err(Error::invalid("sample", format!("index {i} out of range for a batch of shape {:?}", x.shape()))),
    }
}

/// Refuses inputs outside the classifier's bounds: an attack clipped to a box its inputs are not in measures
/// nothing (0–255 images on a [0, 1] model).
fn check_in_bounds(model: &dyn Classifier, x: &Tensor) -> Result<()> {
    let (lo, hi) = model.bounds();
    let v = x.value();
    if v.iter().all(|e| (lo..=hi).contains(e)) {
        return Ok(());
    }
    let (min, max) = v.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &e| (a.min(e), b.max(e)));
    Err(Error::invalid(
        "attack inputs",
        format!(
            "values span [{min}, {max}], outside the classifier's bounds [{lo}, {hi}]; pixels in 0–255? scale them \
             to [0, 1], or declare the model's bounds to match the data"
        ),
    ))
}

fn argmin(it: impl Iterator<Item = f32>) -> usize {
    it.enumerate().fold((0, f32::INFINITY), |(bi, bv), (i, v)| if v < bv { (i, v) } else { (bi, bv) }).0
}

fn check_labels(op: &'static str, labels: &[usize], n: usize, k: usize) -> Result<()> {
    if labels.len() != n {
        return Err(Error::ShapeMismatch { op, expected: vec![n], got: vec![labels.len()] });
    }
    if let Some(&label) = labels.iter().find(|&&l| l >= k) {
        return Err(Error::LabelOutOfRange { op, label, num_classes: k });
    }
    Ok(())
}

/// Perturbation norms of one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Norms {
    /// Number of changed input values.
    pub l0: f32,
    /// Sum of absolute changes.
    pub l1: f32,
    /// Euclidean norm of the change.
    pub l2: f32,
    /// Largest absolute change.
    pub linf: f32,
}

impl Norms {
    /// The norm of the perturbation in `norm`.
    pub fn get(&self, norm: Norm) -> f32 {
        match norm {
            Norm::Linf => self.linf,
            Norm::L2 => self.l2,
            Norm::L1 => self.l1,
        }
    }

    /// The norms of `delta`.
    pub fn of(delta: &[f32]) -> Norms {
        let (mut l0, mut l1, mut l2, mut linf) = (0usize, 0f64, 0f64, 0f32);
        for &d in delta {
            let a = d.abs();
            l0 += usize::from(a > 0.0);
            l1 += a as f64;
            l2 += (a as f64) * (a as f64);
            linf = linf.max(a);
        }
        Norms { l0: l0 as f32, l1: l1 as f32, l2: l2.sqrt() as f32, linf }
    }
}

/// What an attack achieved, per sample.
#[derive(Clone, Debug)]
pub struct AttackResult {
    /// The adversarial inputs (inside the bounds and the budget), same shape as the inputs.
    pub adversarial: Tensor,
    /// Whether each returned input fulfils the goal — re-evaluated by running the model on it.
    pub success: Vec<bool>,
    /// The model's prediction on each returned input.
    pub predictions: Vec<usize>,
    /// Perturbation norms of each sample.
    pub norms: Vec<Norms>,
    /// Gradient evaluations spent on each sample (white-box attacks).
    pub gradients: Vec<u64>,
    /// Model queries spent on each sample (black-box attacks; forward passes of white-box ones).
    pub queries: Vec<u64>,
    /// The goal the attack pursued, with targets resolved.
    pub goal: Resolved,
    /// Gradient evaluations of each sample that were all zero or not finite: a sample that stays robust with
    /// faults was not really attacked (gradient masking, a saturated softmax, a NaN in the model).
    pub gradient_faults: Vec<GradientFaults>,
}

/// How many of a sample's gradient evaluations were degenerate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GradientFaults {
    /// Gradients that were zero everywhere (sign(0) = 0: the step does nothing).
    pub zero: u64,
    /// Gradients with a NaN or an infinity.
    pub non_finite: u64,
}

impl GradientFaults {
    /// Whether any gradient was degenerate.
    pub fn any(&self) -> bool {
        self.zero > 0 || self.non_finite > 0
    }
}

impl AttackResult {
    /// Builds a result, re-running `model` on `adversarial` to decide success (a prediction of the classifier's
    /// rejection class is never a success). No gradient faults are recorded.
    pub fn evaluate(
        model: &dyn Classifier,
        x: &Tensor,
        adversarial: Tensor,
        labels: &[usize],
        goal: Resolved,
        gradients: Vec<u64>,
        queries: Vec<u64>,
    ) -> Result<AttackResult> {
        if adversarial.shape() != x.shape() {
            return Err(Error::ShapeMismatch {
                op: "attack result",
                expected: x.shape().to_vec(),
                got: adversarial.shape().to_vec(),
            });
        }
        let n = model.check_input(x)?;
        check_labels("attack result labels", labels, n, model.num_classes())?;
        goal.check(n, model.num_classes())?;
        for (what, v) in [("gradients", &gradients), ("queries", &queries)] {
            if v.len() != n {
                return Err(Error::invalid("attack result", format!("{} {what} counts for {n} samples", v.len())));
            }
        }
        let predictions = argmax_rows(&model.logits(&adversarial)?);
        let reject = model.rejection_class();
        let success = predictions.iter().enumerate().map(|(i, &p)| goal.is_success(reject, i, labels[i], p)).collect();
        let norms = per_sample_norms(x, &adversarial)?;
        let gradient_faults = vec![GradientFaults::default(); labels.len()];
        Ok(AttackResult { adversarial, success, predictions, norms, gradients, queries, goal, gradient_faults })
    }

    /// Fraction of samples where the attack succeeded.
    pub fn success_rate(&self) -> f32 {
        self.success.iter().filter(|&&s| s).count() as f32 / self.success.len().max(1) as f32
    }

    /// Fraction of samples still classified correctly (untargeted robust accuracy).
    pub fn robust_accuracy(&self, labels: &[usize]) -> f32 {
        self.predictions.iter().zip(labels).filter(|(p, l)| p == l).count() as f32 / labels.len().max(1) as f32
    }

    /// Total gradient evaluations.
    pub fn total_gradients(&self) -> u64 {
        self.gradients.iter().sum()
    }
}

/// Per-sample norms of `adv − x` for batches [N, …]; an error when the shapes differ or `x` is a scalar.
pub fn per_sample_norms(x: &Tensor, adv: &Tensor) -> Result<Vec<Norms>> {
    if x.shape() != adv.shape() || x.rank() == 0 {
        return Err(Error::ShapeMismatch {
            op: "per_sample_norms",
            expected: x.shape().to_vec(),
            got: adv.shape().to_vec(),
        });
    }
    let n = x.shape()[0];
    let d = x.numel() / n.max(1);
    let xs = x.value().as_standard_layout().into_owned();
    let a = adv.value().as_standard_layout().into_owned();
    let (xs, a) = (xs.as_slice().expect("standard"), a.as_slice().expect("standard"));
    Ok((0..n)
        .map(|i| {
            let delta: Vec<f32> =
                xs[i * d..(i + 1) * d].iter().zip(&a[i * d..(i + 1) * d]).map(|(p, q)| q - p).collect();
            Norms::of(&delta)
        })
        .collect())
}

/// An adversarial attack. Implement [`Algorithm`] to get this trait from the template; implement it directly
/// only for an attack that is not one (an ensemble or cascade of attacks).
pub trait Attack: Send + Sync {
    /// A short name with the main settings, e.g. `PGD-Linf(eps=0.1, steps=40)`.
    fn name(&self) -> String;

    /// The budget the attack works to, if it declares one (every [`Algorithm`] does; an ensemble implemented
    /// directly may not): the evaluator refuses an attack whose norm is not the threat model's.
    fn budget_kind(&self) -> Option<Budget> {
        None
    }

    /// Attacks `x` (true labels `labels`) toward `goal`, every random choice drawn from `seed`: the same seed
    /// gives bit-identical results whatever the thread count, the batch size or the order of the samples.
    /// Never mutates `x`.
    fn run(&self, model: &dyn Classifier, x: &Tensor, labels: &[usize], goal: &Goal, seed: u64)
        -> Result<AttackResult>;

    /// Only the adversarial inputs of [`run`](Attack::run) (ART's `generate`): attacks that can skip the
    /// re-evaluation forward pass and the norms do so — adversarial training calls this on every batch.
    fn generate(&self, model: &dyn Classifier, x: &Tensor, labels: &[usize], goal: &Goal, seed: u64) -> Result<Tensor> {
        Ok(self.run(model, x, labels, goal, seed)?.adversarial)
    }

    /// Runs the attack once per budget in `eps` (a sweep), results in the same order; a sample broken at one ε
    /// stays broken at every larger ε. Budget-free attacks return an error.
    fn sweep(
        &self,
        _model: &dyn Classifier,
        _x: &Tensor,
        _labels: &[usize],
        _goal: &Goal,
        _eps: &[f32],
        _seed: u64,
    ) -> Result<Vec<AttackResult>> {
        Err(Error::invalid("sweep", format!("{} has no perturbation budget to sweep", self.name())))
    }
}

/// Logit margin helper: for each row, the largest logit other than `class[i]` and its index (NaN logits count as
/// −∞; ties go to the lowest index). An error when a row has no other class, or `class` does not fit `z`.
pub fn best_other(z: &Array2<f32>, class: &[usize]) -> Result<Vec<(usize, f32)>> {
    if class.len() != z.nrows() {
        return Err(Error::ShapeMismatch { op: "best_other", expected: vec![z.nrows()], got: vec![class.len()] });
    }
    if let Some(&c) = class.iter().find(|&&c| c >= z.ncols()) {
        return Err(Error::LabelOutOfRange { op: "best_other", label: c, num_classes: z.ncols() });
    }
    if z.ncols() < 2 {
        return Err(Error::invalid("best_other", format!("{} class(es): no other class", z.ncols())));
    }
    Ok(z.axis_iter(Axis(0))
        .zip(class)
        .map(|(r, &c)| {
            let first = usize::from(c == 0);
            let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
            r.iter().enumerate().filter(|(j, _)| *j != c).fold((first, key(r[first])), |(bi, bv), (j, &v)| {
                if key(v) > bv {
                    (j, key(v))
                } else {
                    (bi, bv)
                }
            })
        })
        .collect())
}
