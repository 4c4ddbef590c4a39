//! SPSA (Uesato et al., ICML 2018, "Adversarial Risk and the Dangers of Evaluating Against Weak Attacks"):
//! simultaneous-perturbation gradient estimates from Rademacher directions, fed to Adam, projected onto the
//! L∞ ε-ball.

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Result, Tensor};
use ndarray::Axis;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{rand_sign, search_scored, Ctx, Queries};
use crate::budget::{check_positive, Epsilon, Norm};

/// SPSA with Adam, L∞ budget.
///
/// After the clean query, each step evaluates the current point and `pairs` pairs x ± δv, v ∈ {−1, 1}ᵈ, in one batched query, and
/// estimates ∇ = mean of (L(x+δv) − L(x−δv))/(2δ)·v for the log-probability margin loss L (the paper uses the
/// logit margin; only probabilities are visible here). Adam (β₁ = 0.9, β₂ = 0.999) takes a step of `lr`·ε,
/// then the point is projected onto the ε-box and the bounds. The current point's own query gives early stop
/// and the best point so far.
#[derive(Clone, Debug)]
pub struct Spsa {
    /// L∞ budget ε.
    pub eps: Epsilon,
    /// Queries per sample.
    pub max_queries: u64,
    /// Perturbation size δ in input units.
    pub delta: f32,
    /// Adam learning rate as a fraction of ε.
    pub lr: f32,
    /// Perturbation pairs per estimate (a batch of 2·pairs + 1 queries).
    pub pairs: usize,
}

impl Spsa {
    /// δ = 0.01, Adam lr = ε/10, 32 pairs per step, 10,000 queries.
    pub fn new(eps: f32) -> Spsa {
        Spsa { eps: Epsilon::Scalar(eps), max_queries: 10_000, delta: 0.01, lr: 0.1, pairs: 32 }
    }

    fn attack(&self, ctx: &Ctx) -> Result<Vec<f32>> {
        let mut rng = ChaCha8Rng::seed_from_u64(ctx.seed);
        let d = ctx.dim();
        let (b1, b2, tiny) = (0.9f64, 0.999f64, 1e-8f64);
        let lr = (self.lr * ctx.eps) as f64;
        let (mut m, mut v) = (vec![0.0f64; d], vec![0.0f64; d]);
        let mut cur = ctx.x.clone();
        let mut best = (f32::INFINITY, ctx.x.clone());
        let mut t = 0i32;
        // The clean query; later batches carry the current point's own query with the pairs.
        let mut known = Some(ctx.probs(ctx.x.clone())?.row(0).to_owned());
        if known.as_ref().is_some_and(|k| ctx.success(k.view())) {
            return Ok(cur);
        }
        while ctx.remaining() > 0 {
            let lead = u64::from(known.is_none());
            let pairs = (self.pairs as u64).min((ctx.remaining() - lead) / 2) as usize;
            let dirs: Vec<Vec<f32>> = (0..pairs).map(|_| (0..d).map(|_| rand_sign(&mut rng)).collect()).collect();
            let mut data = if lead == 1 { cur.clone() } else { Vec::new() };
            for dir in &dirs {
                for s in [1.0f32, -1.0] {
                    let mut p: Vec<f32> = cur.iter().zip(dir).map(|(&c, &g)| c + s * self.delta * g).collect();
                    ctx.clamp_bounds(&mut p);
                    data.extend_from_slice(&p);
                }
            }
            if data.is_empty() {
                break;
            }
            let mut probs = ctx.probs(data)?;
            if let Some(k) = known.take() {
                let mut all = ndarray::Array2::zeros((probs.nrows() + 1, probs.ncols()));
                all.row_mut(0).assign(&k);
                all.slice_mut(ndarray::s![1.., ..]).assign(&probs);
                probs = all;
            }
            if ctx.success(probs.row(0)) {
                return Ok(cur);
            }
            let loss = ctx.margin(probs.row(0));
            if loss < best.0 {
                best = (loss, cur.clone());
            }
            if pairs == 0 {
                break;
            }
            let losses: Vec<f32> = probs.axis_iter(Axis(0)).skip(1).map(|r| ctx.margin(r)).collect();
            let mut g = vec![0.0f64; d];
            for (k, dir) in dirs.iter().enumerate() {
                let diff = (losses[2 * k] - losses[2 * k + 1]) as f64 / (2.0 * self.delta as f64 * pairs as f64);
                g.iter_mut().zip(dir).for_each(|(gv, &s)| *gv += diff * s as f64);
            }
            t += 1;
            let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
            for j in 0..d {
                m[j] = b1 * m[j] + (1.0 - b1) * g[j];
                v[j] = b2 * v[j] + (1.0 - b2) * g[j] * g[j];
                let step = lr * (m[j] / c1) / ((v[j] / c2).sqrt() + tiny);
                cur[j] = (cur[j] as f64 - step) as f32;
            }
            ctx.clamp_box(&mut cur);
        }
        Ok(best.1)
    }
}

impl Algorithm for Spsa {
    fn name(&self) -> String {
        format!(
            "SPSA(eps={}, queries={}, delta={}, pairs={})",
            self.eps.describe(),
            self.max_queries,
            self.delta,
            self.pairs
        )
    }

    fn access(&self) -> Access {
        Access::Scores
    }

    fn budget(&self) -> Budget {
        Budget::Fixed { norm: Norm::Linf, eps: self.eps.clone() }
    }

    fn query_budget(&self) -> Option<u64> {
        Some(self.max_queries)
    }

    fn validate(&self) -> Result<()> {
        check_positive("spsa", "delta", self.delta)?;
        check_positive("spsa", "lr", self.lr)?;
        if self.pairs == 0 {
            return Err(armoury::Error::invalid("spsa", "at least one perturbation pair per step"));
        }
        Ok(())
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        search_scored(p, Queries { max_queries: self.max_queries, topk: None }, |ctx| self.attack(ctx))
    }
}
