//! Fuzz target `image_folder`: see `armoury_fuzz::image_folder`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: armoury_fuzz::init(), |data: &[u8]| armoury_fuzz::image_folder(data));
