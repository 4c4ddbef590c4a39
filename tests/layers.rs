//! The core's layer order (docs/architecture.md#the-cores-layers), checked on the source: a module may use its own
//! layer and those below it, never one above — presentation sits above figures, figures above the contracts,
//! the contracts above the engine.

use std::path::Path;

/// The layers, bottom to top, with their modules.
const LAYERS: [(&str, &[&str]); 5] = [
    ("engine", &["tensor", "autograd", "ops", "nn", "optim", "io", "data", "limits", "seed", "profile", "alloc"]),
    ("contracts", &["classifier", "attack", "detector", "train", "robustness", "onnx", "load"]),
    ("metrics", &["metrics", "coverage"]),
    ("evaluation", &["eval", "fuzz"]),
    ("report", &["report"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

/// Every `crate::module` a source file names outside comments.
fn uses(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + 7..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            out.push(name);
        }
    }
    out
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_module_of_the_core_uses_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut bad = Vec::new();
    let mut placed = 0;
    for f in &all {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.iter().next().unwrap().to_string_lossy().trim_end_matches(".rs").to_string();
        let Some(own) = layer_of(&first) else {
            assert!(["lib", "error"].contains(&first.as_str()), "{} is in no layer", rel.display());
            continue;
        };
        placed += 1;
        for used in uses(&std::fs::read_to_string(f).unwrap()) {
            if let Some(l) = layer_of(&used) {
                if l > own {
                    bad.push(format!("{} ({}) uses crate::{used} ({})", rel.display(), LAYERS[own].0, LAYERS[l].0));
                }
            }
        }
    }
    assert!(placed > 50, "the walk found the core's files");
    assert!(bad.is_empty(), "layer order broken:\n{}", bad.join("\n"));
    // The check can fail: a figure that reaches up into the report is caught.
    assert_eq!(uses("use crate::report::Interval; // x"), vec!["report"]);
    assert!(layer_of("report") > layer_of("metrics"));
}
