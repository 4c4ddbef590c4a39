//! Checkpoints: the model's parameters and buffers, the optimiser's state and the method's carried state as
//! tensors, and in the header what made them — the run's seed, the batch size, the method and its settings,
//! and the last pass completed — in one safetensors file, written atomically (a temporary file in the same
//! directory renamed over the destination). Resuming checks the record against the run: a different seed,
//! batch size, method or setting would not continue the same run, and is an error naming what differs.

use std::collections::HashMap;
use std::path::Path;

use ndarray::ArrayD;

use super::{Method, TrainConfig};
use crate::io::{self, AnyTensor, SafetensorsFile};
use crate::nn::{Module, ModuleExt};
use crate::optim::Optimizer;
use crate::{Error, Result};

/// What a checkpoint records of its run, besides the tensors.
fn record(config: &TrainConfig, method: &dyn Method) -> Vec<(&'static str, String)> {
    vec![
        ("seed", config.seed.to_string()),
        ("batch_size", config.batch_size.to_string()),
        ("method", method.kind().to_string()),
        ("settings", method.name()),
    ]
}

/// Saves everything needed to resume after pass `epoch` (0-based) of a run with `config` and `method`.
pub fn save_checkpoint(
    path: &Path,
    model: &dyn Module,
    optimizer: &dyn Optimizer,
    method: &dyn Method,
    config: &TrainConfig,
    epoch: usize,
) -> Result<()> {
    let mut tensors: Vec<(String, AnyTensor)> = model
        .named_params()
        .into_iter()
        .map(|(n, p)| (format!("model.{n}"), AnyTensor::F32(p.value().to_owned())))
        .collect();
    tensors.extend(optimizer.state().into_iter().map(|(n, a)| (format!("optim.{n}"), AnyTensor::F32(a))));
    tensors.extend(method.state().into_iter().map(|(n, a)| (format!("method.{n}"), AnyTensor::F32(a))));
    let mut meta: HashMap<String, String> =
        record(config, method).into_iter().map(|(k, v)| (format!("armoury.train.{k}"), v)).collect();
    meta.insert("armoury.train.epoch".into(), epoch.to_string());
    io::save_tensors_any(path, &tensors, Some(&meta))
}

/// Restores a checkpoint into `model`, `optimizer` and `method` after checking that it was written by a run
/// with the same seed, batch size, method and settings; returns the pass to start from (the one after the
/// saved pass). Every model parameter must be present with its shape.
pub fn load_checkpoint(
    path: &Path,
    model: &dyn Module,
    optimizer: &mut dyn Optimizer,
    method: &dyn Method,
    config: &TrainConfig,
) -> Result<usize> {
    let file = SafetensorsFile::open(path)?;
    let empty = HashMap::new();
    let meta = file.metadata().unwrap_or(&empty);
    let get = |k: &str| meta.get(&format!("armoury.train.{k}"));
    let differ: Vec<String> = record(config, method)
        .into_iter()
        .filter_map(|(k, want)| match get(k) {
            Some(had) if *had == want => None,
            Some(had) => Some(format!("{k}: checkpoint '{had}', this run '{want}'")),
            None => Some(format!("{k}: not recorded in the checkpoint, this run '{want}'")),
        })
        .collect();
    if !differ.is_empty() {
        return Err(Error::invalid(
            "resume",
            format!("{} was written by another run — {}", path.display(), differ.join("; ")),
        ));
    }
    let epoch: usize = get("epoch")
        .and_then(|e| e.parse().ok())
        .ok_or_else(|| Error::bad_file(path, "no armoury.train.epoch in the header"))?;
    let tensors: Vec<(String, ArrayD<f32>)> =
        file.names().into_iter().map(|n| Ok((n.clone(), file.f32(&n)?))).collect::<Result<_>>()?;
    let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, a)| a);
    let params = model.named_params();
    let mut problems = Vec::new();
    for (name, p) in &params {
        match find(&format!("model.{name}")) {
            Some(a) if a.shape() == p.shape().as_slice() => {}
            Some(a) => problems.push(format!("shape of {name}: model {:?}, checkpoint {:?}", p.shape(), a.shape())),
            None => problems.push(format!("missing in checkpoint: {name}")),
        }
    }
    if !problems.is_empty() {
        return Err(Error::ParameterMismatch(problems));
    }
    for (name, p) in &params {
        if let Some(a) = find(&format!("model.{name}")) {
            p.set(a.clone())?;
        }
    }
    let strip = |prefix: &str| -> Vec<(String, ArrayD<f32>)> {
        tensors.iter().filter_map(|(n, a)| n.strip_prefix(prefix).map(|s| (s.to_string(), a.clone()))).collect()
    };
    optimizer.load_state(&strip("optim."))?;
    method.load_state(&strip("method."))?;
    Ok(epoch + 1)
}
