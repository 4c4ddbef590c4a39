//! `--model`: a reference architecture or an ONNX file, shared by the examples that take one.

use std::path::PathBuf;

use armoury::nn::ReferenceModel;
use armoury::{Error, Result};

/// `--model`: a reference architecture or an ONNX file.
#[derive(Clone, Debug)]
pub enum ModelChoice {
    Reference(ReferenceModel),
    Onnx(PathBuf),
}

impl std::str::FromStr for ModelChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.ends_with(".onnx") {
            Ok(ModelChoice::Onnx(PathBuf::from(s)))
        } else {
            Ok(ModelChoice::Reference(s.parse()?))
        }
    }
}

impl ModelChoice {
    pub fn name(&self) -> String {
        match self {
            ModelChoice::Reference(m) => m.name().to_string(),
            ModelChoice::Onnx(p) => p.display().to_string(),
        }
    }
}
