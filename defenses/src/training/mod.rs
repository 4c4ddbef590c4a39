//! Adversarial-training methods for Armoury's one training loop ([`armoury::train::Trainer`]): each is a
//! [`Method`] — what one step does to a batch — and the core's trainer runs it (epochs, shuffling, schedule,
//! evaluation, checkpoints). Methods take their attacks as `Box<dyn Attack>`, so any attack — from
//! `armoury-attacks` or your own — drives them; each call gets the step's fresh seed, so random starts differ at
//! every step and every epoch. Inner maximisations a method owns (TRADES's KL ascent, fast AT's FGSM from a
//! random start, free AT's replays, MindArmour's FGSM) are written with [`armoury::attack::budget`].
//!
//! Methods: MindArmour's set, corrected — [`AdversarialDefense`] (a step on given adversarial inputs),
//! [`AdversarialDefenseWithAttacks`] (replace a ratio of each batch, split across attacks),
//! [`NaturalAdversarialDefense`] (FGSM), [`ProjectedAdversarialDefense`] (Madry et al. 2018: PGD from a random
//! start, all-adversarial batches by default) — and beyond it [`EnsembleAdversarialDefense`] (Tramèr et al.
//! 2018), [`Trades`] (Zhang et al. 2019), [`Mart`] (Wang et al. 2020), [`FastAt`] (Wong et al. 2020) and
//! [`FreeAt`] (Shafahi et al. 2019).

mod ensemble;
mod methods;
mod trades;

use armoury::attack::budget::{enforce, rows, sign, unrows, Norm};
use armoury::{Classifier, Reduction, Result, Tensor};

pub use armoury::train::{Method, Standard, StepContext, StepReport};
pub use ensemble::EnsembleAdversarialDefense;
pub use methods::{
    AdversarialDefense, AdversarialDefenseWithAttacks, FastAt, FreeAt, NaturalAdversarialDefense,
    ProjectedAdversarialDefense,
};
pub use trades::{Mart, Trades};

/// One FGSM step (Goodfellow et al. 2015) on cross-entropy from `start` (rows of `x`'s samples): `start +
/// alpha·sign(∇)`, then into the L∞ ball of radius `eps` around `x` and the classifier's bounds, exactly.
pub(crate) fn fgsm_from(
    clf: &dyn Classifier,
    x: &Tensor,
    y: &[usize],
    start: ndarray::Array2<f32>,
    alpha: f32,
    eps: f32,
) -> Result<Tensor> {
    let f = |z: &Tensor, r: std::ops::Range<usize>| z.cross_entropy(&y[r], Reduction::None);
    let t = unrows(start, x.shape());
    let (_, g, _) = clf.gradient(&t, &f)?;
    let g = rows(&g);
    let mut adv = rows(&t);
    adv.zip_mut_with(&g, |a, &gv| *a += alpha * sign(gv));
    let x2 = rows(x);
    enforce(&x2, &mut adv, Norm::Linf, &vec![eps; y.len()], clf.bounds());
    Ok(unrows(adv, x.shape()))
}

/// Checks a budget or weight is a number ≥ 0.
pub(crate) fn check_non_negative(op: &'static str, what: &str, v: f32) -> Result<()> {
    if v.is_nan() || v < 0.0 {
        return Err(armoury::Error::invalid(op, format!("{what} = {v} must be ≥ 0")));
    }
    Ok(())
}
