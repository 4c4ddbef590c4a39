//! Coverage-guided fuzzing of a classifier (DeepHunter-style, with DeepGauge coverage), then retraining on what
//! it found.
//!
//! `cargo run --release --example fuzz -- [--model cnn|mlp|FILE.onnx] [--seeds 100] [--iterations 900]
//! [--out DIR] [--resume DIR/checkpoint.json] [--coverage-only]` (`--help` lists every flag)
//!
//! The model defaults to the fixture cnn (`tests/fixtures/cnn.safetensors`); the data to full Fashion-MNIST when
//! installed, else the embedded sample. Seeds are the first `--seeds` test images, neuron bounds come from the
//! first `--bounds-images` training images (one streaming pass). Prints a progress bar, a summary table, writes
//! `report.json`, `coverage.svg`, `failures.png` (seed | failing mutant | shrunk mutant) and `checkpoint.json`
//! (the corpus, for `--resume` with a larger budget) into `--out`, retrains
//! on the failures of half the seeds and measures the other half, and ends with one JSON line. With
//! `--coverage-only`, prints NC (0.1), TKNC (3), NBC, SNAC and KMNC (100) of the seeds and nothing else.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/fuzz_report.rs"]
mod fuzz_report;
#[path = "support/load.rs"]
mod load;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;

use armoury::coverage::Metric;
use armoury::coverage::{Bounds, ConvNeurons, CoverageConfig, NeuronTaps, Tracker};
use armoury::fuzz::config::MutationConfig;
use armoury::fuzz::mutate::Group;
use armoury::fuzz::{FuzzConfig, Fuzzer};
use armoury::load as model;
use armoury::{Attack, Classifier};
use armoury_attacks::registry::{self, AttackParams};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// Coverage-guided fuzzing of a classifier (DeepHunter-style, with DeepGauge coverage), then retraining on what
/// it found: a progress bar, a summary table, report.json, coverage.svg, failures.png and checkpoint.json in
/// --out, and one JSON line. The model defaults to the cnn: trained here on the full Fashion-MNIST, or the
/// fixture weights (tests/fixtures/cnn.safetensors) on the embedded sample.
#[derive(Parser)]
#[command(name = "fuzz", after_help = after_help())]
struct Args {
    #[command(flatten)]
    m: args::ModelArgs,
    /// Fuzz from the first N test images
    #[arg(long, value_name = "N", default_value_t = 100)]
    seeds: usize,
    /// Stop after N seed draws [default: 900]
    #[arg(long, value_name = "N")]
    iterations: Option<usize>,
    /// Mutants made from each drawn seed
    #[arg(long, value_name = "N", default_value_t = FuzzConfig::default().mutants_per_seed)]
    mutants_per_seed: usize,
    /// Corpus entries drawn per round (one batch through the model)
    #[arg(long, value_name = "N", default_value_t = FuzzConfig::default().seeds_per_round)]
    seeds_per_round: usize,
    /// Stop after N mutants [default: no limit]
    #[arg(long, value_name = "N")]
    max_mutants: Option<usize>,
    /// Stop after S seconds (makes the run depend on the machine) [default: no limit]
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// Stop once the coverage reaches this value [default: no target]
    #[arg(long, value_name = "C")]
    target: Option<f64>,
    /// The coverage metric that guides the search: nc, tknc, nbc, snac or kmnc [default: kmnc]
    #[arg(long, value_name = "METRIC")]
    coverage: Option<Metric>,
    /// A mutant joins the corpus when the coverage rises by more than G
    #[arg(long, value_name = "G", default_value_t = FuzzConfig::default().gain_threshold)]
    gain_threshold: f64,
    /// Mutations from a JSON file (MutationConfig) instead of --attacks and --groups
    #[arg(long, value_name = "FILE.json")]
    config: Option<PathBuf>,
    /// The adversarial mutations, by attack name (listed below), comma-separated
    #[arg(long, value_name = "A,…", default_value = "fgsm,pgd,mdifgsm", value_parser = args::list)]
    attacks: std::vec::Vec<String>, // one value split by args::list (a bare `Vec` is clap's repeated flag)
    /// The mutation groups: pixel, affine, adversarial, comma-separated
    #[arg(long, value_name = "G,…", default_value = "pixel,affine,adversarial", value_parser = groups)]
    groups: std::vec::Vec<Group>,
    /// The activations whose neurons are covered, comma-separated [default: the cnn's conv1_relu, pool1,
    /// conv2_relu, pool2, fc1_relu and fc2; another model's every layer]
    #[arg(long, value_name = "T,…", value_parser = args::list)]
    taps: Option<std::vec::Vec<String>>,
    /// A convolution's neurons per position, not per channel mean
    #[arg(long)]
    per_position: bool,
    /// Neuron bounds from the first N training images
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    bounds_images: usize,
    /// Epochs of retraining on the failures (0: none)
    #[arg(long, value_name = "E", default_value_t = 1)]
    retrain_epochs: usize,
    /// Keep failures as found, unshrunk
    #[arg(long)]
    no_shrink: bool,
    /// A valid mutant keeps at least this SSIM with its seed [default: no SSIM rule]
    #[arg(long, value_name = "S")]
    min_ssim: Option<f32>,
    /// Seed of every random draw
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Directory of the report, the figures and the checkpoint
    #[arg(long, value_name = "DIR", default_value = "out/fuzz")]
    out: PathBuf,
    /// Continue from a checkpoint (DIR/checkpoint.json), e.g. with a larger budget
    #[arg(long, value_name = "FILE")]
    resume: Option<PathBuf>,
    /// Print the seeds' NC (0.1), TKNC (3), NBC, SNAC and KMNC (100) and nothing else
    #[arg(long)]
    coverage_only: bool,
    /// The fuzzing settings the flags above make.
    #[arg(skip = FuzzConfig::default())]
    fuzz: FuzzConfig,
}

/// The attack names for --attacks, then examples.
fn after_help() -> String {
    let mut s = String::from("Attacks (--attacks):\n");
    for (name, description) in registry::table() {
        s += &format!("  {name:<16} {description}\n");
    }
    s + "\nExamples:\n  cargo run --release --example fuzz -- --seeds 100 --iterations 900\n  \
         cargo run --release --example fuzz -- --model tests/fixtures/cnn.onnx --coverage-only"
}

/// The flags, with the fuzzing settings gathered into `fuzz`.
fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args::parse();
    let f = &mut a.fuzz;
    f.max_iterations = a.iterations.or(f.max_iterations);
    f.mutants_per_seed = a.mutants_per_seed;
    f.seeds_per_round = a.seeds_per_round;
    f.max_mutants = a.max_mutants;
    f.max_seconds = a.seconds;
    f.target_coverage = a.target;
    f.metric = a.coverage.unwrap_or(f.metric);
    f.gain_threshold = a.gain_threshold;
    f.shrink = !a.no_shrink;
    f.validity.min_ssim = a.min_ssim;
    f.seed = a.seed;
    Ok(a)
}

fn groups(s: &str) -> Result<Vec<Group>, String> {
    let all = [Group::Pixel, Group::Affine, Group::Adversarial];
    let names = args::list(s)?;
    names
        .iter()
        .map(|n| all.into_iter().find(|g| g.name() == n).ok_or_else(|| format!("unknown group '{n}'")))
        .collect()
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

/// The taps: `--taps`, else the reference models' own (the cnn's six: both post-ReLU convs, both pools,
/// post-ReLU fc1, logits), else every tap of an ONNX model.
fn taps_for(args: &Args, clf: &dyn Classifier) -> NeuronTaps {
    let names: Vec<String> = match (&args.taps, &args.m.model) {
        (Some(t), _) => t.clone(),
        (None, model::ModelChoice::Reference(armoury::nn::ReferenceModel::Cnn)) => {
            ["conv1_relu", "pool1", "conv2_relu", "pool2", "fc1_relu", "fc2"].map(String::from).to_vec()
        }
        _ => clf.layer_names(),
    };
    let conv = if args.per_position { ConvNeurons::PerPosition } else { ConvNeurons::ChannelMean };
    NeuronTaps { layers: names, conv }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = parse()?;
    if args.m.weights.is_none()
        && matches!(args.m.model, model::ModelChoice::Reference(armoury::nn::ReferenceModel::Cnn))
    {
        args.m.weights = Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cnn.safetensors"));
    }
    let set = args.m.load_data()?;
    let (module, clf) = load::load_model(&args.m, args.m.weights.as_deref(), &set, args.fuzz.seed)?;
    let taps = taps_for(&args, &clf);
    let train = set.training("the coverage bounds")?;
    let n_bounds = args.bounds_images.min(train.len());
    let (train_x, _) = train.batch(0..n_bounds)?;
    let bounds = Bounds::fit(&clf, &taps, &train_x, 500)?;
    let n = args.seeds.min(set.test.len());
    let (x, y) = set.test.batch(0..n)?;
    if args.coverage_only {
        let (neurons, _) = taps.read(&clf, &x)?;
        let mut t = Tracker::new(&bounds, CoverageConfig::default())?;
        t.add(&neurons)?;
        let v = t.values();
        let line = serde_json::json!({
            "example": "fuzz",
            "coverage": {"nc": v.nc, "tknc": v.tknc, "nbc": v.nbc, "snac": v.snac, "kmnc": v.kmnc},
            "neurons": t.neurons(),
            "images": n,
            "bounds_images": n_bounds,
        });
        println!("{line}");
        return Ok(());
    }
    println!("data: {} ({}); {n} seeds, bounds from {n_bounds} training images", set.name, set.source);
    println!("neurons: {} from taps {:?}", bounds.neurons(), taps.layers);
    let mut mutations = match &args.config {
        Some(path) => MutationConfig::load(path)?,
        None => {
            let names: Vec<&str> = args.attacks.iter().map(String::as_str).collect();
            MutationConfig::with_attacks(&names)
        }
    };
    mutations.methods.retain(|m| args.groups.contains(&m.method.group()));
    let mut attacks: Vec<(String, Box<dyn Attack>)> = Vec::new();
    for name in mutations.attack_names() {
        attacks.push((name.clone(), registry::by_name(&name, &AttackParams::default())?));
    }
    let fuzzer = Fuzzer::new(&clf, taps, bounds, mutations, attacks, args.fuzz.clone())?;
    let total = args.fuzz.max_iterations.map(|i| i * args.fuzz.mutants_per_seed).or(args.fuzz.max_mutants);
    let bar = ProgressBar::new(total.unwrap_or(0) as u64);
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} mutants {msg} ({elapsed}, eta {eta})")?
            .progress_chars("=> "),
    );
    let metric = args.fuzz.metric;
    let resume = args.resume.as_ref().map(armoury::fuzz::Checkpoint::load).transpose()?;
    let (report, checkpoint) = fuzzer.run_from(&x, &y, resume.as_ref(), &mut |p| {
        bar.set_position(p.mutants as u64);
        bar.set_message(format!("{} {:.4}, {} failures", metric.name(), p.coverage, p.failures));
    })?;
    bar.finish_and_clear();
    std::fs::create_dir_all(&args.out)?;
    checkpoint.save(args.out.join("checkpoint.json"))?;
    fuzz_report::print_table(&report);
    fuzz_report::write_files(&report, &x, &args.out)?;
    let retrain = if args.retrain_epochs > 0 && !report.failures.is_empty() {
        let cfg =
            armoury::fuzz::RetrainConfig { epochs: args.retrain_epochs, seed: args.fuzz.seed, ..Default::default() };
        Some(armoury::fuzz::retrain(&module, &clf, &report, &set, n, &cfg)?)
    } else {
        None
    };
    println!("{}", fuzz_report::json_line(&report, metric, retrain.as_ref()));
    Ok(())
}
