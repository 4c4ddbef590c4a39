//! The Jacobian-based saliency map attack (Papernot et al. 2016, "The limitations of deep learning in adversarial
//! settings"), targeted, with the pairwise saliency map.
//!
//! Each iteration takes a_i = ∂z_t/∂x_i and b_i = Σ_{j≠t} ∂z_j/∂x_i — exactly two vector–Jacobian products per
//! sample: ∇z_t and ∇(Σ_j z_j − z_t) — picks, among pairs (p, q) of features still in the search domain, the one
//! maximising −α·β with α = a_p + a_q > 0 and β = b_p + b_q < 0 (decrease mode: α < 0, β > 0), moves both by θ
//! (clipped to the bounds) and drops features that reached the bound they are pushed toward. A sample stops when
//! it reaches its target, when no pair qualifies, or when the next pair would change more than ⌊γ·D⌋ distinct
//! features.
//!
//! Notes:
//! - The saliency map uses the logits z (as Carlini & Wagner's "JSMA-Z" and CleverHans do), not the softmax
//!   probabilities of the paper: softmax gradients vanish once the model is confident.
//! - The paper caps the iterations at ⌊γ·D/2⌋; the cap here is on distinct changed features (⌊γ·D⌋), which is
//!   the same when θ saturates a feature in one step (θ = ±1 on [0, 1] images) and still bounds L0 otherwise.
//! - Pairs are searched in O(D²) time and O(D) memory per sample (the D×D pair matrix is never built), in
//!   parallel over samples; each sample's path depends on that sample alone.

use armoury::attack::{Access, Algorithm, Budget, Problem, Resolved};
use armoury::classifier::argmax_rows;
use armoury::{Error, Result, Tensor};
use ndarray::{ArrayView1, Axis};
use rayon::prelude::*;

use crate::budget::{rows, unrows};
use crate::losses::zero_non_finite;

/// Which way JSMA pushes features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsmaMode {
    /// Increase features (θ > 0): pairs with α > 0, β < 0; a feature leaves the domain at the upper bound.
    Increase,
    /// Decrease features (θ < 0): pairs with α < 0, β > 0; a feature leaves the domain at the lower bound.
    Decrease,
}

/// JSMA (Papernot et al. 2016): targeted, L0-bounded.
#[derive(Clone, Debug)]
pub struct Jsma {
    /// Change applied to both features of the chosen pair, in input units; its sign must agree with `mode`
    /// (+1 for increase, −1 for decrease: one step saturates a feature of a [0, 1] image).
    pub theta: f32,
    /// Largest fraction of the features that may change (0.1).
    pub gamma: f32,
    /// Increase or decrease features.
    pub mode: JsmaMode,
}

impl Default for Jsma {
    fn default() -> Self {
        Jsma::increase()
    }
}

impl Jsma {
    /// Increasing JSMA: θ = +1, γ = 0.1.
    pub fn increase() -> Jsma {
        Jsma { theta: 1.0, gamma: 0.1, mode: JsmaMode::Increase }
    }

    /// Decreasing JSMA: θ = −1, γ = 0.1.
    pub fn decrease() -> Jsma {
        Jsma { theta: -1.0, mode: JsmaMode::Decrease, ..Jsma::increase() }
    }

    fn check(&self) -> Result<()> {
        let sign_ok = match self.mode {
            JsmaMode::Increase => self.theta > 0.0,
            JsmaMode::Decrease => self.theta < 0.0,
        };
        if !self.theta.is_finite() || !sign_ok {
            return Err(Error::invalid(
                "jsma",
                format!("θ = {} must be finite with the sign of {:?}", self.theta, self.mode),
            ));
        }
        if !(0.0..=1.0).contains(&self.gamma) {
            return Err(Error::invalid("jsma", format!("γ = {} must be in [0, 1]", self.gamma)));
        }
        Ok(())
    }
}

/// One sample's search state.
struct State {
    domain: Vec<bool>,
    changed: Vec<bool>,
    n_changed: usize,
}

/// The pair (p, q), p < q, of domain features maximising −α·β with α > 0 and β < 0 (on sign-adjusted a, b),
/// changing at most `remaining` features not yet changed. First maximum in (p, q) order.
fn best_pair(
    a: ArrayView1<f32>,
    b: ArrayView1<f32>,
    st: &State,
    sign: f32,
    remaining: usize,
) -> Option<(usize, usize)> {
    let idx: Vec<usize> = (0..st.domain.len()).filter(|&i| st.domain[i]).collect();
    let av: Vec<f32> = idx.iter().map(|&i| sign * a[i]).collect();
    let bv: Vec<f32> = idx.iter().map(|&i| sign * b[i]).collect();
    let fresh: Vec<usize> = idx.iter().map(|&i| usize::from(!st.changed[i])).collect();
    let m = idx.len();
    let (mut best, mut pair) = (f32::NEG_INFINITY, None);
    for i in 0..m {
        let (ai, bi) = (av[i], bv[i]);
        if remaining >= 2 {
            for j in i + 1..m {
                let (al, be) = (ai + av[j], bi + bv[j]);
                if al > 0.0 && be < 0.0 && -al * be > best {
                    best = -al * be;
                    pair = Some((i, j));
                }
            }
        } else {
            for j in i + 1..m {
                let (al, be) = (ai + av[j], bi + bv[j]);
                if fresh[i] + fresh[j] <= remaining && al > 0.0 && be < 0.0 && -al * be > best {
                    best = -al * be;
                    pair = Some((i, j));
                }
            }
        }
    }
    pair.map(|(i, j)| (idx[i], idx[j]))
}

impl Algorithm for Jsma {
    fn name(&self) -> String {
        format!("JSMA(theta={}, gamma={})", self.theta, self.gamma)
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    /// Unbounded for the template: JSMA's budget is a count of changed features (⌊γ·D⌋, an L0 budget), which
    /// [`Budget`]'s norms (L1, L2, L∞) cannot state; the attack enforces it itself.
    fn budget(&self) -> Budget {
        Budget::Unbounded
    }

    fn validate(&self) -> Result<()> {
        self.check()
    }

    /// Targeted goals only (given, random or least-likely targets); an untargeted goal is an error.
    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let Resolved::Targeted(targets) = p.goal else {
            return Err(Error::invalid("jsma", "JSMA is targeted: use Goal::Targeted, RandomTarget or LeastLikely"));
        };
        let shape = p.x.shape().to_vec();
        let x2 = p.rows();
        let mut adv = x2.clone();
        let (n, d) = adv.dim();
        let (lo, hi) = p.bounds();
        let budget = (self.gamma as f64 * d as f64 + 1e-9).floor() as usize;
        let (sign, limit) = match self.mode {
            JsmaMode::Increase => (1.0f32, hi),
            JsmaMode::Decrease => (-1.0f32, lo),
        };
        let mut states: Vec<State> = adv
            .axis_iter(Axis(0))
            .map(|r| State { domain: r.iter().map(|&v| v != limit).collect(), changed: vec![false; d], n_changed: 0 })
            .collect();
        let preds = argmax_rows(&p.logits(p.x, None)?);
        let mut active: Vec<usize> = (0..n).filter(|&i| preds[i] != targets[i]).collect();
        while !active.is_empty() {
            let mut bshape = shape.clone();
            bshape[0] = active.len();
            let xa = unrows(adv.select(Axis(0), &active), &bshape);
            let ta: Vec<usize> = active.iter().map(|&i| targets[i]).collect();
            let fa = |z: &Tensor, r: std::ops::Range<usize>| z.pick(&ta[r]);
            let fb = |z: &Tensor, r: std::ops::Range<usize>| z.sum(&[1], false)?.sub(&z.pick(&ta[r])?);
            let grad = |f: &armoury::attack::template::Objective<'_>| -> Result<ndarray::Array2<f32>> {
                let mut g = rows(&p.gradient(&xa, Some(&active), f)?.1);
                zero_non_finite(&mut g);
                Ok(g)
            };
            let (ga, gb) = (grad(&fa)?, grad(&fb)?);
            let pairs: Vec<Option<(usize, usize)>> = active
                .par_iter()
                .enumerate()
                .map(|(r, &i)| {
                    let st = &states[i];
                    best_pair(ga.row(r), gb.row(r), st, sign, budget.saturating_sub(st.n_changed))
                })
                .collect();
            let mut moved = Vec::with_capacity(active.len());
            for (&i, pair) in active.iter().zip(pairs) {
                let Some((p, q)) = pair else { continue };
                let st = &mut states[i];
                for f in [p, q] {
                    let old = adv[[i, f]];
                    let new = (old + self.theta).clamp(lo, hi);
                    adv[[i, f]] = new;
                    if !st.changed[f] && new != x2[[i, f]] {
                        st.changed[f] = true;
                        st.n_changed += 1;
                    }
                    if new == limit || new == old {
                        st.domain[f] = false;
                    }
                }
                moved.push(i);
            }
            if moved.is_empty() {
                break;
            }
            let mut mshape = shape.clone();
            mshape[0] = moved.len();
            let preds = argmax_rows(&p.logits(&unrows(adv.select(Axis(0), &moved), &mshape), Some(&moved))?);
            active = moved.into_iter().zip(preds).filter(|&(i, p)| p != targets[i]).map(|(i, _)| i).collect();
        }
        Ok(p.unrows(adv))
    }
}
