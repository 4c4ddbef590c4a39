//! `armoury::report`: the data model's JSON round trip, the Markdown tables, the HTML page's plots, validation,
//! and the page opened in headless Chromium (plots rendered, no console errors, a screenshot saved as
//! `target/test-artifacts/report.png`).
//!
//! The browser test skips with a notice when `chromium` is not installed, except under CI (`CI` set), where a
//! missing browser fails it: `.ci/run` installs Debian's `chromium`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use armoury::metrics::{attack_metrics, wilson, Z95};
use armoury::report::{
    read, write, AttackSummary, ClassFlips, DefenseReport, DetectorReport, EpsCurve, ExampleImage, Header, Interval,
    NormDistribution, Radar, RadarSeries, Report, StatefulAttack, StatefulReport, Verdict,
};
use armoury::Tensor;
use ndarray::Array2;

const CLASSES: [&str; 10] =
    ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"];

fn ci(k: usize, n: usize) -> Interval {
    wilson(k, n, Z95).unwrap()
}

/// A report with every section filled: four cascade attacks, two L∞ curves and one L2 curve, two minimal-norm
/// distributions, a 10-class flip matrix, attack metrics of two attacks, the audit and four example images from
/// the embedded sample, two defenses (DefenseEvaluate's metrics of the golden probabilities) and a detector.
fn synthetic_report() -> Report {
    let n = 200;
    let mut r = Report::new("Synthetic evaluation <test>", "cnn (reference weights)", n, ci(177, n));
    r.threat_model_hash = "0123abcd0123abcd0123abcd".into();
    r.seed = 7;
    r.header = Some(Header {
        data: "fashion-mnist".into(),
        threat_model: "autoattack-standard-linf".into(),
        norm: "linf".into(),
        eps: vec![0.1],
        attacks: vec![
            "apgd-ce(steps=100)".into(),
            "apgd-t(steps=100, targets=9)".into(),
            "square(queries=5000)".into(),
        ],
        minimal: vec!["deepfool".into()],
        date: "2026-12-05T07:00:00Z".into(),
        version: "0.1.0".into(),
    });
    r.class_names = CLASSES.iter().map(|c| c.to_string()).collect();
    r.robust_accuracy = ci(21, n);
    let cascade = [("apgd-ce", 40, 137), ("apgd-t", 26, 14), ("fab-t", 22, 4), ("square", 21, 1)];
    r.per_attack = cascade
        .iter()
        .map(|&(name, left, broken)| AttackSummary {
            attack: name.into(),
            robust_accuracy_after: ci(left, n),
            broken,
            mean_gradients: if name == "square" { 0.0 } else { 100.0 },
            mean_queries: if name == "square" { 4800.0 } else { 101.0 },
            seconds: 1.5,
        })
        .collect();
    let eps = vec![0.0, 0.02, 0.04, 0.06, 0.08, 0.1];
    let curve = |attack: &str, norm: &str, eps: Vec<f64>, robust: &[usize]| EpsCurve {
        attack: attack.into(),
        norm: norm.into(),
        eps,
        accuracy: robust.iter().map(|&k| ci(k, n)).collect(),
    };
    r.curves = vec![
        curve("pgd-40", "linf", eps.clone(), &[177, 150, 101, 62, 40, 30]),
        curve("fgsm", "linf", eps, &[177, 160, 130, 105, 88, 70]),
        curve("pgd-l2", "l2", vec![0.0, 0.5, 1.0, 1.5], &[177, 90, 30, 8]),
    ];
    let norms = |scale: f64, missing: usize| -> Vec<Option<f64>> {
        (0..n).map(|i| if i % 50 < missing { None } else { Some(scale * ((i * 37) % 101) as f64 / 100.0) }).collect()
    };
    r.minimal_norms = vec![
        NormDistribution { attack: "deepfool".into(), norm: "l2".into(), norms: norms(1.2, 3) },
        NormDistribution { attack: "cw-l2".into(), norm: "l2".into(), norms: norms(0.9, 1) },
    ];
    let counts =
        (0..10).map(|t| (0..10).map(|p| if t == p { 0 } else { ((t * 7 + p * 3) % 11) as u64 }).collect()).collect();
    r.class_flips = Some(ClassFlips { classes: CLASSES.iter().map(|c| c.to_string()).collect(), counts });
    r.attack_metrics = synthetic_attack_metrics();
    r.audit = vec![
        Verdict {
            check: "iterative ≥ single-step".into(), pass: true, explanation: "PGD 0.105 ≤ FGSM 0.35".into()
        },
        Verdict { check: "monotone in ε".into(), pass: true, explanation: "non-increasing on 6 budgets".into() },
        Verdict {
            check: "unbounded ε → 0".into(), pass: false, explanation: "0.12 > 0.01 at ε = 1 <masked?>".into()
        },
    ];
    r.examples = examples();
    r.defenses = defenses(n);
    r.detectors = vec![DetectorReport {
        name: "FeatureSqueezing(BitDepth(bits=4), MedianFilter(size=3))".into(),
        target_fpr: 0.01,
        threshold: 0.4321,
        fit_samples: 1000,
        clean_scored: 200,
        adversarial_scored: 156,
        auc: 0.8125,
        tpr_at_1fpr: 0.25,
        tpr_at_5fpr: 0.5,
        protected_clean_accuracy: 0.87,
        protected_robust_non_adaptive: 0.6,
        adaptive_attack: "AdaptivePgd(eps=0.1, steps=40, step=0.01, λ=1)".into(),
        protected_robust_adaptive: Some(0.05),
        protected_robust_accuracy: 0.05,
    }];
    let attack = |adaptive: bool, flagged: usize, mean: Option<f64>, evaded: usize| StatefulAttack {
        attack: if adaptive { "square, query blinding".into() } else { "square(queries=5000)".into() },
        adaptive,
        attacked: 160,
        flagged,
        mean_queries_to_flag: mean,
        evaded,
    };
    r.stateful = vec![StatefulReport {
        name: "similarity (fc1_relu, k = 20)".into(),
        threshold: -1.25,
        calibration: "0.005 of 600 benign streams".into(),
        benign_streams: 500,
        benign_stream_len: 100,
        benign_flagged: 3,
        attacks: vec![attack(false, 120, Some(21.5), 30), attack(true, 8, None, 140)],
    }];
    r
}

/// A median filter and a bit-depth reduction beside the undefended model, with the golden DefenseEvaluate metrics.
fn defenses(n: usize) -> Vec<DefenseReport> {
    let (raw, def) = crate::metrics::golden_probabilities();
    let golden = armoury::metrics::defense_metrics(&raw, &def, &[3, 1, 0]).unwrap();
    let defense = |name: &str, clean: usize, robust: usize, metrics| DefenseReport {
        name: name.into(),
        clean_accuracy: ci(clean, n),
        robust_accuracy: ci(robust, n),
        eps: 0.1,
        per_attack: Vec::new(),
        transfer_accuracy: ci(robust + 30, n),
        metrics,
        metrics_inputs: "the undefended cascade's adversarial inputs".into(),
    };
    let mild = armoury::metrics::DefenseMetrics { cav: 0.1, crr: 0.2, csr: 0.1, ccv: Some(0.2), cos: Some(0.1) };
    vec![defense("MedianFilter(size=3)", 170, 15, golden), defense("BitDepth(bits=3)", 175, 20, mild)]
}

fn synthetic_attack_metrics() -> Vec<(String, armoury::metrics::AttackMetrics)> {
    let set = armoury::data::sample().unwrap();
    let (x, y) = set.test.batch(0..8).unwrap();
    let noisy = |eps: f32| {
        let noise = Tensor::uniform(x.shape(), -eps, eps, 3);
        Tensor::new((x.value() + noise.value()).mapv(|v| v.clamp(0.0, 1.0)))
    };
    let probs = Array2::from_shape_fn((8, 10), |(i, j)| if j == (y[i] + i % 3) % 10 { 0.7 } else { 0.3 / 9.0 });
    ["fgsm", "pgd-40"]
        .iter()
        .zip([0.1f32, 0.05])
        .map(|(name, eps)| (name.to_string(), attack_metrics(&x, &noisy(eps), &y, &probs, None, 1.0).unwrap()))
        .collect()
}

fn examples() -> Vec<ExampleImage> {
    let set = armoury::data::sample().unwrap();
    (0..4)
        .map(|i| {
            let (x, y) = set.test.batch(i..i + 1).unwrap();
            let original = x.to_vec();
            let adversarial = original
                .iter()
                .enumerate()
                .map(|(k, v)| (v + if k % 3 == 0 { 0.1 } else { -0.1 }).clamp(0.0, 1.0))
                .collect();
            ExampleImage {
                shape: [1, 28, 28],
                original,
                adversarial,
                label: y[0],
                adversarial_prediction: (y[0] + 1) % 10,
                attack: "pgd-40".into(),
            }
        })
        .collect()
}

/// A fresh directory under cargo's temporary directory for tests.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The ids of the plots the synthetic report must have, with a series each must name.
const PLOTS: [(&str, &str); 7] = [
    ("plot-per-attack", "apgd-ce"),
    ("plot-eps-linf", "pgd-40"),
    ("plot-eps-l2", "pgd-l2"),
    ("plot-norms-l2", "cw-l2"),
    ("plot-class-flips", "class flips"),
    ("plot-radar", "pgd-40"),
    ("plot-defense-radar", "MedianFilter(size=3)"),
];

/// The `<svg …>…</svg>` element with this id in `html`.
fn svg_element<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html.find(&format!("<svg id=\"{id}\"")).unwrap_or_else(|| panic!("no <svg id=\"{id}\">"));
    let end = html[start..].find("</svg>").expect("closed svg") + start;
    &html[start..end]
}

#[test]
fn write_produces_json_markdown_and_a_self_contained_page() {
    let r = synthetic_report();
    let dir = scratch("files");
    let files = write(&r, &dir).unwrap();
    // JSON round trip: every figure survives, bit for bit (serde_json's float_roundtrip).
    assert!(read(&files.json).unwrap() == r, "the JSON round trip changed the report");
    // Markdown: the summary and each table.
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.starts_with("# Synthetic evaluation <test>\n"));
    for needle in [
        // The header: what was measured, in a reader's terms.
        "| model | cnn (reference weights) |",
        "| data | fashion-mnist, 200 samples |",
        "| threat model | autoattack-standard-linf: L∞, ε = 0.1 — `0123abcd0123` |",
        "| attacks (cascade) | apgd-ce(steps=100) → apgd-t(steps=100, targets=9) → square(queries=5000) |",
        "| date | 2026-12-05T07:00:00Z |",
        "| Armoury | 0.1.0 |",
        "- **NTE**: noise tolerance",
        "| robust accuracy | 0.1050 [",
        "| apgd-t | 0.1300 [",
        "| fab-t |",
        "## Accuracy vs ε: pgd-l2 (l2)",
        "| deepfool | l2 | 188/200 |",
        "| T-shirt/top |",
        "| unbounded ε → 0 | **FAIL** |",
        "| fgsm | 0.6250 |",
        "| MedianFilter(size=3) | 0.1 | 0.8500 [",
        "| -0.3333 | 0.0000 | 0.3333 | 0.1000 | 0.0451 |",
        "| 0.4321 (1% on 1000) | 200 / 156 | 0.8125 | 0.2500 | 0.5000 | 0.8700 | 0.6000 | 0.0500 |",
        // 120 of 160 flagged = 0.75; 3 of 500 benign streams = 0.006.
        "| similarity (fc1_relu, k = 20) | square(queries=5000) | 160 | 120 | 0.7500 | 21.5 | 30 | 0.0060 (3 of 500 streams of 100) | -1.2500 (0.005 of 600 benign streams) |",
        "| square, query blinding (adaptive) | 160 | 8 | 0.0500 | — | 140 |",
    ] {
        assert!(md.contains(needle), "report.md lacks {needle:?}:\n{md}");
    }
    // HTML: every plot with its series, drawn shapes, text escaped, the grid embedded.
    let html = std::fs::read_to_string(&files.html).unwrap();
    for (id, series) in PLOTS {
        let svg = svg_element(&html, id);
        assert!(svg.contains("class=\"armoury-plot\""), "{id}");
        let tag_end = svg.find('>').unwrap();
        assert!(
            svg[..tag_end].contains(&format!("&quot;{series}&quot;")),
            "{id} does not name {series}: {}",
            &svg[..tag_end]
        );
        assert!(["<path", "<polyline", "<polygon", "<rect"].iter().any(|t| svg.contains(t)), "{id} draws nothing");
    }
    assert!(html.contains("<title>Synthetic evaluation &lt;test&gt;</title>"));
    assert!(html.contains("&lt;masked?&gt;") && !html.contains("<masked?>"));
    // The examples: labelled columns, class names, each picture embedded.
    let examples = &html[html.find("<table id=\"examples\">").expect("the examples table")..];
    let examples = &examples[..examples.find("</table>").unwrap()];
    for column in ["true class", "clean image", "adversarial image", "prediction on it", "perturbation", "attack"] {
        assert!(examples.contains(&format!(">{column}</th>")), "examples column {column}");
    }
    assert_eq!(examples.matches("src=\"data:image/png;base64,iVBORw0KGgo").count(), 4 * 3);
    assert!(examples.contains("<img id=\"example-0-clean\""));
    let first = &r.examples[0];
    assert!(examples.contains(&format!("<td class=\"name\">{}</td>", CLASSES[first.label])), "class names");
    // The header and one sentence per metric.
    assert!(html.find("<table id=\"header\">").unwrap() < html.find("<table id=\"summary\">").unwrap());
    assert!(html.contains("<dt>ACTC</dt><dd>average confidence left on the true class"));
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"), "the page must not load anything");
    // The PNG beside it: 4 rows of 3 images of 28·3 pixels, with labels.
    let png = image::open(files.examples_png.as_ref().unwrap()).unwrap();
    assert_eq!(png.height(), 4 * 84 + 3 * armoury::data::GRID_GAP);
    // The radar was derived from the attack metrics: 5 axes, larger = stronger.
    let radar = svg_element(&html, "plot-radar");
    assert!(
        ["MR", "ACAC", "1 − ACTC", "ASS", "NTE"].iter().all(|a| radar.contains(&format!("{a}\n</text>"))),
        "radar axes"
    );
    // The defenses' radar: DefenseEvaluate's five axes, larger = better, both defenses drawn.
    let radar = svg_element(&html, "plot-defense-radar");
    assert!(
        ["(1 + CAV) / 2", "CRR", "1 − CSR", "1 − CCV", "1 − COS / ln 2"]
            .iter()
            .all(|a| radar.contains(&format!("{a}\n</text>"))),
        "defense radar axes"
    );
    assert!(radar.contains("BitDepth(bits=3)") && radar.matches("<polygon").count() >= 2, "both defenses drawn");
    assert!(html.contains("<table id=\"defenses\">") && html.contains("<table id=\"detectors\">"));
    let stateful = &html[html.find("<table id=\"stateful\">").expect("the stateful table")..];
    let stateful = &stateful[..stateful.find("</table>").unwrap()];
    assert_eq!(stateful.matches("<tr>").count(), 3, "header and one row per attack");
    assert!(stateful.contains("<td>0.7500</td><td>21.5</td><td>30</td><td>0.0060 (3 of 500 streams of 100)</td>"));
    assert!(stateful.contains("<td>0.0500</td><td>—</td><td>140</td>"), "{stateful}");
}

#[test]
fn write_rejects_inconsistent_reports_naming_the_field() {
    let dir = scratch("bad");
    let err = |r: &Report| write(r, &dir).unwrap_err().to_string();
    let mut r = synthetic_report();
    r.per_attack[1].seconds = f64::NAN;
    assert!(err(&r).contains("per_attack[1].seconds"), "{}", err(&r));
    let mut r = synthetic_report();
    r.curves[2].eps.pop();
    assert!(err(&r).contains("curves[2]"));
    let mut r = synthetic_report();
    r.robust_accuracy = Interval { value: 0.5, lo: 0.6, hi: 0.7 };
    assert!(err(&r).contains("robust_accuracy"));
    let mut r = synthetic_report();
    r.class_flips.as_mut().unwrap().counts.pop();
    assert!(err(&r).contains("class_flips"));
    let mut r = synthetic_report();
    r.examples[2].adversarial.pop();
    assert!(err(&r).contains("examples[2]"));
    let mut r = synthetic_report();
    r.minimal_norms[0].norms[5] = Some(-1.0);
    assert!(err(&r).contains("minimal_norms[0].norms[5]"));
    let mut r = synthetic_report();
    r.radar = Some(Radar {
        axes: vec!["a".into(), "b".into(), "c".into()],
        series: vec![RadarSeries { name: "s".into(), values: vec![0.1, 2.0, 0.3] }],
    });
    assert!(err(&r).contains("not in [0, 1]"));
    let mut r = synthetic_report();
    r.defenses[1].transfer_accuracy = Interval { value: 0.5, lo: 0.6, hi: 0.7 };
    assert!(err(&r).contains("defenses[1].transfer_accuracy"), "{}", err(&r));
    let mut r = synthetic_report();
    r.detectors[0].auc = f64::NAN;
    assert!(err(&r).contains("detectors[0]"));
    let mut r = synthetic_report();
    r.stateful[0].attacks[1].flagged = 161;
    assert!(err(&r).contains("stateful[0]"), "{}", err(&r));
    let mut r = synthetic_report();
    r.stateful[0].attacks[0].mean_queries_to_flag = Some(0.5);
    assert!(err(&r).contains("stateful[0]"));
    let mut r = synthetic_report();
    r.stateful[0].benign_flagged = 501;
    assert!(err(&r).contains("stateful[0]"));
    // Nothing was written by the failed calls.
    assert!(!dir.join("report.json").exists());
    // A minimal report (headline figures only) is fine: no plots, no grid.
    let files = write(&Report::new("t", "m", 10, ci(9, 10)), &dir).unwrap();
    assert_eq!(files.examples_png, None);
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(!html.contains("<svg"));
}

// ------------------------------------------------------------------------------------- the browser

/// Runs `cmd` to completion with a time limit, returning (stdout, stderr).
fn run_with_timeout(mut cmd: Command, limit: Duration) -> (String, String) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("chromium starts");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let (o, e) = (reader.join().unwrap(), err_reader.join().unwrap());
            assert!(status.success(), "chromium failed ({status}):\n{e}");
            return (o, e);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `chromium --headless …` with the flags that keep it offline and quiet, a fresh profile, and `extra`.
fn chromium(profile: &Path, extra: &[String]) -> Command {
    let mut cmd = Command::new("chromium");
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        .args(["--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra);
    cmd
}

fn chromium_installed() -> bool {
    Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What the page recorded about itself, and the console messages Chromium logged.
struct Rendered {
    dom: String,
    console: Vec<String>,
}

impl Rendered {
    fn body_attr(&self, name: &str) -> String {
        let body = &self.dom[self.dom.find("<body").expect("a body")..];
        let tag = &body[..body.find('>').unwrap()];
        let key = format!("{name}=\"");
        let start = tag.find(&key).unwrap_or_else(|| panic!("<body> has no {name}: {tag}")) + key.len();
        tag[start..start + tag[start..].find('"').unwrap()].to_string()
    }
}

fn render(page: &Path, profile: &Path) -> Rendered {
    let url = format!("file://{}", page.display());
    let (dom, log) = run_with_timeout(chromium(profile, &["--dump-dom".into(), url]), Duration::from_secs(90));
    let console = log.lines().filter(|l| l.contains(":CONSOLE")).map(str::to_string).collect();
    Rendered { dom, console }
}

#[test]
fn the_page_renders_in_headless_chromium() {
    if !chromium_installed() {
        assert!(std::env::var_os("CI").is_none(), "chromium is not installed, and CI must run the browser test");
        eprintln!("notice: chromium not installed; skipping the browser test (apt-get install chromium)");
        return;
    }
    let dir = scratch("browser");
    let files = write(&synthetic_report(), &dir).unwrap();
    let page = files.html.canonicalize().unwrap();
    let profile = dir.join("profile");

    let r = render(&page, &profile);
    assert!(r.console.is_empty(), "console messages: {:#?}", r.console);
    assert_eq!(r.body_attr("data-errors"), "", "the page recorded errors");
    // The header (what was measured) is on the page, every row visible, with the threat model in words.
    assert_eq!(r.body_attr("data-header-rows"), "8", "the header's rows");
    let header = &r.dom[r.dom.find("<table id=\"header\">").expect("a header in the DOM")..];
    let header = &header[..header.find("</table>").unwrap()];
    for needle in ["fashion-mnist, 200 samples", "L∞, ε = 0.1", "apgd-ce(steps=100)", "2026-12-05", "0.1.0"] {
        assert!(header.contains(needle), "the rendered header lacks {needle:?}: {header}");
    }
    // A page without the header is caught by the same check.
    let html = std::fs::read_to_string(&page).unwrap();
    let start = html.find("<table id=\"header\">").unwrap();
    let end = html[start..].find("</table>").unwrap() + start + "</table>".len();
    let headless = dir.join("no-header.html");
    std::fs::write(&headless, format!("{}{}", &html[..start], &html[end..])).unwrap();
    assert_eq!(render(&headless, &profile).body_attr("data-header-rows"), "0");
    assert_eq!(r.body_attr("data-plots"), PLOTS.len().to_string());
    assert_eq!(r.body_attr("data-plots-rendered"), PLOTS.len().to_string(), "a plot rendered empty");
    for (id, series) in PLOTS {
        let svg = svg_element(&r.dom, id);
        assert!(svg.contains(series), "{id}: {series} missing from the rendered DOM");
    }

    // The checks can fail: a broken image and an empty plot are caught.
    let html = std::fs::read_to_string(&page).unwrap();
    let broken = html.replacen("base64,iVBORw0KGgo", "base64,AAAA", 1);
    let start = broken.find("<svg id=\"plot-radar\"").unwrap();
    let end = broken[start..].find("</svg>").unwrap() + start;
    let broken = format!(
        "{}<svg id=\"plot-radar\" class=\"armoury-plot\" width=\"10\" height=\"10\">{}",
        &broken[..start],
        &broken[end..]
    );
    let bad_page = dir.join("broken.html");
    std::fs::write(&bad_page, broken).unwrap();
    let bad = render(&bad_page, &profile);
    assert!(bad.body_attr("data-errors").contains("example-0-clean"), "{}", bad.body_attr("data-errors"));
    assert_eq!(bad.body_attr("data-plots-rendered"), (PLOTS.len() - 1).to_string());

    // The screenshot, kept as a test artefact.
    let artefacts = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("test-artifacts");
    std::fs::create_dir_all(&artefacts).unwrap();
    let shot = artefacts.join("report.png");
    let _ = std::fs::remove_file(&shot);
    let args = [
        format!("--screenshot={}", shot.display()),
        "--window-size=1280,4000".into(),
        format!("file://{}", page.display()),
    ];
    run_with_timeout(chromium(&profile, &args), Duration::from_secs(90));
    let png = image::open(&shot).expect("a screenshot was written").to_rgb8();
    assert_eq!(png.dimensions(), (1280, 4000));
    let inked = png.pixels().filter(|p| p.0.iter().any(|&c| c < 200)).count();
    assert!(inked > 50_000, "the screenshot is almost blank ({inked} dark pixels)");
    eprintln!("screenshot: {}", shot.display());
}

#[test]
fn a_single_eps_is_drawn_as_points_with_intervals_not_lines() {
    let mut r = synthetic_report();
    r.curves = vec![
        EpsCurve { attack: "after apgd-ce".into(), norm: "linf".into(), eps: vec![0.1], accuracy: vec![ci(40, 200)] },
        EpsCurve { attack: "after square".into(), norm: "linf".into(), eps: vec![0.1], accuracy: vec![ci(21, 200)] },
    ];
    let dir = scratch("single-eps");
    let html = std::fs::read_to_string(write(&r, &dir).unwrap().html).unwrap();
    let svg = svg_element(&html, "plot-eps-linf");
    // No line joins two figures (an invented straight line from clean to robust): every drawn path is an
    // interval bar or a cap, two points; the figures are circles (clean, two attacks, legend marks).
    let polylines: Vec<&str> = svg.split("<polyline").skip(1).collect();
    assert!(!polylines.is_empty());
    for p in &polylines {
        let points = &p[p.find("points=\"").unwrap() + 8..];
        let points = &points[..points.find('"').unwrap()];
        assert_eq!(points.split_whitespace().count(), 2, "a line of more than two points: {points}");
    }
    assert!(svg.matches("<circle").count() >= 3, "clean and both attacks as points");
    assert!(svg.contains("clean (ε = 0)") && !svg.contains("<polygon"), "no band");
    // With a grid, the curves are lines again.
    let r = synthetic_report();
    let html = std::fs::read_to_string(write(&r, &dir).unwrap().html).unwrap();
    assert!(svg_element(&html, "plot-eps-linf").contains("<polygon"), "bands on a grid");
}

#[test]
fn class_names_from_a_file_name_the_flips_and_the_examples() {
    let mut r = synthetic_report();
    r.class_names.clear();
    r.class_flips.as_mut().unwrap().classes = (0..10).map(|c| c.to_string()).collect();
    let dir = scratch("class-names");
    let names_file = dir.join("names.txt");
    let names: Vec<String> = (0..10).map(|c| format!("kind-{c}")).collect();
    std::fs::write(&names_file, names.join("\n")).unwrap();
    r.set_class_names(armoury::data::read_class_names(&names_file, 10).unwrap());
    let files = write(&r, &dir).unwrap();
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("| kind-3 |"), "the flip matrix's rows are named");
    let html = std::fs::read_to_string(&files.html).unwrap();
    let label = r.examples[0].label;
    assert!(html.contains(&format!("<td class=\"name\">kind-{label}</td>")), "the examples are named");
    assert!(armoury::data::read_class_names(&names_file, 9).is_err(), "a count other than the model's");
}

/// Line charts outside the report (training curves, coverage, ROC) go through the same plotters path and are
/// written atomically.
#[test]
fn report_line_chart_is_a_plotters_svg() {
    use armoury::report::{LineChart, Series};
    let chart = LineChart {
        title: "PGD (eps 0.1) & co".into(),
        x_label: "epoch".into(),
        y_label: "accuracy".into(),
        y_range: Some((0.0, 1.0)),
        series: vec![Series::numbered("clean", &[0.5, 0.7, 0.8]), Series::numbered("PGD-40", &[0.1, 0.2, 0.3])],
        ..LineChart::default()
    };
    let svg = chart.svg("plot-training").unwrap();
    assert!(svg.starts_with("<svg id=\"plot-training\" class=\"armoury-plot\""), "{}", &svg[..80]);
    assert!(svg.contains("data-series=\"[&quot;clean&quot;,&quot;PGD-40&quot;]\""), "{}", &svg[..200]);
    assert!(svg.contains("epoch") && svg.contains("&amp; co") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(Series::numbered("a", &[0.5, 0.25]).points, vec![(1.0, 0.5), (2.0, 0.25)]);
    let roc = LineChart {
        series: vec![Series { name: "roc".into(), points: vec![(0.0, 0.0), (0.1, 0.8), (1.0, 1.0)] }],
        diagonal: true,
        ..LineChart::default()
    };
    let dir = std::env::temp_dir().join(format!("armoury-line-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("detect-squeeze-pgd.svg");
    roc.write(&path).unwrap();
    let written = std::fs::read_to_string(&path).unwrap();
    // Named after its file, with the chance diagonal drawn (dashed, or as a line element).
    assert!(
        written.contains("id=\"detect-squeeze-pgd\"")
            && (written.contains("stroke-dasharray") || written.contains("<line")),
        "{written}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(LineChart::default().svg("empty").unwrap().contains("armoury-plot"), "an empty chart draws");
}

#[test]
fn the_json_line_and_the_terminal_lines_state_the_reports_figures() {
    let r = synthetic_report();
    let line = armoury::report::json_line(&r);
    assert_eq!(line["clean_accuracy"], 0.885);
    assert_eq!(line["robust_accuracy"], 0.105);
    assert_eq!(line["per_attack"]["apgd-t"], 0.13);
    assert_eq!(line["audit"]["unbounded ε → 0"], "fail");
    assert_eq!(line["defenses"]["MedianFilter(size=3)"], (r.defenses[0].robust_accuracy.value * 1e4).round() / 1e4);
    let d = &line["detectors"]["FeatureSqueezing(BitDepth(bits=4), MedianFilter(size=3))"];
    assert_eq!(d["protected_robust_accuracy"], (r.detectors[0].protected_robust_accuracy * 1e4).round() / 1e4);
    assert_eq!(line["stateful"]["similarity"]["flagged"], 0.75, "120 of 160");
    assert!(line.get("seconds").is_none(), "the command adds its own fields");
    let table = armoury::report::summary_table(&r);
    assert!(table.contains("threat model `autoattack-standard-linf`") && table.contains("ε = 0.1 (L∞), 200 samples"));
    assert!(table.contains("| apgd-t | 0.1300 |"), "{table}");
    let lines = armoury::report::protection_lines(&r);
    assert_eq!(lines.len(), 2 + 1 + 2, "two defenses, one detector, two stateful attacks");
    assert!(lines[2].starts_with("detector FeatureSqueezing") && lines[2].contains("per sample"));
}
