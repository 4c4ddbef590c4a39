//! Armoury's main job, end to end on a fresh machine: get a reference `cnn` worth evaluating, report its test
//! accuracy and confusion matrix, save it, attack it (FGSM, PGD-40, Carlini–Wagner L2), harden it with a short
//! PGD adversarial fine-tuning, attack it again, and end with a table and one JSON line of the figures.
//!
//! With full Fashion-MNIST installed (`apt-get install dataset-fashion-mnist`, or a directory in `ARMOURY_DATA`)
//! it trains the cnn with the reference recipe (3 epochs of Adam, lr 1e-3, batch 128, seed 0). Without it, it
//! starts from the reference weights shipped in `tests/fixtures/cnn.safetensors` (the same recipe, run by
//! PyTorch on the full training set: 0.865 on the full test set) and evaluates on the embedded sample's 1,000
//! test images, which are the first 1,000 of the full test set: 3 epochs on the sample's 2,000 training images
//! give a model of about 0.67, not one worth attacking (docs/reference.md, quickstart).
//!
//! `cargo run --release --example quickstart` (`--help` lists the flags)

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/progress.rs"]
mod progress;

use armoury::load as model;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;

use armoury::nn::{cnn, ModuleExt, Sequential};
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{evaluate, fit, TrainConfig, Trainer};
use armoury::{data, io, Attack, Goal, ModuleClassifier, Tensor};
use armoury_attacks::{CarliniWagnerL2, Pgd};
use armoury_defenses::training::ProjectedAdversarialDefense;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// Armoury's main job end to end: train (or load) the reference cnn, attack it (FGSM, PGD-40, CW-L2), harden it
/// with PGD adversarial fine-tuning, attack it again, and print a table and one JSON line.
#[derive(Parser)]
#[command(
    name = "quickstart",
    after_help = "Example:\n  cargo run --release --example quickstart -- --save out/my-cnn.safetensors --force"
)]
struct Args {
    /// Where to save the model before the attacks; an existing file is kept unless --force
    #[arg(long, value_name = "FILE", default_value = "out/quickstart-cnn.safetensors")]
    save: PathBuf,
    /// Overwrite the --save file if it exists
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    data: args::DataArgs,
    #[command(flatten)]
    resources: args::Resources,
}

/// Training images of full Fashion-MNIST, on which the reference weights were trained.
const FULL_TRAIN: usize = 60_000;
/// The reference cnn trained by PyTorch, relative to the repository root.
const REFERENCE_WEIGHTS: &str = "tests/fixtures/cnn.safetensors";

/// The JSON line the quickstart ends with (fields in this order).
#[derive(serde::Serialize)]
struct Summary<'a> {
    example: &'static str,
    data: &'a str,
    /// `trained here` or `reference weights`.
    model: &'static str,
    train_images: usize,
    test_images: usize,
    /// Epochs trained by this run (0 when it starts from the reference weights).
    epochs: usize,
    test_accuracy: f64,
    train_seconds: f64,
    fgsm_robust_accuracy: f64,
    pgd40_robust_accuracy: f64,
    cw_success_rate: f64,
    cw_mean_l2: f64,
    at_clean_accuracy: f64,
    at_pgd40_robust_accuracy: f64,
    seconds: f64,
    model_file: String,
}

/// `v` to `decimals` places, so the JSON line carries the figures the table prints.
fn rounded(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

/// Robust accuracy, success rate and mean L2 of successes of `attack` on `x`.
fn attack_row(
    model: &ModuleClassifier,
    attack: &dyn Attack,
    x: &Tensor,
    y: &[usize],
) -> Result<(f32, f32, f32, f64), armoury::Error> {
    let t = Instant::now();
    let r = attack.run(model, x, y, &Goal::Untargeted, 0)?;
    let succ: Vec<f32> = r.norms.iter().zip(&r.success).filter(|(_, &s)| s).map(|(n, _)| n.l2).collect();
    let mean_l2 = if succ.is_empty() { 0.0 } else { succ.iter().sum::<f32>() / succ.len() as f32 };
    Ok((r.robust_accuracy(y), r.success_rate(), mean_l2, t.elapsed().as_secs_f64()))
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.resources.apply()?;
    // Refused before the work rather than after it.
    if args.save.exists() && !args.force {
        return Err(
            format!("{} exists: give --save another FILE, or --force to overwrite it", args.save.display()).into()
        );
    }
    let start = Instant::now();
    let set = match &args.data.data {
        Some(dir) => model::load_data(Some(dir))?,
        None => data::load_default(std::env::var_os("ARMOURY_DATA").as_deref().map(Path::new))?,
    };
    println!("data: {} — {} training / {} test images ({})", set.name, set.train.len(), set.test.len(), set.source);

    let model: Arc<Sequential> = Arc::new(cnn(0));
    println!("model: cnn, {} parameters", model.num_parameters());
    let full = set.name != data::SAMPLE_NAME;
    let (start_from, epochs, train_seconds) = if full {
        // The reference recipe: 3 epochs of Adam, lr 1e-3, batch 128, seeded.
        let mut opt = Adam::new(model.parameters(), AdamConfig::default())?;
        let cfg = TrainConfig { epochs: 3, batch_size: 128, seed: 0, ..Default::default() };
        let reports = fit(model.as_ref(), &mut opt, &set.train, None, &cfg, &mut progress::TrainProgress::new())?;
        ("trained here", 3, reports.iter().map(|r| r.seconds).sum::<f64>())
    } else {
        let weights = Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE_WEIGHTS);
        io::load_module(model.as_ref(), &weights)?;
        println!("full data set not installed: starting from the reference weights {REFERENCE_WEIGHTS}");
        println!("  (3 epochs of Adam in PyTorch on the full 60,000 training images; 0.865 on the full test set)");
        ("reference weights", 0, 0.0)
    };

    let eval = evaluate(model.as_ref(), &set.test, 1000)?;
    println!("\ntest accuracy {:.4} on {} images; confusion matrix (rows: true class):", eval.accuracy, eval.samples);
    for row in eval.confusion.rows() {
        println!("  {}", row.iter().map(|v| format!("{v:>5}")).collect::<String>());
    }

    let path = args.save.as_path();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    io::save_module(model.as_ref(), path)?;
    println!("saved {}", path.display());

    // Attack it: ε = 0.1 (L∞) on the first 1000 test images; CW-L2 on the first 100.
    let clf = ModuleClassifier::new(model.clone(), &[1, 28, 28], 10, (0.0, 1.0))?;
    let (x, y) = set.test.batch(0..1000.min(set.test.len()))?;
    let (x100, y100) = set.test.batch(0..100.min(set.test.len()))?;
    let pgd40 = Pgd { step_size: 0.01, steps: 40, ..Pgd::linf(0.1) };
    println!("\nattacking (ε = 0.1): FGSM, PGD-40, CW-L2");
    let fgsm = attack_row(&clf, &Pgd::fgsm(0.1), &x, &y)?;
    let pgd = attack_row(&clf, &pgd40, &x, &y)?;
    let cw = attack_row(&clf, &CarliniWagnerL2::torchattacks(), &x100, &y100)?;

    // Harden it: one epoch of Madry PGD adversarial fine-tuning (7 steps of 0.025 from a random start) on the
    // embedded sample's 2,000 training images, then PGD-40 again.
    println!("adversarial fine-tuning: 1 epoch of PGD-AT on {} images", set.train.len().min(2000));
    let sample_train = data::sample()?.train;
    let mut opt = Adam::new(model.parameters(), AdamConfig::default())?;
    let madry = ProjectedAdversarialDefense::madry(Box::new(Pgd { step_size: 0.025, steps: 7, ..Pgd::linf(0.1) }));
    let at = Trainer::new(TrainConfig { epochs: 1, ..Default::default() }).method(&madry).fit(
        model.as_ref(),
        &mut opt,
        &sample_train,
        &mut (),
    )?;
    let hardened_clean = evaluate(model.as_ref(), &set.test, 1000)?.accuracy;
    let hardened = attack_row(&clf, &pgd40, &x, &y)?;

    println!("\n{:<28} {:>20}", "figure", "value");
    println!("{:<28} {:>20}", "data", set.name);
    println!("{:<28} {:>20}", "model", start_from);
    println!("{:<28} {:>20}", "training images", if full { set.train.len() } else { FULL_TRAIN });
    println!("{:<28} {:>20.4}", "clean test accuracy", eval.accuracy);
    println!("{:<28} {:>20.1}", "training seconds", train_seconds);
    println!("{:<28} {:>20.4}", "FGSM robust accuracy", fgsm.0);
    println!("{:<28} {:>20.4}", "PGD-40 robust accuracy", pgd.0);
    println!("{:<28} {:>20.4}", "CW-L2 success (100 images)", cw.1);
    println!("{:<28} {:>20.4}", "CW-L2 mean L2 of successes", cw.2);
    println!("{:<28} {:>20.1}", "PGD-40 seconds", pgd.3);
    println!("{:<28} {:>20.1}", "PGD-AT fine-tune seconds", at[0].seconds);
    println!("{:<28} {:>20.4}", "clean accuracy after AT", hardened_clean);
    println!("{:<28} {:>20.4}", "PGD-40 robust after AT", hardened.0);
    let line = Summary {
        example: "quickstart",
        data: &set.name,
        model: start_from,
        train_images: if full { set.train.len() } else { FULL_TRAIN },
        test_images: eval.samples,
        epochs,
        test_accuracy: rounded(f64::from(eval.accuracy), 4),
        train_seconds: rounded(train_seconds, 2),
        fgsm_robust_accuracy: rounded(f64::from(fgsm.0), 4),
        pgd40_robust_accuracy: rounded(f64::from(pgd.0), 4),
        cw_success_rate: rounded(f64::from(cw.1), 4),
        cw_mean_l2: rounded(f64::from(cw.2), 4),
        at_clean_accuracy: rounded(f64::from(hardened_clean), 4),
        at_pgd40_robust_accuracy: rounded(f64::from(hardened.0), 4),
        seconds: rounded(start.elapsed().as_secs_f64(), 2),
        model_file: path.display().to_string(),
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}
