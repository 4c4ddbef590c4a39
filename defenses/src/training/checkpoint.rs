//! Checkpoints: model parameters and buffers, optimiser state, the method's carried state and the epoch, in one
//! safetensors file (written atomically), so a resumed run continues bit for bit.

use std::path::Path;

use armoury::nn::{Module, ModuleExt};
use armoury::optim::Optimizer;
use armoury::{io, Error, Result};
use ndarray::{ArrayD, IxDyn};

use super::Method;

/// Saves everything needed to resume after `epoch` (0-based).
pub fn save_checkpoint(
    path: &Path,
    model: &dyn Module,
    optimizer: &dyn Optimizer,
    method: &dyn Method,
    epoch: usize,
) -> Result<()> {
    let mut tensors: Vec<(String, ArrayD<f32>)> =
        model.named_params().into_iter().map(|(n, p)| (format!("model.{n}"), p.value().to_owned())).collect();
    tensors.extend(optimizer.state().into_iter().map(|(n, a)| (format!("optim.{n}"), a)));
    tensors.extend(method.state().into_iter().map(|(n, a)| (format!("method.{n}"), a)));
    tensors.push(("trainer.epoch".into(), ArrayD::from_elem(IxDyn(&[]), epoch as f32)));
    io::save_tensors(path, &tensors)
}

/// Restores a checkpoint into `model`, `optimizer` and `method`; returns the epoch to start from (the one after
/// the saved epoch). Every model parameter must be present with its shape.
pub fn load_checkpoint(
    path: &Path,
    model: &dyn Module,
    optimizer: &mut dyn Optimizer,
    method: &dyn Method,
) -> Result<usize> {
    let tensors = io::load_tensors(path)?;
    let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, a)| a);
    let mut problems = Vec::new();
    let params = model.named_params();
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
        p.set(find(&format!("model.{name}")).expect("checked above").clone())?;
    }
    let strip = |prefix: &str| -> Vec<(String, ArrayD<f32>)> {
        tensors.iter().filter_map(|(n, a)| n.strip_prefix(prefix).map(|s| (s.to_string(), a.clone()))).collect()
    };
    optimizer.load_state(&strip("optim."))?;
    method.load_state(&strip("method."))?;
    let epoch = find("trainer.epoch")
        .and_then(|a| a.iter().next().copied())
        .ok_or_else(|| Error::bad_file(path, "no trainer.epoch"))?;
    Ok(epoch as usize + 1)
}
