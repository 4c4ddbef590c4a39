//! The flag groups several examples share, as clap argument groups, so that every example spells them the same
//! way and documents them with the same words: the model (`--model`, `--weights`, `--bounds`, `--data`), the
//! data alone (`--data`), and the run (`--seed`, `--threads`, `--max-memory`). `--out` is each example's own: its
//! default and what it holds differ.
//! Needs the `model` support module beside it (for `ModelChoice`).

#![allow(dead_code)] // each example uses some of the groups

use std::path::PathBuf;

use clap::{ArgMatches, Args, Command, FromArgMatches};

use crate::model::ModelChoice;

/// `--model`: a reference architecture (`cnn`, `mlp`) or an ONNX file.
pub fn model_choice(s: &str) -> Result<ModelChoice, String> {
    s.parse().map_err(|e: armoury::Error| e.to_string())
}

/// `--bounds lo,hi`.
pub fn bounds(s: &str) -> Result<(f32, f32), String> {
    crate::model::parse_bounds(s).map_err(|_| format!("'{s}' is not lo,hi (e.g. 0,1)"))
}

/// `--normalize imagenet|MEAN,…/STD,…`.
pub fn normalization(s: &str) -> Result<armoury::load::Normalization, String> {
    s.parse().map_err(|e: armoury::Error| e.to_string())
}

/// A flag's value in lower case (names of attacks, defenses, detectors).
pub fn lower(s: &str) -> Result<String, String> {
    Ok(s.to_lowercase())
}

/// A comma-separated list, blanks dropped.
pub fn list(s: &str) -> Result<Vec<String>, String> {
    Ok(s.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect())
}

/// `--model` as written: a model, or a safetensors file that stands for `--weights FILE` of the cnn.
#[derive(Clone, Debug)]
enum ModelValue {
    Model(ModelChoice),
    Weights(PathBuf),
}

fn model_value(s: &str) -> Result<ModelValue, String> {
    if s.ends_with(".safetensors") {
        Ok(ModelValue::Weights(s.into()))
    } else {
        model_choice(s).map(ModelValue::Model)
    }
}

/// The flags of `ModelArgs` as clap reads them.
#[derive(Args, Debug)]
struct ModelFlags {
    /// The model: a reference architecture (cnn, mlp), an ONNX file (FILE.onnx), or a safetensors file (the cnn
    /// with those weights: the same as --weights FILE)
    #[arg(long, value_name = "cnn|mlp|FILE", default_value = "cnn", value_parser = model_value)]
    model: ModelValue,
    /// Weights (safetensors) to load into the model [default: the example's own, described above]
    #[arg(long, value_name = "FILE")]
    weights: Option<PathBuf>,
    /// The model's input range
    #[arg(long, value_name = "LO,HI", default_value = "0,1", value_parser = bounds)]
    bounds: (f32, f32),
    /// Per-channel normalisation in front of the model, as torchvision's Normalize (ART's preprocessing):
    /// `imagenet` or MEAN,…/STD,…; data, --bounds and ε stay in pixel units [default: none]
    #[arg(long, value_name = "imagenet|MEAN,…/STD,…", value_parser = normalization)]
    normalize: Option<armoury::load::Normalization>,
    #[command(flatten)]
    data: DataArgs,
}

/// The model an example loads: `--model`, `--weights`, `--bounds` and `--data`, with `--model FILE.safetensors`
/// already turned into `--weights FILE` of the cnn.
#[derive(Clone, Debug)]
pub struct ModelArgs {
    pub model: ModelChoice,
    pub weights: Option<PathBuf>,
    pub bounds: (f32, f32),
    pub data: Option<PathBuf>,
    pub resize: Option<u32>,
    pub normalize: Option<armoury::load::Normalization>,
}

impl ModelArgs {
    /// The data, with an image folder resized and centre-cropped to the model's input
    /// ([`armoury::load::load_data_for`]).
    pub fn load_data(&self) -> armoury::Result<armoury::data::TrainTest> {
        // Only an image folder is fitted to the model; reading its shape parses the model file once more.
        let folder = self.data.as_deref().is_some_and(armoury::data::is_image_folder);
        let input = if folder { self.model.input_shape()? } else { None };
        crate::model::load_data_for(self.data.as_deref(), input, self.resize)
    }
}

impl FromArgMatches for ModelArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let f = ModelFlags::from_arg_matches(matches)?;
        let (model, weights) = match (f.model, f.weights) {
            (ModelValue::Model(m), w) => (m, w),
            (ModelValue::Weights(w), None) => (ModelChoice::Reference(armoury::nn::ReferenceModel::Cnn), Some(w)),
            (ModelValue::Weights(_), Some(_)) => {
                return Err(clap::Error::raw(
                    clap::error::ErrorKind::ArgumentConflict,
                    "--model FILE.safetensors names the weights already: give it or --weights, not both",
                ))
            }
        };
        Ok(ModelArgs {
            model,
            weights,
            bounds: f.bounds,
            data: f.data.data,
            resize: f.data.resize,
            normalize: f.normalize,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for ModelArgs {
    fn augment_args(cmd: Command) -> Command {
        ModelFlags::augment_args(cmd)
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        ModelFlags::augment_args_for_update(cmd)
    }
}

/// `--data DIR`.
#[derive(Args, Clone, Debug)]
pub struct DataArgs {
    /// A data directory: IDX files (train-* and t10k-*, plain or .gz), CIFAR-10/100 binary files, or an image
    /// folder (class sub-folders of PNG/JPEG, under train/ and val/ or alone), resized and centre-cropped to the
    /// model's input; `sample` is the embedded sample [default: full Fashion-MNIST when installed, else the
    /// embedded sample]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Image folders: resize the shorter side to N before the centre crop [default: the crop × 8/7, torchvision's
    /// 256 for 224]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub resize: Option<u32>,
    pub normalize: Option<armoury::load::Normalization>,
}

/// How a run draws and what it may use: `--seed`, `--threads`, `--max-memory`.
#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// Seed of every random draw (initialisation, data order, attacks' random starts)
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub resources: Resources,
}

impl RunArgs {
    /// Applies `--threads` and `--max-memory` ([`Resources::apply`]).
    pub fn apply(&self) -> Result<(), Box<dyn std::error::Error>> {
        self.resources.apply()
    }
}

/// What a run may use: `--threads`, `--max-memory`.
#[derive(Args, Clone, Debug)]
pub struct Resources {
    /// Worker threads [default: one per core, or $RAYON_NUM_THREADS]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub threads: Option<u64>,
    /// Memory budget of Armoury's readers and model execution, e.g. 2G or 512M [default: $ARMOURY_MAX_MEMORY,
    /// else half the machine's memory]
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub max_memory: Option<u64>,
}

fn size(s: &str) -> Result<u64, String> {
    armoury::limits::parse_size(s).map_err(|_| format!("'{s}' is not a size (e.g. 512M, 8G, 1073741824)"))
}

impl Resources {
    /// Sets the thread pool's size and the memory budget (`armoury::limits`) for this run, and keeps freed tensor
    /// memory for reuse ([`armoury::limits::reuse_freed_memory`]); call it before any work.
    pub fn apply(&self) -> Result<(), Box<dyn std::error::Error>> {
        armoury::limits::reuse_freed_memory();
        if let Some(n) = self.threads {
            rayon::ThreadPoolBuilder::new().num_threads(n as usize).build_global()?;
        }
        if let Some(bytes) = self.max_memory {
            armoury::limits::set_max_memory(bytes);
        }
        Ok(())
    }
}

/// `i/n`.
fn shard(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("'{s}' is not i/n (e.g. 3/8)");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    Ok((i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?))
}

/// Sharding a run over a cluster: `--shard i/n`, `--shards n` (a Kubernetes indexed job's
/// `$JOB_COMPLETION_INDEX` is i), `--merge n`.
#[derive(Clone, Debug)]
pub struct ShardArgs {
    /// The shard this process runs (`None`: everything).
    pub shard: Option<(usize, usize)>,
    /// Combine the n shards' results instead of running.
    pub merge: Option<usize>,
}

#[derive(Args)]
struct ShardFlags {
    /// Run shard i of n only (samples [N·i/n, N·(i+1)/n)) and write DIR/ledger-i-of-n.json
    #[arg(long, value_name = "i/n", value_parser = shard)]
    shard: Option<(usize, usize)>,
    /// Run shard $JOB_COMPLETION_INDEX of n (a Kubernetes indexed job): --shard $JOB_COMPLETION_INDEX/n
    #[arg(long, value_name = "n", conflicts_with = "shard")]
    shards: Option<usize>,
    /// Combine the n shard ledgers (and defense/detector side files) of --out into the unsharded result
    #[arg(long, value_name = "n")]
    merge: Option<usize>,
}

impl FromArgMatches for ShardArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let f = ShardFlags::from_arg_matches(m)?;
        let shard = match f.shards {
            Some(n) => {
                let i = std::env::var("JOB_COMPLETION_INDEX").ok().and_then(|v| v.parse().ok()).ok_or_else(|| {
                    clap::Error::raw(
                        clap::error::ErrorKind::ValueValidation,
                        "--shards needs JOB_COMPLETION_INDEX set to this shard's index (or use --shard i/n)\n",
                    )
                })?;
                Some((i, n))
            }
            None => f.shard,
        };
        Ok(ShardArgs { shard, merge: f.merge })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for ShardArgs {
    fn augment_args(cmd: Command) -> Command {
        ShardFlags::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        ShardFlags::augment_args_for_update(cmd)
    }
}

fn images_epochs(s: &str) -> Result<(usize, usize), String> {
    armoury_defenses::detectors::images_epochs(s).map_err(|e| e.to_string())
}

/// MagNet's auto-encoders and detector parts (`MagnetConfig`).
#[derive(Args, Clone, Debug)]
pub struct MagnetArgs {
    /// MagNet: the auto-encoders' learning rate
    #[arg(long, value_name = "LR", default_value_t = armoury_defenses::detectors::MagnetConfig::default().lr)]
    ae_lr: f32,
    /// MagNet: auto-encoder I trained on N images for E epochs (MagnetConfig's default)
    #[arg(long, value_name = "N,E", default_value = "20000,10", value_parser = images_epochs)]
    ae1: (usize, usize),
    /// MagNet: auto-encoder II trained on N images for E epochs (MagnetConfig's default)
    #[arg(long, value_name = "N,E", default_value = "60000,20", value_parser = images_epochs)]
    ae2: (usize, usize),
    /// MagNet: the detector parts, comma-separated (MagnetConfig's default)
    #[arg(long, value_name = "P,…", default_value = "l1-ii,jsd10-ii,jsd40-ii", value_parser = list)]
    magnet_parts: std::vec::Vec<String>, // one value, split by `list` (a bare `Vec` is clap's repeated flag)
}

impl MagnetArgs {
    /// The configuration, its auto-encoders seeded by `seed` and cached in `cache`.
    pub fn config(&self, seed: u64, cache: &std::path::Path) -> armoury_defenses::detectors::MagnetConfig {
        armoury_defenses::detectors::MagnetConfig {
            ae1: self.ae1,
            ae2: self.ae2,
            lr: self.ae_lr,
            parts: self.magnet_parts.clone(),
            seed,
            cache: cache.to_path_buf(),
        }
    }
}
