//! Particle-swarm attack in the style of Mosli et al. 2019 ("They Might NOT Be Giants: Crafting Black-Box
//! Adversarial Examples with Fewer Queries Using Particle Swarm Optimization"): a swarm of perturbations in the
//! L∞ ε-box moved by inertia, cognitive and social terms, followed by a reduction step.

use armoury::attack::{Access, Algorithm, Budget, Problem};
use armoury::{Error, Result, Tensor};
use ndarray::Axis;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{rand_sign, search_scored, Ctx, Queries};
use crate::budget::{Epsilon, Norm};

/// Particle swarm optimisation with an L∞ budget.
///
/// As in AdversarialPSO the swarm moves blocks of pixels, coarse to fine: a particle is one value per b×b block
/// (per channel), starting at a random vertex of the ε-box (every block moved by ±ε), with velocities
/// U(−ε, ε); when the swarm's best stalls for `patience` iterations the blocks are halved, carrying every
/// particle over (4×4 → 2×2 → pixels by default). Each iteration updates
/// v ← w·v + c₁r₁(pbest − x) + c₂r₂(gbest − x) with r per coordinate, clamps |v| ≤ `vmax`·ε, moves and clips
/// to the ε-box, and evaluates the whole swarm in one batched query. Fitness is GenAttack's (log-probability of
/// the goal class against the rest). The global best is the best-so-far; on success the reduction step moves
/// blocks of values back to the clean input while it stays adversarial (at most `reduction_queries`, within
/// the budget). Deviation from Mosli et al.: square blocks instead of their image-dependent pixel grouping, and
/// a fixed inertia; the swarm update itself is standard PSO (Kennedy & Eberhart).
#[derive(Clone, Debug)]
pub struct ParticleSwarm {
    /// L∞ budget ε.
    pub eps: Epsilon,
    /// Queries per sample, including the clean query and the reduction.
    pub max_queries: u64,
    /// Number of particles.
    pub particles: usize,
    /// Inertia weight w.
    pub inertia: f32,
    /// Cognitive coefficient c₁ (pull toward the particle's own best).
    pub cognitive: f32,
    /// Social coefficient c₂ (pull toward the swarm's best).
    pub social: f32,
    /// Velocity limit as a multiple of ε.
    pub vmax: f32,
    /// Block sizes of the search, coarse to fine: the swarm moves blocks of b×b pixels together and refines to
    /// the next size when the swarm's best has not improved for `patience` iterations (pixels last).
    pub blocks: Vec<usize>,
    /// Iterations without improvement before refining the blocks.
    pub patience: usize,
    /// Fraction of a particle's blocks set to a random ±ε after each move (turbulence, for exploration).
    pub turbulence: f32,
    /// Queries the reduction step may spend after success.
    pub reduction_queries: u64,
}

impl ParticleSwarm {
    /// 10 particles, Clerc's constriction values w = 0.7298, c₁ = c₂ = 1.49618, |v| ≤ ε, blocks 4 → 2 → 1
    /// with patience 20, 10,000 queries, up to 500 for the reduction.
    pub fn new(eps: f32) -> ParticleSwarm {
        ParticleSwarm {
            eps: Epsilon::Scalar(eps),
            max_queries: 10_000,
            particles: 10,
            inertia: 0.7298,
            cognitive: 1.49618,
            social: 1.49618,
            vmax: 1.0,
            blocks: vec![4, 2, 1],
            patience: 20,
            turbulence: 0.01,
            reduction_queries: 500,
        }
    }

    fn attack(&self, ctx: &Ctx) -> Result<Vec<f32>> {
        let mut rng = ChaCha8Rng::seed_from_u64(ctx.seed);
        if ctx.success(ctx.probs(ctx.x.clone())?.row(0)) {
            return Ok(ctx.x.clone());
        }
        let n = (self.particles as u64).min(ctx.remaining()) as usize;
        if n == 0 {
            return Ok(ctx.x.clone());
        }
        let (c, h, w) = ctx.chw;
        let e = ctx.eps;
        let vmax = self.vmax * e;
        let mut levels: Vec<usize> = self.blocks.iter().copied().filter(|&b| b > 0).collect();
        levels.dedup();
        if levels.last() != Some(&1) {
            levels.push(1);
        }
        let mut level = 0;
        let mut grid = Grid::new(c, h, w, levels[0]);
        let mut pos: Vec<Vec<f32>> =
            (0..n).map(|_| (0..grid.cells).map(|_| rand_sign(&mut rng) * e).collect()).collect();
        let mut vel: Vec<Vec<f32>> =
            (0..n).map(|_| (0..grid.cells).map(|_| e * (2.0 * rng.random::<f32>() - 1.0)).collect()).collect();
        let mut pbest = pos.clone();
        let mut pfit = vec![f32::NEG_INFINITY; n];
        let mut gbest = (f32::NEG_INFINITY, pos[0].clone(), ctx.x.clone());
        let mut stale = 0;
        loop {
            let m = (n as u64).min(ctx.remaining()) as usize;
            if m == 0 {
                break;
            }
            let cands: Vec<Vec<f32>> = pos[..m].iter().map(|p| grid.image(ctx, p)).collect();
            let probs = ctx.probs(cands.concat())?;
            stale += 1;
            for (i, r) in probs.axis_iter(Axis(0)).enumerate() {
                if ctx.success(r) {
                    return ctx.reduce(cands[i].clone(), self.reduction_queries, &mut rng);
                }
                let f = ctx.fitness(r);
                if f > pfit[i] {
                    pfit[i] = f;
                    pbest[i] = pos[i].clone();
                }
                if f > gbest.0 {
                    gbest = (f, pos[i].clone(), cands[i].clone());
                    stale = 0;
                }
            }
            if stale >= self.patience && level + 1 < levels.len() {
                // Refine the grid: every particle, velocity and best is carried over to the finer blocks.
                level += 1;
                let fine = Grid::new(c, h, w, levels[level]);
                for v in pos.iter_mut().chain(vel.iter_mut()).chain(pbest.iter_mut()) {
                    *v = fine.refine(&grid, v);
                }
                gbest.1 = fine.refine(&grid, &gbest.1);
                grid = fine;
                stale = 0;
            }
            for i in 0..n {
                for j in 0..grid.cells {
                    let (r1, r2) = (rng.random::<f32>(), rng.random::<f32>());
                    let v = self.inertia * vel[i][j]
                        + self.cognitive * r1 * (pbest[i][j] - pos[i][j])
                        + self.social * r2 * (gbest.1[j] - pos[i][j]);
                    vel[i][j] = v.clamp(-vmax, vmax);
                    pos[i][j] = (pos[i][j] + vel[i][j]).clamp(-e, e);
                }
                // Turbulence: a few random blocks jump to a random vertex value, so the swarm keeps exploring.
                for _ in 0..((grid.cells as f32 * self.turbulence).ceil() as usize) {
                    let j = rng.random_range(0..grid.cells);
                    pos[i][j] = rand_sign(&mut rng) * e;
                }
            }
        }
        Ok(gbest.2)
    }
}

/// Square blocks of pixels moved together: cell (ch, ⌊r/b⌋, ⌊col/b⌋) per pixel.
struct Grid {
    b: usize,
    gh: usize,
    gw: usize,
    cells: usize,
    h: usize,
    w: usize,
}

impl Grid {
    fn new(c: usize, h: usize, w: usize, b: usize) -> Grid {
        let (gh, gw) = (h.div_ceil(b), w.div_ceil(b));
        Grid { b, gh, gw, cells: c * gh * gw, h, w }
    }

    fn cell(&self, j: usize) -> usize {
        let (ch, r, col) = (j / (self.h * self.w), (j / self.w) % self.h, j % self.w);
        (ch * self.gh + r / self.b) * self.gw + col / self.b
    }

    /// x + the block perturbation, clipped to the ε-box.
    fn image(&self, ctx: &Ctx, p: &[f32]) -> Vec<f32> {
        let mut img: Vec<f32> = ctx.x.iter().enumerate().map(|(j, &xv)| xv + p[self.cell(j)]).collect();
        ctx.clamp_box(&mut img);
        img
    }

    /// A coarser grid's values on this grid (each fine cell takes the value of the coarse cell holding its
    /// first pixel).
    fn refine(&self, coarse: &Grid, v: &[f32]) -> Vec<f32> {
        let c = self.cells / (self.gh * self.gw);
        let mut out = vec![0.0; self.cells];
        for ch in 0..c {
            for r in 0..self.gh {
                for col in 0..self.gw {
                    let j = (ch * self.h + r * self.b) * self.w + col * self.b;
                    out[(ch * self.gh + r) * self.gw + col] = v[coarse.cell(j)];
                }
            }
        }
        out
    }
}

impl Algorithm for ParticleSwarm {
    fn name(&self) -> String {
        format!("PSO(eps={}, queries={}, particles={})", self.eps.describe(), self.max_queries, self.particles)
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
        if self.particles == 0 {
            return Err(Error::invalid("pso", "at least one particle"));
        }
        for (what, v) in
            [("inertia", self.inertia), ("cognitive", self.cognitive), ("social", self.social), ("vmax", self.vmax)]
        {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::invalid("pso", format!("{what} = {v} must be finite and ≥ 0")));
            }
        }
        Ok(())
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        search_scored(p, Queries { max_queries: self.max_queries, topk: None }, |ctx| self.attack(ctx))
    }
}
