//! How robust is a model: the threat model's cascade (default: AutoAttack's standard L∞ list at ε = 0.1), the
//! gradient-masking audit, a summary table, the report (`armoury::report::write`: report.json, report.md and a
//! self-contained report.html) and one JSON line.
//!
//! `cargo run --release --example evaluate -- [--model cnn|mlp|FILE.safetensors|FILE.onnx] [--limit N]
//! [--shard i/n | --shards n] [--merge n] [--out DIR]` (`--help` lists every flag)
//!
//! `--data sample` takes the embedded sample even when the full data set is installed. Without `--weights` a
//! reference model starts from the shipped reference weights (tests/fixtures/cnn.safetensors) on the embedded
//! sample, and is trained here with the reference recipe on any other data (never Fashion-MNIST weights on other
//! data). Progress: a bar naming the attack and ε on a terminal; one line per finished step in a log.
//!
//! `--defense` (repeatable; bit-depth, median, mean, gaussian, jpeg, tv, noise) puts an input transformation in
//! front of the model and attacks the defended model with the same cascade through its BPDA/EOT gradients
//! (`--eot` draws for random ones, default 8) at the headline ε; the report adds DefenseEvaluate's metrics and
//! their radar chart. `--detector` (repeatable) fits a detector on `--fit` clean training images (default 1000)
//! at 1% FPR and reports its detection of the cascade's adversarial examples and the protected pipeline's
//! accuracy, non-adaptive and under AdaptivePgd; `region` is reported as a defense (adaptive: PGD with EOT through
//! it), `similarity` watches the cascade's Square attack and Square with query blinding. See
//! `armoury_defenses::eval`.
//!
//! With `--shard i/n` (or `--shards n` and Kubernetes' `JOB_COMPLETION_INDEX` = i) it runs samples
//! [N·i/n, N·(i+1)/n) only and writes `DIR/ledger-i-of-n.json`; `--merge n` combines the n shard ledgers of DIR
//! into the unsharded result (bit-identical records and figures) and reports it. Defenses and detectors shard
//! too: each shard writes its samples' results to `DIR/protect-i-of-n.json`, which `--merge n` combines. A ledger is also the run's
//! state file: rerunning the same command after an interruption continues where it stopped.

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

use armoury::eval::{self, AuditConfig, CascadeRun, Ledger, ThreatModel};
use armoury::load as model;
use armoury::Classifier;
use armoury_attacks::registry::from_spec;
use armoury_defenses::eval as protect;
use clap::Parser;

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
    /// Run shard i of n only (samples [N·i/n, N·(i+1)/n)) and write DIR/ledger-i-of-n.json
    #[arg(long, value_name = "i/n", value_parser = parse_shard)]
    shard: Option<(usize, usize)>,
    /// Run shard $JOB_COMPLETION_INDEX of n (a Kubernetes indexed job): --shard $JOB_COMPLETION_INDEX/n
    #[arg(long, value_name = "n", conflicts_with = "shard")]
    shards: Option<usize>,
    /// Combine the n shard ledgers (and defense/detector side files) of --out into the unsharded result
    #[arg(long, value_name = "n")]
    merge: Option<usize>,
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
    /// The classes' names for the report, one per line in class order [default: built in for Fashion-MNIST,
    /// MNIST and CIFAR-10, else the indices]
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

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("'{s}' is not i/n (e.g. 3/8)");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    Ok((i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?))
}

/// The flags, with `--shards n` turned into `--shard i/n` from `JOB_COMPLETION_INDEX` and `--threads` and
/// `--max-memory` applied.
fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args::parse();
    a.resources.apply()?;
    if let Some(n) = a.shards {
        let i: usize = std::env::var("JOB_COMPLETION_INDEX")
            .map_err(|_| "--shards needs JOB_COMPLETION_INDEX (or use --shard i/n)")?
            .parse()
            .map_err(|e| format!("--shards: JOB_COMPLETION_INDEX: {e}"))?;
        a.shard = Some((i, n));
    }
    Ok(a)
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn ledger_path(out: &std::path::Path, shard: Option<(usize, usize)>) -> PathBuf {
    eval::ledger_file(out, shard)
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
    // `--data sample`: the embedded sample even when the full data set is installed.
    let set = match args.m.data.as_deref() {
        Some(d) if d == std::path::Path::new("sample") => armoury::data::sample()?,
        d => model::load_data(d)?,
    };
    println!("data: {} ({} test images; {})", set.name, set.test.len(), set.source);
    let weights = weights(&args, &set);
    let (module, clf) = load::load_model(&args.m.model, weights.as_deref(), args.m.bounds, &set, tm.seed)?;
    let model_name = match (&args.m.model, &weights) {
        (_, Some(w)) => format!("{} ({})", args.m.model.name(), w.display()),
        (model::ModelChoice::Onnx(_), None) => args.m.model.name(),
        (_, None) => format!("{} (trained here)", args.m.model.name()),
    };
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
    println!(
        "model {} (sha256 {}), data {} (sha256 {}), kernels {}, armoury {}",
        model_name,
        &identity.model_hash[..12],
        identity.data,
        &identity.data_hash[..12],
        identity.kernel,
        identity.version
    );
    let ledger = cascade(&args, &tm, &clf, &set, model_name, &identity, n)?;
    let clf: Arc<dyn Classifier> = Arc::new(clf);
    if args.shard.is_some() {
        // A shard writes its ledger and its defenses' and detectors' per-sample results; --merge reports.
        println!("shard {:?}: ledger {}", ledger.range, ledger_path(&args.out, args.shard).display());
        if !(args.defenses.is_empty() && args.detectors.is_empty()) {
            protect::run_slice(
                &context(&args, &tm, &clf, &set, &ledger, &|_| {}, &|s| println!("{s}")),
                &args.defenses,
                &args.detectors,
            )?;
            println!(
                "shard {:?}: defenses and detectors {}",
                ledger.range,
                protect::side_file(&args.out, "protect", args.shard).display()
            );
        }
        return Ok(());
    }
    let summary = eval::summarise(&tm, &ledger, clf.num_classes());
    let verdicts = if args.audit {
        let (x, y) = set.test.batch(0..n.min(200))?;
        let norm = tm.norm()?;
        let eps = *tm.eps.last().unwrap_or(&0.1) as f32;
        eprintln!("audit: gradient-masking checks on {} samples at ε = {eps}", x.shape()[0]);
        let audit_start = Instant::now();
        let last = std::sync::Mutex::new(String::new());
        let build = |spec: &eval::AttackSpec, norm, e| {
            let step = format!("{} at ε = {e}", spec.label());
            if let Ok(mut last) = last.lock() {
                if *last != step {
                    eprintln!("audit: {step} ({:.1} s)", audit_start.elapsed().as_secs_f64());
                    *last = step;
                }
            }
            from_spec(spec, norm, e)
        };
        eval::audit(clf.as_ref(), &x, &y, &build, &AuditConfig::new(norm, eps))?
    } else {
        Vec::new()
    };
    let mut report = armoury::report::to_report(clf.as_ref(), &set.test, &tm, &ledger, &summary, verdicts)?;
    if let Some(path) = &args.class_names {
        report.set_class_names(armoury::data::read_class_names(path, clf.num_classes())?);
    }
    protect(&args, &tm, &clf, &set, &ledger, &mut report)?;
    let files = armoury::report::write(&report, &args.out)?;
    armoury::io::write_atomic(&args.out.join("threat-model.json"), serde_json::to_string_pretty(&tm)?.as_bytes())?;
    print_and_save(&tm, &summary, &report, &files.html, start.elapsed().as_secs_f64())
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
    if let Some(k) = args.merge {
        // Every shard must have finished: else one error naming all unfinished ones (a scheduler reruns those).
        let shards = eval::load_shards(&args.out, k, tm)?;
        let merged = eval::merge(tm, identity, shards)?;
        merged.save(&ledger_path(&args.out, None))?;
        return Ok(merged);
    }
    let range = match args.shard {
        Some((i, k)) => eval::shard_range(n, i, k)?,
        None => (0, n),
    };
    let bar = steps::StepProgress::new("cascade");
    let progress = |p: &eval::Progress| bar.update(p);
    let run = CascadeRun {
        threat: tm,
        build: &from_spec,
        model_name,
        identity: identity.clone(),
        range,
        total_samples: n,
        chunk: tm.batch_size,
        state: Some(ledger_path(&args.out, args.shard)),
        max_steps: None,
        progress: Some(&progress),
    };
    let l = eval::run_cascade(clf, &set.test, &run)?;
    bar.finish();
    Ok(l)
}

/// What the defenses and detectors of the command line are evaluated with.
fn context<'a>(
    args: &'a Args,
    tm: &'a ThreatModel,
    clf: &'a Arc<dyn Classifier>,
    set: &'a armoury::data::TrainTest,
    ledger: &'a Ledger,
    progress: &'a (dyn Fn(&eval::Progress) + Sync),
    notify: &'a (dyn Fn(&str) + Sync),
) -> protect::Context<'a> {
    protect::Context {
        model: clf,
        set,
        threat: tm,
        ledger,
        build: &from_spec,
        out: &args.out,
        shard: args.shard,
        eot: args.eot,
        fit: args.fit,
        progress,
        notify,
    }
}

/// The defenses and detectors of the command line — run here on every sample, or merged from the shards' side
/// files with `--merge` — added to the report.
fn protect(
    args: &Args,
    tm: &ThreatModel,
    clf: &Arc<dyn Classifier>,
    set: &armoury::data::TrainTest,
    ledger: &Ledger,
    report: &mut armoury::report::Report,
) -> Result<(), Box<dyn std::error::Error>> {
    if args.defenses.is_empty() && args.detectors.is_empty() {
        return Ok(());
    }
    let bar = steps::StepProgress::new("defenses and detectors");
    let progress = |p: &eval::Progress| bar.update(p);
    let notify = |s: &str| bar.line(s.to_string());
    let cx = context(args, tm, clf, set, ledger, &progress, &notify);
    let slices = match args.merge {
        Some(k) => (0..k)
            .map(|i| protect::load_slice(&protect::side_file(&args.out, "protect", Some((i, k)))))
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![protect::run_slice(&cx, &args.defenses, &args.detectors)?],
    };
    bar.finish();
    let (defenses, detectors, stateful) =
        protect::finalise(&cx, &protect::merge_slices(tm, &ledger.identity, slices)?)?;
    for d in &defenses {
        println!(
            "defense {}: clean {:.4}, robust {:.4} (adaptive at ε = {}), transfer {:.4}",
            d.name, d.clean_accuracy.value, d.robust_accuracy.value, d.eps, d.transfer_accuracy.value
        );
    }
    for d in &detectors {
        println!(
            "detector {}: AUC {:.4}, TPR@1% {:.4}, TPR@5% {:.4}; protected clean {:.4}, robust {:.4} (non-adaptive), \
             {} (adaptive)",
            d.name,
            d.auc,
            d.tpr_at_1fpr,
            d.tpr_at_5fpr,
            d.protected_clean_accuracy,
            d.protected_robust_non_adaptive,
            d.protected_robust_adaptive.map_or("not run".into(), |v| format!("{v:.4}")),
        );
    }
    for d in &stateful {
        for a in &d.attacks {
            println!(
                "{} vs {}: {} of {} attacked samples flagged, mean queries to the first flag {}, {} fooled unflagged; \
                 benign streams flagged {} of {}",
                d.name,
                a.attack,
                a.flagged,
                a.attacked,
                a.mean_queries_to_flag.map_or("—".into(), |q| format!("{q:.1}")),
                a.evaded,
                d.benign_flagged,
                d.benign_streams
            );
        }
    }
    report.defenses.extend(defenses);
    report.detectors.extend(detectors);
    report.stateful.extend(stateful);
    Ok(())
}

fn print_and_save(
    tm: &ThreatModel,
    s: &eval::Summary,
    r: &armoury::report::Report,
    report: &std::path::Path,
    seconds: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let verdicts = &r.audit;
    let eps = *tm.eps.last().unwrap_or(&0.0);
    let mut md = format!(
        "# Robustness of {}\n\nthreat model `{}` (sha256 {}), ε = {eps} ({}), {} samples\n\n| after | robust accuracy | \
         95% CI | broken | gradients/sample | queries/sample | seconds |\n|---|---|---|---|---|---|---|\n| clean | {:.4} \
         | [{:.4}, {:.4}] | | | | |\n",
        s.model, tm.name, s.threat_model_hash, tm.norm, s.samples, s.clean_accuracy.value, s.clean_accuracy.lo,
        s.clean_accuracy.hi
    );
    for a in &s.per_attack {
        let r = a.robust_after.last().expect("one ε at least");
        md += &format!(
            "| {} | {:.4} | [{:.4}, {:.4}] | {} | {:.1} | {:.1} | {:.2} |\n",
            a.attack, r.value, r.lo, r.hi, a.broken, a.mean_gradients, a.mean_queries, a.seconds
        );
    }
    md += "\n## Gradient-masking audit\n\n| check | verdict | explanation |\n|---|---|---|\n";
    for v in verdicts {
        md += &format!("| {} | {} | {} |\n", v.check, if v.pass { "pass" } else { "FAIL" }, v.explanation);
    }
    println!("\n{md}\nreport: {}", report.display());
    let round = |v: f64| (v * 1e4).round() / 1e4;
    let head = s.headline();
    let per_attack: serde_json::Map<String, serde_json::Value> = s
        .per_attack
        .iter()
        .map(|a| (a.attack.clone(), round(a.robust_after.last().map_or(0.0, |p| p.value)).into()))
        .collect();
    let audit: serde_json::Map<String, serde_json::Value> =
        verdicts.iter().map(|v| (v.check.clone(), (if v.pass { "pass" } else { "fail" }).into())).collect();
    let defenses: serde_json::Map<String, serde_json::Value> =
        r.defenses.iter().map(|d| (d.name.clone(), round(d.robust_accuracy.value).into())).collect();
    let detectors: serde_json::Map<String, serde_json::Value> = r
        .detectors
        .iter()
        .map(|d| {
            let v = serde_json::json!({
                "auc": round(d.auc),
                "tpr_at_1fpr": round(d.tpr_at_1fpr),
                "tpr_at_5fpr": round(d.tpr_at_5fpr),
                "protected_clean_accuracy": round(d.protected_clean_accuracy),
                "protected_robust_accuracy": round(d.protected_robust_accuracy),
            });
            (d.name.clone(), v)
        })
        .collect();
    let mut line = serde_json::json!({
        "example": "evaluate",
        "model": s.model,
        "clean_accuracy": round(s.clean_accuracy.value),
        "robust_accuracy": round(head.value),
        "robust_accuracy_ci": [round(head.lo), round(head.hi)],
        "per_attack": per_attack,
        "audit": audit,
        "identity": r.identity,
        "seconds": (seconds * 100.0).round() / 100.0,
        "report": report.display().to_string(),
    });
    if !defenses.is_empty() {
        line["defenses"] = defenses.into();
    }
    if !detectors.is_empty() {
        line["detectors"] = detectors.into();
    }
    let stateful: serde_json::Map<String, serde_json::Value> = r
        .stateful
        .iter()
        .map(|d| {
            let share = |a: &armoury::report::StatefulAttack| round(a.flagged as f64 / a.attacked.max(1) as f64);
            let attack = |adaptive: bool| d.attacks.iter().find(|a| a.adaptive == adaptive);
            let v = serde_json::json!({
                "flagged": attack(false).map(share),
                "mean_queries_to_flag": attack(false).and_then(|a| a.mean_queries_to_flag).map(|q| (q * 10.0).round() / 10.0),
                "flagged_adaptive": attack(true).map(share),
                "benign_flag_rate": round(d.benign_flagged as f64 / d.benign_streams.max(1) as f64),
            });
            ("similarity".to_string(), v)
        })
        .collect();
    if !stateful.is_empty() {
        line["stateful"] = stateful.into();
    }
    println!("{line}");
    Ok(())
}
