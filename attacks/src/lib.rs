//! # armoury-attacks
//!
//! Adversarial attacks on any [`armoury::Classifier`], each an [`armoury::Attack`]: one call takes the
//! classifier, the inputs, their labels, a [`armoury::Goal`] and a seed, and returns per-sample results —
//! adversarial inputs within the bounds and the budget, success re-evaluated on them, L0/L1/L2/L∞ norms, and the
//! gradients, queries and gradient faults each sample cost. The same seed gives bit-identical results whatever
//! the thread count, the batch size or the order of the samples.
//!
//! ```
//! use armoury::{data, nn, Attack, Goal, ModuleClassifier};
//! use armoury_attacks::Pgd;
//! let set = data::sample()?;
//! let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
//! let (x, y) = set.test.batch(0..8)?;
//! let seed = 0;
//! let result = Pgd { steps: 10, ..Pgd::linf(0.1) }.run(&model, &x, &y, &Goal::Untargeted, seed)?;
//! assert!(result.norms.iter().all(|n| n.linf <= 0.1 * (1.0 + 1e-6)));
//! # Ok::<(), armoury::Error>(())
//! ```
//!
//! ## Evaluating a model
//!
//! [`autoattack`] is AutoAttack's standard evaluation in one call on tensors; [`evaluate::evaluator`] gives an
//! [`armoury::eval::Evaluator`] with this crate's attacks for any threat model (state file for a resumable run,
//! shards, progress). See docs/evaluation.md.
//!
//! ```
//! use armoury::{attack::Norm, data, nn, ModuleClassifier};
//! let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
//! let (x, y) = data::sample()?.test.batch(0..2)?;
//! let result = armoury_attacks::autoattack(&model, &x, &y, Norm::Linf, 8.0 / 255.0)?;
//! assert!(result.robust_accuracy() <= result.clean_accuracy());
//! # Ok::<(), armoury::Error>(())
//! ```
//!
//! ## The template
//!
//! An attack writes its algorithm alone by implementing [`armoury::Algorithm`]: its name, what it reads of the
//! model ([`Access`](armoury::attack::Access): gradients, scores or labels), its budget
//! ([`Budget`](armoury::attack::Budget): a fixed ε in a norm, a minimal perturbation, or none), its settings'
//! checks, and `search` over a validated [`Problem`](armoury::attack::Problem). The core's blanket
//! implementation then gives it [`armoury::Attack`]: it validates, resolves the goal for the access (a label-only
//! attack refuses the least-likely target, a score-based one pays a counted query per sample for it), enforces
//! the budget exactly, re-evaluates success, reports the work the search tallied through the `Problem`, and
//! sweeps ε with successes carried forward (Foolbox's fixed-ε and minimisation base classes, Rauber et al. 2017).
//! Black-box attacks run each sample through its own counting oracle ([`score`], [`decision`]).
//!
//! ## The registry
//!
//! [`registry::by_name`] builds any attack of the crate from a name and [`registry::AttackParams`] (ε, norm,
//! steps, step size, restarts, queries); [`registry::table`] lists every name with a description. The
//! examples, evaluators and fuzzers take attacks by these names, and the integration tests run every name
//! through the shared property checks (feasibility, honest success flags, determinism across threads, batches
//! and permutations, zero budget).
//!
//! ## Adding an attack
//!
//! One file with the attack type and its `impl Algorithm`; one row in the registry ([`registry`]'s table and
//! its constructor match); one row in the integration tests' attack table (`tests/attacks_table.rs`), with a
//! budget small enough for the tiny model. The template and the table's checks do the rest.
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
pub mod evaluate;
mod fab;
mod gradient;
mod jsma;
mod l1_box;
mod lbfgs;
pub mod losses;
pub mod registry;
pub mod score;

pub use apgd::{checkpoints as apgd_checkpoints, Apgd, ApgdTargeted};
pub use armoury::attack::budget;
pub use armoury::attack::{Epsilon, Norm};
pub use cw::CarliniWagnerL2;
pub use decision::{BoundaryAttack, HopSkipJump, Pointwise, SaltAndPepper, Start, StepSearch};
pub use deepfool::DeepFool;
pub use ead::{EadRule, ElasticNet};
pub use evaluate::autoattack;
pub use fab::{project_hyperplane_box, Fab};
pub use gradient::{Diversity, Llc, Pgd, RFgsm, UniformNoise, VarianceTuning};
pub use jsma::{Jsma, JsmaMode};
pub use lbfgs::LbfgsB;
pub use losses::Loss;
pub use score::{GenAttack, Nes, NesSetting, ParticleSwarm, SimBA, SimbaBasis, Spsa, SquareAttack};

/// docs/evaluation.md's Rust examples, run as doctests so the page stays true.
#[cfg(doctest)]
#[doc = include_str!("../../docs/evaluation.md")]
pub struct EvaluationDocs;

/// README.md's Rust examples, run as doctests so the front page stays true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDocs;
