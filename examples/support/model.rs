//! Model and data selection shared by the `attack` and `adversarial_training` examples: a reference model or any
//! ONNX export, input bounds, and a data set (IDX directory, full Fashion-MNIST, or the embedded sample).

#[path = "choice.rs"]
mod choice;
pub use choice::ModelChoice;

use std::path::Path;

use armoury::data::{self, TrainTest};
use armoury::{Error, Result};

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
