//! Helpers shared by the test modules.
#![allow(dead_code)]

use std::path::PathBuf;

/// `tests/fixtures/<name>` in this repository (copied from ../shared/fixtures; see its README).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}
