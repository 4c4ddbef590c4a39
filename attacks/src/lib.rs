//! # armoury-attacks
//!
//! Adversarial attacks on any [`armoury::Classifier`], each implementing the core's [`armoury::Attack`]
//! contract: one call takes the classifier, the inputs, their labels and a [`armoury::Goal`], and returns
//! per-sample results (adversarial inputs within bounds and budget, success re-evaluated on them, L0/L1/L2/L∞
//! norms, gradient evaluations).
//!
//! ```
//! use armoury::{data, nn, Attack, Goal, ModuleClassifier};
//! use armoury_attacks::Pgd;
//! let set = data::sample()?;
//! let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
//! let (x, y) = set.test.batch(0..8)?;
//! let result = Pgd { steps: 10, ..Pgd::linf(0.1) }.run(&model, &x, &y, &Goal::Untargeted, 0)?;
//! assert!(result.norms.iter().all(|n| n.linf <= 0.1 * (1.0 + 1e-6)));
//! # Ok::<(), armoury::Error>(())
//! ```
//!
//! Errors are the core's [`armoury::Error`]: the contract lives in the core so every crate can take any attack
//! as `&dyn Attack`, and an attack's misuse (ε < 0, step ≤ 0, labels out of range, wrong shapes) is reported
//! with the same typed variants.
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod apgd;
mod cw;
pub mod decision;
mod deepfool;
mod ead;
mod gradient;
mod jsma;
mod l1_box;
mod lbfgs;
pub mod losses;
pub mod score;

pub use apgd::{checkpoints as apgd_checkpoints, Apgd, ApgdTargeted};
pub use armoury::attack::budget;
pub use armoury::attack::{Epsilon, Norm};
pub use cw::CarliniWagnerL2;
pub use decision::{BoundaryAttack, HopSkipJump, Pointwise, SaltAndPepper, Start, StepSearch};
pub use deepfool::DeepFool;
pub use ead::{EadRule, ElasticNet};
pub use gradient::{Diversity, Llc, Pgd, RFgsm, UniformNoise, VarianceTuning};
pub use jsma::{Jsma, JsmaMode};
pub use lbfgs::LbfgsB;
pub use losses::Loss;
pub use score::{GenAttack, Nes, NesSetting, ParticleSwarm, SimBA, SimbaBasis, Spsa, SquareAttack};
