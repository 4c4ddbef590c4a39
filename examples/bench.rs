//! Core speed: forward, forward + input gradient, a training step and a training epoch of the reference
//! models, as time, images/s and GFLOP/s, against the PyTorch/onnxruntime baselines measured on the AVX-512
//! development machine (docs/reference.md, speed baselines); then FGSM, PGD-40 and CW-L2 on the fixture cnn
//! against torchattacks' times, and the imported ONNX export against the native model.
//!
//! GFLOP/s counts the dense model's work (2 FLOPs per multiply-add; ×2 with the input gradient, ×3 for training),
//! so it is an effective rate: the cnn's pooled backward skips the three quarters of its convolution's
//! multiply-adds that meet zeros.
//!
//! `cargo run --release --example bench [-- --quick]` (`--help` lists the flags)

#[path = "support/args.rs"]
mod args;
#[path = "../benches/support/bench.rs"]
mod bench;
#[path = "support/cli.rs"]
mod cli;

use armoury::data::Dataset;
use armoury::load as model;
use armoury::nn::ReferenceModel;
use armoury::Classifier;
use clap::{Parser, ValueEnum};

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// Core speed of the reference models (forward, input gradient, training) and of FGSM, PGD-40 and CW-L2 against
/// the PyTorch, onnxruntime and torchattacks baselines, as a table and one JSON line.
#[derive(Parser)]
#[command(
    name = "bench",
    after_help = "Example:\n  cargo run --release --example bench -- --workloads inference,attacks --models cnn --reps 5"
)]
struct Args {
    /// The workloads to measure, comma-separated
    #[arg(long, value_name = "W,…", value_delimiter = ',', default_values = ["inference", "training", "attacks", "onnx"])]
    workloads: Vec<Workload>,
    /// The reference models of the inference and training workloads, comma-separated
    #[arg(long, value_name = "M,…", value_delimiter = ',', default_values = ["cnn", "mlp"])]
    models: Vec<ReferenceModel>,
    /// Timed runs per figure, the median reported [default: 9 to 201 for inference by batch size, 21 for a
    /// training step, 3 for the attacks, 15 for the ONNX comparison]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    reps: Option<u64>,
    /// Skip the full training epoch (the longest workload)
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    resources: args::Resources,
}

/// A `--workloads` name.
#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum Workload {
    /// Forward and forward + input gradient at batch 1, 128 and 1000
    Inference,
    /// One Adam step at batch 128 and one epoch of 60,000 images
    Training,
    /// FGSM, PGD-40 and CW-L2 on the fixture cnn
    Attacks,
    /// The imported ONNX export of the fixture cnn against the native model
    Onnx,
}

/// The JSON line the example ends with: every workload and every attack.
#[derive(serde::Serialize)]
struct Summary {
    bench: Vec<RowLine>,
    attacks: Vec<AttackLine>,
}

/// One core workload in the JSON line.
#[derive(serde::Serialize)]
struct RowLine {
    model: &'static str,
    workload: &'static str,
    batch: usize,
    ms: f64,
    images_per_s: f64,
    gflops: f64,
}

/// One attack in the JSON line.
#[derive(serde::Serialize)]
struct AttackLine {
    attack: &'static str,
    images: usize,
    seconds: f64,
    images_per_s: f64,
    robust_accuracy: f64,
    success_rate: f64,
    mean_l2: f64,
    torchattacks_seconds: f64,
    speedup: f64,
}

/// `v` to `decimals` places, so the JSON line carries the figures the table prints.
fn rounded(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.resources.apply()?;
    let reps = args.reps.map(|r| r as usize);
    let on = |w: Workload| args.workloads.contains(&w);
    let set = model::load_data(None)?;
    let train = if !on(Workload::Training) {
        set.train.clone()
    } else if set.train.len() >= 60_000 {
        set.train.take(60_000)?
    } else {
        set.train.repeat_to(60_000)?
    };
    let probe = set.test.take(1000)?.repeat_to(1000)?;
    println!("data: {} ({}), {} threads", set.name, set.source, rayon::current_num_threads());
    let mut rows = Vec::new();
    for &model in &args.models {
        if on(Workload::Inference) {
            rows.extend(bench::inference(model, &[1, 128, 1000], &probe, reps)?);
        }
        if on(Workload::Training) {
            rows.extend(bench::training(model, &train, !args.quick, reps)?);
        }
    }
    println!("{:<5} {:<20} {:>6} {:>11} {:>12} {:>9}", "model", "workload", "batch", "ms", "images/s", "GFLOP/s");
    for r in &rows {
        println!(
            "{:<5} {:<20} {:>6} {:>11.3} {:>12.0} {:>9.1}",
            r.model, r.workload, r.batch, r.ms, r.images_per_s, r.gflops
        );
    }
    let targets = [
        ("cnn", "forward_input_grad", 1000, 50.0, "3x faster than PyTorch's 150 ms"),
        ("cnn", "forward", 1000, 15.0, "within 2x of onnxruntime's 7.7 ms"),
        ("cnn", "forward_input_grad", 1, 0.3, "under 0.3 ms"),
        ("mlp", "forward_input_grad", 1000, 6.0, "within 1.5x of PyTorch's 4.0 ms"),
        ("cnn", "train_epoch", 60000, 3900.0, "faster than PyTorch's 3.9-5.1 s"),
    ];
    println!("\ntargets:");
    for (m, w, b, limit, what) in targets {
        if let Some(r) = rows.iter().find(|r| r.model == m && r.workload == w && r.batch == b) {
            let ok = if r.ms <= limit { "met" } else { "MISSED" };
            println!("  {m} {w} batch {b}: {:.3} ms (target <= {limit} ms, {what}) {ok}", r.ms);
        }
    }
    let weights = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cnn.safetensors");
    let attack_rows =
        if on(Workload::Attacks) { bench::attacks(&weights, &probe, reps.unwrap_or(3))? } else { Vec::new() };
    if on(Workload::Attacks) {
        print_attacks(&attack_rows);
    }
    if on(Workload::Onnx) {
        onnx_vs_native(&probe, reps.unwrap_or(15))?;
    }
    let line = Summary {
        bench: rows
            .iter()
            .map(|r| RowLine {
                model: r.model,
                workload: r.workload,
                batch: r.batch,
                ms: rounded(r.ms, 4),
                images_per_s: rounded(r.images_per_s, 1),
                gflops: rounded(r.gflops, 2),
            })
            .collect(),
        attacks: attack_rows
            .iter()
            .map(|r| AttackLine {
                attack: r.attack,
                images: r.images,
                seconds: rounded(r.seconds, 4),
                images_per_s: rounded(r.images as f64 / r.seconds, 1),
                robust_accuracy: rounded(f64::from(r.robust_accuracy), 4),
                success_rate: rounded(f64::from(r.success_rate), 4),
                mean_l2: rounded(f64::from(r.mean_l2), 4),
                torchattacks_seconds: r.reference_seconds,
                speedup: rounded(r.reference_seconds / r.seconds, 2),
            })
            .collect(),
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}

/// The attack table.
fn print_attacks(attack_rows: &[bench::AttackRow]) {
    println!("\nattacks on the fixture cnn (the baselines' settings; torchattacks' times from the AVX-512 machine):");
    println!(
        "{:<7} {:>6} {:>9} {:>10} {:>8} {:>8} {:>8} {:>12} {:>8}",
        "attack", "images", "seconds", "images/s", "robust", "success", "mean L2", "torchattacks", "speedup"
    );
    for r in attack_rows {
        println!(
            "{:<7} {:>6} {:>9.3} {:>10.0} {:>8.4} {:>8.4} {:>8.4} {:>11.3}s {:>7.1}x",
            r.attack,
            r.images,
            r.seconds,
            r.images as f64 / r.seconds,
            r.robust_accuracy,
            r.success_rate,
            r.mean_l2,
            r.reference_seconds,
            r.reference_seconds / r.seconds
        );
    }
}

/// The imported ONNX export of the fixture cnn against the native model, median of `reps` runs (same kernels; the
/// interpreter runs Conv and Relu as separate nodes where the native `Sequential` fuses them).
fn onnx_vs_native(probe: &Dataset, reps: usize) -> armoury::Result<()> {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let onnx = armoury::onnx::OnnxModel::load(fixtures.join("cnn.onnx"))?.classifier((0.0, 1.0))?;
    let native = armoury::ModuleClassifier::new(ReferenceModel::Cnn.build(0), &[1, 28, 28], 10, (0.0, 1.0))?;
    let (x, y) = probe.batch(0..256)?;
    println!("\nonnx import vs native cnn, batch 256:");
    for (what, onnx_ms, native_ms) in [
        (
            "forward",
            bench::median_ms(reps, || onnx.logits(&x).map(drop))?,
            bench::median_ms(reps, || native.logits(&x).map(drop))?,
        ),
        (
            "forward_input_grad",
            bench::median_ms(reps, || onnx.loss_gradient(&x, &y).map(drop))?,
            bench::median_ms(reps, || native.loss_gradient(&x, &y).map(drop))?,
        ),
    ] {
        println!("  {what:<20} onnx {onnx_ms:.3} ms, native {native_ms:.3} ms, ratio {:.2}", onnx_ms / native_ms);
    }
    Ok(())
}
