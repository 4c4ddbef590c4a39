//! The `fuzz` example's output: the summary table, the report files (JSON, coverage SVG, failure grid) and the
//! JSON line (retraining on fuzzed failures is the core's `armoury::fuzz::retrain`).

use std::path::Path;

use armoury::coverage::Metric;
use armoury::data::{save_png_grid, GridRow};
use armoury::fuzz::mutate::Group;
use armoury::fuzz::{Failure, FuzzReport, Retrain};
use armoury::report::{LineChart, Series};
use armoury::{io, Result, Tensor};

fn mean(v: impl Iterator<Item = f32>) -> f64 {
    let (s, n) = v.fold((0.0f64, 0usize), |(s, n), x| (s + f64::from(x), n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Mean L∞ of the shrunk failures (0 when nothing was shrunk).
pub fn shrunk_mean_linf(r: &FuzzReport) -> f64 {
    mean(r.failures.iter().filter_map(|f| f.shrunk.as_ref()).map(|s| s.linf))
}

pub fn print_table(r: &FuzzReport) {
    let m = r.metric;
    let rows = [
        ("seeds (correctly classified)", format!("{} ({})", r.seeds, r.seeds_correct)),
        ("iterations / rounds", format!("{} / {}", r.iterations, r.rounds)),
        ("mutants (valid)", format!("{} ({})", r.mutants, r.groups.values().map(|g| g.valid).sum::<usize>())),
        ("kept in corpus", format!("{}", r.kept)),
        (
            "coverage seeds -> final",
            format!(
                "{} {:.4} -> {:.4} ({:.2}x)",
                m.name(),
                r.seed_coverage.get(m),
                r.final_coverage.get(m),
                r.final_coverage.get(m) / r.seed_coverage.get(m).max(1e-12)
            ),
        ),
        ("failures (seeds spanned)", format!("{} ({})", r.failures.len(), r.failing_seeds())),
        ("accuracy on fuzzed samples", format!("{:.4}", r.accuracy())),
        ("success rate", format!("{:.4}", r.success_rate())),
        (
            "median / mean Linf (failures)",
            format!(
                "{:.4} / {:.4}",
                median(r.failures.iter().map(|f| f.linf).collect()),
                mean(r.failures.iter().map(|f| f.linf))
            ),
        ),
        (
            "median Linf to the reference",
            format!("{:.4}", median(r.failures.iter().map(|f| f.reference_linf).collect())),
        ),
        ("mean Linf shrunk", format!("{:.4}", shrunk_mean_linf(r))),
        ("failures within Linf 0.1", format!("{}", r.failures.iter().filter(|f| f.linf <= 0.1).count())),
        ("mutants/s", format!("{:.0}", r.mutants_per_second())),
        ("seconds (fuzz + shrink)", format!("{:.2} + {:.2}", r.seconds, r.shrink_seconds)),
    ];
    println!("\n{:<32} value", "figure");
    for (k, v) in rows {
        println!("{k:<32} {v}");
    }
    println!("\n{:<12} {:>8} {:>8} {:>10} {:>9} {:>8}", "group", "mutants", "valid", "of correct", "failures", "rate");
    for (g, s) in &r.groups {
        println!(
            "{:<12} {:>8} {:>8} {:>10} {:>9} {:>8.4}",
            g.name(),
            s.mutants,
            s.valid,
            s.valid_from_correct,
            s.failures,
            s.success_rate()
        );
    }
}

fn failure_json(f: &Failure, attacks: &[String]) -> serde_json::Value {
    let chain: Vec<String> = f.chain.iter().map(|s| s.describe(attacks)).collect();
    let shrunk = f.shrunk.as_ref().map(|s| {
        serde_json::json!({
            "chain": s.chain.iter().map(|st| st.describe(attacks)).collect::<Vec<_>>(),
            "interpolation": s.interpolation, "prediction": s.prediction, "linf": s.linf, "l0": s.l0,
        })
    });
    serde_json::json!({
        "seed": f.seed, "label": f.label, "prediction": f.prediction, "group": f.group.name(),
        "chain": chain, "steps": f.chain, "linf": f.linf, "l0": f.l0, "reference_linf": f.reference_linf,
        "shrunk": shrunk,
    })
}

/// `report.json` (everything but the images), `coverage.svg` and `failures.png` in `out`.
pub fn write_files(r: &FuzzReport, seeds: &Tensor, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| armoury::Error::io(out, e))?;
    let json = serde_json::json!({
        "seeds": r.seeds, "seeds_correct": r.seeds_correct, "iterations": r.iterations, "mutants": r.mutants,
        "kept": r.kept, "metric": r.metric, "seed_coverage": r.seed_coverage, "final_coverage": r.final_coverage,
        "curve": r.curve, "groups": r.groups.iter().map(|(g, s)| (g.name().to_string(), serde_json::json!({
            "mutants": s.mutants, "valid": s.valid, "valid_from_correct": s.valid_from_correct,
            "failures": s.failures, "success_rate": s.success_rate()}))).collect::<serde_json::Map<_, _>>(),
        "accuracy": r.accuracy(), "success_rate": r.success_rate(), "failing_seeds": r.failing_seeds(),
        "attacks": r.attacks, "seconds": r.seconds, "shrink_seconds": r.shrink_seconds,
        "failures": r.failures.iter().map(|f| failure_json(f, &r.attacks)).collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&json).map_err(|e| armoury::Error::invalid("report", e.to_string()))?;
    io::write_atomic(&out.join("report.json"), text.as_bytes())?;
    coverage_chart(r).write(&out.join("coverage.svg"))?;
    if !r.failures.is_empty() {
        let [_, c, h, w] =
            <[usize; 4]>::try_from(seeds.shape()).map_err(|_| armoury::Error::invalid("grid", "not NCHW"))?;
        let img = |v: &[f32]| Tensor::from_slice(v, &[c, h, w]);
        let mut rows = Vec::new();
        // One failure per group first, then the next ones, up to 12 rows.
        let mut picked: Vec<&Failure> = Vec::new();
        for g in [Group::Pixel, Group::Affine, Group::Adversarial] {
            picked.extend(r.failures.iter().filter(|f| f.group == g).take(4));
        }
        for f in picked.into_iter().take(12) {
            let seed = seeds.narrow(0, f.seed, 1)?.reshape(&[c, h, w])?;
            let shrunk = f.shrunk.as_ref().map(|s| s.image.as_slice()).unwrap_or(&f.image);
            let label = format!("{} {}>{}", f.group.name(), f.label, f.prediction);
            rows.push(GridRow::new(label, vec![seed, img(&f.image)?, img(shrunk)?]));
        }
        save_png_grid(out.join("failures.png"), &rows, 3)?;
    }
    Ok(())
}

/// The metric against mutants made, as a line chart.
fn coverage_chart(r: &FuzzReport) -> LineChart {
    LineChart {
        title: format!("{} coverage vs mutants", r.metric.name().to_uppercase()),
        x_label: "mutants".into(),
        y_label: r.metric.name().into(),
        series: vec![Series {
            name: r.metric.name().into(),
            points: r.curve.iter().map(|&(x, y)| (x as f64, y)).collect(),
        }],
        ..LineChart::default()
    }
}

/// The example's JSON line.
pub fn json_line(r: &FuzzReport, metric: Metric, retrain: Option<&Retrain>) -> serde_json::Value {
    let round = |v: f64, p: i32| (v * 10f64.powi(p)).round() / 10f64.powi(p);
    let by_group: serde_json::Map<String, serde_json::Value> =
        r.groups.iter().map(|(g, s)| (g.name().to_string(), s.failures.into())).collect();
    let mut line = serde_json::json!({
        "example": "fuzz", "seeds": r.seeds, "iterations": r.iterations, "coverage_metric": metric.name(),
        "seed_coverage": round(r.seed_coverage.get(metric), 4), "final_coverage": round(r.final_coverage.get(metric), 4),
        "mutants": r.mutants, "mutants_per_second": round(r.mutants_per_second(), 0), "failures": r.failures.len(),
        "failures_by_group": by_group, "failing_seeds": r.failing_seeds(),
        "shrunk_mean_linf": round(shrunk_mean_linf(r), 4), "seconds": round(r.seconds, 2),
    });
    if let (Some(t), Some(obj)) = (retrain, line.as_object_mut()) {
        obj.insert(
            "retrain".into(),
            serde_json::json!({
                "train_fuzzed": t.train_fuzzed, "held_out": t.held_out,
                "fuzzed_accuracy_before": round(t.fuzzed_before, 4), "fuzzed_accuracy_after": round(t.fuzzed_after, 4),
                "clean_accuracy_before": round(t.clean_before, 4), "clean_accuracy_after": round(t.clean_after, 4),
            }),
        );
    }
    line
}
