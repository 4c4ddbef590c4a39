//! Fuzz target `idx_gzip`: see `armoury_fuzz::idx_gzip`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: armoury_fuzz::init(), |data: &[u8]| armoury_fuzz::idx_gzip(data));
