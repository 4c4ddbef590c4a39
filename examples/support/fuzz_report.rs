//! The `fuzz` example's output: the summary table, the report files (JSON, coverage SVG, failure grid), the
//! retraining step on fuzzed failures, and the JSON line.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use armoury::coverage::Metric;
use armoury::data::{save_png_grid, Dataset, GridRow, TrainTest};
use armoury::fuzz::mutate::Group;
use armoury::fuzz::{Failure, FuzzReport};
use armoury::nn::{Module, ModuleExt};
use armoury::optim::{Adam, AdamConfig};
use armoury::{io, Classifier, ModuleClassifier, Result, Tensor};
use armoury_defenses::training::AdversarialDefense;

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
    io::write_atomic(&out.join("coverage.svg"), coverage_svg(r).as_bytes())?;
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

/// The metric against mutants made, as an SVG line chart.
fn coverage_svg(r: &FuzzReport) -> String {
    let (w, h, left, top, right, bottom) = (640.0, 360.0, 70.0, 40.0, 20.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let xmax = r.curve.last().map(|p| p.0).unwrap_or(1).max(1) as f64;
    let ymax = r.curve.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    let px = |x: usize| left + pw * x as f64 / xmax;
    let py = |y: f64| top + ph * (1.0 - y / ymax);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    let _ = write!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{} coverage vs mutants</text>"#,
        left + pw / 2.0,
        r.metric.name().to_uppercase()
    );
    for k in 0..=5 {
        let (yv, xv) = (ymax * k as f64 / 5.0, (xmax * k as f64 / 5.0).round() as usize);
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{yv:.3}</text>"##,
            left + pw,
            left - 6.0,
            py(yv) + 4.0,
            y = py(yv)
        );
        let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{xv}</text>"#, px(xv), top + ph + 18.0);
    }
    let pts: Vec<String> = r.curve.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
    let _ = write!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/><polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="2"/>"##,
        pts.join(" ")
    );
    let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">mutants</text></svg>"#, left + pw / 2.0, h - 10.0);
    s
}

/// What retraining on fuzzed failures did.
pub struct Retrain {
    pub train_fuzzed: usize,
    pub held_out: usize,
    pub fuzzed_before: f64,
    pub fuzzed_after: f64,
    pub clean_before: f64,
    pub clean_after: f64,
}

fn accuracy(clf: &dyn Classifier, x: &Tensor, y: &[usize]) -> Result<f64> {
    let p = clf.predict(x)?;
    Ok(p.iter().zip(y).filter(|(a, b)| a == b).count() as f64 / y.len().max(1) as f64)
}

fn stack(images: &[&[f32]], shape: &[usize]) -> Result<Tensor> {
    let flat: Vec<f32> = images.iter().flat_map(|v| v.iter().copied()).collect();
    let mut dims = vec![images.len()];
    dims.extend_from_slice(shape);
    Tensor::from_vec(flat, &dims)
}

/// Fine-tunes the model (Adam, lr 1e-4, batch 128, `epochs` passes; each step the defenses crate's
/// `AdversarialDefense::train_step`) on every clean training image plus the failures (and shrunk
/// failures, repeated to a sixth of the data) of the
/// even-numbered seeds, and measures the failures of the odd-numbered seeds (held out: their seeds were never
/// trained on) and the clean test images after the seeds, before and after.
pub fn retrain(
    module: &Arc<dyn Module>,
    clf: &ModuleClassifier,
    r: &FuzzReport,
    set: &TrainTest,
    n_seeds: usize,
    epochs: usize,
    seed: u64,
) -> Result<Retrain> {
    let shape = clf.input_shape().to_vec();
    let (train_f, held_f): (Vec<&Failure>, Vec<&Failure>) = r.failures.iter().partition(|f| f.seed % 2 == 0);
    let mut fuzz_imgs: Vec<&[f32]> = train_f.iter().map(|f| f.image.as_slice()).collect();
    fuzz_imgs.extend(train_f.iter().filter_map(|f| f.shrunk.as_ref()).map(|s| s.image.as_slice()));
    let mut fuzz_labels: Vec<usize> = train_f.iter().map(|f| f.label).collect();
    fuzz_labels.extend(train_f.iter().filter(|f| f.shrunk.is_some()).map(|f| f.label));
    let held_x = stack(&held_f.iter().map(|f| f.image.as_slice()).collect::<Vec<_>>(), &shape)?;
    let held_y: Vec<usize> = held_f.iter().map(|f| f.label).collect();
    let (clean_x, clean_y) = set.test.batch(n_seeds.min(set.test.len() - 1)..set.test.len())?;
    let (fuzzed_before, clean_before) = (accuracy(clf, &held_x, &held_y)?, accuracy(clf, &clean_x, &clean_y)?);
    let clean = set.train.clone();
    let mut x = vec![clean.images().clone()];
    let mut y = clean.labels().to_vec();
    if !fuzz_imgs.is_empty() {
        // Repeated so that the fuzzed inputs are about a sixth of what each epoch sees.
        let repeat = (clean.len() / (5 * fuzz_imgs.len())).max(1);
        let fx = stack(&fuzz_imgs, &shape)?;
        for _ in 0..repeat {
            x.push(fx.clone());
            y.extend(&fuzz_labels);
        }
    }
    let data = Dataset::new(Tensor::concat(&x, 0)?, y, clf.num_classes())?;
    let mut opt = Adam::new(module.parameters(), AdamConfig { lr: 1e-4, ..AdamConfig::default() })?;
    for epoch in 0..epochs {
        let order = armoury::seed::shuffled(data.len(), seed, epoch as u64);
        for chunk in order.chunks(128) {
            let b = data.subset(chunk)?;
            AdversarialDefense::train_step(module.as_ref(), &mut opt, b.images(), b.labels())?;
        }
    }
    Ok(Retrain {
        train_fuzzed: fuzz_imgs.len(),
        held_out: held_y.len(),
        fuzzed_before,
        fuzzed_after: accuracy(clf, &held_x, &held_y)?,
        clean_before,
        clean_after: accuracy(clf, &clean_x, &clean_y)?,
    })
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
