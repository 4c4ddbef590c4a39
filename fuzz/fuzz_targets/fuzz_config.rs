//! Fuzz target `fuzz_config`: see `armoury_fuzz::fuzz_config`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: armoury_fuzz::init(), |data: &[u8]| armoury_fuzz::fuzz_config(data));
