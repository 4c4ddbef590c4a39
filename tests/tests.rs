//! Armoury's integration tests: one binary, a module per area (keeps link times down).

mod attack_props;
mod attacks_apgd_jsma;
mod attacks_decision;
mod attacks_gradient;
mod attacks_minnorm;
mod attacks_score;
mod attacks_table;
mod common;
mod coverage;
mod data;
mod data_cifar;
mod defenses_training;
mod defenses_transforms;
mod detector;
mod detectors;
mod eval;
mod eval_api;
mod eval_protect;
mod examples_cli;
mod fixtures_xcheck;
mod fuser;
mod fuzzer;
mod gradcheck;
mod layers;
mod load;
mod metrics;
mod nn;
mod onnx;
mod onnx_zoo;
mod ops;
mod ops_transformer;
mod profile;
mod registry;
mod reliability;
mod report;
mod rgb;
mod taps;
mod train;
mod trust;

/// The suite runs on the allocator the examples use, so a kernel reading memory it never wrote meets stale
/// values from a block freed a moment ago, not the zeros of fresh pages.
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();
