//! EAD, elastic-net attacks (Chen, Sharma, Zhang, Yi & Hsieh 2018, "EAD: Elastic-Net Attacks to Deep Neural
//! Networks via Adversarial Examples").
//!
//! Minimises c·f(x') + ‖x' − x‖₂² + β‖x' − x‖₁ over the box with FISTA: a gradient step of the smooth part
//! g = c·f + ‖·‖₂² at the slack point y_k (learning rate decaying as lr·√(1 − k/steps)), the projected
//! shrinkage-thresholding operator S_β onto [lo, hi] (coordinates within β of x snap back to x, the others move
//! β toward x and are clipped to the box), and the momentum y_{k+1} = x_{k+1} + k/(k+3)·(x_{k+1} − x_k). f is the
//! CW loss with confidence κ. Each iterate x_{k+1} is judged (with κ) and the best successful one is kept by the
//! elastic-net rule (smallest ‖δ‖₂² + β‖δ‖₁) or the L1 rule (smallest ‖δ‖₁); a per-sample binary search on c
//! follows Carlini's schedule. As in the paper and its code, S_β thresholds at β (not lr·β).
//!
//! Cost per iteration and sample: one gradient (at y_k) and one forward (to judge x_{k+1}). A sample never
//! successful is returned unchanged; one already adversarial is returned unchanged with no work.

use std::ops::Range;

use armoury::attack::{Access, Algorithm, Budget, Norm, Problem};
use armoury::{Result, Tensor};
use ndarray::{Array2, Axis};

use crate::budget::check_positive;
use crate::cw::{check_count, check_kappa, cw_loss, start, subset_gradient, subset_logits, succeeds, Search, Start};

/// Which distance picks EAD's best adversarial example.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EadRule {
    /// Smallest ‖δ‖₁.
    L1,
    /// Smallest ‖δ‖₂² + β‖δ‖₁.
    ElasticNet,
}

/// EAD (elastic-net) attack.
///
/// ```
/// use armoury::{data, nn, Attack, Goal, ModuleClassifier};
/// use armoury_attacks::ElasticNet;
/// let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
/// let (x, y) = data::sample()?.test.batch(0..2)?;
/// let ead = ElasticNet { steps: 10, binary_search_steps: 2, ..ElasticNet::default() };
/// let result = ead.run(&model, &x, &y, &Goal::Untargeted, 0)?;
/// assert!(result.gradients.iter().all(|&g| g <= 20));
/// # Ok::<(), armoury::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ElasticNet {
    /// Weight β of the L1 term (1e-2 in the paper).
    pub beta: f32,
    /// Initial constant c on the loss term.
    pub c: f32,
    /// Confidence κ ≥ 0.
    pub kappa: f32,
    /// FISTA iterations per binary-search step.
    pub steps: usize,
    /// Initial learning rate (1e-2), decayed as lr·√(1 − k/steps).
    pub lr: f32,
    /// Runs with different c per sample (1: c stays fixed).
    pub binary_search_steps: usize,
    /// How the best adversarial example is chosen.
    pub decision: EadRule,
}

impl Default for ElasticNet {
    /// The paper's settings (c = 1e-3, β = 1e-2, κ = 0, lr 1e-2, 9 binary-search steps, EN rule) with 1,000
    /// iterations.
    fn default() -> Self {
        ElasticNet {
            beta: 1e-2,
            c: 1e-3,
            kappa: 0.0,
            steps: 1000,
            lr: 1e-2,
            binary_search_steps: 9,
            decision: EadRule::ElasticNet,
        }
    }
}

impl ElasticNet {
    fn check(&self) -> Result<()> {
        check_positive("ead", "c", self.c)?;
        check_positive("ead", "lr", self.lr)?;
        if !self.beta.is_finite() || self.beta < 0.0 {
            return Err(armoury::Error::invalid("ead", format!("beta = {} must be finite and ≥ 0", self.beta)));
        }
        check_kappa("ead", self.kappa)?;
        check_count("ead", "steps", self.steps)?;
        check_count("ead", "binary_search_steps", self.binary_search_steps)
    }
}

/// S_β onto the box: x + (z − x ∓ β) where |z − x| > β, clipped to [lo, hi]; x elsewhere.
fn shrink(z: f32, x: f32, beta: f32, lo: f32, hi: f32) -> f32 {
    let diff = z - x;
    if diff > beta {
        (z - beta).min(hi)
    } else if diff < -beta {
        (z + beta).max(lo)
    } else {
        x
    }
}

impl Algorithm for ElasticNet {
    fn name(&self) -> String {
        format!(
            "EAD-{}(beta={}, c={}, kappa={}, steps={}, search={})",
            match self.decision {
                EadRule::L1 => "L1",
                EadRule::ElasticNet => "EN",
            },
            self.beta,
            self.c,
            self.kappa,
            self.steps,
            self.binary_search_steps
        )
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    /// EAD minimises the elastic-net distance; its L1 part is the norm it reports and sweeps.
    fn budget(&self) -> Budget {
        Budget::Minimal { norm: Norm::L1 }
    }

    fn validate(&self) -> Result<()> {
        self.check()
    }

    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let (lo, hi) = p.bounds();
        let Start { x2, classes, targeted, already } = start(p, self.kappa)?;
        let n = x2.nrows();
        let idx: Vec<usize> = (0..n).filter(|&i| !already[i]).collect();
        let mut best = x2.clone();
        let mut best_dist = vec![f64::INFINITY; n];
        let mut search = vec![Search::new(self.c); n];
        if idx.is_empty() {
            return Ok(p.unrows(best));
        }
        let xs = x2.select(Axis(0), &idx);
        for _ in 0..self.binary_search_steps {
            let cs: Vec<f32> = idx.iter().map(|&i| search[i].c).collect();
            let cls: Vec<usize> = idx.iter().map(|&i| classes[i]).collect();
            let f = |z: &Tensor, r: Range<usize>| -> Result<Tensor> {
                cw_loss(z, &cls[r.clone()], targeted, self.kappa)?.mul(&Tensor::from_slice(&cs[r.clone()], &[r.len()])?)
            };
            let mut xk = xs.clone();
            let mut yk = xs.clone();
            let mut found = vec![false; idx.len()];
            for k in 0..self.steps {
                let lr = self.lr * (1.0 - k as f32 / self.steps as f32).sqrt();
                let met = |r: usize, z: &[f32]| succeeds(z, classes[idx[r]], targeted, self.kappa);
                let (_, g, _) = subset_gradient(p, &yk, &idx, &f, Some(&met))?;
                let mut next = Array2::<f32>::zeros(xs.dim());
                ndarray::Zip::from(&mut next).and(&yk).and(&g).and(&xs).for_each(|o, &y, &gv, &x0| {
                    // ∇ of c·f + ‖y − x‖₂²
                    let z = y - lr * (gv + 2.0 * (y - x0));
                    *o = shrink(z, x0, self.beta, lo, hi);
                });
                let mom = k as f32 / (k as f32 + 3.0);
                yk = &next + &((&next - &xk) * mom);
                xk = next;
                let z = subset_logits(p, &xk, &idx)?;
                for (r, &i) in idx.iter().enumerate() {
                    if !succeeds(z.row(r).as_slice().expect("rows"), classes[i], targeted, self.kappa) {
                        continue;
                    }
                    found[r] = true;
                    let (mut l1, mut l2) = (0f64, 0f64);
                    for (&a, &b) in xk.row(r).iter().zip(xs.row(r)) {
                        let dlt = (a - b) as f64;
                        l1 += dlt.abs();
                        l2 += dlt * dlt;
                    }
                    let dist = match self.decision {
                        EadRule::L1 => l1,
                        EadRule::ElasticNet => l2 + self.beta as f64 * l1,
                    };
                    if dist < best_dist[i] {
                        best_dist[i] = dist;
                        best.row_mut(i).assign(&xk.row(r));
                    }
                }
            }
            for (r, &i) in idx.iter().enumerate() {
                search[i].update(found[r]);
            }
        }
        Ok(p.unrows(best))
    }
}
