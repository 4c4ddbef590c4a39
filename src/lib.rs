//! # Armoury
//!
//! Adversarial robustness for image classifiers, in Rust: an autodiff tensor core on `ndarray`, layers and
//! reference models, optimisers and training, IDX and image-folder data, safetensors model files, and the
//! [`Classifier`] contract every attack, defense and detector programs against.
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
pub mod attack;
pub mod classifier;
pub mod data;
pub mod detector;
pub mod io;
pub mod nn;
pub mod onnx;
pub mod optim;
pub mod robustness;
pub mod seed;
pub mod train;

pub use attack::{Attack, AttackResult, Goal, Norms, Resolved};
pub use classifier::{Activations, Classifier, CountSnapshot, Counters, LabelOracle, ModuleClassifier, ScoreOracle};
pub use detector::{calibrate_threshold, Detector, Guarded};
pub use nn::{Module, ModuleExt, Param, Sequential};
