//! Loading the model an example attacks: a reference model (loaded from safetensors, or trained here with the
//! reference recipe) or any ONNX export. Needs the `model` and `progress` support modules beside it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::nn::{Module, ModuleExt};
use armoury::onnx::OnnxModel;
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{fit, TrainConfig};
use armoury::{io, ModuleClassifier, Result};

use crate::model::ModelChoice;

/// The flags of every example that loads a model: `--model cnn|mlp|FILE.onnx` (a `FILE.safetensors` there is
/// taken as `--weights FILE` of the cnn), `--weights FILE`, `--bounds lo,hi` and `--data DIR`.
#[allow(dead_code)] // evaluate, detect and fuzz still read their flags with it
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

#[allow(dead_code)]
impl ModelFlags {
    /// The flags [`ModelFlags::take`] reads.
    pub const FLAGS: [&'static str; 4] = ["model", "weights", "bounds", "data"];

    /// Reads the value of `--flag`, one of [`ModelFlags::FLAGS`], from `p`.
    pub fn take(&mut self, flag: &str, p: &mut lexopt::Parser) -> std::result::Result<(), Box<dyn std::error::Error>> {
        use lexopt::prelude::*;
        match flag {
            "model" => {
                let v = p.value()?.string()?;
                if v.ends_with(".safetensors") {
                    self.weights = Some(v.into());
                } else {
                    self.model = v.parse()?;
                }
            }
            "weights" => self.weights = Some(p.value()?.into()),
            "bounds" => self.bounds = crate::model::parse_bounds(&p.value()?.string()?)?,
            "data" => self.data = Some(p.value()?.into()),
            _ => return Err(format!("--{flag} is not a model flag").into()),
        }
        Ok(())
    }
}

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
