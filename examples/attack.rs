//! Attack a model and report what broke.
//!
//! `cargo run --release --example attack -- --attack pgd --eps 0.1 [--norm linf] [--steps 40] [--step-size A]
//! [--restarts R] [--queries Q] [--model cnn|mlp|FILE.onnx] [--bounds 0,1] [--weights FILE.safetensors]
//! [--data DIR] [--limit N] [--targeted random|least-likely|CLASS] [--seed S] [--max-memory SIZE] [--out DIR]`
//!
//! Loads the weights (or trains the reference model: 3 epochs of Adam, lr 1e-3, batch 128), builds the attack by
//! name from `armoury_attacks::registry` (`--help` lists the names), attacks the first N test images with the
//! seed, prints a table, writes a PNG grid of clean / adversarial / magnified-perturbation images, and ends with
//! one JSON line.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/load.rs"]
mod load;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;
use std::time::Instant;

use armoury::data::{perturbation_image, save_png_grid, GridRow};
use armoury::load as model;
use armoury::{Classifier, Goal, Tensor};
use armoury_attacks::registry::{self, AttackParams};
use indicatif::{ProgressBar, ProgressStyle};

struct Args {
    m: load::ModelFlags,
    name: String,
    params: AttackParams,
    seed: u64,
    limit: usize,
    targeted: Option<String>,
    out: PathBuf,
}

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let mut a = Args {
        name: "pgd".into(),
        params: AttackParams::default(),
        seed: 0,
        m: load::ModelFlags::default(),
        limit: 1000,
        targeted: None,
        out: PathBuf::from("out"),
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long(k) if load::ModelFlags::FLAGS.contains(&k) => {
                let k = k.to_string();
                a.m.take(&k, &mut p)?
            }
            Long("attack") => a.name = p.value()?.string()?.to_lowercase(),
            Long("eps") => a.params.eps = p.value()?.parse()?,
            Long("norm") => a.params.norm = Some(p.value()?.parse()?),
            Long("steps") => a.params.steps = Some(p.value()?.parse()?),
            Long("step-size") => a.params.step_size = Some(p.value()?.parse()?),
            Long("restarts") => a.params.restarts = Some(p.value()?.parse()?),
            Long("queries") => a.params.queries = Some(p.value()?.parse()?),
            Long("seed") => a.seed = p.value()?.parse()?,
            Long("max-memory") => cli::set_max_memory(&p.value()?.string()?)?,
            Long("limit") => a.limit = p.value()?.parse()?,
            Long("targeted") => a.targeted = Some(p.value()?.string()?),
            Long("out") => a.out = p.value()?.into(),
            Long("help") | Short('h') => {
                println!("attacks:");
                for (name, description) in registry::table() {
                    println!("  {name:<16} {description}");
                }
                std::process::exit(0);
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(a)
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let set = model::load_data(args.m.data.as_deref())?;
    println!("data: {} ({} test images; {})", set.name, set.test.len(), set.source);
    let (_, clf) = load::load_model(&args.m.model, args.m.weights.as_deref(), args.m.bounds, &set, args.seed)?;
    let attack = registry::by_name(&args.name, &args.params)?;
    let n = args.limit.min(set.test.len());
    let (x, y) = set.test.batch(0..n)?;
    let goal = goal(&args, n)?;
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
        results.push(attack.run(&clf, &xs, &y[s..e], &g, args.seed)?);
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
        "attack": args.name,
        // ε as written (its shortest decimal), not the f64 widening of the f32 (0.10000000149011612).
        "eps": args.params.eps.to_string().parse::<f64>().unwrap_or(f64::NAN),
        "seed": args.seed,
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
    let magnify = 0.5 / args.params.eps.max(1e-3);
    let pert = (0..show)
        .map(|i| perturbation_image(&x.narrow(0, i, 1)?, &adv.narrow(0, i, 1)?, magnify))
        .collect::<Result<Vec<_>, _>>()?;
    rows.push(GridRow::new(format!("x{magnify:.0}"), pert));
    save_png_grid(&png, &rows, 3)?;
    Ok(png)
}

/// The goal `--targeted` names (none, `random`, `least-likely`/`ll`, or a class for every image).
fn goal(args: &Args, n: usize) -> Result<Goal, Box<dyn std::error::Error>> {
    Ok(match args.targeted.as_deref() {
        None => Goal::Untargeted,
        Some("random") => Goal::RandomTarget { seed: args.seed },
        Some("least-likely") | Some("ll") => Goal::LeastLikely,
        Some(c) => Goal::Targeted(vec![c.parse()?; n]),
    })
}
