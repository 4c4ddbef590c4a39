//! The examples are command lines: each answers `--help` with its flags, their defaults and an example command
//! line, and refuses an unknown flag or a bad value with a non-zero exit code and a message that names the flag.
//!
//! It runs the example binaries that `cargo test` builds beside this test binary (`target/<profile>/examples/`).
//! A run that built no examples (`cargo test --test tests`) skips, with a note, except under CI, where it fails.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Every example, with a flag of its own and a value that flag refuses.
const EXAMPLES: [(&str, &str, &str); 10] = [
    ("adversarial_training", "--defense", "nonsense"),
    ("attack", "--limit", "many"),
    ("bench", "--reps", "0"),
    ("detect", "--limit", "many"),
    ("evaluate", "--shard", "3"),
    ("fuzz", "--seeds", "many"),
    ("memory_growth", "--epochs", "ten"),
    ("quickstart", "--threads", "0"),
    ("randomized_smoothing", "--sigma", "wide"),
    ("train", "--batch-size", "0"),
];

/// `target/<profile>/examples/NAME`, when `cargo test` built it.
fn example(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?; // target/<profile>/deps/tests-… → target/<profile>
    let path = profile_dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    path.exists().then_some(path)
}

fn run(path: &PathBuf, args: &[&str]) -> Output {
    Command::new(path).args(args).output().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The example binaries, or `None` (with a note) when this run did not build them.
fn examples() -> Option<Vec<(PathBuf, &'static str, &'static str, &'static str)>> {
    let found: Vec<_> = EXAMPLES.iter().filter_map(|&(n, f, v)| example(n).map(|p| (p, n, f, v))).collect();
    if found.len() == EXAMPLES.len() {
        return Some(found);
    }
    let missing = EXAMPLES.len() - found.len();
    assert!(std::env::var_os("CI").is_none(), "{missing} example binaries not built (cargo test builds them)");
    eprintln!("skipped: {missing} example binaries not built (run `cargo test` without --test, or build --examples)");
    None
}

#[test]
fn help_lists_flags_defaults_and_an_example() {
    let Some(examples) = examples() else { return };
    for (path, name, flag, _) in examples {
        let out = run(&path, &["--help"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} --help: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        assert!(text.contains(&format!("Usage: {name}")), "{name} --help has no usage line:\n{text}");
        assert!(text.contains(flag) && text.contains("--help"), "{name} --help does not list {flag}:\n{text}");
        assert!(text.contains("[default: "), "{name} --help shows no default:\n{text}");
        let invocation = format!("cargo run --release --example {name}");
        assert!(text.contains(&invocation), "{name} --help has no example command line:\n{text}");
    }
}

#[test]
fn unknown_flags_and_bad_values_fail_naming_the_flag() {
    let Some(examples) = examples() else { return };
    for (path, name, flag, bad) in examples {
        let out = run(&path, &["--no-such-flag"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} --no-such-flag: {:?}\n{err}", out.status);
        assert!(err.contains("'--no-such-flag'"), "{name}: the error does not name the flag:\n{err}");
        let out = run(&path, &[flag, bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} {flag} {bad}: {:?}\n{err}", out.status);
        assert!(err.contains(&format!("'{flag} ")), "{name} {flag} {bad}: the error does not name the flag:\n{err}");
    }
}

#[test]
fn quickstart_keeps_an_existing_model_file() {
    let Some(examples) = examples() else { return };
    let quickstart = &examples.iter().find(|e| e.1 == "quickstart").expect("listed").0;
    let dir = std::env::temp_dir().join(format!("armoury-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("model.safetensors");
    std::fs::write(&file, b"keep me").unwrap();
    let out = run(quickstart, &["--save", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--force"), "quickstart over an existing file: {err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The examples whose flags take comma-separated lists run with their defaults (clap reads a bare `Vec` field as
/// a repeated flag and panicked on every run of `detect` and `fuzz` before any work), each ending with its JSON
/// line.
#[test]
fn list_flags_parse_and_the_examples_run_end_to_end() {
    if examples().is_none() {
        return;
    }
    let out = std::env::temp_dir().join(format!("armoury-examples-run-{}", std::process::id()));
    let dir = |name: &str| out.join(name).display().to_string();
    let runs: [(&str, Vec<String>); 2] = [
        (
            "detect",
            ["--detector", "squeeze", "--attack", "fgsm", "--limit", "10", "--fit", "50", "--out"]
                .iter()
                .map(|s| s.to_string())
                .chain([dir("detect")])
                .collect(),
        ),
        (
            "fuzz",
            ["--data", "sample", "--seeds", "4", "--iterations", "4", "--bounds-images", "100"]
                .iter()
                .map(|s| s.to_string())
                .chain(["--retrain-epochs".into(), "0".into(), "--out".into(), dir("fuzz")])
                .collect(),
        ),
    ];
    for (name, args) in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run(&example(name).unwrap(), &args);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{name}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        let last = stdout.lines().last().unwrap_or_default();
        let line: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{name}: {e}: {last}"));
        assert_eq!(line["example"], name);
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A CIFAR-10 directory of `n` test images (and as many training images) with a pixel pattern, labelled with the
/// zoo model's own predictions except the first `wrong`, which get the next class: clean accuracy (n − wrong) / n.
fn cifar_for_zoo(dir: &std::path::Path, n: usize, wrong: usize) {
    use armoury::Classifier;
    let pixels: Vec<u8> = (0..n * 3072).map(|k| ((k * 37 + k / 3072 * 101) % 256) as u8).collect();
    let x: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    let x = armoury::Tensor::from_vec(x, &[n, 3, 32, 32]).unwrap();
    let clf =
        armoury::onnx::OnnxModel::load(crate::common::fixture("zoo.onnx")).unwrap().classifier((0.0, 1.0)).unwrap();
    let predicted = clf.predict(&x).unwrap();
    let mut bytes = Vec::new();
    for (i, p) in predicted.iter().enumerate() {
        bytes.push(if i < wrong { ((p + 1) % 10) as u8 } else { *p as u8 });
        bytes.extend_from_slice(&pixels[i * 3072..(i + 1) * 3072]);
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("test_batch.bin"), &bytes).unwrap();
    std::fs::write(dir.join("data_batch_1.bin"), &bytes).unwrap();
}

/// The examples on an RGB model (the 3×32×32 ONNX zoo fixture) with RGB data: a CIFAR-10 directory made here,
/// whose labels give a known clean accuracy, and an image folder of evaluation images whose class folders are
/// matched to the model's classes by `--class-names`.
#[test]
fn rgb_model_and_data_end_to_end() {
    if examples().is_none() {
        return;
    }
    let out = std::env::temp_dir().join(format!("armoury-examples-rgb-{}", std::process::id()));
    let cifar = out.join("cifar");
    cifar_for_zoo(&cifar, 8, 2);
    let folder = out.join("folder");
    for (class, shade) in [("cat", 40u8), ("ship", 200)] {
        std::fs::create_dir_all(folder.join(class)).unwrap();
        for i in 0..3u8 {
            let img = image::RgbImage::from_fn(40, 36, |x, y| image::Rgb([shade, (x * 5) as u8 + i, (y * 7) as u8]));
            img.save(folder.join(class).join(format!("{i}.png"))).unwrap();
        }
    }
    let names = out.join("classes.txt");
    std::fs::write(&names, "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n").unwrap();
    let zoo = crate::common::fixture("zoo.onnx").display().to_string();
    let s = |p: &std::path::Path| p.display().to_string();
    let runs: Vec<(&str, Vec<String>)> = vec![
        ("evaluate", vec!["--limit", "8", "--no-audit", "--data", &s(&cifar), "--out", &s(&out.join("ev"))]),
        (
            "evaluate",
            vec!["--no-audit", "--data", &s(&folder), "--class-names", &s(&names), "--out", &s(&out.join("ef"))],
        ),
        (
            "evaluate",
            vec![
                "--limit",
                "8",
                "--no-audit",
                "--data",
                &s(&cifar),
                "--normalize",
                "imagenet",
                "--out",
                &s(&out.join("en")),
            ],
        ),
        ("attack", vec!["--attack", "pgd", "--limit", "4", "--data", &s(&cifar), "--out", &s(&out.join("at"))]),
        (
            "detect",
            vec![
                "--detector",
                "squeeze",
                "--attack",
                "fgsm",
                "--limit",
                "8",
                "--fit",
                "4",
                "--data",
                &s(&cifar),
                "--out",
                &s(&out.join("de")),
            ],
        ),
        (
            "fuzz",
            vec![
                "--seeds",
                "2",
                "--iterations",
                "2",
                "--bounds-images",
                "8",
                "--retrain-epochs",
                "0",
                "--data",
                &s(&cifar),
                "--out",
                &s(&out.join("fu")),
            ],
        ),
    ]
    .into_iter()
    .map(|(name, args)| (name, args.into_iter().map(String::from).collect()))
    .collect();
    let mut lines = Vec::new();
    for (name, args) in &runs {
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["--model", &zoo]);
        let o = run(&example(name).unwrap(), &args);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{name} {args:?}: {}\n{}\n{stdout}", o.status, String::from_utf8_lossy(&o.stderr));
        let last = stdout.lines().last().unwrap_or_default();
        let line: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{name}: {e}: {last}"));
        assert_eq!(line["example"], *name);
        lines.push(line);
    }
    assert_eq!(lines[0]["clean_accuracy"], 0.75, "6 of 8 labels are the model's predictions: {}", lines[0]);
    assert_eq!(lines[0]["identity"]["data"], "cifar-10");
    let hash = |k: usize| lines[k]["identity"]["model_hash"].as_str().unwrap_or_default().to_string();
    assert_ne!(hash(0), hash(2), "--normalize is part of the model's identity");
    assert_eq!(lines[2]["identity"]["data_hash"], lines[0]["identity"]["data_hash"]);
    let report = std::fs::read_to_string(out.join("ef").join("report.md")).unwrap();
    assert!(report.contains("folder") && report.contains("6 samples"), "{report}");
    // The folder without --class-names has 2 classes for a 10-class model: refused, naming the remedy.
    let o = run(&example("evaluate").unwrap(), &["--model", &zoo, "--data", &s(&folder), "--out", &s(&out.join("eg"))]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("class folders") && err.contains("--class-names"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}
