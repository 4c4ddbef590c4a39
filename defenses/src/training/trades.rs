//! TRADES (Zhang et al. 2019) and MART (Wang et al. 2020): losses that trade clean accuracy against robustness
//! through a KL term between the clean and the adversarial predictions.

use armoury::attack::budget::{enforce, rows, sign, unrows, Norm};
use armoury::seed::sample_seed;
use armoury::train::{correct, Method, StepContext, StepReport};
use armoury::{Attack, Error, Goal, Reduction, Result, Tensor};
use ndarray::{Array2, Axis};
use rayon::prelude::*;

use super::check_non_negative;

/// TRADES: minimise CE(f(x), y) + β·KL(f(x) ‖ f(x′)), with x′ maximising the KL inside the ε-ball (L∞) by `steps`
/// sign steps of `step_size` from x + 0.001·N(0, I), as the authors' code does.
pub struct Trades {
    /// Budget ε.
    pub eps: f32,
    /// Inner step size.
    pub step_size: f32,
    /// Inner steps.
    pub steps: usize,
    /// Weight β of the robustness term.
    pub beta: f32,
}

impl Trades {
    /// β = 6 with `steps` steps of `step_size`.
    pub fn new(eps: f32, step_size: f32, steps: usize) -> Self {
        Trades { eps, step_size, steps, beta: 6.0 }
    }
}

/// Per-sample KL(p ‖ softmax(z)) for the rows `range` of the clean probabilities `p`.
fn kl_rows(z: &Tensor, p: &Array2<f32>, range: std::ops::Range<usize>) -> Result<Tensor> {
    let target = Tensor::new(p.slice(ndarray::s![range, ..]).to_owned().into_dyn());
    let logq = z.log_softmax(1)?;
    // Σ_j p_j (ln p_j − ln q_j) per sample: kl_div with Reduction::None returns one value per sample.
    logq.kl_div(&target, Reduction::None)
}

impl Method for Trades {
    fn kind(&self) -> &'static str {
        "trades"
    }

    fn name(&self) -> String {
        format!("trades(eps {}, beta {}, {} steps of {})", self.eps, self.beta, self.steps, self.step_size)
    }

    fn validate(&self) -> Result<()> {
        check_non_negative("trades", "β", self.beta)?;
        check_non_negative("trades", "ε", self.eps)
    }

    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        self.validate()?;
        let (clf, model) = (ctx.classifier, ctx.model);
        let bounds = clf.bounds();
        let n = x.shape().first().copied().unwrap_or(0);
        // The clean logits. When the model computes the same function in both modes (no dropout, no BatchNorm),
        // the training-mode forward of the loss below, built now and kept with its graph, also gives the
        // attack's clean probabilities: one forward pass fewer per step. Otherwise the evaluation-mode
        // classifier gives them, and the loss runs its own clean forward.
        let pieces = armoury::train::piece_ranges(model, n);
        let clean: Option<Vec<Tensor>> = if model.mode_independent() {
            let zs = pieces
                .par_iter()
                .map(|r| armoury::enable_grad(|| model.forward_t(&x.narrow(0, r.start, r.len())?, true)))
                .collect::<Result<Vec<_>>>()?;
            Some(zs)
        } else {
            None
        };
        let z = match &clean {
            Some(zs) => Tensor::concat(zs, 0)?
                .detach()
                .into_array()
                .into_dimensionality()
                .map_err(|_| Error::invalid("trades", "the model's output must be logits [N, classes]"))?,
            None => clf.logits(x)?,
        };
        let p_clean = armoury::classifier::softmax_rows(&z);
        let x2 = rows(x);
        let d = x2.ncols();
        let eps = vec![self.eps; n];
        // x′ = x + 0.001·N(0, I), then sign ascent on KL(p_clean ‖ f(x′)).
        let seed = ctx.seed;
        let mut adv = x2.clone();
        // Rows in parallel, each from its own generator (so the thread count does not matter).
        adv.axis_iter_mut(Axis(0)).into_par_iter().zip(x2.axis_iter(Axis(0))).for_each(|(mut r, xr)| {
            let mut rng = armoury::seed::rng(sample_seed(seed, 1, xr.as_slice().expect("rows")));
            let z = armoury::seed::normal_vec(&mut rng, d);
            r.iter_mut().zip(&z).for_each(|(v, g)| *v += 0.001 * g);
        });
        enforce(&x2, &mut adv, Norm::Linf, &eps, bounds);
        for _ in 0..self.steps {
            let f = |z: &Tensor, r: std::ops::Range<usize>| kl_rows(z, &p_clean, r);
            // The iterate goes to the classifier and comes back without a copy.
            let t = unrows(std::mem::take(&mut adv), x.shape());
            let (_, g, _) = clf.gradient(&t, &f)?;
            adv = t.into_array().into_shape_with_order((n, d)).expect("N·D elements");
            let gv = g.value();
            let g_std = gv.as_standard_layout();
            let gs = g_std.as_slice().expect("standard layout");
            // Sign step, then into the ε-box around x and the bounds (exact feasibility is enforced once, below);
            // a row at a time over plain slices, which the compiler vectorises.
            let (step, e) = (self.step_size, self.eps);
            let xs = x2.as_slice().expect("rows");
            adv.as_slice_mut()
                .expect("rows")
                .par_chunks_mut(d.max(1))
                .zip(gs.par_chunks(d.max(1)))
                .zip(xs.par_chunks(d.max(1)))
                .for_each(|((a, g), xr)| {
                    for ((a, &gv), &xv) in a.iter_mut().zip(g).zip(xr) {
                        *a = (*a + step * sign(gv)).max(xv - e).min(xv + e).max(bounds.0).min(bounds.1);
                    }
                });
        }
        enforce(&x2, &mut adv, Norm::Linf, &eps, bounds);
        let x_adv = unrows(adv, x.shape());
        let (loss, correct) = ctx.optimise_pieces(n, |r| {
            let kept = clean.as_ref().and_then(|zs| pieces.iter().position(|q| *q == r).map(|i| zs[i].clone()));
            let z_clean = match kept {
                Some(z) => z,
                None => model.forward_t(&x.narrow(0, r.start, r.len())?, true)?,
            };
            let z_adv = model.forward_t(&x_adv.narrow(0, r.start, r.len())?, true)?;
            let natural = z_clean.cross_entropy(&y[r.clone()], Reduction::Sum)?;
            let robust = z_adv.log_softmax(1)?.kl_div(&z_clean.softmax(1)?, Reduction::Sum)?;
            Ok((natural.add(&robust.mul_scalar(self.beta))?, correct(&z_clean, &y[r])))
        })?;
        Ok(StepReport::of(loss, correct, n))
    }
}

/// MART: BCE(f(x′), y) + λ·KL(f(x) ‖ f(x′))·(1 − p_y(x)), with x′ from PGD on cross-entropy; BCE(p, y) =
/// −ln p_y − ln(1 − max_{k≠y} p_k) ("boosted" cross-entropy) and misclassification-aware weighting.
pub struct Mart {
    /// The inner attack (PGD-L∞ on cross-entropy from a random start in the paper), given the step's seed.
    pub attack: Box<dyn Attack>,
    /// Weight λ (6 in the paper's experiments).
    pub lambda: f32,
}

impl Mart {
    /// The paper's λ = 6 with `attack` making x′.
    pub fn new(attack: Box<dyn Attack>) -> Self {
        Mart { attack, lambda: 6.0 }
    }
}

impl Method for Mart {
    fn kind(&self) -> &'static str {
        "mart"
    }

    fn name(&self) -> String {
        format!("mart({}, lambda {})", self.attack.name(), self.lambda)
    }

    fn validate(&self) -> Result<()> {
        check_non_negative("mart", "λ", self.lambda)
    }

    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let x_adv = self.attack.generate(ctx.classifier, x, y, &Goal::Untargeted, ctx.seed)?;
        let n = y.len();
        let model = ctx.model;
        let (loss, correct) = ctx.optimise_pieces(n, |r| {
            let y = &y[r.clone()];
            let z_clean = model.forward_t(&x.narrow(0, r.start, r.len())?, true)?;
            let z_adv = model.forward_t(&x_adv.narrow(0, r.start, r.len())?, true)?;
            let p_adv = z_adv.softmax(1)?;
            // boosted CE: −ln p_y(x′) − ln(1.0001 − max_{k≠y} p_k(x′))
            let mut mask = ndarray::ArrayD::from_elem(ndarray::IxDyn(&[r.len(), p_adv.shape()[1]]), false);
            for (i, &l) in y.iter().enumerate() {
                mask[[i, l]] = true;
            }
            let other = p_adv.masked_fill(&mask, f32::NEG_INFINITY)?.max(1, false)?;
            let bce = z_adv.cross_entropy(y, Reduction::None)?.sub(&other.neg().add_scalar(1.0001).log())?.sum_all();
            let p_clean = z_clean.softmax(1)?;
            let true_prob = p_clean.pick(y)?;
            let kl = p_adv.add_scalar(1e-12).log().kl_div(&p_clean, Reduction::None)?;
            let weighted = kl.mul(&true_prob.neg().add_scalar(1.0000001))?.sum_all();
            Ok((bce.add(&weighted.mul_scalar(self.lambda))?, correct(&z_adv, y)))
        })?;
        Ok(StepReport::of(loss, correct, n))
    }
}
