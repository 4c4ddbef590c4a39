//! ONNX import: the fixture exports (`cnn.onnx`, `mlp.onnx`, `zoo.onnx`, `zoo_opset13.onnx`) against PyTorch and
//! onnxruntime outputs and against the native models; error paths; speed against the native `cnn`.
//! Per-operator graphs written by the tests themselves are in `onnx/ops.rs`.

pub(crate) mod build;
mod ops;
mod ops_fold;
mod ops_nn;
mod ops_shape;
mod ops_transformer;

use std::sync::Arc;

use armoury::io::{load_module, save_module, SafetensorsFile};
use armoury::onnx::OnnxModel;
use armoury::{Classifier, Error, Module, ModuleClassifier, ModuleExt, Tensor};
use ndarray::ArrayD;

use crate::common::fixture;
use build::{node, Graph};

/// Asserts |got − want| ≤ atol + rtol·|want| everywhere, naming the worst element on failure.
pub(crate) fn assert_close(what: &str, got: &ArrayD<f32>, want: &ArrayD<f32>, atol: f32, rtol: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let mut worst = (0.0f32, 0usize, 0.0f32, 0.0f32);
    for (i, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        if excess > worst.0 || excess.is_nan() {
            worst = (excess, i, g, w);
        }
    }
    assert!(
        worst.0 <= 0.0,
        "{what}: element {} is {} but expected {} (atol {atol:e}, rtol {rtol:e})",
        worst.1,
        worst.2,
        worst.3
    );
}

fn labels(file: &SafetensorsFile) -> Vec<usize> {
    file.i64("y").expect("y").iter().map(|&v| usize::try_from(v).expect("label ≥ 0")).collect()
}

fn native(name: &str) -> Arc<dyn Module> {
    let m = if name == "cnn" { armoury::nn::cnn(0) } else { armoury::nn::mlp(0) };
    load_module(&m, fixture(&format!("{name}.safetensors"))).expect("fixture weights load");
    Arc::new(m)
}

fn imported(file: &str) -> (OnnxModel, ModuleClassifier) {
    let model = OnnxModel::load(fixture(file)).expect("fixture model loads");
    let clf = model.classifier((0.0, 1.0)).expect("classifier");
    (model, clf)
}

/// The reference models: logits and input gradients against the native models with the same weights and
/// against PyTorch; FGSM on the import equals FGSM on the native model.
fn reference_model(name: &str) {
    let (model, clf) = imported(&format!("{name}.onnx"));
    assert_eq!(clf.input_shape(), &[1, 28, 28]);
    assert_eq!(clf.num_classes(), 10);
    let nat = ModuleClassifier::new(native(name), &[1, 28, 28], 10, (0.0, 1.0)).expect("native classifier");
    let file = SafetensorsFile::open(fixture("reference.safetensors")).expect("reference");
    let x = Tensor::new(file.f32("x").expect("x"));
    let y = labels(&file);

    let logits = clf.logits(&x).expect("logits").into_dyn();
    let native_logits = nat.logits(&x).expect("native logits").into_dyn();
    assert_close(&format!("{name} onnx vs native logits"), &logits, &native_logits, 1e-5, 0.0);
    let want = file.f32(&format!("{name}.logits")).expect("logits");
    assert_close(&format!("{name} onnx vs PyTorch logits"), &logits, &want, 1e-4, 0.0);

    let (_, g) = clf.loss_gradient(&x, &y).expect("gradient");
    let (_, gn) = nat.loss_gradient(&x, &y).expect("native gradient");
    assert_close(&format!("{name} onnx vs native gradient"), &g.to_array(), &gn.to_array(), 1e-6, 1e-4);
    let want = file.f32(&format!("{name}.grad_ce_sum")).expect("grad");
    assert_close(&format!("{name} onnx vs PyTorch gradient"), &g.to_array(), &want, 1e-4, 1e-3);

    // FGSM, ε = 0.1: clamp(x + ε·sign(∇), 0, 1) on both models.
    let fgsm = |g: &Tensor| x.add(&g.sign().mul_scalar(0.1)).expect("same shape").clamp(0.0, 1.0);
    let (a, b) = (fgsm(&g).to_array(), fgsm(&gn).to_array());
    let differ = a.iter().zip(b.iter()).filter(|(p, q)| (*p - *q).abs() > 1e-6).count();
    assert_eq!(differ, 0, "{name}: FGSM images differ in {differ} pixels");

    // The initialisers are the PyTorch state_dict, as trainable parameters.
    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
    let native_names: Vec<String> = native(name).named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, native_names);
    assert!(model.parameters().len() == names.len());
}

#[test]
fn cnn_onnx_matches_native_and_pytorch() {
    reference_model("cnn");
}

#[test]
fn mlp_onnx_matches_native_and_pytorch() {
    reference_model("mlp");
}

fn zoo(file: &str) {
    let (_, clf) = imported(file);
    assert_eq!(clf.input_shape(), &[3, 32, 32]);
    assert_eq!(clf.num_classes(), 10);
    let reference = SafetensorsFile::open(fixture("zoo_reference.safetensors")).expect("zoo reference");
    let x = Tensor::new(reference.f32("x").expect("x"));
    let y = labels(&reference);
    let logits = clf.logits(&x).expect("logits").into_dyn();
    assert_close(&format!("{file} logits"), &logits, &reference.f32("logits").expect("logits"), 1e-4, 0.0);
    let (_, g) = clf.loss_gradient(&x, &y).expect("gradient");
    let want = reference.f32("grad_ce_sum").expect("grad");
    assert_close(&format!("{file} gradient"), &g.to_array(), &want, 1e-4, 1e-3);
}

#[test]
fn zoo_opset20_matches_onnxruntime_and_pytorch() {
    zoo("zoo.onnx");
}

#[test]
fn zoo_opset13_matches_onnxruntime_and_pytorch() {
    zoo("zoo_opset13.onnx");
    // The legacy export keeps BatchNormalization: its statistics are buffers, its scale and shift trainable.
    let model = OnnxModel::load(fixture("zoo_opset13.onnx")).expect("loads");
    assert_eq!(model.opset(), 13);
    let params = model.named_params();
    assert!(params.iter().any(|(_, p)| !p.is_trainable()), "BatchNorm statistics are buffers");
}

#[test]
fn imported_parameters_save_and_load_as_safetensors() {
    let model = OnnxModel::load(fixture("cnn.onnx")).expect("loads");
    let dir = std::env::temp_dir().join(format!("armoury-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("cnn_from_onnx.safetensors");
    save_module(&model, &path).expect("save");
    // The file loads into the native model and gives the same logits.
    let nat = armoury::nn::cnn(7);
    load_module(&nat, &path).expect("native model loads the imported weights");
    let x = Tensor::uniform(&[2, 1, 28, 28], 0.0, 1.0, 3);
    let a = model.forward_t(&x, false).expect("onnx forward").to_array();
    let b = nat.forward_t(&x, false).expect("native forward").to_array();
    assert_close("round trip", &a, &b, 1e-5, 0.0);
    // And a changed parameter changes the imported model's output.
    let (_, p) = model.named_params().into_iter().find(|(n, _)| n == "fc2.bias").expect("fc2.bias");
    p.set(p.value().mapv(|v| v + 1.0)).expect("same shape");
    let c = model.forward_t(&x, false).expect("forward").to_array();
    assert_close("bias + 1", &c, &b.mapv(|v| v + 1.0), 1e-5, 0.0);
    std::fs::remove_dir_all(&dir).ok();
}

/// Fine-tuning an import: every trainable initialiser gets a gradient, Adam lowers the loss, the BatchNorm
/// statistics (buffers) stay as they were.
#[test]
fn imported_model_fine_tunes() {
    use armoury::optim::{Adam, AdamConfig, Optimizer};
    use armoury::Reduction;
    let model = OnnxModel::load(fixture("zoo_opset13.onnx")).expect("loads");
    let reference = SafetensorsFile::open(fixture("zoo_reference.safetensors")).expect("zoo reference");
    let x = Tensor::new(reference.f32("x").expect("x"));
    let y = labels(&reference);
    let buffers: Vec<(String, ArrayD<f32>)> = model
        .named_params()
        .into_iter()
        .filter(|(_, p)| !p.is_trainable())
        .map(|(n, p)| (n, p.value().to_owned()))
        .collect();
    let params = model.parameters();
    let mut opt = Adam::new(params.clone(), AdamConfig { lr: 1e-2, ..Default::default() }).expect("adam");
    let loss_at = || model.forward_t(&x, true).and_then(|z| z.cross_entropy(&y, Reduction::Mean)).expect("loss");
    let first = loss_at().item().expect("scalar");
    for step in 0..15 {
        let loss = loss_at();
        let grads = loss.backward().expect("backward");
        if step == 0 {
            for p in &params {
                assert!(grads.get(&p.tensor()).is_some(), "a trainable initialiser has no gradient");
            }
        }
        opt.step(&grads).expect("step");
    }
    let last = loss_at().item().expect("scalar");
    assert!(last < 0.95 * first, "fine-tuning lowers the loss: {first} → {last}");
    for (n, before) in buffers {
        let (_, p) = model.named_params().into_iter().find(|(m, _)| *m == n).expect("still there");
        assert_eq!(p.value().to_owned(), before, "{n} is a buffer");
    }
}

#[test]
fn truncated_file_is_an_error() {
    let bytes = std::fs::read(fixture("cnn.onnx")).expect("fixture");
    for cut in [1, 10, 100, bytes.len() / 2, bytes.len() - 3] {
        let err = OnnxModel::from_bytes(&bytes[..cut]).expect_err("truncated file must fail");
        assert!(matches!(err, Error::BadFile { .. } | Error::UnsupportedOnnx { .. }), "cut {cut}: {err}");
    }
    let dir = std::env::temp_dir().join(format!("armoury-onnx-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("cut.onnx");
    std::fs::write(&path, &bytes[..bytes.len() / 3]).expect("write");
    let err = OnnxModel::load(&path).expect_err("fails");
    assert!(matches!(&err, Error::BadFile { path: p, .. } if *p == path), "{err}");
    std::fs::remove_dir_all(&dir).ok();
    assert!(matches!(OnnxModel::load("/nonexistent/model.onnx"), Err(Error::Io { .. })));
    // Garbage that happens to decode must still not panic.
    for seed in 0..20u64 {
        let junk: Vec<u8> = Tensor::uniform(&[64], 0.0, 256.0, seed).to_vec().iter().map(|&v| v as u8).collect();
        let _ = OnnxModel::from_bytes(&junk);
    }
}

/// Corrupted copies of the fixtures (random bytes overwritten) load with an error or run: never a panic.
#[test]
fn corrupted_files_never_panic() {
    for file in ["cnn.onnx", "zoo_opset13.onnx"] {
        let bytes = std::fs::read(fixture(file)).expect("fixture");
        let model = OnnxModel::from_bytes(&bytes).expect("intact file loads");
        let x = Tensor::uniform(&[1, model.input_dims()[1].unwrap_or(1), 28, 28], 0.0, 1.0, 0);
        let x = if file == "cnn.onnx" { x } else { Tensor::uniform(&[1, 3, 32, 32], 0.0, 1.0, 0) };
        // Loaded and failed, loaded and ran, rejected at load.
        let mut outcomes = [0; 3];
        for seed in 0..150u64 {
            let r = Tensor::uniform(&[6], 0.0, 1.0, 1000 + seed).to_vec();
            let mut b = bytes.clone();
            // Damage the structure near the start (headers, attributes) more often than the weights.
            for k in 0..3 {
                let span = if r[0] < 0.7 { b.len().min(4096) } else { b.len() };
                let at = (r[2 * k] * span as f32) as usize % b.len();
                b[at] = (r[2 * k + 1] * 256.0) as u8;
            }
            match OnnxModel::from_bytes(&b) {
                Ok(m) => {
                    outcomes[usize::from(m.forward_t(&x, false).is_ok())] += 1;
                }
                Err(_) => outcomes[2] += 1,
            }
        }
        assert!(outcomes[2] > 0, "{file}: some corruptions are caught at load: {outcomes:?}");
    }
}

#[test]
fn unknown_operator_is_named_with_node_and_opset() {
    let g = Graph::new(17, &[-1, 4]).node(node("Hardmax", &["x"], &["y"], "my_hardmax", vec![])).output("y", &[-1, 4]);
    let err = OnnxModel::from_bytes(&g.bytes()).expect_err("Hardmax is not supported");
    match &err {
        Error::UnsupportedOnnx { node, op, opset, .. } => {
            assert_eq!((node.as_str(), op.as_str(), *opset), ("my_hardmax", "Hardmax", 17));
        }
        other => panic!("expected UnsupportedOnnx, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("Hardmax") && msg.contains("my_hardmax") && msg.contains("17"), "{msg}");
    // An unknown attribute is named too.
    let g = Graph::new(13, &[-1, 4])
        .node(node("Relu", &["x"], &["y"], "r", vec![build::attr_i("fancy", 1)]))
        .output("y", &[-1, 4]);
    let msg = OnnxModel::from_bytes(&g.bytes()).expect_err("unknown attribute").to_string();
    assert!(msg.contains("fancy") && msg.contains("Relu"), "{msg}");
}

/// The class count comes from a dummy forward pass when the file leaves it symbolic; an input shape that is not
/// fixed after the batch axis cannot make a classifier.
#[test]
fn classifier_metadata_from_the_graph() {
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.1).collect();
    let g = Graph::new(13, &[-1, 4])
        .init("fc.weight", &[3, 4], &w)
        .node(node("Gemm", &["x", "fc.weight"], &["y"], "fc", vec![build::attr_i("transB", 1)]))
        .output("y", &[]);
    let clf = g.model().classifier((-1.0, 1.0)).expect("classifier");
    assert_eq!((clf.input_shape(), clf.num_classes(), clf.bounds()), (&[4][..], 3, (-1.0, 1.0)));
    let g = Graph::new(13, &[-1, -1]).node(node("Relu", &["x"], &["y"], "r", vec![])).output("y", &[]);
    assert!(matches!(g.model().classifier((0.0, 1.0)), Err(Error::InvalidArgument { .. })));
    assert!(matches!(g.model().classifier((1.0, 0.0)), Err(Error::InvalidArgument { .. })));
}

#[test]
fn missing_initialiser_is_an_error() {
    let g = Graph::new(13, &[-1, 4]).node(node("Add", &["x", "bias"], &["y"], "add", vec![])).output("y", &[-1, 4]);
    let err = OnnxModel::from_bytes(&g.bytes()).expect_err("'bias' is not defined");
    assert!(matches!(err, Error::BadFile { .. }), "{err}");
    assert!(err.to_string().contains("bias"), "{err}");
}

#[test]
fn wrong_input_rank_or_shape_is_an_error() {
    let (model, clf) = imported("cnn.onnx");
    let err = model.forward_t(&Tensor::zeros(&[1, 28, 28]), false).expect_err("rank 3");
    assert!(matches!(err, Error::RankMismatch { expected: 4, got: 3, .. }), "{err}");
    let err = model.forward_t(&Tensor::zeros(&[2, 1, 28, 27]), false).expect_err("wrong width");
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert!(matches!(clf.logits(&Tensor::zeros(&[1, 28, 28])), Err(Error::RankMismatch { .. })));
}
