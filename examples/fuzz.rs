//! Coverage-guided fuzzing of a classifier (DeepHunter-style, with DeepGauge coverage), then retraining on what
//! it found.
//!
//! `cargo run --release --example fuzz -- [--model cnn|mlp|FILE.onnx] [--weights FILE] [--bounds 0,1] [--data DIR] [--seeds 100]
//! [--iterations 900] [--mutants-per-seed 20] [--max-mutants N] [--seconds S] [--coverage nc|tknc|nbc|snac|kmnc]
//! [--gain-threshold G] [--config FILE.json] [--attacks fgsm,pgd,mdifgsm] [--groups pixel,affine,adversarial]
//! [--taps a,b,…] [--per-position] [--bounds-images 10000] [--retrain-epochs 1] [--min-ssim S] [--no-shrink] [--seed S]
//! [--out DIR] [--resume DIR/checkpoint.json] [--coverage-only]`
//!
//! The model defaults to the fixture cnn (`tests/fixtures/cnn.safetensors`); the data to full Fashion-MNIST when
//! installed, else the embedded sample. Seeds are the first `--seeds` test images, neuron bounds come from the
//! first `--bounds-images` training images (one streaming pass). Prints a progress bar, a summary table, writes
//! `report.json`, `coverage.svg`, `failures.png` (seed | failing mutant | shrunk mutant) and `checkpoint.json`
//! (the corpus, for `--resume` with a larger budget) into `--out`, retrains
//! on the failures of half the seeds and measures the other half, and ends with one JSON line. With
//! `--coverage-only`, prints NC (0.1), TKNC (3), NBC, SNAC and KMNC (100) of the seeds and nothing else.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/fuzz_report.rs"]
mod fuzz_report;
#[path = "support/load.rs"]
mod load;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;

use armoury::coverage::{Bounds, ConvNeurons, CoverageConfig, NeuronTaps, Tracker};
use armoury::fuzz::config::MutationConfig;
use armoury::fuzz::mutate::Group;
use armoury::fuzz::{FuzzConfig, Fuzzer};
use armoury::load as model;
use armoury::{Attack, Classifier};
use armoury_attacks::registry::{self, AttackParams};
use indicatif::{ProgressBar, ProgressStyle};

struct Args {
    m: load::ModelFlags,
    seeds: usize,
    fuzz: FuzzConfig,
    config: Option<PathBuf>,
    attacks: Vec<String>,
    groups: Vec<Group>,
    taps: Option<Vec<String>>,
    per_position: bool,
    bounds_images: usize,
    retrain_epochs: usize,
    out: PathBuf,
    resume: Option<PathBuf>,
    coverage_only: bool,
}

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let mut a = Args {
        m: load::ModelFlags::default(),
        seeds: 100,
        fuzz: FuzzConfig::default(),
        config: None,
        attacks: vec!["fgsm".into(), "pgd".into(), "mdifgsm".into()],
        groups: vec![Group::Pixel, Group::Affine, Group::Adversarial],
        taps: None,
        per_position: false,
        bounds_images: 10_000,
        retrain_epochs: 1,
        out: PathBuf::from("out/fuzz"),
        resume: None,
        coverage_only: false,
    };
    let list = |s: String| s.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect::<Vec<_>>();
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long(k) if load::ModelFlags::FLAGS.contains(&k) => {
                let k = k.to_string();
                a.m.take(&k, &mut p)?
            }
            Long("seeds") => a.seeds = p.value()?.parse()?,
            Long("iterations") => a.fuzz.max_iterations = Some(p.value()?.parse()?),
            Long("mutants-per-seed") => a.fuzz.mutants_per_seed = p.value()?.parse()?,
            Long("seeds-per-round") => a.fuzz.seeds_per_round = p.value()?.parse()?,
            Long("max-mutants") => a.fuzz.max_mutants = Some(p.value()?.parse()?),
            Long("seconds") => a.fuzz.max_seconds = Some(p.value()?.parse()?),
            Long("target") => a.fuzz.target_coverage = Some(p.value()?.parse()?),
            Long("coverage") => a.fuzz.metric = p.value()?.string()?.parse()?,
            Long("gain-threshold") => a.fuzz.gain_threshold = p.value()?.parse()?,
            Long("config") => a.config = Some(p.value()?.into()),
            Long("attacks") => a.attacks = list(p.value()?.string()?),
            Long("groups") => a.groups = parse_groups(&list(p.value()?.string()?))?,
            Long("taps") => a.taps = Some(list(p.value()?.string()?)),
            Long("per-position") => a.per_position = true,
            Long("bounds-images") => a.bounds_images = p.value()?.parse()?,
            Long("retrain-epochs") => a.retrain_epochs = p.value()?.parse()?,
            Long("no-shrink") => a.fuzz.shrink = false,
            Long("min-ssim") => a.fuzz.validity.min_ssim = Some(p.value()?.parse()?),
            Long("seed") => a.fuzz.seed = p.value()?.parse()?,
            Long("out") => a.out = p.value()?.into(),
            Long("resume") => a.resume = Some(p.value()?.into()),
            Long("coverage-only") => a.coverage_only = true,
            Long("help") | Short('h') => {
                println!("see the top of examples/fuzz.rs; attacks for --attacks:");
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

fn parse_groups(names: &[String]) -> Result<Vec<Group>, Box<dyn std::error::Error>> {
    let all = [Group::Pixel, Group::Affine, Group::Adversarial];
    names
        .iter()
        .map(|n| all.into_iter().find(|g| g.name() == n).ok_or_else(|| format!("--groups: unknown group '{n}'").into()))
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
    let set = model::load_data(args.m.data.as_deref())?;
    let (module, clf) =
        load::load_model(&args.m.model, args.m.weights.as_deref(), args.m.bounds, &set, args.fuzz.seed)?;
    let taps = taps_for(&args, &clf);
    let n_bounds = args.bounds_images.min(set.train.len());
    let (train_x, _) = set.train.batch(0..n_bounds)?;
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
