//! The evaluation report: a plain serde data model that an evaluation fills in, and [`write()`]'s three files —
//! `report.json` (every figure), `report.md` (summary tables) and one self-contained `report.html` with SVG
//! plots (radar chart, robust accuracy against ε with confidence bands, the distribution of minimal
//! perturbation norms, the class-flip matrix, per-attack bars, the audit verdicts, example images).
//!
//! The figures in a report are described in `docs/report.md`.
//!
//! ```no_run
//! use armoury::report::{write, Interval, Report};
//! let report = Report::new("cnn on the Fashion-MNIST sample", "cnn", 1000, Interval::exact(0.886));
//! let files = write(&report, std::path::Path::new("out/report"))?;
//! println!("{}", files.html.display());
//! # Ok::<(), armoury::Error>(())
//! ```

mod chart;
mod evaluation;
mod header;
mod html;
mod line;
mod markdown;
mod plots;

pub use crate::eval::Verdict;
pub use crate::metrics::{Interval, Radar, RadarSeries};
pub use evaluation::{attack_summaries, to_report, EXAMPLES};
pub use header::Header;
pub use line::{json_line, protection_lines, summary_table};

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::{perturbation_image, png_grid_bytes, save_png_grid, GridRow};
use crate::io::write_atomic;
use crate::metrics::{AttackMetrics, DefenseMetrics};
use crate::{Error, Result, Tensor};

pub use chart::{LineChart, Series};

/// One attack of a cascade: robust accuracy after it (cumulative, in cascade order) and its cost.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AttackSummary {
    /// The attack's name.
    pub attack: String,
    /// Robust accuracy after this attack and every one before it in the cascade.
    pub robust_accuracy_after: Interval,
    /// Samples this attack broke (that the earlier ones had not).
    pub broken: usize,
    /// Mean gradient evaluations per attacked sample.
    pub mean_gradients: f64,
    /// Mean model queries per attacked sample.
    pub mean_queries: f64,
    /// Wall-clock time of this attack, in seconds.
    pub seconds: f64,
}

/// A security curve: accuracy against ε for one attack and norm.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EpsCurve {
    /// The attack's name.
    pub attack: String,
    /// The norm ε is measured in (`"linf"`, `"l2"`, …).
    pub norm: String,
    /// The budgets, ascending.
    pub eps: Vec<f64>,
    /// Accuracy at each budget, with its interval.
    pub accuracy: Vec<Interval>,
}

/// Minimal perturbation norms found by a minimum-norm attack, one per sample (`None`: not found).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NormDistribution {
    /// The attack's name.
    pub attack: String,
    /// The norm (`"linf"`, `"l2"`, …).
    pub norm: String,
    /// Per sample: the smallest adversarial perturbation's norm, or `None` when the attack found none.
    pub norms: Vec<Option<f64>>,
}

/// How often each true class was turned into each adversarial prediction.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ClassFlips {
    /// Class names, in class order.
    pub classes: Vec<String>,
    /// `counts[true][adversarial prediction]`.
    pub counts: Vec<Vec<u64>>,
}

/// An example adversarial image with its clean original.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExampleImage {
    /// `[C, H, W]`.
    pub shape: [usize; 3],
    /// The clean image, C·H·W values, channel-major.
    pub original: Vec<f32>,
    /// The adversarial image, same layout.
    pub adversarial: Vec<f32>,
    /// The true label.
    pub label: usize,
    /// The model's prediction on the adversarial image.
    pub adversarial_prediction: usize,
    /// The attack that produced it.
    pub attack: String,
}

/// A defense evaluated beside the undefended model: the defended model (a transform in front of it) attacked by
/// the cascade adaptively — through the defense's BPDA/EOT gradients — and MindArmour's `DefenseEvaluate`
/// metrics of the defended against the undefended model on the same inputs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DefenseReport {
    /// The defense's name with its settings, e.g. `MedianFilter(size=3)`.
    pub name: String,
    /// The defended model's clean accuracy.
    pub clean_accuracy: Interval,
    /// The defended model's robust accuracy under the adaptive cascade at `eps`.
    pub robust_accuracy: Interval,
    /// The budget of `robust_accuracy` and `per_attack`.
    pub eps: f64,
    /// The adaptive cascade on the defended model, attack by attack.
    pub per_attack: Vec<AttackSummary>,
    /// The defended model's accuracy on the undefended cascade's adversarial inputs (the non-adaptive attack:
    /// adversarial examples of the bare model, passed through the defense).
    pub transfer_accuracy: Interval,
    /// `DefenseEvaluate`'s CAV, CRR, CSR, CCV and COS, undefended against defended on `metrics_inputs`.
    pub metrics: DefenseMetrics,
    /// Which inputs `metrics` compares the two models on, in words.
    pub metrics_inputs: String,
}

/// A detector of adversarial examples fitted on clean images and evaluated against the cascade's adversarial
/// examples, with the robust accuracy of the protected pipeline (the model that rejects what the detector flags).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DetectorReport {
    /// The detector's name.
    pub name: String,
    /// The false-positive rate its threshold was fitted at, on clean training images.
    pub target_fpr: f64,
    /// The fitted threshold on the detector's score.
    pub threshold: f64,
    /// Clean training images the threshold was fitted on.
    pub fit_samples: usize,
    /// Clean test images scored (the negatives).
    pub clean_scored: usize,
    /// Adversarial examples scored (the positives): the cascade's, on the samples it broke.
    pub adversarial_scored: usize,
    /// Area under the ROC curve, clean against adversarial.
    pub auc: f64,
    /// True-positive rate at the threshold of 1% false positives on the clean test scores.
    pub tpr_at_1fpr: f64,
    /// The same at 5%.
    pub tpr_at_5fpr: f64,
    /// Clean accuracy of the protected pipeline (a rejected clean image counts as wrong).
    pub protected_clean_accuracy: f64,
    /// Robust accuracy of the protected pipeline on the cascade's adversarial inputs (non-adaptive: detected or
    /// correctly classified).
    pub protected_robust_non_adaptive: f64,
    /// The adaptive attack on the pipeline, with its settings.
    pub adaptive_attack: String,
    /// Robust accuracy of the protected pipeline under the adaptive attack; `None` when it was not run.
    pub protected_robust_adaptive: Option<f64>,
    /// The figure a defender can claim: the share of samples the pipeline gets right (or rejects) under *every*
    /// attack run — per sample, the non-adaptive and the adaptive attack together (never the smaller of the two
    /// means, which overstates it when they break different samples).
    #[serde(default)]
    pub protected_robust_accuracy: f64,
}

/// A stateful detector watching the model's query stream (Chen, Carlini & Wagner 2020): how soon it flags a
/// score-based attack, how many attacks it flags at all, and how often it flags benign streams.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StatefulReport {
    /// The detector's name with its settings (encoder, k).
    pub name: String,
    /// The fitted threshold on its score.
    pub threshold: f64,
    /// How the threshold was calibrated, in words.
    pub calibration: String,
    /// Benign streams of clean test images run from an empty history.
    pub benign_streams: usize,
    /// Queries per benign stream.
    pub benign_stream_len: usize,
    /// Benign streams with at least one flagged query (the false-positive rate is this over `benign_streams`).
    pub benign_flagged: usize,
    /// The attacks on the watched model: the non-adaptive one first, then the adaptive one.
    pub attacks: Vec<StatefulAttack>,
}

/// One query attack run sample by sample against the watched model, each from an empty history.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StatefulAttack {
    /// The attack with its settings.
    pub attack: String,
    /// Whether it is the adaptive attack (it knows the detector is there).
    pub adaptive: bool,
    /// Samples attacked (the correctly classified ones).
    pub attacked: usize,
    /// Attacked samples with at least one flagged query.
    pub flagged: usize,
    /// Mean number of queries up to and including the first flagged one, over the flagged samples (`None`: none
    /// flagged).
    pub mean_queries_to_flag: Option<f64>,
    /// Attacked samples the attack fooled the model on without any query being flagged: the attacker's wins.
    pub evaded: usize,
}

/// Everything an evaluation found, as plain data: what [`write()`] renders.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// The report's title.
    pub title: String,
    /// The model's name or file.
    pub model: String,
    /// Hash of the threat model the figures were computed under.
    pub threat_model_hash: String,
    /// What the figures measured: model and data hashes, kernel path, Armoury's version (`None`: not an
    /// evaluation's report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::eval::Identity>,
    /// What was measured, in a reader's terms: data, threat model (norm, ε, attacks and budgets), date, version
    /// (`None`: a report not made by an evaluation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<Header>,
    /// The classes' names, by index (empty: the indices themselves); the class-flip matrix and the examples use
    /// them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub class_names: Vec<String>,
    /// The evaluation's seed.
    pub seed: u64,
    /// Samples evaluated.
    pub samples: usize,
    /// Clean accuracy.
    pub clean_accuracy: Interval,
    /// Robust accuracy under the whole cascade.
    pub robust_accuracy: Interval,
    /// Each attack of the cascade, in order.
    pub per_attack: Vec<AttackSummary>,
    /// Security curves (accuracy against ε).
    pub curves: Vec<EpsCurve>,
    /// Minimal perturbation norms of the minimum-norm attacks.
    pub minimal_norms: Vec<NormDistribution>,
    /// The class-flip matrix, when recorded.
    pub class_flips: Option<ClassFlips>,
    /// MindArmour's attack metrics per attack.
    pub attack_metrics: Vec<(String, AttackMetrics)>,
    /// The radar chart's data, when given.
    pub radar: Option<Radar>,
    /// The gradient-masking audit.
    pub audit: Vec<Verdict>,
    /// Example adversarial images.
    pub examples: Vec<ExampleImage>,
    /// Defenses evaluated beside the model (may be empty).
    #[serde(default)]
    pub defenses: Vec<DefenseReport>,
    /// The radar chart of the defenses' metrics ([`crate::metrics::defense_radar`]); when `None` and there are
    /// defenses, [`write()`] derives it.
    #[serde(default)]
    pub defense_radar: Option<Radar>,
    /// Detectors evaluated against the cascade's adversarial examples (may be empty).
    #[serde(default)]
    pub detectors: Vec<DetectorReport>,
    /// Stateful detectors of query attacks (may be empty).
    #[serde(default)]
    pub stateful: Vec<StatefulReport>,
}

impl Report {
    /// A report with its headline figures only (robust accuracy = clean accuracy until attacks are added, no
    /// attacks, curves, metrics, audit or examples; empty threat-model hash, seed 0): fill in the rest by field.
    pub fn new(title: impl Into<String>, model: impl Into<String>, samples: usize, clean_accuracy: Interval) -> Report {
        Report {
            title: title.into(),
            model: model.into(),
            threat_model_hash: String::new(),
            identity: None,
            header: None,
            class_names: Vec::new(),
            seed: 0,
            samples,
            clean_accuracy,
            robust_accuracy: clean_accuracy,
            per_attack: Vec::new(),
            curves: Vec::new(),
            minimal_norms: Vec::new(),
            class_flips: None,
            attack_metrics: Vec::new(),
            radar: None,
            audit: Vec::new(),
            examples: Vec::new(),
            defenses: Vec::new(),
            defense_radar: None,
            detectors: Vec::new(),
            stateful: Vec::new(),
        }
    }
}

impl Report {
    /// Names the classes (by index) in the class-flip matrix and the examples.
    pub fn set_class_names(&mut self, names: Vec<String>) {
        if let Some(f) = &mut self.class_flips {
            for (c, name) in f.classes.iter_mut().enumerate() {
                if let Some(n) = names.get(c) {
                    n.clone_into(name);
                }
            }
        }
        self.class_names = names;
    }
}

/// The files [`write()`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportFiles {
    /// `report.json`: the [`Report`] itself (read it back with [`read`]).
    pub json: PathBuf,
    /// `report.md`: the summary tables.
    pub markdown: PathBuf,
    /// `report.html`: the self-contained page with every plot.
    pub html: PathBuf,
    /// `examples.png`: the grid of example images (also embedded in the page), when there are examples.
    pub examples_png: Option<PathBuf>,
}

/// At most this many example images go into the grid.
pub const MAX_EXAMPLES: usize = 16;

/// Writes `report.json`, `report.md`, `report.html` and, with examples, `examples.png` into `dir` (created if
/// missing), each atomically. The page embeds its SVG plots and the PNG grid, so it can be mailed or archived
/// alone; when `report.radar` is `None` and there are attack metrics, its radar chart is
/// [`crate::metrics::attack_radar`] of them.
///
/// Errors: an inconsistent report (a non-finite figure, an interval with lo > value or value > hi, lengths that
/// disagree, an invalid radar, an example whose values do not fit its shape — each error names the field), and
/// I/O failures.
pub fn write(report: &Report, dir: &Path) -> Result<ReportFiles> {
    validate(report)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let json = serde_json::to_string_pretty(report).map_err(|e| Error::invalid("report", e.to_string()))?;
    let files = ReportFiles {
        json: dir.join("report.json"),
        markdown: dir.join("report.md"),
        html: dir.join("report.html"),
        examples_png: (!report.examples.is_empty()).then(|| dir.join("examples.png")),
    };
    write_atomic(&files.json, json.as_bytes())?;
    write_atomic(&files.markdown, markdown::summary(report).as_bytes())?;
    if let Some(path) = &files.examples_png {
        example_grid(&report.examples, path)?;
    }
    write_atomic(&files.html, html::page(report)?.as_bytes())?;
    Ok(files)
}

/// Reads a `report.json` written by [`write()`].
pub fn read(path: &Path) -> Result<Report> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))
}

/// The PNG grid of up to [`MAX_EXAMPLES`] examples of the first example's shape: per row the original, the
/// adversarial image and the perturbation ([`example_pictures`]), labelled `true>prediction`.
fn example_grid(examples: &[ExampleImage], path: &Path) -> Result<()> {
    let shape = examples[0].shape;
    let mut rows = Vec::new();
    for e in examples.iter().filter(|e| e.shape == shape).take(MAX_EXAMPLES) {
        let (pictures, _) = example_pictures(e)?;
        rows.push(GridRow::new(format!("{}>{}", e.label, e.adversarial_prediction), pictures.to_vec()));
    }
    save_png_grid(path, &rows, example_scale(shape))
}

/// How many screen pixels an example's pixel takes (about 84 pixels a side).
fn example_scale(shape: [usize; 3]) -> u32 {
    (84 / shape[1].max(shape[2]).max(1)).clamp(1, 8) as u32
}

/// An example's three pictures as drawn — the clean and the adversarial image (as [0, 1] when both lie in it,
/// else rescaled jointly from their own min–max) and the perturbation scaled so that its largest change is black
/// or white (mid-grey = unchanged) — and that largest change |δ|∞ in input units.
fn example_pictures(e: &ExampleImage) -> Result<([Tensor; 3], f32)> {
    let all = e.original.iter().chain(&e.adversarial);
    let (lo, hi) = all.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let (offset, scale) =
        if lo >= 0.0 && hi <= 1.0 { (0.0, 1.0) } else { (lo, 1.0 / (hi - lo).max(f32::MIN_POSITIVE)) };
    let image = |v: &[f32]| Tensor::from_vec(v.iter().map(|x| (x - offset) * scale).collect(), &e.shape);
    let (clean, adv) = (image(&e.original)?, image(&e.adversarial)?);
    let largest = e.original.iter().zip(&e.adversarial).fold(0f32, |m, (a, b)| m.max((b - a).abs()));
    let magnify = if largest > 0.0 { 0.5 / (largest * scale) } else { 1.0 };
    let delta = perturbation_image(&clean, &adv, magnify)?;
    Ok(([clean, adv, delta], largest))
}

/// An example's three pictures as PNG bytes (for the page), with its largest change.
fn example_pngs(e: &ExampleImage) -> Result<([Vec<u8>; 3], f32)> {
    let (pictures, largest) = example_pictures(e)?;
    let scale = example_scale(e.shape);
    let png = |t: &Tensor| png_grid_bytes(&[GridRow::new("", vec![t.clone()])], scale);
    Ok(([png(&pictures[0])?, png(&pictures[1])?, png(&pictures[2])?], largest))
}

/// A class's name: `names[c]` when given, else its index.
fn class_name(names: &[String], c: usize) -> String {
    names.get(c).cloned().unwrap_or_else(|| c.to_string())
}

/// The cells of a per-attack table row after the attack's name: robust accuracy after it, broken, gradients and
/// queries per sample, seconds.
fn summary_cells(a: &AttackSummary) -> [String; 5] {
    [
        fmt_interval(&a.robust_accuracy_after),
        a.broken.to_string(),
        format!("{:.1}", a.mean_gradients),
        format!("{:.1}", a.mean_queries),
        format!("{:.2}", a.seconds),
    ]
}

/// The cells of an attack-metric table row after the attack's name: MR, ACAC, ACTC, relative L0, L2, L∞, ASS
/// (— without), NTE, successes/samples.
fn metric_cells(m: &AttackMetrics) -> [String; 9] {
    let f = |v: f64| format!("{v:.4}");
    [
        f(m.misclassification_rate),
        f(m.avg_confidence_adversarial),
        f(m.avg_confidence_true),
        f(m.avg_relative_l0),
        f(m.avg_relative_l2),
        f(m.avg_relative_linf),
        m.avg_ssim.map_or("—".to_string(), f),
        f(m.nte),
        format!("{}/{}", m.successes, m.samples),
    ]
}

/// One sentence per MindArmour attack metric, under its table (S: the samples the attack succeeded on).
const METRIC_SENTENCES: [(&str, &str); 8] = [
    ("MR", "misclassification rate: the share of attacked samples the attack succeeded on (higher = stronger attack)."),
    ("ACAC", "average confidence of the adversarial class on the successful samples (higher = more confident mistakes)."),
    ("ACTC", "average confidence left on the true class on the successful samples (lower = stronger attack)."),
    ("rel. L0", "mean ‖x_adv − x‖₀ / ‖x‖₀ over S: the share of input values changed, relative to the nonzero ones."),
    ("rel. L2", "mean ‖x_adv − x‖₂ / ‖x‖₂ over S: the perturbation's energy relative to the image's."),
    ("rel. L∞", "mean ‖x_adv − x‖∞ / ‖x‖∞ over S: the largest single change relative to the largest value."),
    ("ASS", "average structural similarity (SSIM) of x_adv to x over S (1 = indistinguishable; — for images under 11×11)."),
    ("NTE", "noise tolerance: mean gap between the adversarial class's probability and the next largest (higher = a more robust mistake)."),
];

/// The columns of the defenses' table.
const DEFENSE_COLUMNS: [&str; 10] = [
    "model",
    "ε",
    "clean accuracy",
    "robust accuracy (adaptive)",
    "transfer accuracy",
    "CAV",
    "CRR",
    "CSR",
    "CCV",
    "COS",
];

/// The defenses' table: the undefended model's row (its clean and robust accuracy), then each defense's, as
/// (name, cells after the name).
fn defense_rows(r: &Report) -> Vec<(String, Vec<String>)> {
    let Some(first) = r.defenses.first() else { return Vec::new() };
    let mut undefended = vec![first.eps.to_string(), fmt_interval(&r.clean_accuracy), fmt_interval(&r.robust_accuracy)];
    undefended.resize(DEFENSE_COLUMNS.len() - 1, String::new());
    let mut rows = vec![("undefended".to_string(), undefended)];
    rows.extend(r.defenses.iter().map(|d| (d.name.clone(), defense_cells(d).to_vec())));
    rows
}

/// The cells of a defense's table row after its name: ε, clean, adaptive robust and transfer accuracy, CAV, CRR,
/// CSR, CCV, COS (— when undefined).
fn defense_cells(d: &DefenseReport) -> [String; 9] {
    let f = |v: f64| format!("{v:.4}");
    let m = &d.metrics;
    [
        d.eps.to_string(),
        fmt_interval(&d.clean_accuracy),
        fmt_interval(&d.robust_accuracy),
        fmt_interval(&d.transfer_accuracy),
        f(m.cav),
        f(m.crr),
        f(m.csr),
        m.ccv.map_or("—".to_string(), f),
        m.cos.map_or("—".to_string(), f),
    ]
}

/// The cells of a detector's table row after its name: threshold (FPR), scored, AUC, TPR at 1% and 5%,
/// protected clean, non-adaptive, adaptive (— when not run) and worst-case robust accuracy.
fn detector_cells(d: &DetectorReport) -> [String; 9] {
    let f = |v: f64| format!("{v:.4}");
    [
        // Rounded: an FPR that went through f32 would print as 0.9999999776482582%.
        format!("{:.4} ({}% on {})", d.threshold, (d.target_fpr * 1e6).round() / 1e4, d.fit_samples),
        format!("{} / {}", d.clean_scored, d.adversarial_scored),
        f(d.auc),
        f(d.tpr_at_1fpr),
        f(d.tpr_at_5fpr),
        f(d.protected_clean_accuracy),
        f(d.protected_robust_non_adaptive),
        d.protected_robust_adaptive.map_or("not run".to_string(), f),
        f(d.protected_robust_accuracy),
    ]
}

/// The columns of the stateful detectors' table.
const STATEFUL_COLUMNS: [&str; 9] = [
    "detector",
    "attack",
    "attacked",
    "flagged",
    "share flagged",
    "mean queries to the first flag",
    "fooled unflagged",
    "benign streams flagged",
    "threshold",
];

/// The stateful detectors' table rows: one per attack, every cell of [`STATEFUL_COLUMNS`].
fn stateful_rows(r: &Report) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for d in &r.stateful {
        let fpr = d.benign_flagged as f64 / d.benign_streams.max(1) as f64;
        for a in &d.attacks {
            rows.push(vec![
                d.name.clone(),
                format!("{}{}", a.attack, if a.adaptive { " (adaptive)" } else { "" }),
                a.attacked.to_string(),
                a.flagged.to_string(),
                format!("{:.4}", a.flagged as f64 / a.attacked.max(1) as f64),
                a.mean_queries_to_flag.map_or("—".to_string(), |q| format!("{q:.1}")),
                a.evaded.to_string(),
                format!("{fpr:.4} ({} of {} streams of {})", d.benign_flagged, d.benign_streams, d.benign_stream_len),
                format!("{:.4} ({})", d.threshold, d.calibration),
            ]);
        }
    }
    rows
}

/// `value [lo, hi]` with 4 decimals.
fn fmt_interval(i: &Interval) -> String {
    if i.lo == i.hi {
        format!("{:.4}", i.value)
    } else {
        format!("{:.4} [{:.4}, {:.4}]", i.value, i.lo, i.hi)
    }
}

/// The distinct norms, in order of first appearance.
fn norms_in<'a>(norms: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in norms {
        if !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    }
    out
}

/// Escapes `&`, `<`, `>`, `"` and `'` for HTML text and attribute values.
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An interval's figures are finite and ordered; the error names `field`.
fn check_interval(field: &dyn Fn() -> String, i: &Interval) -> Result<()> {
    if [i.value, i.lo, i.hi].iter().all(|v| v.is_finite()) && i.lo <= i.value && i.value <= i.hi {
        Ok(())
    } else {
        Err(Error::invalid(
            "report",
            format!("{}: interval {} not finite or not within [{}, {}]", field(), i.value, i.lo, i.hi),
        ))
    }
}

/// The defenses' and detectors' figures are finite, their intervals ordered and their rates in [0, 1].
fn validate_defenses(r: &Report) -> Result<()> {
    for (k, d) in r.defenses.iter().enumerate() {
        for (name, i) in [
            ("clean_accuracy", &d.clean_accuracy),
            ("robust_accuracy", &d.robust_accuracy),
            ("transfer_accuracy", &d.transfer_accuracy),
        ] {
            check_interval(&|| format!("defenses[{k}].{name}"), i)?;
        }
        for (j, a) in d.per_attack.iter().enumerate() {
            check_interval(&|| format!("defenses[{k}].per_attack[{j}]"), &a.robust_accuracy_after)?;
        }
        let m = &d.metrics;
        let values = [d.eps, m.cav, m.crr, m.csr, m.ccv.unwrap_or(0.0), m.cos.unwrap_or(0.0)];
        if values.iter().any(|v| !v.is_finite()) {
            return Err(Error::invalid("report", format!("defenses[{k}].metrics: not finite")));
        }
    }
    for (k, d) in r.detectors.iter().enumerate() {
        let rates = [d.target_fpr, d.auc, d.tpr_at_1fpr, d.tpr_at_5fpr, d.protected_clean_accuracy];
        let more =
            [d.protected_robust_non_adaptive, d.protected_robust_adaptive.unwrap_or(0.0), d.protected_robust_accuracy];
        if !d.threshold.is_finite() || rates.iter().chain(&more).any(|v| !(0.0..=1.0).contains(v)) {
            return Err(Error::invalid(
                "report",
                format!("detectors[{k}]: a rate outside [0, 1] or a non-finite threshold"),
            ));
        }
    }
    for (k, d) in r.stateful.iter().enumerate() {
        let bad_attack = d.attacks.iter().any(|a| {
            a.flagged > a.attacked
                || a.evaded > a.attacked
                || a.mean_queries_to_flag.is_some_and(|q| q.is_nan() || q < 1.0)
        });
        if !d.threshold.is_finite() || d.benign_flagged > d.benign_streams || bad_attack {
            return Err(Error::invalid(
                "report",
                format!("stateful[{k}]: more flagged than run, a mean below one query or a non-finite threshold"),
            ));
        }
    }
    Ok(())
}

/// Checks that every figure is finite, every interval ordered, and every length consistent.
fn validate(r: &Report) -> Result<()> {
    let bad = |field: String, msg: &str| Err(Error::invalid("report", format!("{field}: {msg}")));
    let finite = |field: &dyn Fn() -> String, v: f64| if v.is_finite() { Ok(()) } else { bad(field(), "not finite") };
    check_interval(&|| "clean_accuracy".into(), &r.clean_accuracy)?;
    check_interval(&|| "robust_accuracy".into(), &r.robust_accuracy)?;
    for (k, a) in r.per_attack.iter().enumerate() {
        check_interval(&|| format!("per_attack[{k}].robust_accuracy_after"), &a.robust_accuracy_after)?;
        for (name, v) in
            [("mean_gradients", a.mean_gradients), ("mean_queries", a.mean_queries), ("seconds", a.seconds)]
        {
            finite(&|| format!("per_attack[{k}].{name}"), v)?;
        }
    }
    for (k, c) in r.curves.iter().enumerate() {
        if c.eps.len() != c.accuracy.len() {
            return bad(
                format!("curves[{k}]"),
                &format!("{} ε values for {} accuracies", c.eps.len(), c.accuracy.len()),
            );
        }
        for (j, (e, a)) in c.eps.iter().zip(&c.accuracy).enumerate() {
            finite(&|| format!("curves[{k}].eps[{j}]"), *e)?;
            check_interval(&|| format!("curves[{k}].accuracy[{j}]"), a)?;
        }
    }
    for (k, d) in r.minimal_norms.iter().enumerate() {
        if let Some(j) = d.norms.iter().position(|v| v.is_some_and(|v| !(v.is_finite() && v >= 0.0))) {
            return bad(format!("minimal_norms[{k}].norms[{j}]"), "not a finite non-negative norm");
        }
    }
    if let Some(f) = &r.class_flips {
        let k = f.classes.len();
        if f.counts.len() != k || f.counts.iter().any(|row| row.len() != k) {
            return bad("class_flips.counts".into(), &format!("not a {k}×{k} matrix for {k} classes"));
        }
    }
    for (name, m) in &r.attack_metrics {
        let values = [m.misclassification_rate, m.avg_confidence_adversarial, m.avg_confidence_true, m.avg_relative_l0];
        let more = [m.avg_relative_l2, m.avg_relative_linf, m.nte, m.data_range, m.avg_ssim.unwrap_or(0.0)];
        for v in values.into_iter().chain(more) {
            finite(&|| format!("attack_metrics['{name}']"), v)?;
        }
    }
    for radar in r.radar.iter().chain(&r.defense_radar) {
        crate::metrics::radar(radar.axes.clone(), radar.series.clone())?;
    }
    validate_defenses(r)?;
    for (k, e) in r.examples.iter().enumerate() {
        let [c, h, w] = e.shape;
        if !(c == 1 || c == 3) || h == 0 || w == 0 {
            return bad(format!("examples[{k}].shape"), &format!("{:?} is not a [1 or 3, H, W] image", e.shape));
        }
        if e.original.len() != c * h * w || e.adversarial.len() != c * h * w {
            return bad(
                format!("examples[{k}]"),
                &format!("{} and {} values for shape {:?}", e.original.len(), e.adversarial.len(), e.shape),
            );
        }
        if e.original.iter().chain(&e.adversarial).any(|v| !v.is_finite()) {
            return bad(format!("examples[{k}]"), "non-finite pixel");
        }
    }
    Ok(())
}
