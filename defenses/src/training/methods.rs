//! Training methods built from attacks: MindArmour's adversarial defenses (corrected), Madry's PGD-AT, fast and
//! free adversarial training.

use std::sync::Mutex;

use armoury::attack::budget::{random_in_ball, rows, sign, Norm};
use armoury::nn::Module;
use armoury::seed::row_seeds;
use armoury::train::{correct, Method, StepContext, StepReport};
use armoury::{Attack, Classifier, Error, Goal, Reduction, Result, Tensor};
use ndarray::ArrayD;

use super::{check_non_negative, fgsm_from};

/// MindArmour's `AdversarialDefense`: one training step on a batch of adversarial inputs the caller made.
pub struct AdversarialDefense;

impl AdversarialDefense {
    /// Trains `model` one cross-entropy step on `x_adv` with labels `y` ([`armoury::train::train_step`]).
    pub fn train_step(
        model: &dyn Module,
        optimizer: &mut dyn armoury::optim::Optimizer,
        x_adv: &Tensor,
        y: &[usize],
    ) -> Result<StepReport> {
        let (loss, correct) = armoury::train::train_step(model, optimizer, x_adv, y, None)?;
        Ok(StepReport::of(loss, correct, y.len()))
    }
}

/// The samples `0..⌈ratio·n⌉` of a batch replaced by adversarial versions, split evenly across `attacks` (each
/// run on its own contiguous share, with the step's seed); the rest stay clean.
pub(crate) fn replace_with_adversarial(
    clf: &dyn Classifier,
    attacks: &[&dyn Attack],
    ratio: f32,
    x: &Tensor,
    y: &[usize],
    seed: u64,
) -> Result<Tensor> {
    let n = y.len();
    let k = ((ratio * n as f32).ceil() as usize).min(n);
    if k == 0 || attacks.is_empty() {
        return Ok(x.clone());
    }
    let mut parts = Vec::new();
    let per = k.div_ceil(attacks.len());
    let mut start = 0;
    for a in attacks {
        let end = (start + per).min(k);
        if end > start {
            let xs = x.narrow(0, start, end - start)?;
            parts.push(a.generate(clf, &xs, &y[start..end], &Goal::Untargeted, seed)?);
        }
        start = end;
    }
    if k < n {
        parts.push(x.narrow(0, k, n - k)?);
    }
    Tensor::concat(&parts, 0)
}

pub(crate) fn check_ratio(ratio: f32) -> Result<()> {
    if !(0.0..=1.0).contains(&ratio) {
        return Err(Error::invalid("adversarial defense", format!("replace ratio {ratio} must be in [0, 1]")));
    }
    Ok(())
}

/// MindArmour's `AdversarialDefenseWithAttacks`: per batch, replace a ratio of the samples by adversarial ones,
/// split evenly across a list of attacks, and train on the mix.
pub struct AdversarialDefenseWithAttacks {
    /// The attacks (run against the current model with the step's fresh seed).
    pub attacks: Vec<Box<dyn Attack>>,
    /// Fraction of each batch replaced.
    pub replace_ratio: f32,
}

impl Method for AdversarialDefenseWithAttacks {
    fn kind(&self) -> &'static str {
        "adversarial"
    }
    fn name(&self) -> String {
        let names: Vec<String> = self.attacks.iter().map(|a| a.name()).collect();
        format!("adversarial({}; ratio {})", names.join(", "), self.replace_ratio)
    }
    fn validate(&self) -> Result<()> {
        check_ratio(self.replace_ratio)
    }
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let attacks: Vec<&dyn Attack> = self.attacks.iter().map(|a| a.as_ref()).collect();
        let mixed = replace_with_adversarial(ctx.classifier, &attacks, self.replace_ratio, x, y, ctx.seed)?;
        ctx.cross_entropy_step(&mixed, y)
    }
}

/// MindArmour's `NaturalAdversarialDefense`: FGSM examples (Goodfellow et al. 2015) replacing half of each batch
/// (ε = 0.1 by default).
pub struct NaturalAdversarialDefense {
    /// FGSM budget (L∞).
    pub eps: f32,
    /// Fraction of each batch replaced.
    pub replace_ratio: f32,
}

impl Default for NaturalAdversarialDefense {
    fn default() -> Self {
        NaturalAdversarialDefense { eps: 0.1, replace_ratio: 0.5 }
    }
}

impl Method for NaturalAdversarialDefense {
    fn kind(&self) -> &'static str {
        "nad"
    }
    fn name(&self) -> String {
        format!("nad(FGSM eps {}, ratio {})", self.eps, self.replace_ratio)
    }
    fn validate(&self) -> Result<()> {
        check_ratio(self.replace_ratio)?;
        check_non_negative("nad", "ε", self.eps)
    }
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let n = y.len();
        let k = ((self.replace_ratio * n as f32).ceil() as usize).min(n);
        if k == 0 {
            return ctx.cross_entropy_step(x, y);
        }
        let xs = x.narrow(0, 0, k)?;
        let mut parts = vec![fgsm_from(ctx.classifier, &xs, &y[..k], rows(&xs), self.eps, self.eps)?];
        if k < n {
            parts.push(x.narrow(0, k, n - k)?);
        }
        ctx.cross_entropy_step(&Tensor::concat(&parts, 0)?, y)
    }
}

/// Madry et al. (2018) PGD adversarial training, MindArmour's `ProjectedAdversarialDefense` corrected: the
/// caller's PGD (with a random start: a fresh one at every step, from the step's seed), all-adversarial batches
/// by default.
pub struct ProjectedAdversarialDefense {
    /// The inner attack (PGD-L∞ from a random start in Madry's recipe).
    pub attack: Box<dyn Attack>,
    /// Fraction of each batch replaced (1.0: Madry's all-adversarial batches).
    pub replace_ratio: f32,
}

impl ProjectedAdversarialDefense {
    /// Madry's recipe: all-adversarial batches made by `attack` (PGD-L∞ from a random start, e.g. 7 steps of
    /// 0.025 at ε = 0.1 on MNIST-like data).
    pub fn madry(attack: Box<dyn Attack>) -> Self {
        ProjectedAdversarialDefense { attack, replace_ratio: 1.0 }
    }
}

impl Method for ProjectedAdversarialDefense {
    fn kind(&self) -> &'static str {
        "pgd-at"
    }
    fn name(&self) -> String {
        format!("pgd-at({}, ratio {})", self.attack.name(), self.replace_ratio)
    }
    fn validate(&self) -> Result<()> {
        check_ratio(self.replace_ratio)
    }
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let attacks = [self.attack.as_ref()];
        let mixed = replace_with_adversarial(ctx.classifier, &attacks, self.replace_ratio, x, y, ctx.seed)?;
        ctx.cross_entropy_step(&mixed, y)
    }
}

/// Fast adversarial training (Wong, Rice & Kolter 2020): FGSM from a uniform random start in the ε-ball with
/// step α = 1.25ε, projected back to the ball; all-adversarial batches. (The paper uses a cyclic rate:
/// `LrSchedule::Triangular` with `lr_per_step`.)
pub struct FastAt {
    /// Budget ε (L∞).
    pub eps: f32,
    /// Step size α (1.25ε in the paper).
    pub alpha: f32,
}

impl FastAt {
    /// The paper's α = 1.25ε.
    pub fn new(eps: f32) -> Self {
        FastAt { eps, alpha: 1.25 * eps }
    }
}

impl Method for FastAt {
    fn kind(&self) -> &'static str {
        "fast-at"
    }
    fn name(&self) -> String {
        format!("fast-at(eps {}, alpha {})", self.eps, self.alpha)
    }
    fn validate(&self) -> Result<()> {
        check_non_negative("fast-at", "ε", self.eps)?;
        check_non_negative("fast-at", "α", self.alpha)
    }
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let x2 = rows(x);
        let (n, d) = x2.dim();
        let eps = vec![self.eps; n];
        // Each sample's start from its own generator (its values and the step's seed): thread counts and batch
        // order do not matter.
        let mut start = &x2 + &random_in_ball(n, d, Norm::Linf, &eps, &row_seeds(&x2, ctx.seed, 0));
        armoury::attack::budget::enforce(&x2, &mut start, Norm::Linf, &eps, ctx.classifier.bounds());
        let adv = fgsm_from(ctx.classifier, x, y, start, self.alpha, self.eps)?;
        ctx.cross_entropy_step(&adv, y)
    }
}

/// Free adversarial training (Shafahi et al. 2019): each batch is replayed `replays` (m) times; every replay
/// takes one backward pass that yields both the weight gradient (an optimiser step) and the perturbation
/// gradient (δ ← clip(δ + ε·sign(∇δ))). δ carries over to the next batch. Each pass makes m epochs' worth of
/// updates, so the trainer runs ⌈epochs / m⌉ passes (at least one), and the learning-rate schedule, given in
/// epochs, advances m epochs per pass.
pub struct FreeAt {
    /// Budget ε (L∞).
    pub eps: f32,
    /// Replays per batch (m).
    pub replays: usize,
    delta: Mutex<Option<ArrayD<f32>>>,
}

impl FreeAt {
    /// Free training with `replays` replays.
    pub fn new(eps: f32, replays: usize) -> Self {
        FreeAt { eps, replays, delta: Mutex::new(None) }
    }
}

impl Method for FreeAt {
    fn kind(&self) -> &'static str {
        "free-at"
    }

    fn name(&self) -> String {
        format!("free-at(eps {}, m {})", self.eps, self.replays)
    }

    fn validate(&self) -> Result<()> {
        if self.replays == 0 {
            return Err(Error::invalid("free-at", "replays must be ≥ 1"));
        }
        check_non_negative("free-at", "ε", self.eps)
    }

    fn replays(&self) -> usize {
        self.replays
    }

    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        self.validate()?;
        let (lo, hi) = ctx.classifier.bounds();
        let mut guard = self.delta.lock().unwrap_or_else(|e| e.into_inner());
        let mut delta = match guard.take() {
            Some(d) if d.shape() == x.shape() => d,
            _ => ArrayD::zeros(x.shape()),
        };
        let mut last = StepReport::default();
        for _ in 0..self.replays {
            let dv = Tensor::new(delta.clone()).variable();
            let xin = x.add(&dv)?.clamp(lo, hi);
            let z = ctx.model.forward_t(&xin, true)?;
            let loss = z.cross_entropy(y, Reduction::Mean)?;
            let grads = loss.backward_with(&[&dv])?;
            let gd = grads.get(&dv).cloned().unwrap_or_else(|| ArrayD::zeros(x.shape()));
            ctx.update(grads)?;
            ndarray::Zip::from(&mut delta)
                .and(&gd)
                .for_each(|d, &g| *d = (*d + self.eps * sign(g)).clamp(-self.eps, self.eps));
            last = StepReport::of(loss.item()?, correct(&z, y), y.len());
        }
        *guard = Some(delta);
        Ok(last)
    }

    fn state(&self) -> Vec<(String, ArrayD<f32>)> {
        let guard = self.delta.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().map(|d| vec![("free.delta".to_string(), d.clone())]).unwrap_or_default()
    }

    fn load_state(&self, state: &[(String, ArrayD<f32>)]) -> Result<()> {
        let mut guard = self.delta.lock().unwrap_or_else(|e| e.into_inner());
        *guard = state.iter().find(|(n, _)| n == "free.delta").map(|(_, d)| d.clone());
        Ok(())
    }
}
