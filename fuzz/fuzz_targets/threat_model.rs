//! Fuzz target `threat_model`: see `armoury_fuzz::threat_model`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: armoury_fuzz::init(), |data: &[u8]| armoury_fuzz::threat_model(data));
