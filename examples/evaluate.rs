//! How robust is a model: the threat model's cascade (default: AutoAttack's standard L∞ list at ε = 0.1), the
//! gradient-masking audit, a summary table, the report (`armoury::report::write`: report.json, report.md and a
//! self-contained report.html) and one JSON line.
//!
//! `cargo run --release --example evaluate -- [--model cnn|mlp|FILE.safetensors|FILE.onnx] [--weights FILE]
//! [--bounds 0,1] [--data DIR] [--threat-model FILE.json] [--eps E] [--limit N] [--shard i/n | --shards n]
//! [--merge n] [--no-audit] [--defense NAME[:PARAM]]… [--eot N]
//! [--detector squeeze|lid|mahalanobis|ensemble|magnet[:N,E]|region|similarity]… [--fit N] [--out DIR]`
//!
//! `--data sample` takes the embedded sample even when the full data set is installed. Without `--model`/`--weights` the reference cnn is trained here with the reference recipe when the full
//! Fashion-MNIST is installed, else it starts from the shipped reference weights (tests/fixtures/cnn.safetensors).
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

#[path = "support/cli.rs"]
mod cli;
#[path = "support/load.rs"]
mod load;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use armoury::eval::{self, AuditConfig, CascadeRun, Ledger, ThreatModel};
use armoury::load as model;
use armoury::Classifier;
use armoury_attacks::registry::from_spec;
use armoury_defenses::eval as protect;
use indicatif::{ProgressBar, ProgressStyle};

struct Args {
    m: load::ModelFlags,
    threat: Option<PathBuf>,
    eps: Option<f64>,
    limit: usize,
    shard: Option<(usize, usize)>,
    merge: Option<usize>,
    audit: bool,
    defenses: Vec<String>,
    eot: usize,
    detectors: Vec<String>,
    fit: usize,
    out: PathBuf,
}

fn parse_shard(s: &str) -> Result<(usize, usize), Box<dyn std::error::Error>> {
    let (i, n) = s.split_once('/').ok_or("--shard takes i/n")?;
    Ok((i.trim().parse()?, n.trim().parse()?))
}

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let mut a = Args {
        m: load::ModelFlags::default(),
        threat: None,
        eps: None,
        limit: 1000,
        shard: None,
        merge: None,
        audit: true,
        defenses: Vec::new(),
        eot: 8,
        detectors: Vec::new(),
        fit: 1000,
        out: PathBuf::from("out/evaluate"),
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long(k) if load::ModelFlags::FLAGS.contains(&k) => {
                let k = k.to_string();
                a.m.take(&k, &mut p)?
            }
            Long("threat-model") => a.threat = Some(p.value()?.into()),
            Long("eps") => a.eps = Some(p.value()?.parse()?),
            Long("limit") => a.limit = p.value()?.parse()?,
            Long("shard") => a.shard = Some(parse_shard(&p.value()?.string()?)?),
            Long("shards") => {
                let n: usize = p.value()?.parse()?;
                let i: usize = std::env::var("JOB_COMPLETION_INDEX")
                    .map_err(|_| "--shards needs JOB_COMPLETION_INDEX (or use --shard i/n)")?
                    .parse()?;
                a.shard = Some((i, n));
            }
            Long("merge") => a.merge = Some(p.value()?.parse()?),
            Long("no-audit") => a.audit = false,
            Long("defense") => a.defenses.push(p.value()?.string()?.to_lowercase()),
            Long("eot") => a.eot = p.value()?.parse()?,
            Long("detector") => a.detectors.push(p.value()?.string()?.to_lowercase()),
            Long("fit") => a.fit = p.value()?.parse()?,
            Long("out") => a.out = p.value()?.into(),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(a)
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn ledger_path(out: &std::path::Path, shard: Option<(usize, usize)>) -> PathBuf {
    match shard {
        Some((i, n)) => out.join(format!("ledger-{i}-of-{n}.json")),
        None => out.join("ledger.json"),
    }
}

/// The progress bar of one cascade, and its callback.
fn bar() -> Result<ProgressBar, Box<dyn std::error::Error>> {
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("[{bar:30}] {pos}/{len} steps ({elapsed}, eta {eta}) {msg}")?);
    Ok(bar)
}

/// The weights to load: `--weights` when given; for a reference model without them, none (trained here with
/// the reference recipe) when the full data set is loaded, else the shipped reference weights — three epochs
/// on the 2,000-image sample give a much weaker model than the reference one.
fn weights(args: &Args, set: &armoury::data::TrainTest) -> Option<PathBuf> {
    if args.m.weights.is_some() {
        return args.m.weights.clone();
    }
    let model::ModelChoice::Reference(r) = &args.m.model else { return None };
    let fixture = PathBuf::from(format!("tests/fixtures/{}.safetensors", r.name()));
    (set.train.len() < 60_000 && fixture.exists()).then_some(fixture)
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
                &context(&args, &tm, &clf, &set, &ledger, &|_, _| {}, &|s| println!("{s}")),
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
        eval::audit(clf.as_ref(), &x, &y, &from_spec, &AuditConfig::new(norm, *tm.eps.last().unwrap_or(&0.1) as f32))?
    } else {
        Vec::new()
    };
    let mut report = eval::to_report(clf.as_ref(), &set.test, &tm, &ledger, &summary, verdicts)?;
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
        let shards = (0..k).map(|i| Ledger::load(&ledger_path(&args.out, Some((i, k))))).collect::<Result<_, _>>()?;
        let merged = eval::merge(tm, identity, shards)?;
        merged.save(&ledger_path(&args.out, None))?;
        return Ok(merged);
    }
    let range = match args.shard {
        Some((i, k)) => eval::shard_range(n, i, k)?,
        None => (0, n),
    };
    let bar = bar()?;
    let started = std::sync::atomic::AtomicBool::new(false);
    let progress = |done: usize, total: usize| {
        if !started.swap(true, std::sync::atomic::Ordering::Relaxed) && done > 0 {
            bar.println(format!("resuming: {done} of {total} steps done"));
        }
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
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
    bar.finish_and_clear();
    Ok(l)
}

/// What the defenses and detectors of the command line are evaluated with.
fn context<'a>(
    args: &'a Args,
    tm: &'a ThreatModel,
    clf: &'a Arc<dyn Classifier>,
    set: &'a armoury::data::TrainTest,
    ledger: &'a Ledger,
    progress: &'a (dyn Fn(usize, usize) + Sync),
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
    let bar = bar()?;
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let notify = |s: &str| bar.suspend(|| println!("{s}"));
    let cx = context(args, tm, clf, set, ledger, &progress, &notify);
    let slices = match args.merge {
        Some(k) => (0..k)
            .map(|i| protect::load_slice(&protect::side_file(&args.out, "protect", Some((i, k)))))
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![protect::run_slice(&cx, &args.defenses, &args.detectors)?],
    };
    bar.finish_and_clear();
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
