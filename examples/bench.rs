//! Core speed: forward, forward + input gradient, a training step and a training epoch of the reference
//! models, as time, images/s and GFLOP/s, against the PyTorch/onnxruntime figures of SPEC §6.
//!
//! GFLOP/s counts the dense model's work (2 FLOPs per multiply-add; ×2 with the input gradient, ×3 for training),
//! so it is an effective rate: the cnn's pooled backward skips the three quarters of its convolution's
//! multiply-adds that meet zeros.
//!
//! `cargo run --release --example bench [-- --quick]`

#[path = "support/bench.rs"]
mod bench;
#[path = "support/cli.rs"]
mod cli;

use armoury::data;
use armoury::nn::ReferenceModel;
use armoury::Classifier;

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
    let attack_rows = bench::attacks(&weights, &probe)?;
    println!(
        "\nattacks on the fixture cnn (SPEC §6 settings; torchattacks as SPEC §6 measured it, on its AVX-512 machine):"
    );
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
    let json: Vec<String> = rows.iter().map(bench::Row::json).collect();
    let attack_json: Vec<String> = attack_rows.iter().map(bench::AttackRow::json).collect();
    println!("{{\"bench\":[{}],\"attacks\":[{}]}}", json.join(","), attack_json.join(","));
    Ok(())
}
