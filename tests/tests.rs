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
mod defenses_training;
mod defenses_transforms;
mod detector;
mod detectors;
mod eval;
mod fixtures_xcheck;
mod fuzzer;
mod gradcheck;
mod metrics;
mod nn;
mod onnx;
mod ops;
mod reliability;
mod report;
mod taps;
mod train;
