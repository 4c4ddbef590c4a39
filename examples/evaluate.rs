//! How robust is a model: the threat model's cascade (default: AutoAttack's standard L∞ list at ε = 0.1), the
//! gradient-masking audit, a summary table, the report (`armoury::report::write`: report.json, report.md and a
//! self-contained report.html) and one JSON line.
//!
//! `cargo run --release --example evaluate -- [--model cnn|mlp|FILE.safetensors|FILE.onnx] [--limit N]
//! [--shard i/n | --shards n] [--merge n] [--out DIR]` (`--help` lists every flag)
//!
//! Without `--weights` a reference model starts from the shipped reference weights on the embedded sample and is
//! trained here on any other data. `--defense`/`--detector` add defenses and detectors evaluated beside the
//! cascade (`armoury_defenses::eval`); `--shard`/`--merge` split a run over a cluster (deploy/README.md). A ledger
//! is also the run's state file: rerunning the same command continues an interrupted run. docs/evaluation.md has
//! the details; `--help` every flag.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/load.rs"]
mod load;
#[path = "support/progress.rs"]
mod progress;
#[path = "support/steps.rs"]
mod steps;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use armoury::eval::{self, AuditConfig, Ledger, ThreatModel};
use armoury::load as model;
use armoury::Classifier;
use armoury_attacks::registry::from_spec;
use armoury_defenses::eval as protect;
use clap::Parser;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// How robust is a model: the threat model's cascade (default: AutoAttack's standard L∞ list at ε = 0.1), the
/// gradient-masking audit, a summary table, the report (report.json, report.md, report.html) and one JSON line.
/// Without --weights a reference model starts from the shipped reference weights (tests/fixtures/cnn.safetensors)
/// on the embedded sample and is trained here on any other data.
#[derive(Parser)]
#[command(name = "evaluate", after_help = AFTER_HELP)]
struct Args {
    #[command(flatten)]
    m: args::ModelArgs,
    /// The threat model (JSON; deploy/ has examples) [default: AutoAttack's standard L∞ cascade at ε = 0.1]
    #[arg(long = "threat-model", value_name = "FILE")]
    threat: Option<PathBuf>,
    /// Evaluate at this ε instead of the threat model's
    #[arg(long, value_name = "E")]
    eps: Option<f64>,
    /// Evaluate the first N test images
    #[arg(long, value_name = "N", default_value_t = 1000)]
    limit: usize,
    #[command(flatten)]
    shards: args::ShardArgs,
    /// Skip the gradient-masking audit
    #[arg(long = "no-audit", action = clap::ArgAction::SetFalse)]
    audit: bool,
    /// An input transformation in front of the model, attacked through BPDA/EOT (repeatable; names below)
    #[arg(long = "defense", value_name = "NAME[:PARAM]", value_parser = args::lower)]
    defenses: Vec<String>,
    /// Draws of the expectation over a random defense's randomness
    #[arg(long, value_name = "N", default_value_t = 8)]
    eot: usize,
    /// A detector fitted at 1% FPR and evaluated on the cascade's adversarial examples (repeatable; names below)
    #[arg(long = "detector", value_name = "NAME", value_parser = args::lower)]
    detectors: Vec<String>,
    /// Clean training images the detectors are fitted on
    #[arg(long, value_name = "N", default_value_t = 1000)]
    fit: usize,
    /// Directory of the report, the ledgers and the threat model used; rerunning the same command continues an
    /// interrupted run from its ledger
    #[arg(long, value_name = "DIR", default_value = "out/evaluate")]
    out: PathBuf,
    /// The model's class names, one per line in output order: named in the report, and an image folder's class
    /// folders are matched to them by name [default: an image folder's folder names; built in for
    /// Fashion-MNIST, MNIST and CIFAR-10; else the indices]
    #[arg(long = "class-names", value_name = "FILE")]
    class_names: Option<PathBuf>,
    #[command(flatten)]
    resources: args::Resources,
}

const AFTER_HELP: &str = "\
Defenses (--defense): bit-depth, median, mean, gaussian, jpeg, tv, noise, each with an optional :PARAM.
Detectors (--detector): squeeze, lid, mahalanobis, ensemble, magnet[:N,E], region, similarity.
--data sample takes the embedded sample even when the full data set is installed.

Examples:
  cargo run --release --example evaluate -- --model tests/fixtures/cnn-pgd.safetensors --limit 1000
  evaluate --model /data/model.safetensors --threat-model /data/threat-model.json --shard 3/8 --out /data/out
  evaluate --model /data/model.safetensors --threat-model /data/threat-model.json --merge 8 --out /data/out";

/// The flags, with `--threads` and `--max-memory` applied.
fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    let a = Args::parse();
    a.resources.apply()?;
    Ok(a)
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

/// The weights to load: `--weights` when given; for a reference model without them, the shipped reference
/// weights when the data is the embedded Fashion-MNIST sample (three epochs on its 2,000 images give a much
/// weaker model than the reference one), else none: trained here on the user's data with the reference recipe —
/// never Fashion-MNIST weights evaluated on other data.
fn weights(args: &Args, set: &armoury::data::TrainTest) -> Option<PathBuf> {
    if args.m.weights.is_some() {
        return args.m.weights.clone();
    }
    let model::ModelChoice::Reference(r) = &args.m.model else { return None };
    let fixture = PathBuf::from(format!("tests/fixtures/{}.safetensors", r.name()));
    (set.name == armoury::data::SAMPLE_NAME && fixture.exists()).then_some(fixture)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let args = parse()?;
    // Every defense and detector name is checked before the cascade runs.
    protect::check_specs(&args.defenses, &args.detectors)?;
    let mut tm = match &args.threat {
        Some(p) => ThreatModel::load(p)?,
        None => ThreatModel::autoattack_linf(0.1),
    };
    if let Some(e) = args.eps {
        tm.eps = vec![e];
        tm.check()?;
    }
    let mut set = args.m.load_data()?;
    if let (Some(path), Some(_)) = (&args.class_names, &set.class_names) {
        set = set.relabel_by_name(&armoury::data::read_class_list(path)?)?;
    }
    println!("data: {} ({} test images; {})", set.name, set.test.len(), set.source);
    let weights = weights(&args, &set);
    let (module, clf) = load::load_model(&args.m, weights.as_deref(), &set, tm.seed)?;
    let model_name = args.m.model.describe(weights.as_deref());
    if args.limit == 0 {
        return Err("--limit 0 evaluates no sample: nothing would be measured".into());
    }
    let n = args.limit.min(set.test.len());
    // What the figures measure: the model's content (its parameters, and an ONNX file's graph), the samples,
    // the kernel path and the version — a ledger or shard of anything else is refused.
    let graph = args.m.model.graph_bytes()?;
    let identity = eval::Identity::new(eval::identity::model_hash(module.as_ref(), &graph), &set.test, n, &set.name)?;
    std::fs::create_dir_all(&args.out)?;
    println!("threat model {} ({}), {} samples", tm.name, &tm.hash()[..12], n);
    println!("{model_name}: {identity}");
    let ledger = cascade(&args, &tm, &clf, &set, model_name, &identity, n)?;
    let clf: Arc<dyn Classifier> = Arc::new(clf);
    if args.shards.shard.is_some() {
        // A shard writes its ledger and its defenses' and detectors' per-sample results; --merge reports.
        println!("shard {:?}: ledger {}", ledger.range, eval::ledger_file(&args.out, args.shards.shard).display());
        return protect(&args, &tm, &clf, &set, &ledger, None);
    }
    let summary = eval::summarise(&tm, &ledger, clf.num_classes());
    let verdicts = if args.audit {
        let (x, y) = set.test.batch(0..n.min(200))?;
        let eps = *tm.eps.last().unwrap_or(&0.1) as f32;
        eprintln!("audit: gradient-masking checks on {} samples at ε = {eps}", x.shape()[0]);
        let t = Instant::now();
        let say = |step: &str| eprintln!("audit: {step} ({:.1} s)", t.elapsed().as_secs_f64());
        let build = eval::announcing(&from_spec, &say);
        eval::audit(clf.as_ref(), &x, &y, &build, &AuditConfig::new(tm.norm()?, eps))?
    } else {
        Vec::new()
    };
    let mut report = armoury::report::to_report(clf.as_ref(), &set.test, &tm, &ledger, &summary, verdicts)?;
    if let Some(path) = &args.class_names {
        report.set_class_names(armoury::data::read_class_names(path, clf.num_classes())?);
    } else if let Some(names) = set.class_names.clone().filter(|n| n.len() == clf.num_classes()) {
        report.set_class_names(names);
    }
    protect(&args, &tm, &clf, &set, &ledger, Some(&mut report))?;
    let files = armoury::report::write(&report, &args.out)?;
    armoury::io::write_atomic(&args.out.join("threat-model.json"), serde_json::to_string_pretty(&tm)?.as_bytes())?;
    println!("\n{}\nreport: {}", armoury::report::summary_table(&report), files.html.display());
    let mut line = armoury::report::json_line(&report);
    line["example"] = "evaluate".into();
    line["seconds"] = ((start.elapsed().as_secs_f64() * 100.0).round() / 100.0).into();
    line["report"] = files.html.display().to_string().into();
    println!("{line}");
    Ok(())
}

/// The undefended cascade of the run's samples (a shard's, or all), or the merge of the shards' ledgers.
fn cascade(
    args: &Args,
    tm: &ThreatModel,
    clf: &dyn Classifier,
    set: &armoury::data::TrainTest,
    model_name: String,
    identity: &eval::Identity,
    n: usize,
) -> Result<Ledger, Box<dyn std::error::Error>> {
    if let Some(k) = args.shards.merge {
        // Every shard must have finished: else one error naming all unfinished ones (a scheduler reruns those).
        let shards = eval::load_shards(&args.out, k, tm)?;
        let merged = eval::merge(tm, identity, shards)?;
        merged.save(&eval::ledger_file(&args.out, None))?;
        return Ok(merged);
    }
    let bar = steps::StepProgress::new("cascade");
    let progress = |p: &eval::Progress| bar.update(p);
    let mut run = eval::Evaluator::new(tm.clone(), &from_spec)
        .identity(identity.clone())
        .model_name(model_name)
        .state(eval::ledger_file(&args.out, args.shards.shard))
        .progress(&progress);
    if let Some((i, k)) = args.shards.shard {
        run = run.shard(i, k);
    }
    let l = run.run_dataset(clf, &set.test.take(n)?, &set.name)?.ledger;
    bar.finish();
    Ok(l)
}

/// The defenses and detectors of the command line — run here on every sample (a shard: on its samples, into its
/// side file), or merged from the shards' side files with `--merge` — added to the report.
fn protect(
    args: &Args,
    tm: &ThreatModel,
    clf: &Arc<dyn Classifier>,
    set: &armoury::data::TrainTest,
    ledger: &Ledger,
    report: Option<&mut armoury::report::Report>,
) -> Result<(), Box<dyn std::error::Error>> {
    if args.defenses.is_empty() && args.detectors.is_empty() {
        return Ok(());
    }
    let bar = steps::StepProgress::new("defenses and detectors");
    let (progress, notify) = (|p: &eval::Progress| bar.update(p), |s: &str| bar.line(s.to_string()));
    let (shard, eot, fit, out) = (args.shards.shard, args.eot, args.fit, &args.out);
    let cx = protect::Context {
        model: clf,
        set,
        threat: tm,
        ledger,
        build: &from_spec,
        out,
        shard,
        eot,
        fit,
        progress: &progress,
        notify: &notify,
    };
    let figures = protect::evaluate(&cx, &args.defenses, &args.detectors, args.shards.merge)?;
    bar.finish();
    let (Some((defenses, detectors, stateful)), Some(report)) = (figures, report) else {
        println!("shard {:?}: defenses and detectors {}", ledger.range, cx.file("protect").display());
        return Ok(());
    };
    report.defenses.extend(defenses);
    report.detectors.extend(detectors);
    report.stateful.extend(stateful);
    for line in armoury::report::protection_lines(report) {
        println!("{line}");
    }
    Ok(())
}
