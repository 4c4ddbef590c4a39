//! Train a reference model on any IDX data set.
//!
//! `cargo run --release --example train -- --model cnn|mlp|FILE.onnx [--data DIR] [--epochs N] [--batch-size B]
//! [--lr LR] [--seed S] [--max-memory SIZE] [--out FILE.safetensors]`
//!
//! An ONNX model is imported and fine-tuned (its initialisers are the trainable parameters).
//!
//! DIR holds `train-*` and `t10k-*` IDX files (plain or .gz); without it, full Fashion-MNIST when found, else the
//! embedded sample. Prints per-epoch loss and accuracy and ends with one JSON line.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;
use std::time::Instant;

use std::sync::Arc;

use armoury::load as choice;
use armoury::nn::{Module, ModuleExt, ReferenceModel};
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{fit, TrainConfig};
use armoury::{data, io};

struct Args {
    model: choice::ModelChoice,
    data: Option<PathBuf>,
    epochs: usize,
    batch_size: usize,
    lr: f32,
    seed: u64,
    out: Option<PathBuf>,
}

fn parse() -> Result<Args, lexopt::Error> {
    use lexopt::prelude::*;
    let mut a = Args {
        model: choice::ModelChoice::Reference(ReferenceModel::Cnn),
        data: None,
        epochs: 3,
        batch_size: 128,
        lr: 1e-3,
        seed: 0,
        out: None,
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long("model") => a.model = p.value()?.parse()?,
            Long("data") => a.data = Some(p.value()?.into()),
            Long("epochs") => a.epochs = p.value()?.parse()?,
            Long("batch-size") => a.batch_size = p.value()?.parse()?,
            Long("lr") => a.lr = p.value()?.parse()?,
            Long("seed") => a.seed = p.value()?.parse()?,
            Long("max-memory") => cli::set_max_memory(&p.value()?.string()?)?,
            Long("out") => a.out = Some(p.value()?.into()),
            Long("help") | Short('h') => {
                println!("usage: train --model cnn|mlp|FILE.onnx [--data DIR] [--epochs N] [--batch-size B] [--lr LR] [--seed S] [--max-memory SIZE] [--out FILE]");
                std::process::exit(0);
            }
            _ => return Err(arg.unexpected()),
        }
    }
    Ok(a)
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
    let args = parse()?;
    let set = match &args.data {
        Some(dir) => data::load_idx_dir(dir)?,
        None => data::load_default(None)?,
    };
    println!(
        "data: {} — {} training and {} test images of shape {:?}, {} classes ({})",
        set.name,
        set.train.len(),
        set.test.len(),
        set.train.image_shape(),
        set.train.num_classes(),
        set.source
    );
    let [c, h, w] = set.train.image_shape();
    let model: Arc<dyn Module> = match &args.model {
        choice::ModelChoice::Reference(r) => {
            if (c, h, w) != (1, 28, 28) {
                return Err(
                    format!("the reference {} takes 1×28×28 images; this data set has {c}×{h}×{w}", r.name()).into()
                );
            }
            Arc::new(r.build(args.seed))
        }
        choice::ModelChoice::Onnx(path) => Arc::new(armoury::onnx::OnnxModel::load(path)?),
    };
    println!("model: {} ({} parameters)", args.model.name(), model.num_parameters());
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: args.lr, ..Default::default() })?;
    let cfg = TrainConfig { epochs: args.epochs, batch_size: args.batch_size, seed: args.seed, ..Default::default() };
    let start = Instant::now();
    let reports =
        fit(model.as_ref(), &mut opt, &set.train, Some(&set.test), &cfg, &mut progress::TrainProgress::new())?;
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
