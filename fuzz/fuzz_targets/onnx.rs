//! Fuzz target `onnx`: see `armoury_fuzz::onnx`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: armoury_fuzz::init(), |data: &[u8]| armoury_fuzz::onnx(data));
