//! Model and data selection shared by the `attack` and `adversarial_training` examples: a reference model
//! (trained here or loaded from safetensors) or any ONNX export, and a data set (IDX directory, full
//! Fashion-MNIST, or the embedded sample). Needs the `progress` support module beside it in the example.

#[path = "choice.rs"]
mod choice;
pub use choice::ModelChoice;

use std::path::Path;
use std::sync::Arc;

use armoury::data::{self, TrainTest};
use armoury::nn::{Module, ModuleExt};
use armoury::onnx::OnnxModel;
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{fit, TrainConfig};
use armoury::{io, Error, ModuleClassifier, Result};

/// Parses `--bounds lo,hi`.
pub fn parse_bounds(s: &str) -> Result<(f32, f32)> {
    let bad = || Error::invalid("--bounds", format!("'{s}' is not lo,hi"));
    let (a, b) = s.split_once(',').ok_or_else(bad)?;
    Ok((a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?))
}

/// The data set: an IDX directory if given, else full Fashion-MNIST when found, else the embedded sample.
pub fn load_data(dir: Option<&Path>) -> Result<TrainTest> {
    match dir {
        Some(d) => data::load_idx_dir(d),
        None => data::load_default(None),
    }
}

/// The model as a shared module plus a classifier over it. A reference model is loaded from `weights` when
/// given, else trained with the reference recipe (3 epochs of Adam, lr 1e-3, batch 128; docs/reference.md,
/// reference training) on `set.train`.
// `adversarial_training` includes this module for the model choice, bounds and data but builds its model itself.
#[allow(dead_code, reason = "used by the attack example only")]
pub fn load_model(
    choice: &ModelChoice,
    weights: Option<&Path>,
    bounds: (f32, f32),
    set: &TrainTest,
    seed: u64,
) -> Result<(Arc<dyn Module>, ModuleClassifier)> {
    let [c, h, w] = set.test.image_shape();
    let classes = set.test.num_classes().max(set.train.num_classes());
    let module: Arc<dyn Module> = match choice {
        ModelChoice::Onnx(path) => {
            let m = OnnxModel::load(path)?;
            if let Some(wf) = weights {
                io::load_module(&m, wf)?;
            }
            Arc::new(m)
        }
        ModelChoice::Reference(r) => {
            let net = r.build(seed);
            match weights {
                Some(wf) => io::load_module(&net, wf)?,
                None => {
                    println!(
                        "no --weights: training {} (3 epochs of Adam, lr 1e-3, batch 128) on {} images",
                        choice.name(),
                        set.train.len()
                    );
                    let mut opt = Adam::new(net.parameters(), AdamConfig::default())?;
                    let cfg = TrainConfig { epochs: 3, seed, ..Default::default() };
                    fit(&net, &mut opt, &set.train, None, &cfg, &mut crate::progress::TrainProgress::new())?;
                }
            }
            Arc::new(net)
        }
    };
    let clf = ModuleClassifier::new(module.clone(), &[c, h, w], classes, bounds)?;
    Ok((module, clf))
}
