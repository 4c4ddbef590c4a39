//! The model flags of the examples that load a model, over the core's `armoury::load`. Needs the `progress`
//! and `args` support modules beside it.

use std::path::Path;
use std::sync::Arc;

use armoury::data::TrainTest;
use armoury::load::ModelChoice;
use armoury::nn::Module;
use armoury::{ModuleClassifier, Result};

/// [`armoury::load::load_model`] with a progress bar, saying so when a reference model is trained here.
pub fn load_model(
    m: &crate::args::ModelArgs,
    weights: Option<&Path>,
    set: &TrainTest,
    seed: u64,
) -> Result<(Arc<dyn Module>, ModuleClassifier)> {
    let choice = &m.model;
    if let (ModelChoice::Reference(_), None) = (choice, weights) {
        println!(
            "no --weights: training {} (3 epochs of Adam, lr 1e-3, batch 128) on {} images",
            choice.name(),
            set.train.len()
        );
    }
    let progress = &mut crate::progress::TrainProgress::new();
    armoury::load::load_model_with(choice, weights, m.bounds, m.normalize.as_ref(), set, seed, progress)
}
