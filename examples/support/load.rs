//! Loading the model an example attacks: a reference model (loaded from safetensors, or trained here with the
//! reference recipe) or any ONNX export. Needs the `model` and `progress` support modules beside it.

use std::path::Path;
use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::nn::{Module, ModuleExt};
use armoury::onnx::OnnxModel;
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{fit, TrainConfig};
use armoury::{io, ModuleClassifier, Result};

use crate::model::ModelChoice;

/// The model as a shared module plus a classifier over it. A reference model is loaded from `weights` when
/// given, else trained with the reference recipe (3 epochs of Adam, lr 1e-3, batch 128; docs/reference.md,
/// reference training) on `set.train`.
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
