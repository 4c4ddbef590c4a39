//! How robust is a model: the threat model's cascade (default: AutoAttack's standard L∞ list at ε = 0.1), the
//! gradient-masking audit, a summary table, the report (`armoury::report::write`: report.json, report.md and a
//! self-contained report.html) and one JSON line.
//!
//! `cargo run --release --example evaluate -- [--model cnn|mlp|FILE.safetensors|FILE.onnx] [--weights FILE]
//! [--bounds 0,1] [--data DIR] [--threat-model FILE.json] [--eps E] [--limit N] [--shard i/n | --shards n]
//! [--merge n] [--no-audit] [--out DIR]`
//!
//! With `--shard i/n` (or `--shards n` and Kubernetes' `JOB_COMPLETION_INDEX` = i) it runs samples
//! [N·i/n, N·(i+1)/n) only and writes `DIR/ledger-i-of-n.json`; `--merge n` combines the n shard ledgers of DIR
//! into the unsharded result (bit-identical records and figures) and reports it. A ledger is also the run's
//! state file: rerunning the same command after an interruption continues where it stopped.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/load.rs"]
mod load;
#[path = "support/model.rs"]
mod model;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;
use std::time::Instant;

use armoury::eval::{self, AuditConfig, CascadeRun, Ledger, ThreatModel};
use armoury::Classifier;
use armoury_attacks::registry::from_spec;
use indicatif::{ProgressBar, ProgressStyle};

struct Args {
    model: model::ModelChoice,
    weights: Option<PathBuf>,
    bounds: (f32, f32),
    data: Option<PathBuf>,
    threat: Option<PathBuf>,
    eps: Option<f64>,
    limit: usize,
    shard: Option<(usize, usize)>,
    merge: Option<usize>,
    audit: bool,
    out: PathBuf,
}

fn parse_shard(s: &str) -> Result<(usize, usize), Box<dyn std::error::Error>> {
    let (i, n) = s.split_once('/').ok_or("--shard takes i/n")?;
    Ok((i.trim().parse()?, n.trim().parse()?))
}

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    use lexopt::prelude::*;
    let mut a = Args {
        model: model::ModelChoice::Reference(armoury::nn::ReferenceModel::Cnn),
        weights: None,
        bounds: (0.0, 1.0),
        data: None,
        threat: None,
        eps: None,
        limit: 1000,
        shard: None,
        merge: None,
        audit: true,
        out: PathBuf::from("out/evaluate"),
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next()? {
        match arg {
            Long("model") => {
                let v = p.value()?.string()?;
                if v.ends_with(".safetensors") {
                    a.weights = Some(v.into());
                } else {
                    a.model = v.parse()?;
                }
            }
            Long("weights") => a.weights = Some(p.value()?.into()),
            Long("bounds") => a.bounds = model::parse_bounds(&p.value()?.string()?)?,
            Long("data") => a.data = Some(p.value()?.into()),
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

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let args = parse()?;
    let mut tm = match &args.threat {
        Some(p) => ThreatModel::load(p)?,
        None => ThreatModel::autoattack_linf(0.1),
    };
    if let Some(e) = args.eps {
        tm.eps = vec![e];
        tm.check()?;
    }
    let set = model::load_data(args.data.as_deref())?;
    println!("data: {} ({} test images; {})", set.name, set.test.len(), set.source);
    let (_, clf) = load::load_model(&args.model, args.weights.as_deref(), args.bounds, &set, tm.seed)?;
    let model_name = match &args.weights {
        Some(w) => format!("{} ({})", args.model.name(), w.display()),
        None => format!("{} (trained here)", args.model.name()),
    };
    let n = args.limit.min(set.test.len());
    std::fs::create_dir_all(&args.out)?;
    println!("threat model {} ({}), {} samples", tm.name, &tm.hash()[..12], n);
    let ledger = match args.merge {
        Some(k) => {
            let shards =
                (0..k).map(|i| Ledger::load(&ledger_path(&args.out, Some((i, k))))).collect::<Result<_, _>>()?;
            let merged = eval::merge(&tm, shards)?;
            merged.save(&ledger_path(&args.out, None))?;
            merged
        }
        None => {
            let range = match args.shard {
                Some((i, k)) => eval::shard_range(n, i, k)?,
                None => (0, n),
            };
            let bar = ProgressBar::new(0);
            bar.set_style(ProgressStyle::with_template("[{bar:30}] {pos}/{len} steps ({elapsed}, eta {eta})")?);
            let progress = |done: usize, total: usize| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            };
            let run = CascadeRun {
                threat: &tm,
                build: &from_spec,
                model_name: model_name.clone(),
                range,
                total_samples: n,
                chunk: tm.batch_size,
                state: Some(ledger_path(&args.out, args.shard)),
                max_steps: None,
                progress: Some(&progress),
            };
            let l = eval::run_cascade(&clf, &set.test, &run)?;
            bar.finish_and_clear();
            if args.shard.is_some() {
                println!("shard {:?}: ledger {}", range, ledger_path(&args.out, args.shard).display());
                return Ok(());
            }
            l
        }
    };
    let summary = eval::summarise(&tm, &ledger, clf.num_classes());
    let verdicts = if args.audit {
        let (x, y) = set.test.batch(0..n.min(200))?;
        let norm = tm.norm()?;
        eval::audit(&clf, &x, &y, &from_spec, &AuditConfig::new(norm, *tm.eps.last().unwrap_or(&0.1) as f32))?
    } else {
        Vec::new()
    };
    let report = eval::to_report(&clf, &set.test, &tm, &ledger, &summary, verdicts.clone())?;
    let files = armoury::report::write(&report, &args.out)?;
    armoury::io::write_atomic(&args.out.join("threat-model.json"), serde_json::to_string_pretty(&tm)?.as_bytes())?;
    print_and_save(&tm, &summary, &verdicts, &files.html, start.elapsed().as_secs_f64())
}

fn print_and_save(
    tm: &ThreatModel,
    s: &eval::Summary,
    verdicts: &[eval::Verdict],
    report: &std::path::Path,
    seconds: f64,
) -> Result<(), Box<dyn std::error::Error>> {
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
    let line = serde_json::json!({
        "example": "evaluate",
        "model": s.model,
        "clean_accuracy": round(s.clean_accuracy.value),
        "robust_accuracy": round(head.value),
        "robust_accuracy_ci": [round(head.lo), round(head.hi)],
        "per_attack": per_attack,
        "audit": audit,
        "seconds": (seconds * 100.0).round() / 100.0,
        "report": report.display().to_string(),
    });
    println!("{line}");
    Ok(())
}
