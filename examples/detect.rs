//! Detect adversarial examples, and evaluate the detector honestly (`armoury_defenses::eval::detect`): fitted at
//! 1% FPR on clean training images, against `--attack` on the first N test images (and with `--adaptive` PGD on
//! the detector in front of the model); `similarity` watches query attacks and benign streams. Prints a table,
//! writes an SVG ROC curve and ends with one JSON line; `--help` lists every flag.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/load.rs"]
mod load;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use armoury::data::TrainTest;
use armoury::load as model;
use armoury::{Classifier, Tensor};
use armoury_attacks::registry;
use armoury_defenses::detectors::{self as magnet, AdaptivePgd};
use armoury_defenses::eval::detect::{self, DetectRun, SimilarityRun, ATTACK_BATCH};
use armoury_defenses::registry::DetectorBuild;
use clap::Parser;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Detect adversarial examples, and evaluate the detector honestly: ROC AUC, TPR at fitted 1% / 5% FPR, the
/// protected pipeline's accuracy under the non-adaptive attack and, with --adaptive, under PGD on the detector in
/// front of the model; an SVG ROC curve and one JSON line. The model defaults to the cnn with
/// tests/fixtures/cnn.safetensors when that file exists.
#[derive(Parser)]
#[command(name = "detect", after_help = AFTER_HELP)]
struct Args {
    #[command(flatten)]
    m: args::ModelArgs,
    /// The detector: magnet, squeeze, region, ensemble, lid, mahalanobis or similarity
    #[arg(long, value_name = "NAME", default_value = "magnet", value_parser = args::lower)]
    detector: String,
    /// The attack whose examples are detected: fgsm, pgd (PGD-40 of step 0.01), cw, jsma, hsj, nes or square
    #[arg(long, value_name = "NAME", default_value = "pgd", value_parser = args::lower)]
    attack: String,
    /// The attack's budget ε
    #[arg(long, value_name = "E", default_value_t = 0.1)]
    eps: f32,
    /// Also attack the detector and the model together (PGD on classifier loss − λ·detector score)
    #[arg(long)]
    adaptive: bool,
    /// λ, the adaptive attack's weight of the detector score
    #[arg(long, value_name = "L", default_value_t = 1.0)]
    lambda: f32,
    /// Attack the first N test images
    #[arg(long, value_name = "N", default_value_t = 1000)]
    limit: usize,
    /// Fit the detector on N clean training images
    #[arg(long, value_name = "N", default_value_t = 1000)]
    fit: usize,
    #[command(flatten)]
    magnet: args::MagnetArgs,
    /// similarity: the false-positive rate its threshold is fitted at
    #[arg(long, value_name = "F", default_value_t = 0.005)]
    sim_fpr: f32,
    /// similarity: benign query streams
    #[arg(long, value_name = "STREAMS", default_value_t = 500)]
    benign: usize,
    /// similarity: the k nearest stored queries it compares with
    #[arg(long, value_name = "K", default_value_t = 20)]
    k: usize,
    /// similarity: the activation it encodes [default: the input of the model's head]
    #[arg(long, value_name = "NAME")]
    tap: Option<String>,
    /// lid, mahalanobis: the layers whose activations they read, comma-separated [default: the cnn's
    /// conv1_relu,conv2_relu,fc1_relu,fc2; another model's taps at ¼, ½ and ¾ of its depth and its output]
    #[arg(long, value_name = "L,…", value_parser = args::list)]
    layers: Option<std::vec::Vec<String>>,
    /// Seed of every random draw
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Directory of the ROC curve and MagNet's cached auto-encoders
    #[arg(long, value_name = "DIR", default_value = "out")]
    out: PathBuf,
}

const AFTER_HELP: &str = "\
Examples:
  cargo run --release --example detect -- --detector magnet --attack pgd --eps 0.1 --limit 500 --adaptive
  cargo run --release --example detect -- --detector similarity --attack hsj --limit 100";

/// The flags, with the fixture cnn's weights as the default for the cnn when the file is there (never for another
/// model: an ONNX file carries its own).
fn parse() -> Res<Args> {
    let mut a = Args::parse();
    let fixture = PathBuf::from("tests/fixtures/cnn.safetensors");
    let cnn = matches!(a.m.model, model::ModelChoice::Reference(armoury::nn::ReferenceModel::Cnn));
    if a.m.weights.is_none() && cnn && fixture.exists() {
        a.m.weights = Some(fixture);
    }
    Ok(a)
}

/// A titled two-column table of figures.
fn table(title: &str, rows: &[(&str, String)]) {
    println!("\n{title:<44} {:>10}", "value");
    for (k, v) in rows {
        println!("{k:<48} {v:>10}");
    }
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

/// Adversarial inputs of `--attack` against the bare classifier.
fn attack(args: &Args, clf: &dyn Classifier, x: &Tensor, y: &[usize], seed: u64) -> armoury::Result<Tensor> {
    let attack = registry::by_name(&args.attack, &registry::detection_params(&args.attack, args.eps))?;
    let goal = registry::default_goal(&args.attack, seed);
    registry::run_in_batches(attack.as_ref(), clf, (x, y), &goal, seed, ATTACK_BATCH)
}

fn run() -> Res<()> {
    let args = parse()?;
    let set = args.m.load_data()?;
    println!("data: {} ({} test images; {})", set.name, set.test.len(), set.source);
    let (_, clf) = load::load_model(&args.m, args.m.weights.as_deref(), &set, args.seed)?;
    let clf: Arc<dyn Classifier> = Arc::new(clf);
    if args.detector == "similarity" {
        return similarity(&args, &clf, &set);
    }
    evaluate(&args, &clf, &set)
}

fn evaluate(args: &Args, clf: &Arc<dyn Classifier>, set: &TrainTest) -> Res<()> {
    let start = Instant::now();
    let layers = args.layers.clone().unwrap_or_else(|| armoury_defenses::registry::default_layers(clf.as_ref()));
    let layers: Vec<&str> = layers.iter().map(String::as_str).collect();
    // Supervised combiners are trained on the attack being evaluated.
    let combiner_attack = |x: &Tensor, y: &[usize]| attack(args, clf.as_ref(), x, y, args.seed + 1);
    let magnet_progress = |p: &magnet::MagnetProgress<'_>| {
        if !matches!(p, magnet::MagnetProgress::Step(_)) {
            println!("{p}");
        }
    };
    let build = DetectorBuild {
        model: clf,
        set,
        fit: args.fit,
        layers: &layers,
        attack: &combiner_attack,
        // `magnet-PART` is MagNet with that one part (the registry's); `magnet` has the --magnet-parts.
        magnet: args.magnet.config(args.seed, &args.out),
        magnet_progress: &magnet_progress,
    };
    let adaptive =
        args.adaptive.then_some(AdaptivePgd { eps: args.eps, lambda: args.lambda, ..AdaptivePgd::default() });
    let e = detect::evaluate(&DetectRun {
        detector: &args.detector,
        build,
        limit: args.limit,
        attack: &|x, y| attack(args, clf.as_ref(), x, y, args.seed),
        adaptive,
        seed: args.seed,
        notify: &|line: &str| println!("{line}"),
    })?;
    let (name, m, seconds) = (e.name.as_str(), &e.metrics, start.elapsed().as_secs_f64());
    let adaptive = e.protected_robust_adaptive.map_or("not run".into(), |v| format!("{v:.4}"));
    let rows = [
        ("undefended clean accuracy", format!("{:.4}", e.undefended_clean)),
        ("undefended robust accuracy", format!("{:.4}", e.undefended_robust)),
        ("adversarial examples scored (fooling the model)", format!("{}", e.fooled)),
        ("ROC AUC", format!("{:.4}", m.auc)),
        ("TPR at 1% FPR", format!("{:.4}", m.tpr_at_1fpr)),
        ("TPR at 5% FPR", format!("{:.4}", m.tpr_at_5fpr)),
        ("protected clean accuracy", format!("{:.4}", e.protected_clean)),
        ("protected robust accuracy, non-adaptive", format!("{:.4}", e.protected_robust_non_adaptive)),
        ("protected robust accuracy, adaptive", adaptive),
        ("fit images/s", format!("{:.0}", e.fit_per_second)),
        ("score images/s", format!("{:.0}", e.score_per_second)),
        ("seconds", format!("{seconds:.1}")),
    ];
    table(&format!("{name} vs {} (ε = {})", args.attack, args.eps), &rows);
    std::fs::create_dir_all(&args.out)?;
    let svg = args.out.join(format!("detect-{}-{}.svg", args.detector, args.attack));
    let title = format!("{name} vs {} (ε = {}): AUC {:.3}", args.attack, args.eps, m.auc);
    m.roc_chart(title, name).write(&svg)?;
    println!("ROC curve: {}", svg.display());
    let round = |v: f64| (v * 1e4).round() / 1e4;
    let line = serde_json::json!({
        "example": "detect",
        "detector": args.detector,
        "attack": args.attack,
        "eps": args.eps.to_string().parse::<f64>().unwrap_or(f64::NAN),
        "auc": round(m.auc),
        "tpr_at_1fpr": round(m.tpr_at_1fpr),
        "tpr_at_5fpr": round(m.tpr_at_5fpr),
        "protected_clean_accuracy": round(e.protected_clean),
        // With --adaptive: per sample, right or rejecting under both attacks, the figure a defender can claim.
        "protected_robust_accuracy": round(e.protected_robust_accuracy),
        "adaptive": args.adaptive,
        "seconds": (seconds * 1e3).round() / 1e3,
    });
    println!("{line}");
    Ok(())
}

fn similarity(args: &Args, clf: &Arc<dyn Classifier>, set: &TrainTest) -> Res<()> {
    let start = Instant::now();
    let attack = registry::by_name(&args.attack, &registry::detection_params(&args.attack, args.eps))?;
    let e = detect::similarity(&SimilarityRun {
        model: clf,
        set,
        tap: args.tap.as_deref(),
        k: args.k,
        fpr: args.sim_fpr,
        benign: args.benign,
        limit: args.limit,
        attack: attack.as_ref(),
        seed: args.seed,
        notify: &|line: &str| println!("{line}"),
    })?;
    let costs = detect::index_costs(args.seed)?;
    let (within_rate, benign_rate) = (e.flagged_within(100), e.benign_flag_rate());
    let mean_q = e.mean_queries_to_flag().unwrap_or(f64::NAN);
    let seconds = start.elapsed().as_secs_f64();
    let join = |f: &dyn Fn(&magnet::IndexMeasurement) -> String| costs.iter().map(f).collect::<Vec<_>>().join(" / ");
    let rows = [
        ("detected within the first 100 queries", format!("{within_rate:.4}")),
        ("detected at all (200 queries)", format!("{:.4}", e.flagged())),
        ("mean queries to detection", format!("{mean_q:.1}")),
        ("benign streams flagged", format!("{benign_rate:.4} of {}", e.benign_streams)),
        ("calibration queries/s", format!("{:.0}", e.calibration_per_second)),
        ("attack seconds", format!("{:.1}", e.attack_seconds)),
        ("µs/query at history 1k / 10k / 100k", join(&|c| format!("{:.1}", c.micros_per_query))),
        ("index recall of the 20 nearest at 1k / 10k / 100k", join(&|c| format!("{:.2}", c.recall))),
        ("seconds", format!("{seconds:.1}")),
    ];
    table(&format!("similarity vs {} ({} attacked images)", args.attack, e.attacked()), &rows);
    let round = |v: f64| (v * 1e4).round() / 1e4;
    let line = serde_json::json!({
        "example": "detect",
        "detector": "similarity",
        "attack": args.attack,
        "eps": args.eps.to_string().parse::<f64>().unwrap_or(f64::NAN),
        "detected_within_100": round(within_rate),
        "benign_flag_rate": round(benign_rate),
        "mean_queries_to_detection": if mean_q.is_finite() { serde_json::json!((mean_q * 10.0).round() / 10.0) } else { serde_json::Value::Null },
        "adaptive": false,
        "seconds": (seconds * 1e3).round() / 1e3,
    });
    println!("{line}");
    Ok(())
}
