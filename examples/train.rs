//! Train a reference model on any IDX data set.
//!
//! `cargo run --release --example train -- --model cnn|mlp|FILE.onnx [--epochs N] [--out FILE.safetensors]`
//! (`--help` lists every flag)
//!
//! An ONNX model is imported and fine-tuned (its initialisers are the trainable parameters).
//!
//! DIR holds `train-*` and `t10k-*` IDX files (plain or .gz); without it, full Fashion-MNIST when found, else the
//! embedded sample. Prints per-epoch loss and accuracy and ends with one JSON line.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use armoury::io;
use armoury::load as model;
use armoury::nn::{Module, ModuleExt};
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{fit, TrainConfig};
use clap::Parser;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// Train a reference model (or fine-tune an imported ONNX model) on any IDX data set: loss and accuracy per
/// epoch, the weights saved, one JSON line.
#[derive(Parser)]
#[command(
    name = "train",
    after_help = "Example:\n  cargo run --release --example train -- --model cnn --data /usr/share/datasets/fashion-mnist \\\n    \
                        --epochs 3 --out cnn.safetensors"
)]
struct Args {
    /// The model: a reference architecture (cnn, mlp) or an ONNX file (FILE.onnx), fine-tuned
    #[arg(long, value_name = "cnn|mlp|FILE.onnx", default_value = "cnn", value_parser = args::model_choice)]
    model: model::ModelChoice,
    #[command(flatten)]
    data: args::DataArgs,
    /// Passes over the training set
    #[arg(long, value_name = "N", default_value_t = 3)]
    epochs: usize,
    /// Images per training step
    #[arg(long, value_name = "B", default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    batch_size: u64,
    /// Adam's learning rate
    #[arg(long, value_name = "LR", default_value_t = 1e-3)]
    lr: f32,
    /// Where to save the trained weights (safetensors) [default: not saved]
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    run: args::RunArgs,
}

/// The JSON line the example ends with.
#[derive(serde::Serialize)]
struct Summary {
    model: String,
    epochs: usize,
    /// On the test split after the last epoch.
    test_accuracy: f64,
    seconds: f64,
}

/// `v` to `decimals` places, so the JSON line carries the figures the text prints.
fn rounded(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.run.apply()?;
    let set = model::load_data(args.data.data.as_deref())?;
    let train = set.training("training")?;
    println!(
        "data: {} — {} training and {} test images of shape {:?}, {} classes ({})",
        set.name,
        train.len(),
        set.test.len(),
        train.image_shape(),
        train.num_classes(),
        set.source
    );
    let [c, h, w] = train.image_shape();
    let model: Arc<dyn Module> = match &args.model {
        model::ModelChoice::Reference(r) => {
            if (c, h, w) != (1, 28, 28) {
                return Err(
                    format!("the reference {} takes 1×28×28 images; this data set has {c}×{h}×{w}", r.name()).into()
                );
            }
            Arc::new(r.build(args.run.seed))
        }
        model::ModelChoice::Onnx(path) => Arc::new(armoury::onnx::OnnxModel::load(path)?),
    };
    println!("model: {} ({} parameters)", args.model.name(), model.num_parameters());
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: args.lr, ..Default::default() })?;
    let cfg = TrainConfig {
        epochs: args.epochs,
        batch_size: args.batch_size as usize,
        seed: args.run.seed,
        ..Default::default()
    };
    let start = Instant::now();
    let reports = fit(model.as_ref(), &mut opt, train, Some(&set.test), &cfg, &mut progress::TrainProgress::new())?;
    let seconds = start.elapsed().as_secs_f64();
    let accuracy = reports.last().and_then(|r| r.test.as_ref()).map(|t| t.accuracy).unwrap_or(f32::NAN);
    if let Some(out) = &args.out {
        io::save_module(model.as_ref(), out)?;
        println!("saved {}", out.display());
    }
    println!("test accuracy {accuracy:.4} after {} epochs in {seconds:.1} s", args.epochs);
    let line = Summary {
        model: args.model.name(),
        epochs: args.epochs,
        test_accuracy: rounded(f64::from(accuracy), 4),
        seconds: rounded(seconds, 2),
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}
