//! The objectives attacks ascend, per sample, for untargeted and targeted goals.

use std::ops::Range;

use armoury::attack::Problem;
use armoury::{Reduction, Resolved, Result, Tensor};
use ndarray::{Array2, ArrayD, IxDyn};

/// Which per-sample objective an attack maximises.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Loss {
    /// Cross-entropy: CE(z, y) untargeted, −CE(z, t) targeted.
    CrossEntropy,
    /// Carlini–Wagner margin clipped at κ: min(max_{j≠y} z_j − z_y, κ) untargeted, min(z_t − max_{j≠t} z_j, κ)
    /// targeted.
    Margin {
        /// Confidence κ.
        kappa: f32,
    },
    /// Difference of logits ratio (Croce & Hein 2020): −(z_y − max_{j≠y} z_j)/(z_π1 − z_π3) untargeted,
    /// −(z_y − z_t)/(z_π1 − (z_π3 + z_π4)/2) targeted (π sorts the logits in decreasing order).
    Dlr,
}

impl Loss {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Loss::CrossEntropy => "ce",
            Loss::Margin { .. } => "margin",
            Loss::Dlr => "dlr",
        }
    }

    /// The objective for the samples `range` of the batch, from their logits `z` [n, K].
    pub fn objective(self, z: &Tensor, range: Range<usize>, labels: &[usize], goal: &Resolved) -> Result<Tensor> {
        let y = &labels[range.clone()];
        match (self, goal) {
            (Loss::CrossEntropy, Resolved::Untargeted) => z.cross_entropy(y, Reduction::None),
            (Loss::CrossEntropy, Resolved::Targeted(t)) => Ok(z.cross_entropy(&t[range], Reduction::None)?.neg()),
            (Loss::Margin { kappa }, Resolved::Untargeted) => Ok(z.cw_margin(y)?.clamp(f32::NEG_INFINITY, kappa)),
            (Loss::Margin { kappa }, Resolved::Targeted(t)) => {
                Ok(z.cw_margin(&t[range])?.neg().clamp(f32::NEG_INFINITY, kappa))
            }
            (Loss::Dlr, goal) => dlr(z, y, goal, range),
        }
    }
}

fn dlr(z: &Tensor, y: &[usize], goal: &Resolved, range: Range<usize>) -> Result<Tensor> {
    let (n, k) = z.dims2("dlr")?;
    let (top, _) = z.topk(k.min(4))?;
    let col = |j: usize| top.narrow(1, j.min(k - 1), 1).and_then(|t| t.reshape(&[n]));
    let zy = z.pick(y)?;
    match goal {
        Resolved::Untargeted => {
            let other = z.cw_margin(y)?.add(&zy)?; // max_{j≠y} z_j
            let denom = col(0)?.sub(&col(2)?)?.add_scalar(1e-12);
            zy.sub(&other)?.div(&denom).map(|t| t.neg())
        }
        Resolved::Targeted(t) => {
            let zt = z.pick(&t[range])?;
            let denom = col(0)?.sub(&col(2)?.add(&col(3)?)?.mul_scalar(0.5))?.add_scalar(1e-12);
            zy.sub(&zt)?.div(&denom).map(|t| t.neg())
        }
    }
}

/// A one-hot mask [n, K] with `true` at `(i, class[i])`.
pub fn one_hot(n: usize, k: usize, class: &[usize]) -> ArrayD<bool> {
    let mut m = ArrayD::from_elem(IxDyn(&[n, k]), false);
    for (i, &c) in class.iter().enumerate() {
        m[[i, c]] = true;
    }
    m
}

/// The largest logit other than `class[i]` and its index, per row.
pub fn best_other(z: &Array2<f32>, class: &[usize]) -> Result<Vec<(usize, f32)>> {
    armoury::attack::best_other(z, class)
}

/// Whether prediction `class` of sample `i` fulfils the problem's goal (never the classifier's rejection class).
pub(crate) fn succeeded(p: &Problem<'_>, i: usize, class: usize) -> bool {
    p.goal.fulfilled_by(p.model, i, p.labels[i], class)
}

/// Sets the non-finite entries of gradient rows to zero: a NaN or infinite gradient (already noted as a fault by
/// the [`Problem`]) gives no direction, instead of a non-finite iterate.
pub(crate) fn zero_non_finite(g: &mut Array2<f32>) {
    if g.iter().any(|v| !v.is_finite()) {
        g.mapv_inplace(|v| if v.is_finite() { v } else { 0.0 });
    }
}
