//! Resident memory over a long adversarial training: does it stay flat after the first epoch?
//!
//! `cargo run --release --example memory_growth -- [--epochs 10] [--train-limit 2000] [--steps 7] [--eps 0.1]
//! [--model cnn|mlp] [--data DIR] [--seed S] [--max-memory SIZE]`
//!
//! Trains the reference model with PGD adversarial training (Madry et al. 2018: L∞ PGD with `--steps` steps of
//! 0.025·ε/0.1 from a random start) on the first `--train-limit` training images, evaluating on the test set after
//! every epoch, and prints the process's resident memory (`VmRSS` of `/proc/self/status`) after each epoch, its
//! growth after the first epoch, and one JSON line. See docs/reliability.md.

#[path = "support/cli.rs"]
mod cli;

use std::path::PathBuf;

use armoury::nn::{ModuleExt, ReferenceModel};
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{EpochReport, TrainCallback, TrainConfig, Trainer};
use armoury_attacks::Pgd;
use armoury_defenses::training::ProjectedAdversarialDefense;

struct Args {
    epochs: usize,
    train_limit: usize,
    steps: usize,
    eps: f32,
    model: ReferenceModel,
    data: Option<PathBuf>,
    seed: u64,
}

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let mut a =
        Args { epochs: 10, train_limit: 2000, steps: 7, eps: 0.1, model: ReferenceModel::Cnn, data: None, seed: 0 };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long("epochs") => a.epochs = p.value()?.parse()?,
            Long("train-limit") => a.train_limit = p.value()?.parse()?,
            Long("steps") => a.steps = p.value()?.parse()?,
            Long("eps") => a.eps = p.value()?.parse()?,
            Long("model") => a.model = p.value()?.parse()?,
            Long("data") => a.data = Some(p.value()?.into()),
            Long("seed") => a.seed = p.value()?.parse()?,
            Long("max-memory") => cli::set_max_memory(&p.value()?.string()?)?,
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(a)
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
    let args = parse()?;
    let set = match &args.data {
        Some(d) => armoury::data::load_idx_dir(d)?,
        None => armoury::data::load_default(None)?,
    };
    let train = set.train.take(args.train_limit.min(set.train.len()))?;
    println!(
        "data: {} — {} training / {} test images; VmRSS at start {} KiB",
        set.name,
        train.len(),
        set.test.len(),
        rss_kib()
    );
    let net = args.model.build(args.seed);
    let step = 0.025 * args.eps / 0.1;
    let method =
        ProjectedAdversarialDefense::madry(Box::new(Pgd { step_size: step, steps: args.steps, ..Pgd::linf(args.eps) }));
    let config = TrainConfig { epochs: args.epochs, seed: args.seed, ..TrainConfig::default() };
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
