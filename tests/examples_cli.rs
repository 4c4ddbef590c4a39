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
