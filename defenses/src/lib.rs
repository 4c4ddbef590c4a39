//! # armoury-defenses
//!
//! Defenses for Armoury classifiers: adversarial-training methods for the core's training loop ([`training`]:
//! Madry PGD-AT, TRADES, MART, fast and free adversarial training, ensemble adversarial training, and
//! MindArmour's defense set, corrected; run by [`armoury::train::Trainer`]) and input
//! transformations ([`transforms`]: feature squeezing, spatial smoothing, JPEG, total-variation minimisation,
//! randomized smoothing), each usable as a [`armoury::Classifier`] with BPDA/EOT gradients so white-box attacks
//! can still be run through it.
//!
//! The crate depends on the core alone: defenses take attacks as `Box<dyn armoury::Attack>` or
//! `&dyn armoury::Attack`, so any attack — from `armoury-attacks` or your own — can drive adversarial training.
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod detectors;
pub mod eval;
pub mod registry;
pub mod training;
pub mod transforms;
