//! Make a model more robust: adversarial training with any of Armoury's methods, clean and robust accuracy
//! after every epoch, the model saved, an SVG of accuracy per epoch, and a JSON line.
//!
//! `cargo run --release --example adversarial_training -- --defense pgd|trades|mart|fast|free|nad|ensemble
//! [--eps 0.1] [--epochs 10]` (`--help` lists every flag)
//!
//! Clean accuracy is on the full test set, robust accuracy (PGD-40 with steps of 0.01 from a random start, and
//! APGD-CE) on its first `--robust-samples` images. A defense that resists PGD but not APGD or a box-sized
//! budget is flagged.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use armoury::load as model;
use armoury::nn::{ModuleExt, ReferenceModel};
use armoury::optim::{Adam, AdamConfig, LrSchedule};
use armoury::report::{LineChart, Series};
use armoury::robustness::RobustnessConfig;
use armoury::train::{EpochReport, Method, Standard, StepReport, TrainCallback, TrainConfig, Trainer};
use armoury::{io, Attack, Classifier};
use armoury_attacks::{Apgd, Pgd};
use armoury_defenses::training::*;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// Make a model more robust with adversarial training: clean and robust accuracy (PGD-40, APGD-CE) after every
/// epoch, the model saved, an SVG of accuracy per epoch, and one JSON line. Training starts from --weights when
/// given, else from a fresh initialisation.
#[derive(Parser)]
#[command(
    name = "adversarial_training",
    after_help = "Example:\n  cargo run --release --example adversarial_training -- --defense pgd --eps 0.1 --epochs 10"
)]
struct Args {
    /// The training method: PGD-AT (Madry), TRADES, MART, fast AT, free AT, NAD, ensemble AT, or standard
    /// training
    #[arg(long, value_name = "NAME", default_value = "pgd", value_parser = [
        "pgd", "madry", "trades", "mart", "fast", "free", "nad", "ensemble", "standard", "none",
    ])]
    defense: String,
    /// L∞ budget ε of the training attacks and of the robust accuracy
    #[arg(long, value_name = "E", default_value_t = 0.1)]
    eps: f32,
    /// Training epochs
    #[arg(long, value_name = "N", default_value_t = 10)]
    epochs: usize,
    #[command(flatten)]
    m: args::ModelArgs,
    /// Where to save the trained weights [default: out/DEFENSE-MODEL.safetensors]
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Train on the first N training images [default: all]
    #[arg(long, value_name = "N")]
    train_limit: Option<usize>,
    /// Robust accuracy on the first N test images
    #[arg(long, value_name = "N", default_value_t = 2000)]
    robust_samples: usize,
    #[command(flatten)]
    run: args::RunArgs,
}

struct Bars {
    bar: Option<ProgressBar>,
}

impl TrainCallback for Bars {
    fn on_step(&mut self, r: &StepReport) {
        let bar = self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::new(r.batches as u64);
            bar.set_style(
                ProgressStyle::with_template("epoch {prefix:>2} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(format!("{}", r.epoch + 1));
            bar
        });
        bar.set_message(format!("loss {:.3}", r.loss));
        bar.inc(1);
    }
    fn on_epoch(&mut self, s: &EpochReport) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        let Some(e) = s.robust.as_ref() else { return };
        let robust: Vec<String> = e.robust_accuracy.iter().map(|(n, a)| format!("{n} {a:.4}")).collect();
        println!(
            "epoch {:>2}: loss {:.4}, train acc {:.4}, clean {:.4}, robust {}, {:.1} s{}",
            s.epoch + 1,
            s.train_loss,
            s.train_accuracy,
            e.clean_accuracy,
            robust.join(", "),
            s.seconds,
            if e.warnings.is_empty() { String::new() } else { format!("  WARNING: {}", e.warnings.join("; ")) }
        );
    }
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

/// The training method named by `--defense`, its attacks built from the attack crate.
fn build_method(args: &Args, train: &armoury::data::Dataset) -> Result<Box<dyn Method>, Box<dyn std::error::Error>> {
    let eps = args.eps;
    let step = 0.025 * eps / 0.1; // Madry et al.'s MNIST recipe scaled to ε: 7 steps of 0.025 at ε = 0.1
    let pgd = |steps: usize| Box::new(Pgd { step_size: step, steps, ..Pgd::linf(eps) });
    Ok(match args.defense.as_str() {
        "pgd" | "madry" => Box::new(ProjectedAdversarialDefense::madry(pgd(7))),
        "trades" => Box::new(Trades::new(eps, step, 7)),
        "mart" => Box::new(Mart::new(pgd(7))),
        "fast" => Box::new(FastAt::new(eps)),
        "free" => Box::new(FreeAt::new(eps, 4)),
        "nad" => Box::new(NaturalAdversarialDefense { eps, replace_ratio: 0.5 }),
        "standard" | "none" => Box::new(Standard),
        "ensemble" => {
            println!("ensemble: training two static models (1 epoch each, standard) to source adversarial examples");
            let mut statics: Vec<Arc<dyn Classifier>> = Vec::new();
            for (i, r) in [ReferenceModel::Cnn, ReferenceModel::Mlp].iter().enumerate() {
                let net = r.build(args.run.seed + 100 + i as u64);
                let mut opt = Adam::new(net.parameters(), AdamConfig::default())?;
                armoury::train::fit(
                    &net,
                    &mut opt,
                    train,
                    None,
                    &TrainConfig { epochs: 1, ..Default::default() },
                    &mut (),
                )?;
                statics.push(Arc::new(armoury::ModuleClassifier::new(net, &[1, 28, 28], 10, args.m.bounds)?));
            }
            Box::new(EnsembleAdversarialDefense::new(statics, Box::new(Pgd::fgsm(eps))))
        }
        other => {
            return Err(
                format!("unknown defense '{other}' (pgd, trades, mart, fast, free, nad, ensemble, standard)").into()
            )
        }
    })
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.run.apply()?;
    let set = args.m.load_data()?;
    let train = match args.train_limit {
        Some(n) => set.training("adversarial training")?.take(n)?,
        None => set.training("adversarial training")?.clone(),
    };
    println!("data: {} — {} training / {} test images ({})", set.name, train.len(), set.test.len(), set.source);
    let module = match &args.m.model {
        model::ModelChoice::Reference(r) => Arc::new(r.build(args.run.seed)) as Arc<dyn armoury::nn::Module>,
        model::ModelChoice::Onnx(p) => Arc::new(armoury::onnx::OnnxModel::load(p)?),
    };
    if let Some(w) = &args.m.weights {
        io::load_module(module.as_ref(), w)?;
        println!("starting from {}", w.display());
    }
    let eps = args.eps;
    let method = build_method(&args, &train)?;
    println!("defense: {} for {} epochs", method.name(), args.epochs);
    let box_eps = args.m.bounds.1 - args.m.bounds.0;
    let pgd40: Box<dyn Attack> = Box::new(Pgd { step_size: 0.01 * eps / 0.1, steps: 40, ..Pgd::linf(eps) });
    let apgd: Box<dyn Attack> = Box::new(Apgd::linf(eps));
    let robustness = RobustnessConfig {
        data: set.test.clone(),
        robust_samples: args.robust_samples,
        attacks: vec![("pgd40".into(), pgd40), ("apgd".into(), apgd)],
        // A budget as large as the box [min, max]: 20 steps of a tenth of it from a random start.
        unbounded_check: Some(Box::new(Pgd { steps: 20, step_size: box_eps / 10.0, ..Pgd::linf(box_eps) })),
        batch_size: 500,
        seed: 0,
    };
    // Adam at a constant rate, as Madry et al.'s MNIST recipe.
    let config = TrainConfig {
        epochs: args.epochs,
        seed: args.run.seed,
        schedule: LrSchedule::Constant,
        bounds: args.m.bounds,
        ..TrainConfig::default()
    };
    let mut opt = Adam::new(module.parameters(), AdamConfig::default())?;
    let start = Instant::now();
    let summaries = Trainer::new(config).method(method.as_ref()).robustness(&robustness).fit(
        module.as_ref(),
        &mut opt,
        &train,
        &mut Bars { bar: None },
    )?;
    let last = summaries.last().and_then(|s| s.robust.clone()).ok_or("no epochs ran")?;

    std::fs::create_dir_all("out")?;
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!("out/{}-{}.safetensors", args.defense, args.m.model.name().replace(['/', '.'], "_")))
    });
    io::save_module(module.as_ref(), &out)?;
    let per_epoch = |f: &dyn Fn(&armoury::robustness::RobustEvaluation) -> Option<f32>| -> Vec<f32> {
        summaries.iter().map(|s| s.robust.as_ref().and_then(f).unwrap_or(0.0)).collect()
    };
    let chart = LineChart {
        title: format!("{} (eps {eps})", method.name()),
        x_label: "epoch".into(),
        y_label: "accuracy".into(),
        y_range: Some((0.0, 1.0)),
        series: vec![
            Series::numbered("clean", &per_epoch(&|e| Some(e.clean_accuracy))),
            Series::numbered("PGD-40", &per_epoch(&|e| e.robust("pgd40"))),
            Series::numbered("APGD-CE", &per_epoch(&|e| e.robust("apgd"))),
        ],
        ..LineChart::default()
    };
    let svg_path = out.with_extension("svg");
    chart.write(&svg_path)?;

    println!("\n{:<28} {:>10}", "figure", "value");
    println!("{:<28} {:>10.4}", "clean accuracy", last.clean_accuracy);
    println!("{:<28} {:>10.4}", "PGD-40 robust accuracy", last.robust("pgd40").unwrap_or(f32::NAN));
    println!("{:<28} {:>10.4}", "APGD-CE robust accuracy", last.robust("apgd").unwrap_or(f32::NAN));
    println!("{:<28} {:>10.4}", "box-sized ε accuracy", last.unbounded_accuracy.unwrap_or(f32::NAN));
    println!(
        "{:<28} {:>10.1}",
        "mean s/epoch (training)",
        summaries.iter().map(|s| s.seconds).sum::<f64>() / summaries.len() as f64
    );
    println!("{:<28} {:>10.1}", "total seconds", start.elapsed().as_secs_f64());
    for w in &last.warnings {
        println!("WARNING: {w}");
    }
    println!("saved {} and {}", out.display(), svg_path.display());
    let line = serde_json::json!({
        "defense": args.defense,
        "eps": format!("{eps}").parse::<f64>().unwrap_or(f64::NAN), // as typed: 0.1, not 0.10000000149
        "epochs": summaries.len(),
        "clean_accuracy": round4(last.clean_accuracy),
        "robust_accuracy_pgd40": last.robust("pgd40").map(round4),
        "robust_accuracy_apgd": last.robust("apgd").map(round4),
        "epoch_seconds": summaries.iter().map(|s| (s.seconds * 100.0).round() / 100.0).collect::<Vec<f64>>(),
        "warnings": last.warnings.len(),
    });
    println!("{line}");
    Ok(())
}

/// `v` to 4 decimals, as the table prints it.
fn round4(v: f32) -> f64 {
    (v as f64 * 1e4).round() / 1e4
}
