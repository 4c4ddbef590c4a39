//! The model zoo (`tests/fixtures/zoo/`, made by `tests/fixtures/scripts/zoo_models.py`): the architectures users
//! bring — torchvision's ResNets, MobileNets, EfficientNet, DenseNet, SqueezeNet, ShuffleNet, RegNet, VGG,
//! GoogLeNet, ConvNeXt, ViT, Swin, MaxViT and the robustness papers' CIFAR PreAct-ResNet and WideResNet — at small
//! widths, each exported by the TorchScript exporter at opsets 13 and 17 and by the dynamo exporter at opset 18.
//!
//! For every export in the manifest: it loads with [`OnnxModel`], its opset is the manifest's, its logits agree
//! with onnxruntime's on the same file (|Δ| ≤ 1e-4 + 1e-4·|onnxruntime|), its input gradient of the summed
//! cross-entropy agrees with PyTorch's in direction (cosine ≥ 0.9995 when no ReLU-like kink is within
//! [`KINK_MARGIN`] of an activation's input on the fixture's x; otherwise ≥ 0.99, since a unit on the other side
//! of its kink changes the gradient by a whole path) and in size (|‖g‖ − ‖g_torch‖| ≤ 1e-3·‖g_torch‖ under the
//! same condition), and its three named node outputs ("taps") agree with onnxruntime's (1e-4 + 1e-4·|value|).
//!
//! The exports the importer cannot load yet are listed, with the ops they were missing when they were listed, in
//! [`NOT_YET`]; each must still fail to load (printing the importer's error, which names the node and op), so
//! the list shrinks as ops land. `cargo test --release --test tests onnx_zoo -- --nocapture` prints the measured
//! errors.

use std::collections::BTreeSet;

use armoury::io::SafetensorsFile;
use armoury::onnx::OnnxModel;
use armoury::{Classifier, Tensor};
use ndarray::ArrayD;
use serde::Deserialize;

use crate::common::fixture;

/// Exports that do not load yet: (model, export tag, the ops it needed that the importer lacked when listed).
const NOT_YET: &[(&str, &str, &str)] = &[];

/// The smallest distance of a ReLU-like input from its kink (over the forward pass on the fixture's x) above
/// which the input gradients must agree to cosine 0.9995: f32 rounding moves these pre-activations (of order
/// one) by about 1e-7. The fixtures' x were chosen for their margin; every model's is above 1e-5.
const KINK_MARGIN: f64 = 1e-6;

#[derive(Deserialize)]
struct Manifest {
    models: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    name: String,
    reference: String,
    input_shape: Vec<usize>,
    classes: usize,
    kink_margin: Option<f64>,
    exports: Vec<Export>,
}

#[derive(Deserialize)]
struct Export {
    tag: String,
    file: String,
    opset: i64,
    ops: Vec<String>,
    taps: Vec<String>,
}

fn manifest() -> Manifest {
    let text = std::fs::read_to_string(fixture("zoo/manifest.json")).expect("zoo manifest");
    serde_json::from_str(&text).expect("zoo manifest parses")
}

/// max |got − want| / (1 + |want|)·1e-4 ≤ 1 is the pass mark; returns (max |Δ|, worst excess ratio).
fn max_err(got: &ArrayD<f32>, want: &ArrayD<f32>) -> (f32, f32) {
    assert_eq!(got.shape(), want.shape(), "shape");
    got.iter().zip(want.iter()).fold((0.0f32, 0.0f32), |(m, r), (&g, &w)| {
        let d = (g - w).abs();
        let ratio = if d.is_nan() { f32::INFINITY } else { d / (1e-4 + 1e-4 * w.abs()) };
        (m.max(d), r.max(ratio))
    })
}

fn cosine_and_norms(a: &ArrayD<f32>, b: &ArrayD<f32>) -> (f64, f64, f64) {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b.iter()) {
        ab += f64::from(x) * f64::from(y);
        aa += f64::from(x) * f64::from(x);
        bb += f64::from(y) * f64::from(y);
    }
    (ab / (aa.sqrt() * bb.sqrt()), aa.sqrt(), bb.sqrt())
}

/// Checks every export of one model; returns the failures (empty when all pass).
fn check_model(name: &str) -> Vec<String> {
    let manifest = manifest();
    let entry = manifest.models.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("{name} in the manifest"));
    let reference = SafetensorsFile::open(fixture(&format!("zoo/{}", entry.reference))).expect("zoo reference");
    let x = Tensor::new(reference.f32("x").expect("x"));
    assert_eq!(x.shape(), entry.input_shape.as_slice(), "{name}: x");
    let y: Vec<usize> =
        reference.i64("y").expect("y").iter().map(|&v| usize::try_from(v).expect("label ≥ 0")).collect();
    let grad_want = reference.f32("grad_ce_sum").expect("grad_ce_sum");
    let kinks_clear = entry.kink_margin.is_none_or(|m| m >= KINK_MARGIN);
    let mut failures = Vec::new();
    for export in &entry.exports {
        let what = format!("{name} {}", export.tag);
        let listed = NOT_YET.iter().find(|(m, t, _)| *m == name && *t == export.tag);
        let model = match (OnnxModel::load(fixture(&format!("zoo/{}", export.file))), listed) {
            (Err(e), Some((_, _, ops))) => {
                println!("{what}: not yet (needed {ops}): {e}");
                continue;
            }
            (Err(e), None) => {
                failures.push(format!("{what}: does not load: {e}"));
                continue;
            }
            (Ok(_), Some(_)) => {
                failures.push(format!("{what}: loads now — remove it from NOT_YET"));
                continue;
            }
            (Ok(model), None) => model,
        };
        if model.opset() != export.opset {
            failures.push(format!("{what}: opset {} but the manifest says {}", model.opset(), export.opset));
        }
        let clf = match model.classifier((0.0, 1.0)) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{what}: classifier: {e}"));
                continue;
            }
        };
        assert_eq!(clf.num_classes(), entry.classes, "{what}: classes");

        let logits = clf.logits(&x).map(|l| l.into_dyn());
        let want = reference.f32(&format!("logits.{}", export.tag)).expect("onnxruntime logits");
        let (logit_err, logit_ratio) = match &logits {
            Ok(l) => max_err(l, &want),
            Err(e) => {
                failures.push(format!("{what}: forward: {e}"));
                continue;
            }
        };
        if logit_ratio > 1.0 {
            failures.push(format!("{what}: logits differ from onnxruntime's by {logit_err:.2e}"));
        }

        let (cos, norm, norm_want, grad_err) = match clf.loss_gradient(&x, &y) {
            Ok((_, g)) => {
                let g = g.to_array();
                let (cos, norm, norm_want) = cosine_and_norms(&g, &grad_want);
                (cos, norm, norm_want, max_err(&g, &grad_want).0)
            }
            Err(e) => {
                failures.push(format!("{what}: gradient: {e}"));
                continue;
            }
        };
        let norm_rel = (norm - norm_want).abs() / norm_want;
        let min_cos = if kinks_clear { 0.9995 } else { 0.99 };
        if cos.is_nan() || cos < min_cos || (kinks_clear && norm_rel > 1e-3) {
            failures.push(format!(
                "{what}: input gradient vs PyTorch: cosine {cos:.6} (≥ {min_cos} needed), norm off by {norm_rel:.1e}"
            ));
        }

        let names: Vec<&str> = export.taps.iter().map(String::as_str).collect();
        let mut tap_err = 0.0f32;
        match clf.activations(&x, &names) {
            Ok(acts) => {
                for (tap, t) in &acts.layers {
                    let want = reference.f32(&format!("tap.{}.{tap}", export.tag)).expect("tap value");
                    if t.shape() != want.shape() {
                        failures.push(format!(
                            "{what}: tap {tap}: shape {:?}, onnxruntime {:?}",
                            t.shape(),
                            want.shape()
                        ));
                        continue;
                    }
                    let (err, ratio) = max_err(&t.to_array(), &want);
                    tap_err = tap_err.max(err);
                    if ratio > 1.0 {
                        failures.push(format!("{what}: tap {tap} differs from onnxruntime's by {err:.2e}"));
                    }
                }
            }
            Err(e) => failures.push(format!("{what}: taps {names:?}: {e}")),
        }
        println!(
            "{what}: logits |Δ| {logit_err:.1e}, gradient cosine {cos:.7} (norm {norm_rel:.1e}, |Δ| {grad_err:.1e} of max {:.1e}, kink margin {}), taps |Δ| {tap_err:.1e}",
            grad_want.iter().fold(0.0f32, |m, v| m.max(v.abs())),
            entry.kink_margin.map_or("none".into(), |m| format!("{m:.1e}"))
        );
    }
    failures
}

fn run(name: &str) {
    let failures = check_model(name);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! zoo_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run(stringify!($name));
            }
        )*
        /// The tests above cover exactly the manifest's models, and NOT_YET names only exports that exist.
        #[test]
        fn zoo_tests_cover_the_manifest() {
            let tested: BTreeSet<&str> = [$(stringify!($name)),*].into_iter().collect();
            let manifest = manifest();
            let listed: BTreeSet<&str> = manifest.models.iter().map(|e| e.name.as_str()).collect();
            assert_eq!(tested, listed, "one test per model of tests/fixtures/zoo/manifest.json");
            for (model, tag, _) in NOT_YET {
                let entry = manifest.models.iter().find(|e| e.name == *model);
                assert!(
                    entry.is_some_and(|e| e.exports.iter().any(|x| x.tag == *tag)),
                    "NOT_YET names {model} {tag}, which the manifest does not have"
                );
            }
            // What the importer has to run: every op type of every export.
            let ops: BTreeSet<&str> =
                manifest.models.iter().flat_map(|e| &e.exports).flat_map(|x| &x.ops).map(String::as_str).collect();
            println!("zoo op types: {ops:?}");
        }
    };
}

zoo_tests!(
    resnet18,
    resnet50,
    wide_resnet50_2,
    mobilenet_v2,
    efficientnet_b0,
    densenet121,
    squeezenet,
    shufflenet_v2,
    regnet_y,
    vgg11_bn,
    googlenet,
    preact_resnet18,
    wrn_28_10,
    convnext_t,
    vit_b_16,
    swin_t,
    maxvit_t,
    mobilenet_v3,
);
