//! The model flags of the examples that load a model, over the core's `armoury::load`. Needs the `progress`
//! support module beside it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::load::ModelChoice;
use armoury::nn::Module;
use armoury::{ModuleClassifier, Result};

/// The flags of every example that loads a model: `--model cnn|mlp|FILE.onnx` (a `FILE.safetensors` there is
/// taken as `--weights FILE` of the cnn), `--weights FILE`, `--bounds lo,hi` and `--data DIR`.
pub struct ModelFlags {
    pub model: ModelChoice,
    pub weights: Option<PathBuf>,
    pub bounds: (f32, f32),
    pub data: Option<PathBuf>,
}

impl Default for ModelFlags {
    /// The reference cnn, trained here, on [0, 1] inputs and the default data.
    fn default() -> Self {
        ModelFlags {
            model: ModelChoice::Reference(armoury::nn::ReferenceModel::Cnn),
            weights: None,
            bounds: (0.0, 1.0),
            data: None,
        }
    }
}

impl ModelFlags {
    /// The flags [`ModelFlags::take`] reads.
    pub const FLAGS: [&'static str; 4] = ["model", "weights", "bounds", "data"];

    /// Reads the value of `--flag`, one of [`ModelFlags::FLAGS`], from `p`.
    pub fn take(&mut self, flag: &str, p: &mut lexopt::Parser) -> std::result::Result<(), Box<dyn std::error::Error>> {
        use lexopt::prelude::*;
        match flag {
            "model" => {
                let spec: armoury::load::ModelSpec = p.value()?.string()?.parse()?;
                match spec.weights {
                    Some(w) => self.weights = Some(w),
                    None => self.model = spec.model,
                }
            }
            "weights" => self.weights = Some(p.value()?.into()),
            "bounds" => self.bounds = armoury::load::parse_bounds(&p.value()?.string()?)?,
            "data" => self.data = Some(p.value()?.into()),
            _ => return Err(format!("--{flag} is not a model flag").into()),
        }
        Ok(())
    }
}

/// [`armoury::load::load_model`] with a progress bar, saying so when a reference model is trained here.
pub fn load_model(
    choice: &ModelChoice,
    weights: Option<&Path>,
    bounds: (f32, f32),
    set: &TrainTest,
    seed: u64,
) -> Result<(Arc<dyn Module>, ModuleClassifier)> {
    if let (ModelChoice::Reference(_), None) = (choice, weights) {
        println!(
            "no --weights: training {} (3 epochs of Adam, lr 1e-3, batch 128) on {} images",
            choice.name(),
            set.train.len()
        );
    }
    armoury::load::load_model(choice, weights, bounds, set, seed, &mut crate::progress::TrainProgress::new())
}
