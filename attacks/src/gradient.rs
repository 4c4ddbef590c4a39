//! The iterative gradient family as one algorithm over a norm (Foolbox's design): random start, a normalised
//! ascent step, projection onto the ε-ball and the input box. FGSM/FGM are one full step from the clean input;
//! BIM, PGD, MI-FGSM, DI²-FGSM, M-DI²-FGSM, VMI-FGSM and VNI-FGSM are settings of the same loop. Each runs behind
//! the attack template ([`armoury::attack::template`]), which validates, resolves the goal, enforces the budget
//! exactly, re-evaluates success, counts the work and sweeps ε with successes carried forward.
//!
//! Where the references differ, Armoury follows the papers:
//! - FGM-L∞ uses sign(∇) (Goodfellow et al. 2015; MindArmour normalises by max|∇|); FGM-L2 is ε·∇/‖∇‖₂ and FGM-L1
//!   ε·∇/‖∇‖₁, as ART and Foolbox compute them.
//! - PGD (Madry et al. 2018) has a random start, honours targets and projects onto L2/L1 balls (MindArmour's PGD
//!   does neither). With `keep_success` (PGD's presets) a sample whose last iterate is not adversarial returns
//!   its latest iterate that was (AutoAttack's `x_best_adv`), so robust accuracy never rises with the step count,
//!   while the ascent itself runs on unchanged (Madry's adversarial training still gets its loss-maximising last
//!   iterate wherever that one fools the model); FGSM, BIM and the momentum/diversity/variance presets return the
//!   last iterate like torchattacks, whose images they reproduce.
//! - PGD-L1 is the sparse L1 descent of Tramèr & Boneh (2019) as Foolbox's `SparseL1DescentAttack` writes it
//!   (gradient entries that push a pixel at the box edge outward are dropped before the top-q coordinates are
//!   chosen), with the exact Euclidean projection onto the intersection of the L1 ball and the box (as the L1
//!   APGD of Croce & Hein 2021 does) instead of Foolbox's ball projection followed by clipping.
//! - MI-FGSM accumulates ∇/‖∇‖₁ (Dong et al. 2018). VMI/VNI-FGSM (Wang & He 2021) look ahead by α·μ·g with g the
//!   accumulator of ∇/mean|∇| — the authors' code and torchattacks divide by the *mean* absolute value, so each
//!   pixel looks ahead by about α·μ; a sign step cannot tell the two normalisers apart, so MI and VMI only use it
//!   for the look-ahead.
//! - DI²-FGSM (Xie et al. 2019) really applies its input transform, through [`armoury::Classifier::gradient_through`].

use std::ops::Range;

use armoury::attack::{Access, Algorithm, Budget, Goal, Problem};
use armoury::classifier::argmax_rows;
use armoury::{Result, Tensor};
use ndarray::{Array2, ArrayView1, Axis, Zip};
use rand::Rng;

use crate::budget::{check_positive, project_row, random_in_ball, row_seeds, rows, unrows, Epsilon, Norm};
use crate::l1_box::project_l1_box;
use crate::losses::{succeeded, zero_non_finite, Loss};

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
///
/// A run costs `steps · (1 + variance samples) · restarts` gradients per sample (and, with `restarts` > 1, one
/// forward per restart to keep each sample's worst case). At a budget ε other than the configured one (a sweep)
/// the step size keeps its ratio to ε.
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
    /// Nesterov look-ahead x + α·μ·g for the gradient (NI/VNI-FGSM; g accumulates ∇/mean|∇|).
    pub nesterov: bool,
    /// DI² input diversity.
    pub diversity: Option<Diversity>,
    /// VMI/VNI variance tuning.
    pub variance: Option<VarianceTuning>,
    /// L1 steps move the coordinates at or above this quantile of |∇| (Tramèr & Boneh 2019); 0 is the dense
    /// step ∇/‖∇‖₁ (FGM-L1).
    pub l1_quantile: f32,
    /// Where the last iterate is not adversarial, return the sample's latest iterate that was (each iterate at
    /// which a gradient is taken is judged by that gradient's forward pass; the last one by one more forward).
    pub keep_success: bool,
    /// The name reported (FGSM, BIM, PGD, …).
    pub label: &'static str,
}

impl Pgd {
    /// PGD-L∞ (Madry et al. 2018): 40 steps of ε/4 from a random start; each sample keeps its first success.
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
            keep_success: true,
            label: "PGD",
        }
    }

    /// PGD-L2: 40 steps of ε/4 from a random start in the L2 ball.
    pub fn l2(eps: f32) -> Pgd {
        Pgd { norm: Norm::L2, ..Pgd::linf(eps) }
    }

    /// PGD-L1 with sparse steepest-ascent steps (Tramèr & Boneh 2019) and the exact projection onto the
    /// intersection of the L1 ball and the box.
    pub fn l1(eps: f32) -> Pgd {
        Pgd { norm: Norm::L1, ..Pgd::linf(eps) }
    }

    /// FGSM (Goodfellow et al. 2015): x + ε·sign(∇), one full step, no random start.
    pub fn fgsm(eps: f32) -> Pgd {
        Pgd { steps: 1, step_size: eps, random_start: false, keep_success: false, label: "FGSM", ..Pgd::linf(eps) }
    }

    /// FGM with L1, L2 or L∞ normalisation: x + ε·∇/‖∇‖₁, ε·∇/‖∇‖₂ or ε·sign(∇).
    pub fn fgm(norm: Norm, eps: f32) -> Pgd {
        Pgd { norm, label: "FGM", l1_quantile: 0.0, ..Pgd::fgsm(eps) }
    }

    /// BIM / I-FGSM (Kurakin et al. 2017): `steps` sign steps of `alpha` from the clean input, clipped to ε.
    pub fn bim(eps: f32, alpha: f32, steps: usize) -> Pgd {
        Pgd { step_size: alpha, steps, random_start: false, keep_success: false, label: "BIM", ..Pgd::linf(eps) }
    }

    /// MI-FGSM (Dong et al. 2018): momentum μ = 1 on L1-normalised gradients, 10 steps of ε/10.
    pub fn mi_fgsm(eps: f32) -> Pgd {
        Pgd { momentum: Some(1.0), label: "MI-FGSM", ..Pgd::bim(eps, eps / 10.0, 10) }
    }

    /// DI²-FGSM (Xie et al. 2019): BIM with input diversity.
    pub fn di_fgsm(eps: f32) -> Pgd {
        Pgd { diversity: Some(Diversity::default()), label: "DI2-FGSM", ..Pgd::bim(eps, eps / 10.0, 10) }
    }

    /// M-DI²-FGSM (Xie et al. 2019): MI-FGSM with input diversity.
    pub fn m_di_fgsm(eps: f32) -> Pgd {
        Pgd { diversity: Some(Diversity::default()), label: "M-DI2-FGSM", ..Pgd::mi_fgsm(eps) }
    }

    /// VMI-FGSM (Wang & He 2021): MI-FGSM with variance tuning.
    pub fn vmi_fgsm(eps: f32) -> Pgd {
        Pgd { variance: Some(VarianceTuning::default()), label: "VMI-FGSM", ..Pgd::mi_fgsm(eps) }
    }

    /// VNI-FGSM (Wang & He 2021): VMI-FGSM with the Nesterov look-ahead.
    pub fn vni_fgsm(eps: f32) -> Pgd {
        Pgd { nesterov: true, label: "VNI-FGSM", ..Pgd::vmi_fgsm(eps) }
    }

    /// The step size of each sample: the configured one, scaled with ε when the budget is not the configured ε.
    fn step_sizes(&self, eps: &[f32]) -> Vec<f32> {
        eps.iter()
            .map(|&e| match self.eps {
                Epsilon::Scalar(b) if b > 0.0 && e != b => (self.step_size * (e / b)).max(f32::MIN_POSITIVE),
                _ => self.step_size,
            })
            .collect()
    }

    fn is_single_step(&self) -> bool {
        self.steps == 1
            && !self.random_start
            && self.diversity.is_none()
            && self.variance.is_none()
            && self.restarts == 1
            && matches!(self.eps, Epsilon::Scalar(e) if e == self.step_size)
    }
}

/// ∂objective/∂x of a problem's rows, through the problem (counted, faults noted, non-finite entries zeroed).
struct Ctx<'a, 'p> {
    p: &'a Problem<'p>,
    loss: Loss,
}

/// A gradient and the logits of the forward pass it came from.
struct Grad {
    g: Array2<f32>,
    logits: Array2<f32>,
}

impl Ctx<'_, '_> {
    fn grad(&self, x2: &Array2<f32>, div: Option<(Diversity, &[u64], u64)>) -> Result<Grad> {
        Ok(self.grad_owned(x2.clone(), div)?.1)
    }

    /// [`Ctx::grad`] of an iterate the caller gives up and gets back: the rows travel into the classifier and
    /// back without a copy (as does the gradient).
    fn grad_owned(&self, x2: Array2<f32>, div: Option<(Diversity, &[u64], u64)>) -> Result<(Array2<f32>, Grad)> {
        let (p, n) = (self.p, x2.nrows());
        let x = unrows(x2, p.x.shape());
        let f = |z: &Tensor, r: Range<usize>| self.loss.objective(z, r, p.labels, p.goal);
        let back = |t: Tensor| {
            let a = t.into_array();
            let d = a.len() / n.max(1);
            a.into_shape_with_order((n, d)).expect("N·D elements")
        };
        let (g, logits) = match div {
            None => {
                let (_, g, z) = p.gradient(&x, None, &f)?;
                (if g.value().is_standard_layout() { back(g) } else { rows(&g) }, z)
            }
            Some((d, seeds, step)) => {
                let t = |xv: &Tensor, r: Range<usize>| diversify(xv, d, &seeds[r], step);
                let (_, g, z) = p.model.gradient_through(&x, &t, &f)?;
                let g = rows(&g);
                p.note_gradient(g.view(), None);
                (g, z)
            }
        };
        let mut g = g;
        zero_non_finite(&mut g);
        Ok((back(x), Grad { g, logits }))
    }
}

/// The DI² transform, per image with its own generator (seeded by the image and the step).
fn diversify(x: &Tensor, d: Diversity, seeds: &[u64], step: u64) -> Result<Tensor> {
    let (n, _, h, w) = x.dims4("input diversity")?;
    let mut parts = Vec::with_capacity(n);
    for (i, &s) in seeds.iter().enumerate().take(n) {
        let mut rng = armoury::seed::rng(s ^ step.wrapping_mul(0xD1B5_4A32_D192_ED03));
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

/// The steepest-ascent direction of unit size in `norm` of gradient row `g` at the point `a`: sign(g) (L∞),
/// g/‖g‖₂ (L2), g/‖g‖₁ (L1 with quantile 0), or Foolbox's sparse L1 direction: entries that push a coordinate at
/// the box edge outward dropped, then sign(g) on the coordinates at or above the `q`-quantile of |g|, divided by
/// their count.
fn direction(g: &mut [f32], a: &[f32], norm: Norm, q: f32, (lo, hi): (f32, f32)) {
    match norm {
        Norm::L1 if q == 0.0 => {
            let n: f64 = g.iter().map(|v| (*v as f64).abs()).sum();
            if n > 0.0 {
                g.iter_mut().for_each(|v| *v = (*v as f64 / n) as f32);
            }
        }
        Norm::L1 => {
            g.iter_mut().zip(a).for_each(|(v, &x)| {
                if (x <= lo && *v < 0.0) || (x >= hi && *v > 0.0) {
                    *v = 0.0;
                }
            });
            crate::budget::steepest_row(g, norm, q);
        }
        _ => crate::budget::steepest_row(g, norm, q),
    }
}

impl Pgd {
    /// One run from restart stream `r`: the final rows (with `keep_success`, a sample's latest success if the final
    /// row is not one).
    fn run_once(&self, ctx: &Ctx, x2: &Array2<f32>, eps: &[f32], alpha: &[f32], r: usize) -> Result<Array2<f32>> {
        let p = ctx.p;
        let bounds = p.bounds();
        let (n, d) = x2.dim();
        let seeds = row_seeds(x2, p.seed, r as u64);
        // Zero steps is the identity: no random start without a step after it.
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
        let mut kept: Option<(Array2<f32>, Vec<bool>)> = self.keep_success.then(|| (x2.clone(), vec![false; n]));
        for t in 0..self.steps {
            let div = self.diversity.map(|dv| (dv, seeds.as_slice(), t as u64));
            let grad = if self.nesterov {
                // g_acc sums ∇/‖∇‖₁; the look-ahead uses the paper's ∇/mean|∇|, which is d times that.
                let mut look = adv.clone();
                for ((mut l, g), &a) in look.rows_mut().into_iter().zip(g_acc.rows()).zip(alpha) {
                    l.zip_mut_with(&g, |lv, &gv| *lv += gv * (a * mu * d as f32));
                }
                clip(&mut look, bounds);
                ctx.grad(&look, div)?
            } else {
                let (back, grad) = ctx.grad_owned(std::mem::take(&mut adv), div)?;
                adv = back;
                grad
            };
            if let Some(kept) = kept.as_mut() {
                let at_adv = !self.nesterov && self.diversity.is_none();
                let preds = match at_adv {
                    true => argmax_rows(&grad.logits),
                    false => argmax_rows(&p.logits(&p.unrows(adv.clone()), None)?),
                };
                keep(p, kept, &adv, &preds);
            }
            let grad = grad.g;
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
                        acc += &ctx.grad(&xn, None)?.g;
                    }
                    variance = acc / v.samples as f32 - &grad;
                    dir
                }
            };
            if self.momentum.is_some() {
                g_acc = &g_acc * mu + &l1_normalise(&dir);
                dir = g_acc.clone();
            }
            self.step(&mut adv, x2, &mut dir, (eps, alpha), bounds);
        }
        crate::budget::enforce(x2, &mut adv, self.norm, eps, bounds);
        match kept {
            Some(kept) => last_or_kept(p, adv, kept),
            None => Ok(adv),
        }
    }

    /// One pass per row: steepest direction, step, projection onto the ball (for L1 onto the ball and the box),
    /// clip to the bounds.
    fn step(
        &self,
        adv: &mut Array2<f32>,
        x2: &Array2<f32>,
        dir: &mut Array2<f32>,
        budget: (&[f32], &[f32]),
        bounds: (f32, f32),
    ) {
        let (eps, alpha) = budget;
        let (norm, q) = (self.norm, self.l1_quantile);
        Zip::from(adv.rows_mut())
            .and(x2.rows())
            .and(dir.rows_mut())
            .and(&ArrayView1::from(eps))
            .and(&ArrayView1::from(alpha))
            .par_for_each(|mut a, xr, mut s, &e, &al| {
                let (a, s) = (a.as_slice_mut().expect("rows"), s.as_slice_mut().expect("rows"));
                let xr = xr.as_slice().expect("rows");
                direction(s, a, norm, q, bounds);
                for ((av, &xv), &sv) in a.iter_mut().zip(xr).zip(s.iter()) {
                    *av = *av - xv + al * sv;
                }
                match norm {
                    Norm::L1 => project_l1_box(a, xr, e, bounds),
                    // ε was validated by `Epsilon::resolve`; an invalid one would leave no perturbation.
                    _ => {
                        if project_row(a, norm, e).is_err() {
                            a.fill(0.0);
                        }
                    }
                }
                for (av, &xv) in a.iter_mut().zip(xr) {
                    *av = (xv + *av).clamp(bounds.0, bounds.1);
                }
            });
    }

    /// The restarts, each sample keeping its worst case: a success, else the highest objective.
    fn restarts(&self, p: &Problem<'_>) -> Result<Array2<f32>> {
        let x2 = p.rows();
        let n = p.len();
        let alpha = self.step_sizes(p.eps);
        let ctx = Ctx { p, loss: self.loss };
        let mut best: Option<(Array2<f32>, Vec<bool>, Vec<f32>)> = None;
        for r in 0..self.restarts {
            let adv = self.run_once(&ctx, &x2, p.eps, &alpha, r)?;
            if self.restarts == 1 {
                return Ok(adv);
            }
            let z = p.logits(&p.unrows(adv.clone()), None)?;
            let ok: Vec<bool> = argmax_rows(&z).iter().enumerate().map(|(i, &c)| succeeded(p, i, c)).collect();
            let obj = self.loss.objective(&Tensor::new(z.into_dyn()), 0..n, p.labels, p.goal)?.to_vec();
            best = Some(match best {
                None => (adv, ok, obj),
                Some((mut b, mut bok, mut bobj)) => {
                    for i in 0..n {
                        if (ok[i] && !bok[i]) || (ok[i] == bok[i] && obj[i] > bobj[i]) {
                            b.row_mut(i).assign(&adv.row(i));
                            bok[i] = ok[i];
                            bobj[i] = obj[i];
                        }
                    }
                    (b, bok, bobj)
                }
            });
        }
        best.map(|b| b.0).ok_or_else(|| armoury::Error::invalid("pgd", "restarts must be at least 1"))
    }

    /// One gradient for every budget (FGSM/FGM sweeps need one gradient, not one per ε).
    fn single_step_sweep(&self, p: &Problem<'_>, eps: &[f32]) -> Result<Vec<Tensor>> {
        let x2 = p.rows();
        let bounds = p.bounds();
        let grad = Ctx { p, loss: self.loss }.grad(&x2, None)?;
        let clean =
            (x2.clone(), argmax_rows(&grad.logits).iter().enumerate().map(|(i, &c)| succeeded(p, i, c)).collect());
        let mut dir = grad.g;
        for (mut s, a) in dir.rows_mut().into_iter().zip(x2.rows()) {
            direction(
                s.as_slice_mut().expect("rows"),
                a.as_slice().expect("rows"),
                self.norm,
                self.l1_quantile,
                bounds,
            );
        }
        eps.iter()
            .map(|&e| {
                let adv = &x2 + &(&dir * e);
                let adv = if self.keep_success { last_or_kept(p, adv, clean.clone())? } else { adv };
                Ok(p.unrows(adv))
            })
            .collect()
    }
}

/// Records the rows of `adv` whose predictions `preds` fulfil the goal as the samples' latest successes.
fn keep(p: &Problem<'_>, (rows, found): &mut (Array2<f32>, Vec<bool>), adv: &Array2<f32>, preds: &[usize]) {
    for (i, &c) in preds.iter().enumerate() {
        if succeeded(p, i, c) {
            rows.row_mut(i).assign(&adv.row(i));
            found[i] = true;
        }
    }
}

/// `adv`, with each row that is not adversarial (one counted forward) replaced by the sample's kept success.
fn last_or_kept(p: &Problem<'_>, mut adv: Array2<f32>, (rows, found): (Array2<f32>, Vec<bool>)) -> Result<Array2<f32>> {
    if !found.iter().any(|&f| f) {
        return Ok(adv);
    }
    let preds = argmax_rows(&p.logits(&p.unrows(adv.clone()), None)?);
    for (i, &c) in preds.iter().enumerate() {
        if found[i] && !succeeded(p, i, c) {
            adv.row_mut(i).assign(&rows.row(i));
        }
    }
    Ok(adv)
}

impl Algorithm for Pgd {
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

    fn access(&self) -> Access {
        Access::Gradients
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: self.norm, eps: self.eps.clone() }
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

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        Ok(p.unrows(self.restarts(p)?))
    }

    fn search_sweep(&self, p: &Problem<'_>, eps: &[f32]) -> Option<Result<Vec<Tensor>>> {
        self.is_single_step().then(|| self.single_step_sweep(p, eps))
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
        let g = Ctx { p, loss: self.loss }.grad(&start, None)?.g;
        let mut dir = crate::budget::steepest(&g, Norm::Linf, 0.0);
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

impl Llc {
    fn inner(&self) -> Box<dyn Algorithm> {
        match self.random {
            true => Box::new(RFgsm::new(self.eps)),
            false => Box::new(Pgd::fgsm(self.eps)),
        }
    }
}

impl Algorithm for Llc {
    fn name(&self) -> String {
        format!("{}LLC(eps={})", if self.random { "R+" } else { "" }, self.eps)
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: Norm::Linf, eps: Epsilon::Scalar(self.eps) }
    }

    fn validate(&self) -> Result<()> {
        self.inner().validate()
    }

    /// The goal argument is ignored: this attack always targets the least-likely class.
    fn fixed_goal(&self) -> Option<Goal> {
        Some(Goal::LeastLikely)
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        self.inner().search(p)
    }

    fn search_sweep(&self, p: &Problem<'_>, eps: &[f32]) -> Option<Result<Vec<Tensor>>> {
        self.inner().search_sweep(p, eps)
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
