//! Training methods built from attacks: plain, MindArmour's adversarial defenses (corrected), Madry's PGD-AT,
//! ensemble adversarial training, fast and free adversarial training.

use std::sync::{Arc, Mutex};

use armoury::nn::Module;
use armoury::{Attack, Classifier, Error, Goal, ModuleClassifier, Reduction, Result, Tensor};
use armoury_attacks::Pgd;
use ndarray::ArrayD;

use super::{correct, optimise_pieces, Method, StepContext, StepReport};

/// Cross-entropy on `x` in training mode, one optimiser step.
fn ce_step(ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport> {
    AdversarialDefense::train_step(ctx.model, ctx.optimizer, x, y)
}

/// Standard training (no attack): the baseline every defense is compared with.
pub struct Standard;

impl Method for Standard {
    fn name(&self) -> String {
        "standard".into()
    }
    fn step(&self, ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        ce_step(ctx, x, y)
    }
}

/// MindArmour's `AdversarialDefense`: one training step on a batch of adversarial inputs the caller made.
pub struct AdversarialDefense;

impl AdversarialDefense {
    /// Trains `model` one step on `x_adv` with labels `y`.
    pub fn train_step(
        model: &dyn Module,
        optimizer: &mut dyn armoury::optim::Optimizer,
        x_adv: &Tensor,
        y: &[usize],
    ) -> Result<StepReport> {
        let n = y.len();
        if x_adv.rank() == 0 || x_adv.shape()[0] != n {
            return Err(Error::ShapeMismatch { op: "train_step", expected: vec![n], got: x_adv.shape().to_vec() });
        }
        let (loss, correct) = optimise_pieces(model, optimizer, n, |r| {
            let z = model.forward_t(&x_adv.narrow(0, r.start, r.len())?, true)?;
            Ok((z.cross_entropy(&y[r.clone()], Reduction::Sum)?, correct(&z, &y[r])))
        })?;
        Ok(StepReport { loss, correct, size: n })
    }
}

/// The samples `0..⌈ratio·n⌉` of a batch replaced by adversarial versions, split evenly across `attacks` (each
/// run on its own contiguous share); the rest stay clean.
fn replace_with_adversarial(
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

fn check_ratio(ratio: f32) -> Result<()> {
    if !(0.0..=1.0).contains(&ratio) {
        return Err(Error::invalid("adversarial defense", format!("replace ratio {ratio} must be in [0, 1]")));
    }
    Ok(())
}

/// MindArmour's `AdversarialDefenseWithAttacks`: per batch, replace a ratio of the samples by adversarial ones,
/// split evenly across a list of attacks, and train on the mix.
pub struct AdversarialDefenseWithAttacks {
    /// The attacks (run against the current model).
    pub attacks: Vec<Arc<dyn Attack>>,
    /// Fraction of each batch replaced.
    pub replace_ratio: f32,
}

impl Method for AdversarialDefenseWithAttacks {
    fn name(&self) -> String {
        let names: Vec<String> = self.attacks.iter().map(|a| a.name()).collect();
        format!("adversarial({}; ratio {})", names.join(", "), self.replace_ratio)
    }
    fn step(&self, ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        check_ratio(self.replace_ratio)?;
        let attacks: Vec<&dyn Attack> = self.attacks.iter().map(|a| a.as_ref()).collect();
        let mixed = replace_with_adversarial(ctx.classifier, &attacks, self.replace_ratio, x, y, ctx.step_seed())?;
        ce_step(ctx, &mixed, y)
    }
}

/// MindArmour's `NaturalAdversarialDefense`: FGSM examples replacing half of each batch (ε = 0.1 by default).
pub struct NaturalAdversarialDefense {
    /// FGSM budget.
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
    fn name(&self) -> String {
        format!("nad(FGSM eps {}, ratio {})", self.eps, self.replace_ratio)
    }
    fn step(&self, ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        check_ratio(self.replace_ratio)?;
        let fgsm = Pgd::fgsm(self.eps);
        let mixed = replace_with_adversarial(ctx.classifier, &[&fgsm], self.replace_ratio, x, y, ctx.step_seed())?;
        ce_step(ctx, &mixed, y)
    }
}

/// Madry et al. (2018) PGD adversarial training, MindArmour's `ProjectedAdversarialDefense` corrected: PGD with a
/// random start (a fresh one every step), all-adversarial batches by default.
#[derive(Clone)]
pub struct ProjectedAdversarialDefense {
    /// The inner attack (its seed is replaced per step so random starts differ across epochs).
    pub pgd: Pgd,
    /// Fraction of each batch replaced (1.0: Madry's all-adversarial batches).
    pub replace_ratio: f32,
}

impl ProjectedAdversarialDefense {
    /// Madry's recipe at budget ε: `steps` steps of `step_size` from a random start, L∞.
    pub fn madry(eps: f32, step_size: f32, steps: usize) -> Self {
        ProjectedAdversarialDefense { pgd: Pgd { step_size, steps, ..Pgd::linf(eps) }, replace_ratio: 1.0 }
    }
}

impl Method for ProjectedAdversarialDefense {
    fn name(&self) -> String {
        format!("pgd-at({}, ratio {})", self.pgd.name(), self.replace_ratio)
    }
    fn step(&self, ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        check_ratio(self.replace_ratio)?;
        let mixed = replace_with_adversarial(ctx.classifier, &[&self.pgd], self.replace_ratio, x, y, ctx.step_seed())?;
        ce_step(ctx, &mixed, y)
    }
}

/// Fast adversarial training (Wong, Rice & Kolter 2020): FGSM from a uniform random start with step 1.25ε,
/// projected to the ε-ball; all-adversarial batches. (Use a cyclic `LrSchedule::Triangular` as in the paper.)
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
    fn name(&self) -> String {
        format!("fast-at(eps {}, alpha {})", self.eps, self.alpha)
    }
    fn step(&self, ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let pgd = Pgd { steps: 1, step_size: self.alpha, random_start: true, ..Pgd::linf(self.eps) };
        let adv = pgd.generate(ctx.classifier, x, y, &Goal::Untargeted, ctx.step_seed())?;
        ce_step(ctx, &adv, y)
    }
}

/// Free adversarial training (Shafahi et al. 2019): each batch is replayed `replays` times; every replay takes
/// one backward pass that yields both the weight gradient (an optimiser step) and the perturbation gradient
/// (δ ← clip(δ + ε·sign(∇δ))). δ carries over to the next batch. The trainer runs `epochs / replays` passes.
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
    fn name(&self) -> String {
        format!("free-at(eps {}, m {})", self.eps, self.replays)
    }

    fn epoch_divisor(&self) -> usize {
        self.replays.max(1)
    }

    fn step(&self, ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        if self.replays == 0 || self.eps.is_nan() || self.eps < 0.0 {
            return Err(Error::invalid("free-at", "replays must be ≥ 1 and ε ≥ 0"));
        }
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
            ctx.optimizer.step(&grads)?;
            let gd = grads.get(&dv).cloned().unwrap_or_else(|| ArrayD::zeros(x.shape()));
            ndarray::Zip::from(&mut delta)
                .and(&gd)
                .for_each(|d, &g| *d = (*d + self.eps * armoury_attacks::budget::sign(g)).clamp(-self.eps, self.eps));
            last = StepReport { loss: loss.item()?, correct: correct(&z, y), size: y.len() };
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

/// Ensemble adversarial training (Tramèr et al. 2018): each batch's adversarial half comes, in rotation, from
/// the current model or one of several fixed pre-trained models, so the defense does not overfit to its own
/// gradients.
pub struct EnsembleAdversarialDefense {
    /// The fixed models adversarial inputs are also made on.
    pub static_models: Vec<Arc<ModuleClassifier>>,
    /// The attack (FGSM in the paper; R+FGSM variants work too).
    pub attack: Arc<dyn Attack>,
    /// Fraction of each batch replaced (0.5 in the paper).
    pub replace_ratio: f32,
}

impl Method for EnsembleAdversarialDefense {
    fn name(&self) -> String {
        format!(
            "ensemble({} + {} static models, ratio {})",
            self.attack.name(),
            self.static_models.len(),
            self.replace_ratio
        )
    }
    fn step(&self, ctx: &mut StepContext, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        check_ratio(self.replace_ratio)?;
        let source = ctx.batch % (self.static_models.len() + 1);
        let clf: &dyn Classifier = if source == 0 { ctx.classifier } else { self.static_models[source - 1].as_ref() };
        let mixed = replace_with_adversarial(clf, &[self.attack.as_ref()], self.replace_ratio, x, y, ctx.step_seed())?;
        ce_step(ctx, &mixed, y)
    }
}
