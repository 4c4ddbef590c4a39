//! Attack a model and report what broke.
//!
//! `cargo run --release --example attack -- --attack pgd --eps 0.1` (`--help` lists every flag and attack)
//!
//! Loads the weights (or trains the reference model: 3 epochs of Adam, lr 1e-3, batch 128), builds the attack by
//! name from `armoury_attacks::registry`, attacks the first N test images with the
//! seed, prints a table, writes a PNG grid of clean / adversarial / magnified-perturbation images, and ends with
//! one JSON line.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/load.rs"]
mod load;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;
use std::time::Instant;

use armoury::attack::Norm;
use armoury::data::{perturbation_image, save_png_grid, GridRow};
use armoury::load as model;
use armoury::{Classifier, Goal, Tensor};
use armoury_attacks::registry::{self, AttackParams};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// Attack a model and report what broke: a table, a PNG grid of clean / adversarial / magnified-perturbation
/// images, and one JSON line. Without --weights, a reference model is trained here first (3 epochs of Adam).
#[derive(Parser)]
#[command(name = "attack", after_help = after_help())]
struct Args {
    #[command(flatten)]
    m: args::ModelArgs,
    /// The attack, by its registry name (listed below)
    #[arg(long = "attack", value_name = "NAME", default_value = "pgd", value_parser = args::lower)]
    name: String,
    /// Perturbation budget ε in input units
    #[arg(long, value_name = "E", default_value_t = 0.1)]
    eps: f32,
    /// The norm, for attacks that have several: l1, l2 or linf [default: the attack's own]
    #[arg(long, value_name = "NORM")]
    norm: Option<Norm>,
    /// Iterations [default: the attack's own]
    #[arg(long, value_name = "N")]
    steps: Option<usize>,
    /// Step size in input units [default: the attack's own]
    #[arg(long, value_name = "A")]
    step_size: Option<f32>,
    /// Random restarts [default: the attack's own]
    #[arg(long, value_name = "R")]
    restarts: Option<usize>,
    /// Model queries per image, for black-box attacks [default: the attack's own]
    #[arg(long, value_name = "Q")]
    queries: Option<u64>,
    /// Attack the first N test images
    #[arg(long, value_name = "N", default_value_t = 1000)]
    limit: usize,
    /// A targeted attack: a random other class, the least-likely class, or CLASS for every image [default:
    /// untargeted]
    #[arg(long, value_name = "random|least-likely|CLASS", value_parser = target)]
    targeted: Option<Target>,
    /// Directory of the PNG grid
    #[arg(long, value_name = "DIR", default_value = "out")]
    out: PathBuf,
    #[command(flatten)]
    run: args::RunArgs,
}

/// `--targeted`.
#[derive(Clone, Debug)]
enum Target {
    Random,
    LeastLikely,
    Class(usize),
}

fn target(s: &str) -> Result<Target, String> {
    match s {
        "random" => Ok(Target::Random),
        "least-likely" | "ll" => Ok(Target::LeastLikely),
        c => c.parse().map(Target::Class).map_err(|_| format!("'{c}' is not random, least-likely or a class")),
    }
}

/// The attack names of the registry, then an example.
fn after_help() -> String {
    let mut s = String::from("Attacks (--attack):\n");
    for (name, description) in registry::table() {
        s += &format!("  {name:<16} {description}\n");
    }
    s + "\nExample:\n  cargo run --release --example attack -- --attack pgd --eps 0.1 --steps 40 --step-size 0.01 \\\n    \
         --weights tests/fixtures/cnn.safetensors --limit 200"
}

impl Args {
    /// The attack's settings from the flags.
    fn params(&self) -> AttackParams {
        AttackParams {
            eps: self.eps,
            norm: self.norm,
            steps: self.steps,
            step_size: self.step_size,
            restarts: self.restarts,
            queries: self.queries,
            ..AttackParams::default()
        }
    }
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.run.apply()?;
    let params = args.params();
    let set = args.m.load_data()?;
    println!("data: {} ({} test images; {})", set.name, set.test.len(), set.source);
    let (_, clf) = load::load_model(&args.m, args.m.weights.as_deref(), &set, args.run.seed)?;
    let attack = registry::by_name(&args.name, &params)?;
    let n = args.limit.min(set.test.len());
    let (x, y) = set.test.batch(0..n)?;
    let goal = goal(&args, n);
    println!("attack: {} on {} images, goal {:?}", attack.name(), n, goal);

    let clean_pred = clf.predict(&x)?;
    let clean_acc = clean_pred.iter().zip(&y).filter(|(p, l)| p == l).count() as f64 / n as f64;
    let start = Instant::now();
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} images ({elapsed}, eta {eta})")?.progress_chars("=> "),
    );
    let chunk = 250;
    let mut results = Vec::new();
    for s in (0..n).step_by(chunk) {
        let e = (s + chunk).min(n);
        let xs = x.narrow(0, s, e - s)?;
        let g = match &goal {
            Goal::Targeted(t) => Goal::Targeted(t[s..e].to_vec()),
            other => other.clone(),
        };
        results.push(attack.run(&clf, &xs, &y[s..e], &g, args.run.seed)?);
        bar.inc((e - s) as u64);
    }
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    let adv = Tensor::concat(&results.iter().map(|r| r.adversarial.clone()).collect::<Vec<_>>(), 0)?;
    let success: Vec<bool> = results.iter().flat_map(|r| r.success.iter().copied()).collect();
    let preds: Vec<usize> = results.iter().flat_map(|r| r.predictions.iter().copied()).collect();
    let norms: Vec<armoury::Norms> = results.iter().flat_map(|r| r.norms.iter().copied()).collect();
    let gradients: u64 = results.iter().map(|r| r.total_gradients()).sum();
    let mut queries: Vec<u64> = results.iter().flat_map(|r| r.queries.iter().copied()).collect();
    let robust = preds.iter().zip(&y).filter(|(p, l)| p == l).count() as f64 / n as f64;
    let rate = success.iter().filter(|&&s| s).count() as f64 / n as f64;
    let succ: Vec<&armoury::Norms> = norms.iter().zip(&success).filter(|(_, &s)| s).map(|(m, _)| m).collect();
    let mean = |f: &dyn Fn(&armoury::Norms) -> f32| {
        if succ.is_empty() {
            0.0
        } else {
            succ.iter().map(|m| f(m) as f64).sum::<f64>() / succ.len() as f64
        }
    };
    let (mean_l0, mean_l2, mean_linf) = (mean(&|m| m.l0), mean(&|m| m.l2), mean(&|m| m.linf));
    queries.sort_unstable();
    let q_mean = queries.iter().sum::<u64>() as f64 / n as f64;
    let q_median = queries.get(n / 2).copied().unwrap_or(0);
    let q_max = *queries.last().unwrap_or(&0);

    let png = save_grid(&args, &x, &adv, n)?;

    println!("\n{:<26} {:>12}", "figure", "value");
    let table = [
        ("images", format!("{n}")),
        ("clean accuracy", format!("{clean_acc:.4}")),
        ("robust accuracy", format!("{robust:.4}")),
        ("success rate", format!("{rate:.4}")),
        ("mean L0 (successes)", format!("{mean_l0:.1}")),
        ("mean L2 (successes)", format!("{mean_l2:.4}")),
        ("mean Linf (successes)", format!("{mean_linf:.4}")),
        ("gradients", format!("{gradients}")),
        ("queries mean/median/max", format!("{q_mean:.0}/{q_median}/{q_max}")),
        ("seconds", format!("{seconds:.2}")),
        ("images/s", format!("{:.0}", n as f64 / seconds)),
    ];
    for (k, v) in table {
        println!("{k:<26} {v:>12}");
    }
    println!("grid: {}", png.display());
    // Figures rounded as the table shows them.
    let round = |v: f64, places: i32| (v * 10f64.powi(places)).round() / 10f64.powi(places);
    let line = serde_json::json!({
        "example": "attack",
        "attack": args.name,
        // ε as written (its shortest decimal), not the f64 widening of the f32 (0.10000000149011612).
        "eps": args.eps.to_string().parse::<f64>().unwrap_or(f64::NAN),
        "seed": args.run.seed,
        "images": n,
        "clean_accuracy": round(clean_acc, 4),
        "robust_accuracy": round(robust, 4),
        "success_rate": round(rate, 4),
        "mean_l2": round(mean_l2, 4),
        "mean_linf": round(mean_linf, 4),
        "seconds": round(seconds, 3),
        "gradients": gradients,
        "queries_mean": round(q_mean, 1),
        "queries_median": q_median,
        "queries_max": q_max,
    });
    println!("{line}");
    Ok(())
}

/// The PNG grid of the first images: clean, adversarial, and the perturbation magnified to half the range.
fn save_grid(
    args: &Args,
    x: &Tensor,
    adv: &Tensor,
    n: usize,
) -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&args.out)?;
    let png = args.out.join(format!("attack-{}.png", args.name));
    let show = n.min(8);
    let mut rows = vec![GridRow::new("clean", (0..show).map(|i| x.narrow(0, i, 1)).collect::<Result<Vec<_>, _>>()?)];
    rows.push(GridRow::new("adv", (0..show).map(|i| adv.narrow(0, i, 1)).collect::<Result<Vec<_>, _>>()?));
    let magnify = 0.5 / args.eps.max(1e-3);
    let pert = (0..show)
        .map(|i| perturbation_image(&x.narrow(0, i, 1)?, &adv.narrow(0, i, 1)?, magnify))
        .collect::<Result<Vec<_>, _>>()?;
    rows.push(GridRow::new(format!("x{magnify:.0}"), pert));
    save_png_grid(&png, &rows, 3)?;
    Ok(png)
}

/// The goal `--targeted` names (none, `random`, `least-likely`/`ll`, or a class for every image).
fn goal(args: &Args, n: usize) -> Goal {
    match args.targeted {
        None => Goal::Untargeted,
        Some(Target::Random) => Goal::RandomTarget { seed: args.run.seed },
        Some(Target::LeastLikely) => Goal::LeastLikely,
        Some(Target::Class(c)) => Goal::Targeted(vec![c; n]),
    }
}
