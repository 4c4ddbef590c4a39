//! Core speed: forward, forward + input gradient, a training step and a training epoch of the reference
//! models, as time, images/s and GFLOP/s, against the PyTorch/onnxruntime baselines measured on the AVX-512
//! development machine (docs/reference.md, speed baselines); then FGSM, PGD-40 and CW-L2 on the fixture cnn
//! against torchattacks' times, and the imported ONNX export against the native model.
//!
//! GFLOP/s counts the dense model's work (2 FLOPs per multiply-add; ×2 with the input gradient, ×3 for training),
//! so it is an effective rate: the cnn's pooled backward skips the three quarters of its convolution's
//! multiply-adds that meet zeros.
//!
//! `cargo run --release --example bench [-- --quick]`

#[path = "../benches/support/bench.rs"]
mod bench;
#[path = "support/cli.rs"]
mod cli;

use armoury::data::{self, Dataset};
use armoury::nn::ReferenceModel;
use armoury::Classifier;

/// The JSON line the example ends with: every workload and every attack.
#[derive(serde::Serialize)]
struct Summary {
    bench: Vec<RowLine>,
    attacks: Vec<AttackLine>,
}

/// One core workload in the JSON line.
#[derive(serde::Serialize)]
struct RowLine {
    model: &'static str,
    workload: &'static str,
    batch: usize,
    ms: f64,
    images_per_s: f64,
    gflops: f64,
}

/// One attack in the JSON line.
#[derive(serde::Serialize)]
struct AttackLine {
    attack: &'static str,
    images: usize,
    seconds: f64,
    images_per_s: f64,
    robust_accuracy: f64,
    success_rate: f64,
    mean_l2: f64,
    torchattacks_seconds: f64,
    speedup: f64,
}

/// `v` to `decimals` places, so the JSON line carries the figures the table prints.
fn rounded(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let set = data::load_default(None)?;
    let train = if set.train.len() >= 60_000 { set.train.take(60_000)? } else { set.train.repeat_to(60_000)? };
    let probe = set.test.take(1000)?.repeat_to(1000)?;
    println!("data: {} ({}), {} threads", set.name, set.source, rayon::current_num_threads());
    let mut rows = Vec::new();
    for model in [ReferenceModel::Cnn, ReferenceModel::Mlp] {
        rows.extend(bench::inference(model, &[1, 128, 1000], &probe)?);
        rows.extend(bench::training(model, &train, !quick)?);
    }
    println!("{:<5} {:<20} {:>6} {:>11} {:>12} {:>9}", "model", "workload", "batch", "ms", "images/s", "GFLOP/s");
    for r in &rows {
        println!(
            "{:<5} {:<20} {:>6} {:>11.3} {:>12.0} {:>9.1}",
            r.model, r.workload, r.batch, r.ms, r.images_per_s, r.gflops
        );
    }
    let targets = [
        ("cnn", "forward_input_grad", 1000, 50.0, "3x faster than PyTorch's 150 ms"),
        ("cnn", "forward", 1000, 15.0, "within 2x of onnxruntime's 7.7 ms"),
        ("cnn", "forward_input_grad", 1, 0.3, "under 0.3 ms"),
        ("mlp", "forward_input_grad", 1000, 6.0, "within 1.5x of PyTorch's 4.0 ms"),
        ("cnn", "train_epoch", 60000, 3900.0, "faster than PyTorch's 3.9-5.1 s"),
    ];
    println!("\ntargets:");
    for (m, w, b, limit, what) in targets {
        if let Some(r) = rows.iter().find(|r| r.model == m && r.workload == w && r.batch == b) {
            let ok = if r.ms <= limit { "met" } else { "MISSED" };
            println!("  {m} {w} batch {b}: {:.3} ms (target <= {limit} ms, {what}) {ok}", r.ms);
        }
    }
    let weights = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cnn.safetensors");
    let attack_rows = attacks(&weights, &probe)?;
    println!("\nattacks on the fixture cnn (the baselines' settings; torchattacks' times from the AVX-512 machine):");
    println!(
        "{:<7} {:>6} {:>9} {:>10} {:>8} {:>8} {:>8} {:>12} {:>8}",
        "attack", "images", "seconds", "images/s", "robust", "success", "mean L2", "torchattacks", "speedup"
    );
    for r in &attack_rows {
        println!(
            "{:<7} {:>6} {:>9.3} {:>10.0} {:>8.4} {:>8.4} {:>8.4} {:>11.3}s {:>7.1}x",
            r.attack,
            r.images,
            r.seconds,
            r.images as f64 / r.seconds,
            r.robust_accuracy,
            r.success_rate,
            r.mean_l2,
            r.reference_seconds,
            r.reference_seconds / r.seconds
        );
    }
    // The imported ONNX export of the fixture cnn against the native model (same kernels; the interpreter runs
    // Conv and Relu as separate nodes where the native `Sequential` fuses them).
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let onnx = armoury::onnx::OnnxModel::load(fixtures.join("cnn.onnx"))?.classifier((0.0, 1.0))?;
    let native = armoury::ModuleClassifier::new(ReferenceModel::Cnn.build(0), &[1, 28, 28], 10, (0.0, 1.0))?;
    let (x, y) = probe.batch(0..256)?;
    println!(
        "
onnx import vs native cnn, batch 256:"
    );
    for (what, onnx_ms, native_ms) in [
        (
            "forward",
            bench::median_ms(15, || onnx.logits(&x).map(drop))?,
            bench::median_ms(15, || native.logits(&x).map(drop))?,
        ),
        (
            "forward_input_grad",
            bench::median_ms(15, || onnx.loss_gradient(&x, &y).map(drop))?,
            bench::median_ms(15, || native.loss_gradient(&x, &y).map(drop))?,
        ),
    ] {
        println!("  {what:<20} onnx {onnx_ms:.3} ms, native {native_ms:.3} ms, ratio {:.2}", onnx_ms / native_ms);
    }
    let line = Summary {
        bench: rows
            .iter()
            .map(|r| RowLine {
                model: r.model,
                workload: r.workload,
                batch: r.batch,
                ms: rounded(r.ms, 4),
                images_per_s: rounded(r.images_per_s, 1),
                gflops: rounded(r.gflops, 2),
            })
            .collect(),
        attacks: attack_rows
            .iter()
            .map(|r| AttackLine {
                attack: r.attack,
                images: r.images,
                seconds: rounded(r.seconds, 4),
                images_per_s: rounded(r.images as f64 / r.seconds, 1),
                robust_accuracy: rounded(f64::from(r.robust_accuracy), 4),
                success_rate: rounded(f64::from(r.success_rate), 4),
                mean_l2: rounded(f64::from(r.mean_l2), 4),
                torchattacks_seconds: r.reference_seconds,
                speedup: rounded(r.reference_seconds / r.seconds, 2),
            })
            .collect(),
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}

/// One measured attack.
#[derive(Clone, Debug)]
struct AttackRow {
    attack: &'static str,
    images: usize,
    seconds: f64,
    robust_accuracy: f32,
    success_rate: f32,
    mean_l2: f32,
    reference_seconds: f64,
}

/// The attack workloads of the speed baselines (docs/reference.md, speed baselines) on the fixture `cnn`, median
/// of 3 runs: FGSM and PGD-40 (ε = 0.1 L∞, 40 steps of 0.01, random start) on 1000 images, CW-L2 (c = 1, κ = 0,
/// 100 Adam steps) on 100; `reference_seconds` is torchattacks' time for the same run.
fn attacks(weights: &std::path::Path, test: &Dataset) -> armoury::Result<Vec<AttackRow>> {
    use armoury::{Attack, Goal, ModuleClassifier};
    use armoury_attacks::{CarliniWagnerL2, Pgd};
    let net = ReferenceModel::Cnn.build(0);
    armoury::io::load_module(&net, weights)?;
    let clf = ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0))?;
    let runs: Vec<(&'static str, Box<dyn Attack>, usize, f64)> = vec![
        ("fgsm", Box::new(Pgd::fgsm(0.1)), 1000, 0.132),
        ("pgd40", Box::new(Pgd { step_size: 0.01, steps: 40, ..Pgd::linf(0.1) }), 1000, 5.4),
        ("cw_l2", Box::new(CarliniWagnerL2::torchattacks()), 100, 0.95),
    ];
    let mut rows = Vec::new();
    for (name, attack, n, reference) in runs {
        let (x, y) = test.batch(0..n)?;
        let mut last = None;
        let ms = bench::median_ms(3, || {
            last = Some(attack.run(&clf, &x, &y, &Goal::Untargeted, 0)?);
            Ok(())
        })?;
        let r = last.expect("ran at least once");
        let l2: Vec<f32> = r.norms.iter().zip(&r.success).filter(|(_, &s)| s).map(|(m, _)| m.l2).collect();
        rows.push(AttackRow {
            attack: name,
            images: n,
            seconds: ms / 1e3,
            robust_accuracy: r.robust_accuracy(&y),
            success_rate: r.success_rate(),
            mean_l2: if l2.is_empty() { 0.0 } else { l2.iter().sum::<f32>() / l2.len() as f32 },
            reference_seconds: reference,
        });
    }
    Ok(rows)
}
