//! # Armoury
//!
//! Adversarial robustness for image classifiers, in Rust: an autodiff tensor core on `ndarray`, layers and
//! reference models, optimisers, IDX and image-folder data, safetensors and ONNX model files, and the contracts
//! the attack and defense crates, detectors, evaluations and fuzzers program against:
//!
//! - [`Classifier`] ([`classifier`]): bounds, shape and classes; logits, gradients of any per-sample objective,
//!   and named intermediate activations ([`Classifier::activations`], for native and ONNX models alike);
//! - [`Attack`] ([`attack`]): one call with a seed, per-sample results re-evaluated on the returned inputs; an
//!   attack implements [`attack::Algorithm`] and the template does the rest ([`attack::template`]); norms,
//!   budgets and exact projections in [`attack::budget`];
//! - [`Detector`] ([`detector`]): scores, thresholds at a target false-positive rate, and [`Guarded`], a
//!   detector in front of a classifier that any attack can run against;
//! - [`train`]: the one training loop, running any [`train::Method`]; [`robustness`]: clean and robust accuracy
//!   with gradient-masking checks;
//! - [`metrics`]: Wilson intervals, SSIM and MindArmour's attack, defense and neuron metrics; [`report`]: the
//!   evaluation report's data model and its JSON, Markdown and HTML files;
//! - [`eval`]: the evaluation — AutoAttack's worst-case cascade with a per-sample ledger, resumable and sharded,
//!   its identity, summary and report, and the gradient-masking audit; [`eval::Evaluator`] runs it on tensors;
//! - [`seed`]: every random choice's seed, so results are bit-identical whatever the thread count or batch size.
//!
//! How robust is a model? AutoAttack's standard evaluation is one call (`armoury_attacks::autoattack`):
//!
//! ```
//! use armoury::{attack::Norm, data, nn, ModuleClassifier};
//! let model = ModuleClassifier::new(nn::cnn(0), &[1, 28, 28], 10, (0.0, 1.0))?;
//! let (x, y) = data::sample()?.test.batch(0..2)?;
//! let result = armoury_attacks::autoattack(&model, &x, &y, Norm::Linf, 0.1)?;
//! println!("robust accuracy {:.3} of clean {:.3}", result.robust_accuracy(), result.clean_accuracy());
//! # Ok::<(), armoury::Error>(())
//! ```
//!
//! ```
//! use armoury::{Tensor, Reduction};
//! // ∂/∂x of the cross-entropy of a linear model's logits.
//! let x = Tensor::from_vec(vec![0.1, 0.2, 0.7], &[1, 3])?.variable();
//! let loss = x.cross_entropy(&[2], Reduction::Sum)?;
//! let [g] = <[Tensor; 1]>::try_from(loss.grad_wrt(&[&x])?).unwrap();
//! assert_eq!(g.shape(), &[1, 3]);
//! # Ok::<(), armoury::Error>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod autograd;
mod error;
pub mod ops;
mod tensor;

pub use autograd::Gradients;
pub use error::{Error, Result};
pub use ops::{Conv2dParams, Pool2dParams, Reduction, UnaryKind};
pub use tensor::{enable_grad, grad_enabled, no_grad, Array, Tensor, TensorId};
pub mod alloc;
pub mod attack;
pub mod classifier;
pub mod coverage;
pub mod data;
pub mod detector;
pub mod eval;
pub mod fuzz;
pub mod io;
pub mod limits;
pub mod load;
pub mod metrics;
pub mod nn;
pub mod onnx;
pub mod optim;
pub mod profile;
pub mod report;
pub mod robustness;
pub mod seed;
pub mod train;

pub use attack::{Attack, AttackResult, Goal, Norms, Resolved};
pub use classifier::{Activations, Classifier, CountSnapshot, Counters, LabelOracle, ModuleClassifier, ScoreOracle};
pub use detector::{calibrate_threshold, Detector, Guarded};
pub use nn::{Module, ModuleExt, Param, Sequential};
