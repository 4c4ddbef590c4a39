//! Resident memory over a long adversarial training: does it stay flat after the first epoch?
//!
//! `cargo run --release --example memory_growth -- [--epochs 10] [--train-limit 2000]` (`--help` lists every flag)
//!
//! Trains the reference model with PGD adversarial training (Madry et al. 2018: L∞ PGD with `--steps` steps of
//! 0.025·ε/0.1 from a random start) on the first `--train-limit` training images, evaluating on the test set after
//! every epoch, and prints the process's resident memory (`VmRSS` of `/proc/self/status`) after each epoch, its
//! growth after the first epoch, and one JSON line. See docs/reliability.md.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;

use armoury::load as model;
use armoury::nn::{ModuleExt, ReferenceModel};
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{EpochReport, TrainCallback, TrainConfig, Trainer};
use armoury_attacks::Pgd;
use armoury_defenses::training::ProjectedAdversarialDefense;
use clap::Parser;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// Resident memory over a long PGD adversarial training of a reference model: does it stay flat after the first
/// epoch? Prints VmRSS after each epoch, the growth after the first, and one JSON line.
#[derive(Parser)]
#[command(
    name = "memory_growth",
    after_help = "Example:\n  cargo run --release --example memory_growth -- --epochs 10 --train-limit 2000"
)]
struct Args {
    /// Training epochs
    #[arg(long, value_name = "N", default_value_t = 10)]
    epochs: usize,
    /// Train on the first N training images
    #[arg(long, value_name = "N", default_value_t = 2000)]
    train_limit: usize,
    /// PGD steps per training batch (of 0.025·ε/0.1 each, from a random start)
    #[arg(long, value_name = "N", default_value_t = 7)]
    steps: usize,
    /// PGD's L∞ budget ε
    #[arg(long, value_name = "E", default_value_t = 0.1)]
    eps: f32,
    /// The reference model: cnn or mlp
    #[arg(long, value_name = "cnn|mlp", default_value = "cnn")]
    model: ReferenceModel,
    #[command(flatten)]
    data: args::DataArgs,
    #[command(flatten)]
    run: args::RunArgs,
}

/// The resident set size of this process in KiB (Linux), 0 where `/proc` is not available.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Rss(Vec<u64>);

impl TrainCallback for Rss {
    fn on_epoch(&mut self, r: &EpochReport) {
        let kib = rss_kib();
        self.0.push(kib);
        println!(
            "epoch {:>2}: loss {:.4}, train acc {:.4}, {:.1} s, VmRSS {:.1} MiB",
            r.epoch + 1,
            r.train_loss,
            r.train_accuracy,
            r.seconds,
            kib as f64 / 1024.0
        );
    }
}

#[derive(serde::Serialize)]
struct Line {
    epochs: usize,
    train_images: usize,
    rss_mib: Vec<f64>,
    growth_after_first_epoch_mib: f64,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.run.apply()?;
    let set = model::load_data(args.data.data.as_deref())?;
    let train = set.training("training")?;
    let train = train.take(args.train_limit.min(train.len()))?;
    println!(
        "data: {} — {} training / {} test images; VmRSS at start {} KiB",
        set.name,
        train.len(),
        set.test.len(),
        rss_kib()
    );
    let net = args.model.build(args.run.seed);
    let step = 0.025 * args.eps / 0.1;
    let method =
        ProjectedAdversarialDefense::madry(Box::new(Pgd { step_size: step, steps: args.steps, ..Pgd::linf(args.eps) }));
    let config = TrainConfig { epochs: args.epochs, seed: args.run.seed, ..TrainConfig::default() };
    let mut opt = Adam::new(net.parameters(), AdamConfig::default())?;
    let mut rss = Rss(Vec::new());
    Trainer::new(config).method(&method).test(Some(&set.test)).fit(&net, &mut opt, &train, &mut rss)?;
    let mib: Vec<f64> = rss.0.iter().map(|&k| (k as f64 / 1024.0 * 10.0).round() / 10.0).collect();
    let after_first =
        rss.0.iter().skip(1).max().copied().unwrap_or(0) as f64 - rss.0.first().copied().unwrap_or(0) as f64;
    let growth = (after_first / 1024.0 * 10.0).round() / 10.0;
    println!("growth after the first epoch: {growth} MiB (largest later epoch − first epoch)");
    let line =
        Line { epochs: args.epochs, train_images: train.len(), rss_mib: mib, growth_after_first_epoch_mib: growth };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}
