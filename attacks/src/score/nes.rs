//! NES attacks (Ilyas et al., ICML 2018, "Black-box Adversarial Attacks with Limited Queries and Information"):
//! a natural-evolution-strategies gradient estimate (antithetic Gaussian samples) driving PGD sign steps, in the
//! paper's three threat models — query-limited, partial-information (top-k probabilities) and label-only.

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Classifier, Error, Result, Tensor};
use ndarray::Axis;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{normal, search_scored, Ctx, Queries};
use crate::budget::{sign, Epsilon, Norm};

/// The threat model.
#[derive(Clone, Debug)]
pub enum NesSetting {
    /// Full probability vectors; PGD on the NES estimate of the margin loss's gradient.
    QueryLimited,
    /// Only the `k` largest probabilities are seen (the oracle output is masked). Targeted runs with `starts`
    /// follow the paper's Algorithm 2: start from an image of the target class, ε₀ = its L∞ distance from x,
    /// and shrink ε by `decay` after every step that keeps the target in the top k (halving `decay` and the
    /// step when it does not), down to the budget ε. Untargeted runs (or no `starts`) run the query-limited
    /// loop on the masked output.
    PartialInfo {
        /// Probabilities revealed per query.
        k: usize,
        /// One image per class, [classes, C, H, W]: `starts[t]` should be classified as t.
        starts: Option<Tensor>,
        /// Initial ε decrement δ_ε, in input units.
        decay: f32,
    },
    /// Only the top-1 label is seen. The score is the proxy S(x) = fraction of `copies` noisy copies
    /// x + U(−μ, μ)ᵈ whose label fulfils the goal (the paper's discretised proxy for k = 1); NES ascends it.
    /// Targeted runs with `starts` use the ε-decay of the partial-information setting (a point is admissible
    /// when its own label is the target).
    LabelOnly {
        /// Noise radius μ of the proxy, in input units.
        mu: f32,
        /// Noisy copies per proxy evaluation.
        copies: usize,
        /// One image per class, as for `PartialInfo`.
        starts: Option<Tensor>,
        /// Initial ε decrement δ_ε.
        decay: f32,
    },
}

/// NES with an L∞ budget.
///
/// Each gradient estimate evaluates the current point and `samples` antithetic points x ± σu, u ~ N(0, I), in
/// one batched query (label-only: `copies` noisy copies of each). The step is x ← Π(x − η·sign(ĝ)) with
/// η = `step`·ε. The current point's own query tells success (early stop) and the best point so far (lowest
/// loss) is returned. Sample points are clipped to the input bounds so every query is a valid image.
#[derive(Clone, Debug)]
pub struct Nes {
    /// The threat model.
    pub setting: NesSetting,
    /// L∞ budget ε.
    pub eps: Epsilon,
    /// Queries per sample.
    pub max_queries: u64,
    /// Antithetic evaluations per gradient estimate (n in the paper; pairs = n/2).
    pub samples: usize,
    /// Search variance σ in input units.
    pub sigma: f32,
    /// PGD step as a fraction of ε (η_max).
    pub step: f32,
    /// Momentum on the gradient estimate, ĝ ← μ·ĝ + (1 − μ)·g (Ilyas et al.'s code; 0 = the paper's Algorithm 1).
    pub momentum: f32,
    /// Plateau schedule of the official code: when the current point's loss has not improved for this many
    /// estimates, the step halves (down to η_max/20). 0 turns it off.
    pub plateau: usize,
}

impl Nes {
    /// Query-limited NES: n = 50, σ = 0.001, step ε/5, 10,000 queries.
    pub fn query_limited(eps: f32) -> Nes {
        Nes {
            setting: NesSetting::QueryLimited,
            eps: Epsilon::Scalar(eps),
            max_queries: 10_000,
            samples: 50,
            sigma: 0.001,
            step: 0.2,
            momentum: 0.9,
            plateau: 5,
        }
    }

    /// Partial-information NES with top-`k` probabilities and optional target-class start images.
    pub fn partial_info(eps: f32, k: usize, starts: Option<Tensor>) -> Nes {
        Nes { setting: NesSetting::PartialInfo { k, starts, decay: 0.05 }, ..Nes::query_limited(eps) }
    }

    /// Label-only NES: proxy from 10 noisy copies with μ = ε, n = 20, σ = 0.01.
    pub fn label_only(eps: f32, starts: Option<Tensor>) -> Nes {
        Nes {
            setting: NesSetting::LabelOnly { mu: eps, copies: 10, starts, decay: 0.05 },
            samples: 20,
            sigma: 0.01,
            ..Nes::query_limited(eps)
        }
    }

    /// The checks that need the model: k of at most its class count, start images of its input shape.
    fn check_model(&self, model: &dyn Classifier) -> Result<()> {
        let (k, starts) = match &self.setting {
            NesSetting::QueryLimited => (None, None),
            NesSetting::PartialInfo { k, starts, .. } => (Some(*k), starts.as_ref()),
            NesSetting::LabelOnly { starts, .. } => (None, starts.as_ref()),
        };
        if let Some(k) = k.filter(|&k| k > model.num_classes()) {
            return Err(Error::invalid("nes", format!("top-k with k = {k} of {} classes", model.num_classes())));
        }
        if let Some(s) = starts {
            let mut want = vec![model.num_classes()];
            want.extend_from_slice(model.input_shape());
            if s.shape() != want.as_slice() {
                return Err(Error::ShapeMismatch { op: "nes starts", expected: want, got: s.shape().to_vec() });
            }
            if !s.all_finite() {
                return Err(Error::NonFinite { op: "nes starts" });
            }
        }
        Ok(())
    }

    /// Queries per evaluated point (label-only: one per noisy copy).
    fn cost(&self) -> u64 {
        match self.setting {
            NesSetting::LabelOnly { copies, .. } => copies as u64,
            _ => 1,
        }
    }

    /// Loss of a probability vector (minimised): −log p_t for targeted partial information (the paper's
    /// objective), the log-probability margin otherwise.
    fn loss(&self, ctx: &Ctx, p: ndarray::ArrayView1<f32>) -> f32 {
        match (&self.setting, ctx.target) {
            (NesSetting::PartialInfo { .. }, Some(t)) => -p[t].max(f32::MIN_POSITIVE).ln(),
            _ => ctx.margin(p),
        }
    }

    /// Evaluates the center (one query) and, in the same batch, the losses of `points`. Returns (center
    /// fulfils the goal, center is admissible for the ε-decay, center loss, point losses).
    fn evaluate(
        &self,
        ctx: &Ctx,
        center: &[f32],
        points: &[Vec<f32>],
        rng: &mut ChaCha8Rng,
    ) -> Result<(bool, bool, f32, Vec<f32>)> {
        let mut data = center.to_vec();
        match &self.setting {
            NesSetting::LabelOnly { mu, copies, .. } => {
                for p in points {
                    for _ in 0..*copies {
                        let mut c: Vec<f32> = p.iter().map(|&v| v + mu * (2.0 * rng.random::<f32>() - 1.0)).collect();
                        ctx.clamp_bounds(&mut c);
                        data.extend_from_slice(&c);
                    }
                }
                let labels = ctx.labels(data)?;
                let ok = ctx.goal_met(labels[0]);
                let losses = labels[1..]
                    .chunks(*copies)
                    .map(|ch| -(ch.iter().filter(|&&l| ctx.goal_met(l)).count() as f32) / *copies as f32)
                    .collect();
                Ok((ok, ok, if ok { -1.0 } else { 0.0 }, losses))
            }
            _ => {
                points.iter().for_each(|p| data.extend_from_slice(p));
                let probs = ctx.probs(data)?;
                let p0 = probs.row(0);
                let admissible = ctx.target.is_none_or(|t| p0[t] > 0.0);
                let losses = probs.axis_iter(Axis(0)).skip(1).map(|r| self.loss(ctx, r)).collect();
                Ok((ctx.success(p0), admissible, self.loss(ctx, p0), losses))
            }
        }
    }

    fn admissible(&self, ctx: &Ctx, cand: &[f32]) -> Result<bool> {
        Ok(match &self.setting {
            NesSetting::LabelOnly { .. } => ctx.goal_met(ctx.labels(cand.to_vec())?[0]),
            _ => {
                let p = ctx.probs1(cand)?;
                ctx.target.is_none_or(|t| p[t] > 0.0)
            }
        })
    }

    fn starts(&self) -> (Option<&Tensor>, f32) {
        match &self.setting {
            NesSetting::QueryLimited => (None, 0.0),
            NesSetting::PartialInfo { starts, decay, .. } | NesSetting::LabelOnly { starts, decay, .. } => {
                (starts.as_ref(), *decay)
            }
        }
    }

    /// Partial-information ε-decay (Ilyas et al. 2018, Algorithm 2): one signed step along `g` into a box shrunk
    /// by `decay`, halving the step until the point stays admissible and, below 1/64 of `eta`, the decay itself.
    fn shrink_box(
        &self,
        ctx: &Ctx,
        cur: &mut Vec<f32>,
        (cur_eps, decay): (&mut f32, &mut f32),
        g: &[f32],
        eta: f32,
    ) -> Result<()> {
        let eta_min = eta / 64.0;
        let mut lr = eta;
        let mut next = (*cur_eps - *decay).max(ctx.eps);
        while ctx.remaining() > 0 {
            let mut cand: Vec<f32> = cur
                .iter()
                .zip(g)
                .zip(&ctx.x)
                .map(|((&c, &gv), &xv)| (c - lr * sign(gv)).clamp(xv - next, xv + next))
                .collect();
            ctx.clamp_bounds(&mut cand);
            if self.admissible(ctx, &cand)? {
                *cur = cand;
                *cur_eps = next;
                break;
            }
            lr /= 2.0;
            if lr < eta_min {
                *decay /= 2.0;
                lr = eta;
                next = (*cur_eps - *decay).max(ctx.eps);
                if *decay < 1e-6 {
                    break;
                }
            }
        }
        Ok(())
    }

    fn attack(&self, ctx: &Ctx) -> Result<Vec<f32>> {
        let mut rng = ChaCha8Rng::seed_from_u64(ctx.seed);
        let d = ctx.dim();
        // The clean query.
        let clean_ok = match self.setting {
            NesSetting::LabelOnly { .. } => ctx.goal_met(ctx.labels(ctx.x.clone())?[0]),
            _ => ctx.success(ctx.probs(ctx.x.clone())?.row(0)),
        };
        if clean_ok {
            return Ok(ctx.x.clone());
        }
        let (starts, mut decay) = self.starts();
        let mut cur = ctx.x.clone();
        let mut cur_eps = ctx.eps;
        if let (Some(s), Some(t)) = (starts, ctx.target) {
            let mut start: Vec<f32> = s.value().index_axis(Axis(0), t).iter().copied().collect();
            ctx.clamp_bounds(&mut start);
            if ctx.remaining() > 0 && self.admissible(ctx, &start)? {
                cur_eps = start.iter().zip(&ctx.x).fold(ctx.eps, |m, (a, b)| m.max((a - b).abs()));
                cur = start;
            }
        }
        let eta = self.step * ctx.eps;
        let mut lr = eta;
        let mut mom = vec![0.0f32; d];
        let (mut since, mut plateau_best) = (0usize, f32::INFINITY);
        let mut best = (f32::INFINITY, ctx.x.clone());
        let pairs_max = (self.samples / 2) as u64;
        while ctx.remaining() > 0 {
            let pairs = pairs_max.min((ctx.remaining() - 1) / (2 * self.cost())) as usize;
            let us: Vec<Vec<f32>> = (0..pairs).map(|_| normal(&mut rng, d)).collect();
            let mut points = Vec::with_capacity(2 * pairs);
            for u in &us {
                for s in [1.0f32, -1.0] {
                    let mut p: Vec<f32> = cur.iter().zip(u).map(|(&c, &g)| c + s * self.sigma * g).collect();
                    ctx.clamp_bounds(&mut p);
                    points.push(p);
                }
            }
            let (ok, _, loss, losses) = self.evaluate(ctx, &cur, &points, &mut rng)?;
            let feasible = cur_eps <= ctx.eps;
            if ok && feasible {
                return Ok(cur);
            }
            if feasible && loss < best.0 {
                best = (loss, cur.clone());
            }
            if pairs == 0 {
                break;
            }
            let mut g = vec![0.0f32; d];
            for (k, u) in us.iter().enumerate() {
                let diff = (losses[2 * k] - losses[2 * k + 1]) / (2.0 * self.sigma * pairs as f32);
                g.iter_mut().zip(u).for_each(|(gv, &uv)| *gv += diff * uv);
            }
            mom.iter_mut().zip(&g).for_each(|(m, &gv)| *m = self.momentum * *m + (1.0 - self.momentum) * gv);
            if feasible {
                if self.plateau > 0 {
                    if loss < plateau_best {
                        (plateau_best, since) = (loss, 0);
                    } else {
                        since += 1;
                        if since >= self.plateau {
                            (lr, since) = ((lr / 2.0).max(eta / 20.0), 0);
                        }
                    }
                }
                cur.iter_mut().zip(&mom).for_each(|(c, &gv)| *c -= lr * sign(gv));
                ctx.clamp_box(&mut cur);
                continue;
            }
            self.shrink_box(ctx, &mut cur, (&mut cur_eps, &mut decay), &mom, eta)?;
            if cur_eps <= ctx.eps {
                ctx.clamp_box(&mut cur);
            }
        }
        Ok(if best.0.is_finite() { best.1 } else { cur })
    }
}

impl Algorithm for Nes {
    fn name(&self) -> String {
        let setting = match &self.setting {
            NesSetting::QueryLimited => "QL".to_string(),
            NesSetting::PartialInfo { k, .. } => format!("PI-top{k}"),
            NesSetting::LabelOnly { .. } => "LO".to_string(),
        };
        format!(
            "NES-{setting}(eps={}, queries={}, n={}, sigma={})",
            self.eps.describe(),
            self.max_queries,
            self.samples,
            self.sigma
        )
    }

    fn access(&self) -> Access {
        match self.setting {
            NesSetting::LabelOnly { .. } => Access::Labels,
            _ => Access::Scores,
        }
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: Norm::Linf, eps: self.eps.clone() }
    }

    fn query_budget(&self) -> Option<u64> {
        Some(self.max_queries)
    }

    fn validate(&self) -> Result<()> {
        if self.samples < 2 {
            return Err(Error::invalid("nes", "at least 2 samples (one antithetic pair) per estimate"));
        }
        crate::budget::check_positive("nes", "sigma", self.sigma)?;
        crate::budget::check_positive("nes", "step", self.step)?;
        match &self.setting {
            NesSetting::QueryLimited => {}
            NesSetting::PartialInfo { k, decay, .. } => {
                if *k == 0 {
                    return Err(Error::invalid("nes", "top-k with k = 0: at least one probability must be seen"));
                }
                crate::budget::check_positive("nes", "decay", *decay)?;
            }
            NesSetting::LabelOnly { mu, copies, decay, .. } => {
                crate::budget::check_positive("nes", "mu", *mu)?;
                crate::budget::check_positive("nes", "decay", *decay)?;
                if *copies == 0 {
                    return Err(Error::invalid("nes", "label-only proxy needs at least one copy"));
                }
            }
        }
        Ok(())
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        self.check_model(p.model)?;
        let topk = match self.setting {
            NesSetting::PartialInfo { k, .. } => Some(k),
            _ => None,
        };
        search_scored(p, Queries { max_queries: self.max_queries, topk }, |ctx| self.attack(ctx))
    }
}
