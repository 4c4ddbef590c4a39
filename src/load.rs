//! A model and its data by name, as the command lines take them: `cnn`, `mlp` (the reference models,
//! [`ReferenceModel`]), `FILE.onnx` (any ONNX export) or `FILE.safetensors` (the reference cnn with those
//! weights); input bounds `lo,hi`; a data directory — IDX, CIFAR-10/100 binary, or an image folder resized and
//! centre-cropped to the model's input as torchvision evaluates ([`load_data_for`]) —, else full Fashion-MNIST
//! when installed, else the embedded sample.
//!
//! The number of classes is the model's output width, never the largest label of the data: a test set without
//! class 9 still evaluates a ten-class model, and a label the model has no class for is an error naming the
//! sample ([`Dataset::check_labels`]).
//!
//! ```
//! use armoury::load::{load_model, ModelChoice, ModelSpec};
//! let set = armoury::data::sample()?;
//! let spec: ModelSpec = "tests/fixtures/cnn.safetensors".parse()?;
//! assert!(matches!(spec.model, ModelChoice::Reference(_)));
//! # let spec = ModelSpec { weights: Some(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cnn.safetensors").into()), ..spec };
//! let (_, clf) = load_model(&spec.model, spec.weights.as_deref(), (0.0, 1.0), &set, 0, &mut ())?;
//! assert_eq!(armoury::Classifier::num_classes(&clf), 10);
//! # Ok::<(), armoury::Error>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(doc)]
use crate::data::Dataset;
use crate::data::{self, ImageFolderOptions, TrainTest};
pub use crate::nn::output_classes;
use crate::nn::{Module, ModuleExt, ReferenceModel};
use crate::onnx::OnnxModel;
use crate::optim::{Adam, AdamConfig};
use crate::train::{fit, TrainCallback, TrainConfig};
use crate::{io, Error, ModuleClassifier, Result};

/// A model architecture: a reference model or an ONNX file.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelChoice {
    /// `cnn` or `mlp`.
    Reference(ReferenceModel),
    /// `FILE.onnx`.
    Onnx(PathBuf),
}

impl std::str::FromStr for ModelChoice {
    type Err = Error;
    /// `cnn`, `mlp` or `FILE.onnx`.
    fn from_str(s: &str) -> Result<Self> {
        if s.ends_with(".onnx") {
            Ok(ModelChoice::Onnx(PathBuf::from(s)))
        } else {
            Ok(ModelChoice::Reference(s.parse()?))
        }
    }
}

impl ModelChoice {
    /// `cnn`, `mlp`, or the ONNX file's path.
    pub fn name(&self) -> String {
        match self {
            ModelChoice::Reference(m) => m.name().to_string(),
            ModelChoice::Onnx(p) => p.display().to_string(),
        }
    }

    /// The model as a report names it: with its weights file, `(trained here)` for a reference model without
    /// one, the file alone for an ONNX model.
    pub fn describe(&self, weights: Option<&Path>) -> String {
        match (self, weights) {
            (_, Some(w)) => format!("{} ({})", self.name(), w.display()),
            (ModelChoice::Onnx(_), None) => self.name(),
            (ModelChoice::Reference(_), None) => format!("{} (trained here)", self.name()),
        }
    }

    /// The image shape `C×H×W` the model declares (`None` where an axis is free or the file declares none): the
    /// reference models take 1×28×28; an ONNX file is read for its input's dimensions after the batch axis.
    pub fn input_shape(&self) -> Result<Option<[usize; 3]>> {
        match self {
            ModelChoice::Reference(_) => Ok(Some([1, 28, 28])),
            ModelChoice::Onnx(path) => {
                let m = OnnxModel::load(path)?;
                Ok(match m.input_dims() {
                    [_, Some(c), Some(h), Some(w)] => Some([*c, *h, *w]),
                    _ => None,
                })
            }
        }
    }

    /// The bytes that identify the model beyond its parameters (an ONNX file's graph; nothing for a reference
    /// model), for [`crate::eval::identity::model_hash`].
    pub fn graph_bytes(&self) -> Result<Vec<u8>> {
        match self {
            ModelChoice::Onnx(path) => std::fs::read(path).map_err(|e| Error::io(path, e)),
            ModelChoice::Reference(_) => Ok(Vec::new()),
        }
    }
}

/// A model by spec: the architecture and the weights to load (`None`: a reference model is trained).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// The architecture.
    pub model: ModelChoice,
    /// A safetensors file of weights.
    pub weights: Option<PathBuf>,
}

impl std::str::FromStr for ModelSpec {
    type Err = Error;
    /// `cnn|mlp|FILE.onnx` without weights, or `FILE.safetensors`: the reference cnn with those weights.
    fn from_str(s: &str) -> Result<Self> {
        if s.ends_with(".safetensors") {
            return Ok(ModelSpec { model: ModelChoice::Reference(ReferenceModel::Cnn), weights: Some(s.into()) });
        }
        Ok(ModelSpec { model: s.parse()?, weights: None })
    }
}

/// Per-channel input normalisation put in front of a model ([`crate::nn::Normalized`]), so that data, bounds and
/// ε stay in pixel units while the model sees torchvision's `Normalize(mean, std)`: `imagenet` (mean 0.485, 0.456,
/// 0.406; std 0.229, 0.224, 0.225) or `MEAN,…/STD,…` with one value per channel.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalization {
    /// Per-channel means.
    pub mean: Vec<f32>,
    /// Per-channel standard deviations.
    pub std: Vec<f32>,
}

impl Normalization {
    /// torchvision's ImageNet statistics.
    pub fn imagenet() -> Normalization {
        Normalization { mean: vec![0.485, 0.456, 0.406], std: vec![0.229, 0.224, 0.225] }
    }

    /// The layer ([`crate::nn::Normalize`]); errors as it does.
    pub fn layer(&self) -> Result<crate::nn::Normalize> {
        crate::nn::Normalize::new(&self.mean, &self.std)
    }
}

impl std::str::FromStr for Normalization {
    type Err = Error;
    /// `imagenet` or `MEAN,…/STD,…`.
    fn from_str(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("imagenet") {
            return Ok(Normalization::imagenet());
        }
        let bad = || {
            Error::invalid(
                "--normalize",
                format!("'{s}' is not imagenet or MEAN,…/STD,… (e.g. 0.5,0.5,0.5/0.25,0.25,0.25)"),
            )
        };
        let (m, sd) = s.split_once('/').ok_or_else(bad)?;
        let values =
            |t: &str| t.split(',').map(|v| v.trim().parse::<f32>().map_err(|_| bad())).collect::<Result<Vec<f32>>>();
        let n = Normalization { mean: values(m)?, std: values(sd)? };
        n.layer()?;
        Ok(n)
    }
}

/// Parses input bounds `lo,hi`.
pub fn parse_bounds(s: &str) -> Result<(f32, f32)> {
    let bad = || Error::invalid("--bounds", format!("'{s}' is not lo,hi"));
    let (a, b) = s.split_once(',').ok_or_else(bad)?;
    Ok((a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?))
}

/// The data set: `dir` if given — a CIFAR-10/100 binary directory ([`data::load_cifar_dir`], CIFAR-100 with its
/// fine labels), an image folder at its stored size ([`data::load_image_folder_set`]; [`load_data_for`] fits one
/// to a model), an IDX directory, or `sample` for the embedded sample —, else full Fashion-MNIST when found, else
/// the embedded sample.
pub fn load_data(dir: Option<&Path>) -> Result<TrainTest> {
    match dir {
        Some(d) if d == Path::new("sample") => data::sample(),
        Some(d) if data::is_cifar_dir(d) => data::load_cifar_dir(d, data::Cifar::HundredFine),
        Some(d) if data::is_image_folder(d) => data::load_image_folder_set(d, ImageFolderOptions::default()),
        Some(d) => data::load_idx_dir(d),
        None => data::load_default(None),
    }
}

/// [`load_data`] with image folders fitted to a model that takes `input` (`C×H×W`) images: torchvision's evaluation
/// transform — the shorter side resized to `resize` (default: `⌊H·8/7⌉`, torchvision's 256 for a 224 crop, keeping
/// the aspect ratio), then the `H×W` centre; `C` is 1 (luma) or 3 (RGB). Without `input`, images are used as
/// stored and must all have one size. Other formats are read as stored; the model's shape is checked against them
/// when the model loads.
pub fn load_data_for(dir: Option<&Path>, input: Option<[usize; 3]>, resize: Option<u32>) -> Result<TrainTest> {
    let Some(dir) = dir.filter(|d| data::is_image_folder(d)) else {
        return load_data(dir);
    };
    let mut options = ImageFolderOptions::default();
    if let Some([c, h, w]) = input {
        if c != 1 && c != 3 {
            return Err(Error::invalid(
                "model and data",
                format!("the model takes {c}-channel images; an image folder gives 1 (grey) or 3 (RGB)"),
            ));
        }
        let side = |v: usize| u32::try_from(v).map_err(|_| Error::invalid("model and data", "image size too large"));
        let (h, w) = (side(h)?, side(w)?);
        options.channels = c;
        options.center_crop = Some((w, h));
        options.shorter_side = Some(resize.unwrap_or(((h.min(w) as f64) * 8.0 / 7.0).round() as u32));
    } else if resize.is_some() {
        return Err(Error::invalid("data", "a resize needs the model's input size, and the model declares none"));
    }
    data::load_image_folder_set(dir, options)
}

/// `C×H×W`.
fn dims(shape: &[usize]) -> String {
    shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("×")
}

/// Refuses data whose images are not the shape the model takes, in the user's terms ("the model expects
/// 3×224×224 images; the data are 1×28×28"): `expected` is what the model declares (`None`: a free axis).
fn check_input_shape(choice: &ModelChoice, expected: &[Option<usize>], data: [usize; 3]) -> Result<()> {
    if expected.iter().zip(data).all(|(e, d)| e.is_none_or(|e| e == d)) {
        return Ok(());
    }
    let want: Vec<String> = expected.iter().map(|e| e.map_or("?".to_string(), |e| e.to_string())).collect();
    Err(Error::invalid(
        "model and data",
        format!(
            "{} expects {} images; the data are {} (a model for other images, or resize the data to its input)",
            choice.name(),
            want.join("×"),
            dims(&data)
        ),
    ))
}

/// The model as a shared module plus a classifier over it, with as many classes as the model has outputs. A
/// reference model is loaded from `weights` when given, else trained with the reference recipe (3 epochs of Adam,
/// lr 1e-3, batch 128; docs/reference.md, reference training) on `set.train`, reporting to `progress`. Every
/// label of both splits must be one of the model's classes ([`Dataset::check_labels`]).
pub fn load_model(
    choice: &ModelChoice,
    weights: Option<&Path>,
    bounds: (f32, f32),
    set: &TrainTest,
    seed: u64,
    progress: &mut dyn TrainCallback,
) -> Result<(Arc<dyn Module>, ModuleClassifier)> {
    load_model_with(choice, weights, bounds, None, set, seed, progress)
}

/// [`load_model`] with the model behind `normalize` when given ([`crate::nn::Normalized`]; its channel count must
/// be the data's). A reference model trained here trains behind it too.
pub fn load_model_with(
    choice: &ModelChoice,
    weights: Option<&Path>,
    bounds: (f32, f32),
    normalize: Option<&Normalization>,
    set: &TrainTest,
    seed: u64,
    progress: &mut dyn TrainCallback,
) -> Result<(Arc<dyn Module>, ModuleClassifier)> {
    let shape = set.test.image_shape();
    let module: Arc<dyn Module> = match choice {
        ModelChoice::Onnx(path) => {
            let m = OnnxModel::load(path)?;
            if m.input_dims().len() == 4 {
                check_input_shape(choice, &m.input_dims()[1..], shape)?;
            }
            if let Some(wf) = weights {
                io::load_module(&m, wf)?;
            }
            Arc::new(m)
        }
        ModelChoice::Reference(r) => {
            check_input_shape(choice, &[Some(1), Some(28), Some(28)], shape)?;
            Arc::new(r.build(seed))
        }
    };
    // Weights load into the bare model (their names are its own); the model is used, and trained, normalised.
    let bare = module.clone();
    let module: Arc<dyn Module> = match normalize {
        Some(n) => Arc::new(crate::nn::Normalized::new(n.layer()?, module)),
        None => module,
    };
    let classes = output_classes(module.as_ref(), shape)?;
    if let Some(names) = set.class_names.as_ref().filter(|n| n.len() != classes) {
        // An image folder's labels are its class folders' sorted positions: with fewer (or more) folders than
        // the model has classes, they are not the model's classes, and every figure would be wrong.
        return Err(Error::invalid(
            "model and data",
            format!(
                "the data have {} class folders and {} has {classes} classes, so the folders' positions are not \
                 its labels: name the model's classes in output order (evaluate's --class-names FILE; \
                 TrainTest::relabel_by_name) to match the folders by name",
                names.len(),
                choice.name()
            ),
        ));
    }
    set.train.check_labels(classes, "training")?;
    set.test.check_labels(classes, "test")?;
    if let ModelChoice::Reference(_) = choice {
        match weights {
            Some(wf) => io::load_module(bare.as_ref(), wf)?,
            None => {
                let mut opt = Adam::new(module.parameters(), AdamConfig::default())?;
                let cfg = TrainConfig { epochs: 3, seed, ..Default::default() };
                let train = set.training("training the reference model")?;
                fit(module.as_ref(), &mut opt, &train.with_num_classes(classes)?, None, &cfg, progress)?;
            }
        }
    }
    let clf = ModuleClassifier::new(module.clone(), &shape, classes, bounds)?;
    Ok((module, clf))
}
