//! Helpers shared by the test modules.
#![allow(dead_code)]

use std::path::PathBuf;

/// `tests/fixtures/<name>` in this repository (made with PyTorch and onnxruntime by the project's fixture scripts; see
/// tests/fixtures/README.md).
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}
