//! Armoury's integration tests: one binary, a module per area (keeps link times down).

mod common;
mod gradcheck;
mod fixtures_xcheck;
mod data;
mod ops;
mod onnx;
mod train;
mod attack_props;
mod attacks_gradient;
