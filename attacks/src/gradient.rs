//! The iterative gradient family as one template over a norm (Foolbox's design): random start, a normalised
//! ascent step, projection onto the ε-ball and the input box. FGSM/FGM are one full step from the clean input;
//! BIM, PGD, MI-FGSM, DI²-FGSM, M-DI²-FGSM, VMI-FGSM and VNI-FGSM are settings of the same loop.
//!
//! Where MindArmour differs (SPEC §5) Armoury follows the papers: FGM-L∞ uses sign(∇) (not ∇/max|∇|); PGD has a
//! random start, honours targets and projects onto L2/L1 balls; MI-FGSM normalises by ‖∇‖₁ (Dong et al. 2018);
//! DI² really applies its input transform; VMI/VNI use the paper's ‖·‖₁ normaliser.

use armoury::attack::{resolve_goal, Access, Algorithm, AttackResult, Budget, Problem, Resolved};
use armoury::{Attack, Classifier, Goal, Result, Tensor};
use ndarray::{Array2, Axis, Zip};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::budget::{
    check_positive, enforce, project_row, random_in_ball, row_seeds, rows, steepest, steepest_row, unrows, Epsilon,
    Norm,
};
use crate::losses::Loss;

/// DI² input diversity (Xie et al. 2019): with probability `prob`, resize each image to a random r×r with
/// r ∈ [⌊rate·H⌋, H) (nearest neighbour) and pad it back to H×W at a random offset, before the gradient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Diversity {
    /// Probability of transforming an image at a step.
    pub prob: f32,
    /// Smallest resize as a fraction of the image size.
    pub resize_rate: f32,
}

impl Default for Diversity {
    fn default() -> Self {
        Diversity { prob: 0.5, resize_rate: 0.9 }
    }
}

/// Variance tuning (Wang & He 2021): the next step adds v = mean of ∇ at `samples` points drawn uniformly from
/// the β·ε-cube around the current iterate, minus the current gradient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VarianceTuning {
    /// Neighbours sampled per step (N in the paper; 20).
    pub samples: usize,
    /// Neighbourhood radius as a multiple of ε (β in the paper; 1.5).
    pub beta: f32,
}

impl Default for VarianceTuning {
    fn default() -> Self {
        VarianceTuning { samples: 20, beta: 1.5 }
    }
}

/// Projected gradient ascent on a loss, the template of the whole gradient family.
#[derive(Clone, Debug)]
pub struct Pgd {
    /// The budget's norm; also the step's normalisation (sign for L∞, ∇/‖∇‖₂ for L2, sparse for L1).
    pub norm: Norm,
    /// The budget ε.
    pub eps: Epsilon,
    /// Step size in input units.
    pub step_size: f32,
    /// Iterations.
    pub steps: usize,
    /// Start from a uniform point in the ε-ball (Madry et al. 2018).
    pub random_start: bool,
    /// Independent runs; each sample keeps its worst case (a success, else the highest loss).
    pub restarts: usize,
    /// The objective ascended.
    pub loss: Loss,
    /// Momentum decay μ (MI-FGSM: g ← μg + ∇/‖∇‖₁).
    pub momentum: Option<f32>,
    /// Nesterov look-ahead x + α·μ·g for the gradient (NI/VNI-FGSM).
    pub nesterov: bool,
    /// DI² input diversity.
    pub diversity: Option<Diversity>,
    /// VMI/VNI variance tuning.
    pub variance: Option<VarianceTuning>,
    /// L1 steps move the coordinates at or above this quantile of |∇| (Tramèr & Boneh 2019).
    pub l1_quantile: f32,
    /// The name reported (FGSM, BIM, PGD, …).
    pub label: &'static str,
}

impl Pgd {
    /// PGD-L∞ (Madry et al. 2018): 40 steps of ε/4 from a random start.
    pub fn linf(eps: f32) -> Pgd {
        Pgd {
            norm: Norm::Linf,
            eps: Epsilon::Scalar(eps),
            step_size: eps / 4.0,
            steps: 40,
            random_start: true,
            restarts: 1,
            loss: Loss::CrossEntropy,
            momentum: None,
            nesterov: false,
            diversity: None,
            variance: None,
            l1_quantile: 0.99,
            label: "PGD",
        }
    }

    /// PGD-L2: 40 steps of ε/4 from a random start in the L2 ball.
    pub fn l2(eps: f32) -> Pgd {
        Pgd { norm: Norm::L2, ..Pgd::linf(eps) }
    }

    /// PGD-L1 with sparse steepest-ascent steps (Tramèr & Boneh 2019) and exact projection onto the L1 ball.
    pub fn l1(eps: f32) -> Pgd {
        Pgd { norm: Norm::L1, ..Pgd::linf(eps) }
    }

    /// FGSM (Goodfellow et al. 2015): x + ε·sign(∇), one full step, no random start.
    pub fn fgsm(eps: f32) -> Pgd {
        Pgd { steps: 1, step_size: eps, random_start: false, label: "FGSM", ..Pgd::linf(eps) }
    }

    /// FGM with L1, L2 or L∞ normalisation: x + ε·∇/‖∇‖₁, ε·∇/‖∇‖₂ or ε·sign(∇).
    pub fn fgm(norm: Norm, eps: f32) -> Pgd {
        Pgd { norm, label: "FGM", l1_quantile: 0.0, ..Pgd::fgsm(eps) }
    }

    /// BIM / I-FGSM (Kurakin et al. 2017): `steps` sign steps of `alpha` from the clean input, clipped to ε.
    pub fn bim(eps: f32, alpha: f32, steps: usize) -> Pgd {
        Pgd { step_size: alpha, steps, random_start: false, label: "BIM", ..Pgd::linf(eps) }
    }

    /// MI-FGSM (Dong et al. 2018): momentum μ = 1 on L1-normalised gradients, 10 steps of ε/10.
    pub fn mi_fgsm(eps: f32) -> Pgd {
        Pgd { momentum: Some(1.0), label: "MI-FGSM", ..Pgd::bim(eps, eps / 10.0, 10) }
    }

    /// DI²-FGSM (Xie et al. 2019): BIM with input diversity.
    pub fn di_fgsm(eps: f32) -> Pgd {
        Pgd { diversity: Some(Diversity::default()), label: "DI2-FGSM", ..Pgd::bim(eps, eps / 10.0, 10) }
    }

    /// M-DI²-FGSM: MI-FGSM with input diversity.
    pub fn m_di_fgsm(eps: f32) -> Pgd {
        Pgd { diversity: Some(Diversity::default()), label: "M-DI2-FGSM", ..Pgd::mi_fgsm(eps) }
    }

    /// VMI-FGSM (Wang & He 2021): MI-FGSM with variance tuning.
    pub fn vmi_fgsm(eps: f32) -> Pgd {
        Pgd { variance: Some(VarianceTuning::default()), label: "VMI-FGSM", ..Pgd::mi_fgsm(eps) }
    }

    /// VNI-FGSM: VMI-FGSM with the Nesterov look-ahead.
    pub fn vni_fgsm(eps: f32) -> Pgd {
        Pgd { nesterov: true, label: "VNI-FGSM", ..Pgd::vmi_fgsm(eps) }
    }

    fn validate(&self) -> Result<()> {
        if self.steps > 0 {
            check_positive("pgd", "step size", self.step_size)?;
        }
        if self.restarts == 0 {
            return Err(armoury::Error::invalid("pgd", "restarts must be at least 1"));
        }
        if let Some(m) = self.momentum {
            if !(m.is_finite() && m >= 0.0) {
                return Err(armoury::Error::invalid("pgd", format!("momentum {m} must be ≥ 0")));
            }
        }
        if let Some(d) = self.diversity {
            if !((0.0..=1.0).contains(&d.prob) && d.resize_rate > 0.0 && d.resize_rate <= 1.0) {
                return Err(armoury::Error::invalid("pgd", format!("bad input diversity {d:?}")));
            }
        }
        if let Some(v) = self.variance {
            if v.samples == 0 || v.beta.is_nan() || v.beta < 0.0 {
                return Err(armoury::Error::invalid("pgd", format!("bad variance tuning {v:?}")));
            }
        }
        if !(0.0..1.0).contains(&self.l1_quantile) {
            return Err(armoury::Error::invalid("pgd", format!("l1 quantile {} must be in [0, 1)", self.l1_quantile)));
        }
        Ok(())
    }

    fn gradients_per_run(&self) -> u64 {
        self.steps as u64 * (1 + self.variance.map_or(0, |v| v.samples as u64))
    }
}

/// What [`Pgd::attack_eps`] produced: a full result, or only the adversarial inputs.
enum Evaluated {
    Full(AttackResult),
    Skipped(Tensor),
}

/// ∂objective/∂x for the rows of `x2` (shape `shape`), with the DI² transform applied when `div` is given.
struct Ctx<'a> {
    model: &'a dyn Classifier,
    shape: Vec<usize>,
    labels: &'a [usize],
    goal: &'a Resolved,
    loss: Loss,
    seed: u64,
}

impl Ctx<'_> {
    fn grad(&self, x2: &Array2<f32>, div: Option<(Diversity, &[u64], u64)>) -> Result<Array2<f32>> {
        Ok(self.grad_owned(x2.clone(), div)?.1)
    }

    /// [`Ctx::grad`] of an iterate the caller gives up and gets back: the rows travel into the classifier and
    /// back without a copy (as does the gradient).
    fn grad_owned(&self, x2: Array2<f32>, div: Option<(Diversity, &[u64], u64)>) -> Result<(Array2<f32>, Array2<f32>)> {
        let n = x2.nrows();
        let x = unrows(x2, &self.shape);
        let g = match div {
            None => {
                let f = |z: &Tensor, r: std::ops::Range<usize>| self.loss.objective(z, r, self.labels, self.goal);
                self.model.gradient(&x, &f)?.1
            }
            Some((d, seeds, step)) => {
                let n = self.shape[0];
                let xv = x.variable();
                let xin = diversify(&xv, d, seeds, step)?;
                let z = self.model.forward(&xin)?;
                let obj = self.loss.objective(&z, 0..n, self.labels, self.goal)?;
                self.model.counters().add_forward(n);
                self.model.counters().add_backward(n);
                obj.grad_wrt(&[&xv])?.pop().expect("one target")
            }
        };
        let back = |t: Tensor| {
            let a = t.into_array();
            let d = a.len() / n.max(1);
            a.into_shape_with_order((n, d)).expect("N·D elements")
        };
        let g = if g.value().is_standard_layout() { back(g) } else { rows(&g) };
        Ok((back(x), g))
    }
}

/// The DI² transform, per image with its own generator (seeded by the image and the step).
fn diversify(x: &Tensor, d: Diversity, seeds: &[u64], step: u64) -> Result<Tensor> {
    let (n, _, h, w) = x.dims4("input diversity")?;
    let mut parts = Vec::with_capacity(n);
    for (i, &s) in seeds.iter().enumerate().take(n) {
        let mut rng = ChaCha8Rng::seed_from_u64(s ^ step.wrapping_mul(0xD1B5_4A32_D192_ED03));
        let xi = x.narrow(0, i, 1)?;
        let lo = ((d.resize_rate * h.min(w) as f32).floor() as usize).max(1);
        if rng.random::<f32>() >= d.prob || lo >= h.min(w) {
            parts.push(xi);
            continue;
        }
        let r = rng.random_range(lo..h.min(w));
        let rows_idx: Vec<usize> = (0..r).map(|j| j * h / r).collect();
        let cols_idx: Vec<usize> = (0..r).map(|j| j * w / r).collect();
        let small = xi.index_select(2, &rows_idx)?.index_select(3, &cols_idx)?;
        let top = rng.random_range(0..=h - r);
        let left = rng.random_range(0..=w - r);
        parts.push(small.pad(&[(0, 0), (0, 0), (top, h - r - top), (left, w - r - left)], 0.0)?);
    }
    Tensor::concat(&parts, 0)
}

fn l1_normalise(g: &Array2<f32>) -> Array2<f32> {
    let mut out = g.clone();
    for mut r in out.axis_iter_mut(Axis(0)) {
        let n: f64 = r.iter().map(|v| (*v as f64).abs()).sum::<f64>();
        if n > 0.0 {
            r.mapv_inplace(|v| (v as f64 / n) as f32);
        }
    }
    out
}

fn clip(a: &mut Array2<f32>, (lo, hi): (f32, f32)) {
    a.mapv_inplace(|v| v.clamp(lo, hi));
}

impl Pgd {
    /// One run from restart stream `r`: the final adversarial rows.
    fn run_once(&self, ctx: &Ctx, x2: &Array2<f32>, eps: &[f32], r: usize) -> Result<Array2<f32>> {
        let bounds = ctx.model.bounds();
        let (n, d) = x2.dim();
        let seeds = row_seeds(x2, ctx.seed, r as u64);
        // Zero steps is the identity (SPEC §4.2): no random start without a step after it.
        let delta = if self.random_start && self.steps > 0 {
            random_in_ball(n, d, self.norm, eps, &seeds)
        } else {
            Array2::zeros((n, d))
        };
        let mut adv = x2 + &delta;
        clip(&mut adv, bounds);
        let mut g_acc = Array2::<f32>::zeros((n, d));
        let mut variance = Array2::<f32>::zeros((n, d));
        let mu = self.momentum.unwrap_or(0.0);
        for t in 0..self.steps {
            let nesterov_look;
            let look = if self.nesterov {
                let mut l = &adv + &(&g_acc * (self.step_size * mu));
                clip(&mut l, bounds);
                nesterov_look = l;
                &nesterov_look
            } else {
                &adv
            };
            let div = self.diversity.map(|dv| (dv, seeds.as_slice(), t as u64));
            let grad = if self.nesterov {
                ctx.grad(look, div)?
            } else {
                let (back, grad) = ctx.grad_owned(std::mem::take(&mut adv), div)?;
                adv = back;
                grad
            };
            let mut dir = match self.variance {
                None => grad,
                Some(v) => {
                    let dir = &grad + &variance;
                    // v ← mean ∇ at uniform neighbours of the current iterate − the current gradient.
                    let mut acc = Array2::<f32>::zeros((n, d));
                    for k in 0..v.samples {
                        let radius: Vec<f32> = eps.iter().map(|e| e * v.beta).collect();
                        let ks: Vec<u64> = seeds
                            .iter()
                            .map(|s| s ^ ((t * v.samples + k + 1) as u64).wrapping_mul(0x9E37_79B9))
                            .collect();
                        let mut xn = &adv + &random_in_ball(n, d, Norm::Linf, &radius, &ks);
                        clip(&mut xn, bounds);
                        acc += &ctx.grad(&xn, None)?;
                    }
                    variance = acc / v.samples as f32 - &grad;
                    dir
                }
            };
            if self.momentum.is_some() {
                g_acc = &g_acc * mu + &l1_normalise(&dir);
                dir = g_acc.clone();
            }
            // One pass per row: steepest direction, step, projection onto the ball, clip to the bounds.
            let (alpha, norm, q) = (self.step_size, self.norm, self.l1_quantile);
            Zip::from(adv.rows_mut())
                .and(x2.rows())
                .and(dir.rows_mut())
                .and(&ndarray::ArrayView1::from(eps))
                .par_for_each(|mut a, xr, mut s, &e| {
                    let (a, s) = (a.as_slice_mut().expect("rows"), s.as_slice_mut().expect("rows"));
                    let xr = xr.as_slice().expect("rows");
                    steepest_row(s, norm, q);
                    for ((av, &xv), &sv) in a.iter_mut().zip(xr).zip(s.iter()) {
                        *av = *av - xv + alpha * sv;
                    }
                    project_row(a, norm, e);
                    for (av, &xv) in a.iter_mut().zip(xr) {
                        *av = (xv + *av).clamp(bounds.0, bounds.1);
                    }
                });
        }
        enforce(x2, &mut adv, self.norm, eps, bounds);
        Ok(adv)
    }

    /// The attack at the given per-sample budgets.
    fn run_eps(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        labels: &[usize],
        goal: &Resolved,
        eps: &[f32],
        seed: u64,
    ) -> Result<AttackResult> {
        match self.attack_eps(model, x, labels, goal, eps, true, seed)? {
            Evaluated::Full(r) => Ok(r),
            Evaluated::Skipped(_) => unreachable!("evaluation was asked for"),
        }
    }

    /// The attack at the given budgets; with `evaluate` false only the adversarial inputs (no success forward).
    #[allow(clippy::too_many_arguments)] // transitional: goes with the move onto the attack template
    fn attack_eps(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        labels: &[usize],
        goal: &Resolved,
        eps: &[f32],
        evaluate: bool,
        seed: u64,
    ) -> Result<Evaluated> {
        let shape = x.shape().to_vec();
        let x2 = rows(x);
        let ctx = Ctx { model, shape: shape.clone(), labels, goal, loss: self.loss, seed };
        let mut best: Option<(Array2<f32>, Vec<bool>, Vec<f32>)> = None;
        for r in 0..self.restarts {
            let adv = self.run_once(&ctx, &x2, eps, r)?;
            if self.restarts == 1 {
                best = Some((adv, vec![], vec![]));
                break;
            }
            // Keep each sample's worst case: a success, else the highest objective.
            let t = unrows(adv.clone(), &shape);
            let z = model.logits(&t)?;
            let preds = armoury::classifier::argmax_rows(&z);
            let ok: Vec<bool> = preds.iter().enumerate().map(|(i, &p)| goal.is_success(i, labels[i], p)).collect();
            let zt = Tensor::new(z.into_dyn());
            let obj = self.loss.objective(&zt, 0..labels.len(), labels, goal)?.to_vec();
            best = Some(match best {
                None => (adv, ok, obj),
                Some((mut b, mut bok, mut bobj)) => {
                    for i in 0..labels.len() {
                        let better = (ok[i] && !bok[i]) || (ok[i] == bok[i] && obj[i] > bobj[i]);
                        if better {
                            b.row_mut(i).assign(&adv.row(i));
                            bok[i] = ok[i];
                            bobj[i] = obj[i];
                        }
                    }
                    (b, bok, bobj)
                }
            });
        }
        let adv = best.expect("at least one restart").0;
        if !evaluate {
            return Ok(Evaluated::Skipped(unrows(adv, &shape)));
        }
        let n = labels.len();
        let grads = vec![self.gradients_per_run() * self.restarts as u64; n];
        let queries = grads.clone();
        AttackResult::evaluate(model, x, unrows(adv, &shape), labels, goal.clone(), grads, queries).map(Evaluated::Full)
    }

    /// A single gradient step reused for every budget (FGSM/FGM sweeps need one gradient, not one per ε).
    fn single_step_sweep(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        labels: &[usize],
        goal: &Resolved,
        eps: &[f32],
        seed: u64,
    ) -> Result<Vec<AttackResult>> {
        let shape = x.shape().to_vec();
        let x2 = rows(x);
        let ctx = Ctx { model, shape: shape.clone(), labels, goal, loss: self.loss, seed };
        let dir = steepest(&ctx.grad(&x2, None)?, self.norm, self.l1_quantile);
        let n = labels.len();
        eps.iter()
            .map(|&e| {
                let ev = vec![e; n];
                let mut adv = &x2 + &(&dir * e);
                enforce(&x2, &mut adv, self.norm, &ev, model.bounds());
                AttackResult::evaluate(model, x, unrows(adv, &shape), labels, goal.clone(), vec![1; n], vec![1; n])
            })
            .collect()
    }

    fn is_single_step(&self) -> bool {
        self.steps == 1
            && !self.random_start
            && self.diversity.is_none()
            && self.variance.is_none()
            && self.restarts == 1
    }
}

impl Attack for Pgd {
    fn name(&self) -> String {
        format!(
            "{}-{}(eps={}, step={}, steps={})",
            self.label,
            self.norm.name(),
            self.eps.describe(),
            self.step_size,
            self.steps
        )
    }

    fn run(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        labels: &[usize],
        goal: &Goal,
        seed: u64,
    ) -> Result<AttackResult> {
        self.validate()?;
        let goal = resolve_goal(model, x, labels, goal)?;
        let eps = self.eps.resolve(labels.len())?;
        self.run_eps(model, x, labels, &goal, &eps, seed)
    }

    /// The adversarial inputs without the success forward pass and the norms.
    fn generate(&self, model: &dyn Classifier, x: &Tensor, labels: &[usize], goal: &Goal, seed: u64) -> Result<Tensor> {
        self.validate()?;
        let goal = resolve_goal(model, x, labels, goal)?;
        let eps = self.eps.resolve(labels.len())?;
        match self.attack_eps(model, x, labels, &goal, &eps, false, seed)? {
            Evaluated::Skipped(t) => Ok(t),
            Evaluated::Full(r) => Ok(r.adversarial),
        }
    }

    fn sweep(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        labels: &[usize],
        goal: &Goal,
        eps: &[f32],
        seed: u64,
    ) -> Result<Vec<AttackResult>> {
        self.validate()?;
        let goal = resolve_goal(model, x, labels, goal)?;
        for &e in eps {
            Epsilon::Scalar(e).resolve(1)?;
        }
        if self.is_single_step() && (self.step_size == self.eps_scalar().unwrap_or(f32::NAN)) {
            return self.single_step_sweep(model, x, labels, &goal, eps, seed);
        }
        eps.iter()
            .map(|&e| {
                // The step scales with ε, as the configured step did with the configured ε.
                let scale = self.eps_scalar().filter(|&b| b > 0.0).map_or(1.0, |b| e / b);
                let cfg = Pgd {
                    eps: Epsilon::Scalar(e),
                    step_size: (self.step_size * scale).max(f32::MIN_POSITIVE),
                    ..self.clone()
                };
                cfg.run_eps(model, x, labels, &goal, &vec![e; labels.len()], seed)
            })
            .collect()
    }
}

impl Pgd {
    fn eps_scalar(&self) -> Option<f32> {
        match self.eps {
            Epsilon::Scalar(e) => Some(e),
            Epsilon::PerSample(_) => None,
        }
    }
}

/// R+FGSM (Tramèr et al. 2018): a random step x' = x + α·sign(N(0, I)), then an FGSM step of ε − α with the
/// gradient taken at x' (MindArmour takes it at x; the paper at x').
#[derive(Clone, Debug)]
pub struct RFgsm {
    /// Total budget ε (L∞).
    pub eps: f32,
    /// Size of the random step α < ε.
    pub alpha: f32,
    /// Objective.
    pub loss: Loss,
}

impl RFgsm {
    /// R+FGSM with α = ε/2.
    pub fn new(eps: f32) -> RFgsm {
        RFgsm { eps, alpha: eps / 2.0, loss: Loss::CrossEntropy }
    }
}

impl Algorithm for RFgsm {
    fn name(&self) -> String {
        format!("R+FGSM(eps={}, alpha={})", self.eps, self.alpha)
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: Norm::Linf, eps: Epsilon::Scalar(self.eps) }
    }

    fn validate(&self) -> Result<()> {
        if !(self.alpha >= 0.0 && self.alpha <= self.eps) {
            return Err(armoury::Error::invalid(
                "rfgsm",
                format!("α = {} must be in [0, ε = {}]", self.alpha, self.eps),
            ));
        }
        Ok(())
    }

    /// At a budget ε other than the configured one (a sweep), α keeps its fraction of ε.
    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let x2 = p.rows();
        let d = x2.ncols();
        let seeds = row_seeds(&x2, p.seed, 0);
        let frac = if self.eps > 0.0 { self.alpha / self.eps } else { 0.0 };
        let alpha: Vec<f32> = p.eps.iter().map(|&e| if e == self.eps { self.alpha } else { frac * e }).collect();
        let mut start = x2.clone();
        for (((mut row, &s), xr), &a) in start.axis_iter_mut(Axis(0)).zip(&seeds).zip(x2.axis_iter(Axis(0))).zip(&alpha)
        {
            let mut rng = armoury::seed::rng(s);
            let z = armoury::seed::normal_vec(&mut rng, d);
            row.iter_mut().zip(xr).zip(&z).for_each(|((v, &xv), &g)| *v = xv + a * crate::budget::sign(g));
        }
        clip(&mut start, p.bounds());
        let ctx = Ctx {
            model: p.model,
            shape: p.x.shape().to_vec(),
            labels: p.labels,
            goal: p.goal,
            loss: self.loss,
            seed: p.seed,
        };
        let g = ctx.grad(&start, None)?;
        p.note_gradient(g.view(), None);
        let mut dir = steepest(&g, Norm::Linf, 0.0);
        for ((mut r, &e), &a) in dir.axis_iter_mut(Axis(0)).zip(p.eps).zip(&alpha) {
            r.mapv_inplace(|v| v * (e - a));
        }
        Ok(p.unrows(&start + &dir))
    }
}

/// Least-likely-class method (Kurakin et al. 2017): a targeted FGSM step toward the class the model finds
/// least likely on the clean input, x − ε·sign(∇ CE(x, y_LL)); with `random`, preceded by an R+FGSM-style
/// random step of α = ε/2 (the "random LLC" variant). Success means reaching the least-likely class.
#[derive(Clone, Debug)]
pub struct Llc {
    /// Budget ε (L∞).
    pub eps: f32,
    /// Take a random sign step of ε/2 first.
    pub random: bool,
}

impl Attack for Llc {
    fn name(&self) -> String {
        format!("{}LLC(eps={})", if self.random { "R+" } else { "" }, self.eps)
    }

    /// The goal argument is ignored: this attack always targets the least-likely class.
    fn run(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        labels: &[usize],
        _goal: &Goal,
        seed: u64,
    ) -> Result<AttackResult> {
        if self.random {
            RFgsm { eps: self.eps, alpha: self.eps / 2.0, loss: Loss::CrossEntropy }.run(
                model,
                x,
                labels,
                &Goal::LeastLikely,
                seed,
            )
        } else {
            Pgd::fgsm(self.eps).run(model, x, labels, &Goal::LeastLikely, seed)
        }
    }
}

/// Uniform noise in the ε-ball (a baseline: any attack worth running must beat it).
#[derive(Clone, Debug)]
pub struct UniformNoise {
    /// The ball's norm.
    pub norm: Norm,
    /// Its radius.
    pub eps: Epsilon,
}

impl Algorithm for UniformNoise {
    fn name(&self) -> String {
        format!("UniformNoise-{}(eps={})", self.norm.name(), self.eps.describe())
    }

    fn access(&self) -> Access {
        Access::Scores
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: self.norm, eps: self.eps.clone() }
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let x2 = p.rows();
        let (n, d) = x2.dim();
        (0..n).for_each(|i| p.add_queries(i, 1)); // the forward that decides success: the only look at the model
        Ok(p.unrows(&x2 + &random_in_ball(n, d, self.norm, p.eps, &row_seeds(&x2, p.seed, 0))))
    }
}
