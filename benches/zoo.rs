//! `cargo bench --bench zoo -- DIR [MODEL…] [--reps N] [--peak GFLOPS | --no-peak] [--json]`: the full-size
//! model zoo of the performance issue, on Armoury's side.
//!
//! `DIR` holds what `benches/reference/zoo_full.py export DIR` writes: `<model>.onnx`, `<model>_input.safetensors`
//! (the batch `x`, its labels `y` and PyTorch's `logits` on it) and `<model>.json` (the forward's FLOPs as
//! PyTorch's `FlopCounterMode` counts them). For each model (default: every `*.onnx` in `DIR`, sorted) it loads
//! the file, checks the logits against PyTorch's, and times the forward (evaluation mode, no gradient) and the
//! forward + input gradient of the summed cross-entropy (what an attack step costs) — one warm-up of each, then
//! `--reps` rounds (default 5) of one forward and one forward + gradient in turn; medians in ms per call.
//! GFLOP/s counts PyTorch's forward FLOPs (×2 with the input gradient: its backward is one more pass of the same
//! products), and "% peak" is against [`armoury::ops::measured_peak_gflops`] measured first (`--peak` passes a
//! value measured elsewhere, `--no-peak` skips it, `--peak-only` prints it and exits).
//!
//! `--autoattack N` runs AutoAttack's standard L∞ evaluation (ε = 8/255) of each model on its first N images
//! instead, labelled with the model's own predictions, and prints the time as a JSON line; `zoo_full.py
//! autoattack` runs the authors' AutoAttack (`pyautoattack`) on the same weights, images and labels.
//!
//! `--profile ROWS` prints where one forward + input gradient spends its time instead ([`armoury::profile`]);
//! with `--forward-only`, one forward pass with no graph recorded (what the onnxruntime column times).
//!
//! `--json` prints one JSON line per model instead of the table: `benches/reference/zoo_full.py compare` runs this
//! binary once per round, interleaved with onnxruntime and PyTorch, and reads those lines.

use std::path::{Path, PathBuf};
use std::time::Instant;

use armoury::io::SafetensorsFile;
use armoury::onnx::OnnxModel;
use armoury::{Classifier, Tensor};

type BoxError = Box<dyn std::error::Error>;

/// Outputs land in blocks freed a moment ago, still in cache, as onnxruntime's arena gives them (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

struct Args {
    dir: PathBuf,
    models: Vec<String>,
    reps: usize,
    peak: Option<Option<f64>>,
    json: bool,
    autoattack: Option<usize>,
    profile: Option<usize>,
    /// `--profile` times the forward pass alone (no graph recorded), as `logits` runs it.
    forward_only: bool,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut dir = None;
    let mut models = Vec::new();
    let (mut reps, mut peak, mut json, mut autoattack, mut profile) = (5, None, false, None, None);
    let mut forward_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--help" | "-h" => {
                println!("{}", HELP);
                std::process::exit(0);
            }
            "--reps" => reps = args.next().ok_or("--reps needs a number")?.parse()?,
            "--peak" => peak = Some(Some(args.next().ok_or("--peak needs GFLOP/s")?.parse()?)),
            "--no-peak" => peak = Some(None),
            "--json" => json = true,
            "--forward-only" => forward_only = true,
            "--profile" => profile = Some(args.next().ok_or("--profile needs a row count")?.parse()?),
            "--autoattack" => autoattack = Some(args.next().ok_or("--autoattack needs a sample count")?.parse()?),
            "--peak-only" => {
                let peak = armoury::ops::measured_peak_gflops(1.0).ok_or("no vector kernels: no peak")?;
                println!("{peak:.1}");
                std::process::exit(0);
            }
            flag if flag.starts_with("--") => return Err(format!("unknown flag '{flag}'\n\n{HELP}").into()),
            _ if dir.is_none() => dir = Some(PathBuf::from(a)),
            _ => models.push(a),
        }
    }
    if forward_only && profile.is_none() {
        return Err(format!("--forward-only applies to --profile\n\n{HELP}").into());
    }
    let dir = dir.ok_or_else(|| format!("no directory given\n\n{HELP}"))?;
    if models.is_empty() {
        let mut found: Vec<String> = std::fs::read_dir(&dir)
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".onnx").map(str::to_string))
            .collect();
        found.sort();
        if found.is_empty() {
            return Err(
                format!("no .onnx files in {} (run benches/reference/zoo_full.py export)", dir.display()).into()
            );
        }
        models = found;
    }
    Ok(Args { dir, models, reps: reps.max(1), peak, json, autoattack, profile, forward_only })
}

const HELP: &str =
    "usage: zoo DIR [MODEL…] [--reps N] [--peak GFLOPS | --no-peak] [--json] [--autoattack N] [--profile ROWS
           [--forward-only]]
  DIR      what `python benches/reference/zoo_full.py export DIR` wrote
  MODEL    model names (files DIR/MODEL.onnx); default: every .onnx in DIR
  --reps   timed rounds of forward and forward + input gradient (default 5)
  --peak   the machine's f32 peak in GFLOP/s, measured elsewhere (default: measured here for 1 s)
  --no-peak  skip the peak
  --peak-only  measure the peak, print it in GFLOP/s and exit
  --json   one JSON line per model instead of the table
  --autoattack N  instead of timing passes: AutoAttack's standard L∞ evaluation at ε = 8/255 of the first N
           images, labelled with the model's own predictions; one JSON line per model
  --profile ROWS  instead of timing passes: where one forward + input gradient spends its time, the ROWS most
           expensive steps (forward: graph steps; backward: ops) and the totals per operator
  --forward-only  with --profile: profile the forward pass alone, with no graph recorded (what `logits` and the
           onnxruntime comparison run) instead of forward + input gradient";

/// One model's measurements.
struct Measured {
    name: String,
    batch: usize,
    hw: usize,
    flops: f64,
    load_s: f64,
    logit_diff: f32,
    forward_ms: f64,
    grad_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The exported batch of model `name`: `x`, labels `y` and PyTorch's `logits`.
fn input(dir: &Path, name: &str) -> Result<SafetensorsFile, BoxError> {
    Ok(SafetensorsFile::open(dir.join(format!("{name}_input.safetensors")))?)
}

/// The batch's labels `y`.
fn labels(input: &SafetensorsFile) -> Result<Vec<usize>, BoxError> {
    Ok(input.i64("y")?.iter().map(|&v| v as usize).collect())
}

/// Model `name` imported from `DIR/name.onnx`, inputs in [0, 1].
fn classifier(dir: &Path, name: &str) -> Result<armoury::ModuleClassifier, BoxError> {
    Ok(OnnxModel::load(dir.join(format!("{name}.onnx")))?.classifier((0.0, 1.0))?)
}

fn measure(dir: &Path, name: &str, reps: usize) -> Result<Measured, BoxError> {
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}.json"))).map_err(|e| format!("{name}.json: {e}"))?,
    )?;
    let flops = meta["forward_flops"].as_f64().ok_or("forward_flops missing")?;
    let input = input(dir, name)?;
    let (x, y) = (Tensor::new(input.f32("x")?), labels(&input)?);
    let reference = input.f32("logits")?;
    let t = Instant::now();
    let clf = classifier(dir, name)?;
    let load_s = t.elapsed().as_secs_f64();
    let logits = clf.logits(&x)?;
    let logit_diff = logits.iter().zip(reference.iter()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    clf.loss_gradient(&x, &y)?;
    let (mut fwd, mut grad) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(clf.logits(&x)?);
        fwd.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(clf.loss_gradient(&x, &y)?);
        grad.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let shape = x.shape();
    Ok(Measured {
        name: name.to_string(),
        batch: shape[0],
        hw: shape[shape.len() - 1],
        flops,
        load_s,
        logit_diff,
        forward_ms: median(fwd),
        grad_ms: median(grad),
    })
}

/// AutoAttack's standard L∞ evaluation (ε = 8/255) of the model on its first `n` images, labelled with its own
/// predictions (so every image is attacked), as one JSON line with the samples passed forward and through the
/// input gradient (Armoury's APGD stops a sample at its first success; the authors' runs every iteration); `benches/reference/zoo_full.py autoattack` runs
/// the authors' code on the same weights, images and labels.
fn autoattack(dir: &Path, name: &str, n: usize) -> Result<(), BoxError> {
    let x = input(dir, name)?.f32("x")?;
    let n = n.min(x.shape()[0]);
    let x = Tensor::new(x.slice_axis(ndarray::Axis(0), (0..n).into()).to_owned());
    let clf = classifier(dir, name)?;
    let y = clf.predict(&x)?;
    clf.counters().reset();
    let t = Instant::now();
    let result = armoury_attacks::autoattack(&clf, &x, &y, armoury::attack::Norm::Linf, 8.0 / 255.0)?;
    let seconds = t.elapsed().as_secs_f64();
    let passes = clf.counters().snapshot();
    println!(
        "{}",
        serde_json::json!({
            "model": name, "n": n, "eps": 8.0 / 255.0, "seconds": seconds, "labels": y,
            "clean_accuracy": result.clean_accuracy(), "robust_accuracy": result.robust_accuracy(),
            "forward_samples": passes.forward_samples, "gradient_samples": passes.backward_samples,
            "threads": rayon::current_num_threads(),
        })
    );
    Ok(())
}

/// Passes before a profiled one: the second pass of a process ran some large ops 3–4× slower than the third and
/// later ones (ResNet-50's `256 → 512` projection's input gradient 19.5 ms, then 5.8–6.6), so one warm-up profiled
/// a pass no attack sees.
const WARM_UPS: usize = 3;

/// Where one forward + input gradient (or, `forward_only`, one forward with no graph recorded) of the model spends
/// its time ([`armoury::profile`]), after [`WARM_UPS`] passes: the `rows` most expensive steps, then the time per
/// operator in each phase.
fn profile(dir: &Path, name: &str, rows: usize, forward_only: bool) -> Result<(), BoxError> {
    use armoury::profile::Phase;
    let input = input(dir, name)?;
    let (x, y) = (Tensor::new(input.f32("x")?), labels(&input)?);
    let clf = classifier(dir, name)?;
    let pass = || -> armoury::Result<()> {
        match forward_only {
            true => clf.logits(&x).map(drop),
            false => clf.loss_gradient(&x, &y).map(drop),
        }
    };
    for _ in 0..WARM_UPS {
        pass()?;
    }
    let t = Instant::now();
    let (result, p) = armoury::profile::record(pass);
    let wall = t.elapsed().as_secs_f64() * 1e3;
    result?;
    let (fwd, bwd) = (p.total_ms(Phase::Forward), p.total_ms(Phase::Backward));
    let what = if forward_only { "forward" } else { "forward + ∂x" };
    println!("{name}: {what} {wall:.1} ms: graph steps {fwd:.1} ms, backward ops {bwd:.1} ms");
    println!("{:>9} {:>6} {:>6}  {:<9} {:<40} {:<22} → output", "ms", "%", "calls", "phase", "op", "input");
    for e in p.entries.iter().take(rows) {
        println!(
            "{:>9.2} {:>6.1} {:>6}  {:<9} {:<40} {:<22} → {:?}",
            e.ms,
            100.0 * e.ms / wall,
            e.calls,
            format!("{:?}", e.phase),
            e.op,
            format!("{:?}", e.input),
            e.output
        );
    }
    for phase in [Phase::Forward, Phase::Backward] {
        let ops: Vec<String> = p
            .by_op(phase)
            .iter()
            .take(8)
            .map(|(op, ms)| format!("{op} {ms:.1} ms ({:.0}%)", 100.0 * ms / wall))
            .collect();
        println!("{phase:?} by operator: {}", ops.join(", "));
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    armoury::limits::reuse_freed_memory();
    let args = parse_args()?;
    if let Some(rows) = args.profile {
        for name in &args.models {
            profile(&args.dir, name, rows, args.forward_only).map_err(|e| format!("{name}: {e}"))?;
        }
        return Ok(());
    }
    if let Some(n) = args.autoattack {
        for name in &args.models {
            autoattack(&args.dir, name, n).map_err(|e| format!("{name}: {e}"))?;
        }
        return Ok(());
    }
    let peak = match args.peak {
        Some(p) => p,
        None => armoury::ops::measured_peak_gflops(1.0),
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    if !args.json {
        println!(
            "{} threads, measured f32 peak {}, load average {}",
            rayon::current_num_threads(),
            peak.map_or("n/a".to_string(), |p| format!("{p:.1} GFLOP/s")),
            load.join(" ")
        );
        println!(
            "{:<17} {:>10} {:>8} {:>10} {:>9} {:>7} {:>12} {:>9} {:>7} {:>10}",
            "model", "batch×size", "GFLOP", "fwd ms", "GFLOP/s", "% peak", "fwd+∂x ms", "GFLOP/s", "% peak", "max |Δ|"
        );
    }
    for name in &args.models {
        let m = measure(&args.dir, name, args.reps).map_err(|e| format!("{name}: {e}"))?;
        let rate = |ms: f64, factor: f64| factor * m.flops / (ms / 1e3) / 1e9;
        let (rf, rg) = (rate(m.forward_ms, 1.0), rate(m.grad_ms, 2.0));
        let pct = |r: f64| peak.map_or("-".to_string(), |p| format!("{:.1}", 100.0 * r / p));
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "model": m.name, "batch": m.batch, "hw": m.hw, "forward_flops": m.flops,
                    "forward_ms": m.forward_ms, "grad_ms": m.grad_ms, "load_s": m.load_s,
                    "max_logit_diff": m.logit_diff, "peak_gflops": peak, "threads": rayon::current_num_threads(),
                    "load_average": load,
                })
            );
        } else {
            println!(
                "{:<17} {:>10} {:>8.2} {:>10.1} {:>9.1} {:>7} {:>12.1} {:>9.1} {:>7} {:>10.1e}",
                m.name,
                format!("{}×{}²", m.batch, m.hw),
                m.flops / 1e9,
                m.forward_ms,
                rf,
                pct(rf),
                m.grad_ms,
                rg,
                pct(rg),
                m.logit_diff
            );
        }
    }
    Ok(())
}
