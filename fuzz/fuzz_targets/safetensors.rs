//! Fuzz target `safetensors`: see `armoury_fuzz::safetensors`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: armoury_fuzz::init(), |data: &[u8]| armoury_fuzz::safetensors(data));
