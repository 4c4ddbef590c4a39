//! Detect adversarial examples, and evaluate the detector honestly.
//!
//! `cargo run --release --example detect -- --detector magnet|squeeze|region|ensemble|lid|mahalanobis|similarity
//! --attack fgsm|pgd|cw|jsma|hsj|nes|square --eps 0.1 [--adaptive]` (`--help` lists every flag)
//!
//! Fits the detector on clean training images (thresholds at 1% FPR; MagNet's auto-encoders trained here; LID's
//! and Mahalanobis' logistic combiners on attacked training images), attacks the first N test images (PGD-40 of
//! step 0.01 for `pgd`), and reports ROC AUC, TPR at fitted 1% / 5% FPR, the protected pipeline's clean accuracy
//! and its robust accuracy (detected or correct) under the non-adaptive attack and, with `--adaptive`, under PGD
//! on the detector in front of the model (loss = classifier loss − λ·detector score inside the rejection region;
//! BPDA through squeezers, EOT through the region classifier's noise). `similarity` runs query attacks (one
//! image at a time, 200 queries) against the model watched by the stateful detector instead, and benign streams
//! of 100 shuffled test images; it encodes the activation `--tap NAME` (default: the input of the model's head,
//! `armoury_defenses::detectors::default_tap` — `fc1_relu` for the cnn, `/Relu_2_output_0` for cnn.onnx).
//! Writes an SVG ROC curve and ends with one JSON line.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/load.rs"]
mod load;
#[path = "support/progress.rs"]
mod progress;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use armoury::data::TrainTest;
use armoury::load as model;
use armoury::report::{LineChart, Series};
use armoury::{Classifier, Detector, Goal, Guarded, Tensor};
use armoury_attacks::registry::{self, AttackParams};
use armoury_defenses::detectors::{
    self as magnet, detection_metrics, gaussian_encodings, measure_index, protected_correct, AdaptivePgd, IndexConfig,
    IndexMeasurement, RegionClassifier,
};
use armoury_defenses::eval::stateful;
use armoury_defenses::registry as detectors;
use clap::Parser;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Detect adversarial examples, and evaluate the detector honestly: ROC AUC, TPR at fitted 1% / 5% FPR, the
/// protected pipeline's accuracy under the non-adaptive attack and, with --adaptive, under PGD on the detector in
/// front of the model; an SVG ROC curve and one JSON line. The model defaults to the cnn with
/// tests/fixtures/cnn.safetensors when that file exists.
#[derive(Parser)]
#[command(name = "detect", after_help = AFTER_HELP)]
struct Args {
    #[command(flatten)]
    m: args::ModelArgs,
    /// The detector: magnet, squeeze, region, ensemble, lid, mahalanobis or similarity
    #[arg(long, value_name = "NAME", default_value = "magnet", value_parser = args::lower)]
    detector: String,
    /// The attack whose examples are detected: fgsm, pgd (PGD-40 of step 0.01), cw, jsma, hsj, nes or square
    #[arg(long, value_name = "NAME", default_value = "pgd", value_parser = args::lower)]
    attack: String,
    /// The attack's budget ε
    #[arg(long, value_name = "E", default_value_t = 0.1)]
    eps: f32,
    /// Also attack the detector and the model together (PGD on classifier loss − λ·detector score)
    #[arg(long)]
    adaptive: bool,
    /// λ, the adaptive attack's weight of the detector score
    #[arg(long, value_name = "L", default_value_t = 1.0)]
    lambda: f32,
    /// Attack the first N test images
    #[arg(long, value_name = "N", default_value_t = 1000)]
    limit: usize,
    /// Fit the detector on N clean training images
    #[arg(long, value_name = "N", default_value_t = 1000)]
    fit: usize,
    /// MagNet: the auto-encoders' learning rate
    #[arg(long, value_name = "LR", default_value_t = magnet::MagnetConfig::default().lr)]
    ae_lr: f32,
    /// MagNet: auto-encoder I trained on N images for E epochs (MagnetConfig's default)
    #[arg(long, value_name = "N,E", default_value = "20000,10", value_parser = images_epochs)]
    ae1: (usize, usize),
    /// MagNet: auto-encoder II trained on N images for E epochs (MagnetConfig's default)
    #[arg(long, value_name = "N,E", default_value = "60000,20", value_parser = images_epochs)]
    ae2: (usize, usize),
    /// MagNet: the detector parts, comma-separated (MagnetConfig's default)
    #[arg(long, value_name = "P,…", default_value = "l1-ii,jsd10-ii,jsd40-ii", value_parser = args::list)]
    magnet_parts: Vec<String>,
    /// similarity: the false-positive rate its threshold is fitted at
    #[arg(long, value_name = "F", default_value_t = 0.005)]
    sim_fpr: f32,
    /// similarity: benign query streams
    #[arg(long, value_name = "STREAMS", default_value_t = 500)]
    benign: usize,
    /// similarity: the k nearest stored queries it compares with
    #[arg(long, value_name = "K", default_value_t = 20)]
    k: usize,
    /// similarity: the activation it encodes [default: the input of the model's head]
    #[arg(long, value_name = "NAME")]
    tap: Option<String>,
    /// lid, mahalanobis: the layers whose activations they read, comma-separated
    #[arg(long, value_name = "L,…", default_value = "conv1_relu,conv2_relu,fc1_relu,fc2", value_parser = args::list)]
    layers: Vec<String>,
    /// Seed of every random draw
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Directory of the ROC curve and MagNet's cached auto-encoders
    #[arg(long, value_name = "DIR", default_value = "out")]
    out: PathBuf,
}

const AFTER_HELP: &str = "\
Examples:
  cargo run --release --example detect -- --detector magnet --attack pgd --eps 0.1 --limit 500 --adaptive
  cargo run --release --example detect -- --detector similarity --attack hsj --limit 100";

fn images_epochs(s: &str) -> Result<(usize, usize), String> {
    magnet::images_epochs(s).map_err(|e| e.to_string())
}

/// The flags, with the fixture cnn's weights as the default when the file is there.
fn parse() -> Res<Args> {
    let mut a = Args::parse();
    let fixture = PathBuf::from("tests/fixtures/cnn.safetensors");
    if a.m.weights.is_none() && fixture.exists() {
        a.m.weights = Some(fixture);
    }
    Ok(a)
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn attack_params(args: &Args) -> AttackParams {
    let mut params = AttackParams { eps: args.eps, ..AttackParams::default() };
    match args.attack.as_str() {
        "pgd" => {
            params.steps = Some(40);
            params.step_size = Some(0.01);
        }
        "hsj" | "nes" | "square" => params.queries = Some(200),
        _ => {}
    }
    params
}

/// Adversarial inputs of the attack against the bare classifier.
fn attack(args: &Args, clf: &dyn Classifier, x: &Tensor, y: &[usize], seed: u64) -> Res<Tensor> {
    let attack = registry::by_name(&args.attack, &attack_params(args))?;
    // JSMA is targeted by definition: a random target other than the label.
    let goal = if args.attack == "jsma" { Goal::RandomTarget { seed } } else { Goal::Untargeted };
    let mut parts = Vec::new();
    let n = y.len();
    for s in (0..n).step_by(250) {
        let e = (s + 250).min(n);
        parts.push(attack.run(clf, &x.narrow(0, s, e - s)?, &y[s..e], &goal, seed)?.adversarial);
    }
    Ok(Tensor::concat(&parts, 0)?)
}

fn share(ok: &[bool]) -> f64 {
    ok.iter().filter(|&&c| c).count() as f64 / ok.len().max(1) as f64
}

fn accuracy(pred: &[usize], y: &[usize]) -> f64 {
    pred.iter().zip(y).filter(|(p, l)| p == l).count() as f64 / y.len().max(1) as f64
}

/// `magnet` (the pipeline of the --magnet-parts detectors with auto-encoder I as the reformer) or one part
/// (`magnet-l2-i`, `magnet-l1-ii`, `magnet-jsd10-ii`, …), also with the reformer; auto-encoders cached in --out.
fn magnet_config(args: &Args) -> magnet::MagnetConfig {
    let parts = match args.detector.strip_prefix("magnet-") {
        Some(one) => vec![one.to_string()],
        None => args.magnet_parts.clone(),
    };
    magnet::MagnetConfig {
        ae1: args.ae1,
        ae2: args.ae2,
        lr: args.ae_lr,
        parts,
        seed: args.seed,
        cache: args.out.clone(),
    }
}

/// The detector, and the fitted radius when it is the region classifier.
fn build(args: &Args, clf: &Arc<dyn Classifier>, set: &TrainTest) -> Res<(Box<dyn Detector>, Option<f32>)> {
    if args.detector == "region" {
        let r = detectors::region(clf, set, args.seed)?;
        let radius = r.radius();
        println!("region radius fitted: {radius}");
        return Ok((Box::new(r), Some(radius)));
    }
    let layers: Vec<&str> = args.layers.iter().map(String::as_str).collect();
    // Supervised combiners are trained on the attack being evaluated.
    let attack = |x: &Tensor, y: &[usize]| {
        attack(args, clf.as_ref(), x, y, args.seed + 1).map_err(|e| armoury::Error::invalid("attack", e.to_string()))
    };
    let magnet_progress = |p: &magnet::MagnetProgress<'_>| {
        if !matches!(p, magnet::MagnetProgress::Step(_)) {
            println!("{p}");
        }
    };
    let b = detectors::DetectorBuild {
        model: clf,
        set,
        fit: args.fit,
        layers: &layers,
        attack: &attack,
        magnet: magnet_config(args),
        magnet_progress: &magnet_progress,
    };
    Ok((detectors::detector(&b, &args.detector)?, None))
}

fn run() -> Res<()> {
    let args = parse()?;
    let set = model::load_data(args.m.data.as_deref())?;
    println!("data: {} ({} test images; {})", set.name, set.test.len(), set.source);
    let (_, clf) = load::load_model(&args.m.model, args.m.weights.as_deref(), args.m.bounds, &set, args.seed)?;
    let clf: Arc<dyn Classifier> = Arc::new(clf);
    if args.detector == "similarity" {
        return similarity(&args, &clf, &set);
    }
    evaluate(&args, &clf, &set)
}

fn median_spread(scores: &[f32], tau: f32) -> f32 {
    let mut s = scores.to_vec();
    s.sort_by(f32::total_cmp);
    let spread = tau - s[s.len() / 2];
    if spread.is_finite() && spread > 0.0 {
        spread
    } else {
        1.0
    }
}

fn evaluate(args: &Args, clf: &Arc<dyn Classifier>, set: &TrainTest) -> Res<()> {
    let start = Instant::now();
    let n = args.limit.min(set.test.len());
    let (x, y) = set.test.batch(0..n)?;
    let (mut detector, radius) = build(args, clf, set)?;
    let (fit_x, _) = set.train.batch(0..args.fit.min(set.train.len() / 2))?;
    let t = Instant::now();
    let tau = detector.fit(&fit_x, 0.01)?;
    let fit_rate = fit_x.shape()[0] as f64 / t.elapsed().as_secs_f64();
    let clean_scores = detector.score(&fit_x)?;
    let spread = median_spread(&clean_scores, tau);
    println!("detector {}: threshold {tau} at 1% FPR on {} clean training images", detector.name(), fit_x.shape()[0]);

    let undefended_clean = accuracy(&clf.predict(&x)?, &y);
    let adv = attack(args, clf.as_ref(), &x, &y, args.seed)?;
    let adv_pred = clf.predict(&adv)?;
    let undefended_robust = accuracy(&adv_pred, &y);
    // Detection is measured on the adversarial examples that fool the classifier, against all clean images.
    let fooled: Vec<usize> = (0..n).filter(|&i| adv_pred[i] != y[i]).collect();
    let t = Instant::now();
    let metrics = detection_metrics(detector.as_ref(), &x, &adv.index_select(0, &fooled)?)?;
    let score_rate = (n + fooled.len()) as f64 / t.elapsed().as_secs_f64();

    let detector: Arc<dyn Detector> = Arc::from(detector);
    let guarded = Guarded::new(clf.clone(), detector.clone())?.with_scale(1.0 / spread)?;
    // The region classifier is its own protected pipeline (it classifies; it does not reject).
    let region_clf = radius.map(|r| RegionClassifier::new(clf.clone(), r, 100, args.seed)).transpose()?;
    let pipeline: &dyn Classifier = match &region_clf {
        Some(r) => r,
        None => &guarded,
    };
    let protected_clean = share(&protected_correct(pipeline, &x, &y, false)?);
    let non_adaptive_ok = protected_correct(pipeline, &adv, &y, true)?;
    let non_adaptive = share(&non_adaptive_ok);
    let adaptive = if args.adaptive {
        let pgd = AdaptivePgd { eps: args.eps, steps: 40, step_size: 0.01, lambda: args.lambda, random_start: true };
        let adv_a = match &region_clf {
            Some(r) => {
                // The attacker votes over 10 copies and differentiates 8 (EOT); the defense answers with its 100.
                let attacker =
                    RegionClassifier::new(clf.clone(), r.radius(), 10, args.seed + 1)?.with_eot_samples(8)?;
                pgd.run(&attacker, &x, &y, args.seed)?
            }
            None => pgd.run(&guarded, &x, &y, args.seed)?,
        };
        Some(protected_correct(pipeline, &adv_a, &y, true)?)
    } else {
        None
    };
    // The figure a defender can claim: per sample, right or rejecting under both attacks.
    let worst = match &adaptive {
        Some(a) => share(&armoury_defenses::eval::survived_all(&[&non_adaptive_ok, a])?),
        None => non_adaptive,
    };
    let adaptive = adaptive.as_deref().map(share);
    let seconds = start.elapsed().as_secs_f64();
    report(
        args,
        detector.name(),
        &metrics,
        (undefended_clean, undefended_robust, protected_clean, non_adaptive, adaptive, worst),
        (fit_rate, score_rate),
        fooled.len(),
        seconds,
    )
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    name: &str,
    m: &armoury_defenses::detectors::DetectionMetrics,
    acc: (f64, f64, f64, f64, Option<f64>, f64),
    rates: (f64, f64),
    fooled: usize,
    seconds: f64,
) -> Res<()> {
    let (clean, robust, p_clean, p_robust, p_adaptive, p_worst) = acc;
    println!("\n{:<44} {:>10}", format!("{name} vs {} (ε = {})", args.attack, args.eps), "value");
    let rows = [
        ("undefended clean accuracy", format!("{clean:.4}")),
        ("undefended robust accuracy", format!("{robust:.4}")),
        ("adversarial examples scored (fooling the model)", format!("{fooled}")),
        ("ROC AUC", format!("{:.4}", m.auc)),
        ("TPR at 1% FPR", format!("{:.4}", m.tpr_at_1fpr)),
        ("TPR at 5% FPR", format!("{:.4}", m.tpr_at_5fpr)),
        ("protected clean accuracy", format!("{p_clean:.4}")),
        ("protected robust accuracy, non-adaptive", format!("{p_robust:.4}")),
        ("protected robust accuracy, adaptive", p_adaptive.map_or("not run".into(), |v| format!("{v:.4}"))),
        ("fit images/s", format!("{:.0}", rates.0)),
        ("score images/s", format!("{:.0}", rates.1)),
        ("seconds", format!("{seconds:.1}")),
    ];
    for (k, v) in rows {
        println!("{k:<48} {v:>10}");
    }
    std::fs::create_dir_all(&args.out)?;
    let svg = args.out.join(format!("detect-{}-{}.svg", args.detector, args.attack));
    let title = format!("{name} vs {} (ε = {}): AUC {:.3}", args.attack, args.eps, m.auc);
    let roc = LineChart {
        title,
        x_label: "false-positive rate".into(),
        y_label: "true-positive rate".into(),
        x_range: Some((0.0, 1.0)),
        y_range: Some((0.0, 1.0)),
        series: vec![Series { name: name.to_string(), points: m.roc.clone() }],
        diagonal: true,
    };
    roc.write(&svg)?;
    println!("ROC curve: {}", svg.display());
    let round = |v: f64| (v * 1e4).round() / 1e4;
    let line = serde_json::json!({
        "example": "detect",
        "detector": args.detector,
        "attack": args.attack,
        "eps": args.eps.to_string().parse::<f64>().unwrap_or(f64::NAN),
        "auc": round(m.auc),
        "tpr_at_1fpr": round(m.tpr_at_1fpr),
        "tpr_at_5fpr": round(m.tpr_at_5fpr),
        "protected_clean_accuracy": round(p_clean),
        // With --adaptive: per sample, right or rejecting under both attacks, the figure a defender can claim.
        "protected_robust_accuracy": round(p_worst),
        "adaptive": args.adaptive,
        "seconds": (seconds * 1e3).round() / 1e3,
    });
    println!("{line}");
    Ok(())
}

fn similarity(args: &Args, clf: &Arc<dyn Classifier>, set: &TrainTest) -> Res<()> {
    let start = Instant::now();
    let t = Instant::now();
    let tap = armoury_defenses::detectors::choose_tap(clf.as_ref(), args.tap.as_deref())?;
    println!("similarity: encoding the activation '{tap}'");
    let (mut d, tau, calib) = stateful::calibrated(clf, &set.train, &tap, args.k, args.sim_fpr, args.seed)?;
    let fit_rate = (calib * stateful::STREAM) as f64 / t.elapsed().as_secs_f64();
    println!(
        "similarity: threshold {tau} (mean {}-NN distance {:.3}) at {} of {calib} benign streams of {} training images",
        args.k,
        -tau,
        args.sim_fpr,
        stateful::STREAM
    );
    let (flagged, benign) = stateful::benign_flagged(&mut d, &set.test, args.benign, args.seed)?;
    let benign_rate = flagged as f64 / benign as f64;
    // Query attacks, one image at a time, against the watched model; only the images the model classifies
    // correctly are attacked (an attack stops at once on the others).
    let n = args.limit.min(set.test.len());
    let (x, y) = set.test.batch(0..n)?;
    let attack = registry::by_name(&args.attack, &attack_params(args))?;
    let t = Instant::now();
    let (results, _) = stateful::watch(clf, d, attack.as_ref(), (&x, &y), None, &|i| args.seed + i as u64)?;
    let attacked = results.iter().filter(|r| r.attacked).count();
    let firsts: Vec<usize> = results.iter().filter_map(|r| r.first_flag).collect();
    let (detected, first_sum) = (firsts.len(), firsts.iter().map(|f| f + 1).sum::<usize>());
    let within = firsts.iter().filter(|&&f| f < 100).count();
    let attack_seconds = t.elapsed().as_secs_f64();
    let costs = query_costs(args.seed)?;
    let within_rate = within as f64 / attacked.max(1) as f64;
    let mean_q = if detected > 0 { first_sum as f64 / detected as f64 } else { f64::NAN };
    let seconds = start.elapsed().as_secs_f64();
    println!("\n{:<44} {:>10}", format!("similarity vs {} ({attacked} attacked images)", args.attack), "value");
    let rows = [
        ("detected within the first 100 queries", format!("{within_rate:.4}")),
        ("detected at all (200 queries)", format!("{:.4}", detected as f64 / attacked.max(1) as f64)),
        ("mean queries to detection", format!("{mean_q:.1}")),
        ("benign streams flagged", format!("{benign_rate:.4} of {benign}")),
        ("calibration queries/s", format!("{fit_rate:.0}")),
        ("attack seconds", format!("{attack_seconds:.1}")),
        (
            "µs/query at history 1k / 10k / 100k",
            costs.iter().map(|c| format!("{:.1}", c.micros_per_query)).collect::<Vec<_>>().join(" / "),
        ),
        (
            "index recall of the 20 nearest at 1k / 10k / 100k",
            costs.iter().map(|c| format!("{:.2}", c.recall)).collect::<Vec<_>>().join(" / "),
        ),
        ("seconds", format!("{seconds:.1}")),
    ];
    for (k, v) in rows {
        println!("{k:<48} {v:>10}");
    }
    let round = |v: f64| (v * 1e4).round() / 1e4;
    let line = serde_json::json!({
        "example": "detect",
        "detector": "similarity",
        "attack": args.attack,
        "eps": args.eps.to_string().parse::<f64>().unwrap_or(f64::NAN),
        "detected_within_100": round(within_rate),
        "benign_flag_rate": round(benign_rate),
        "mean_queries_to_detection": if mean_q.is_finite() { serde_json::json!((mean_q * 10.0).round() / 10.0) } else { serde_json::Value::Null },
        "adaptive": false,
        "seconds": (seconds * 1e3).round() / 1e3,
    });
    println!("{line}");
    Ok(())
}

/// The stateful index's cost per query (score + insert of a 128-value encoding) once its history holds 1k,
/// 10k and 100k encodings (random Gaussian ones), in µs, and its recall against the exact 20 nearest
/// (`cargo bench --bench similarity` has the same on the cnn's encodings of Fashion-MNIST).
fn query_costs(seed: u64) -> Res<Vec<IndexMeasurement>> {
    let history = gaussian_encodings(100_000, 128, seed);
    let probes = gaussian_encodings(1050, 128, seed + 1);
    Ok(measure_index(20, IndexConfig::default(), &history, &probes, &[1_000, 10_000, 100_000])?)
}
