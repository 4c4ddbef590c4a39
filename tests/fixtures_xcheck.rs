//! Cross-checks against PyTorch: the fixture weights loaded into Armoury's reference models must reproduce
//! `tests/fixtures/reference.safetensors` (logits, activations, input gradients, FGSM and BIM) within the
//! tolerances of tests/fixtures/README.md; and the safetensors round trip, mismatch and corruption behaviour.

use std::path::PathBuf;
use std::sync::Arc;

use armoury::io::{load_module, read_i64, save_module, save_tensors, SafetensorsFile};
use armoury::nn::{BatchNorm, Conv2d, Linear, ReLU};
use armoury::{Classifier, Conv2dParams, Error, Module, ModuleClassifier, ModuleExt, Reduction, Sequential, Tensor};
use ndarray::{ArrayD, IxDyn, Zip};

/// `tests/fixtures/<name>` (the same as `common::fixture`; repeated so that this file also compiles as its own
/// test target, which Cargo builds from every `tests/*.rs` unless `autotests = false`).
fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The reference file (`reference.safetensors`), opened once per test.
fn reference() -> SafetensorsFile {
    SafetensorsFile::open(fixture("reference.safetensors")).expect("reference fixture reads")
}

/// A model of the given name with the fixture weights.
fn trained(name: &str) -> Arc<Sequential> {
    let model = match name {
        "mlp" => armoury::nn::mlp(0),
        "cnn" => armoury::nn::cnn(0),
        _ => unreachable!("only mlp and cnn"),
    };
    load_module(&model, fixture(&format!("{name}.safetensors"))).expect("fixture weights load");
    Arc::new(model)
}

fn classifier(model: &Arc<Sequential>) -> ModuleClassifier {
    let m: Arc<dyn Module> = model.clone();
    ModuleClassifier::new(m, &[1, 28, 28], 10, (0.0, 1.0)).expect("valid classifier")
}

fn labels(file: &SafetensorsFile) -> Vec<usize> {
    file.i64("y").expect("y").iter().map(|&v| usize::try_from(v).expect("label ≥ 0")).collect()
}

/// Asserts |got − want| ≤ atol + rtol·|want| everywhere, naming the worst element on failure.
fn assert_close(what: &str, got: &ArrayD<f32>, want: &ArrayD<f32>, atol: f32, rtol: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let mut worst = (0.0f32, 0usize, 0.0f32, 0.0f32);
    for (i, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        if excess > worst.0 || excess.is_nan() {
            worst = (excess, i, g, w);
        }
    }
    let max_abs = got.iter().zip(want.iter()).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
    println!("{what}: max |diff| {max_abs:e}");
    assert!(
        worst.0 <= 0.0,
        "{what}: element {} is {} but PyTorch gives {} (max |diff| {max_abs:e}, atol {atol:e}, rtol {rtol:e})",
        worst.1,
        worst.2,
        worst.3
    );
}

/// Compares an attack's image with PyTorch's: within 1e-6 on ≥ 99.9% of pixels, and every pixel that differs
/// had a gradient within float rounding of zero (`tiny[i]` is the smallest |gradient| the pixel saw).
fn assert_attack_close(what: &str, got: &ArrayD<f32>, want: &ArrayD<f32>, tiny: &ArrayD<f32>, grad_scale: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let threshold = 1e-6 * grad_scale;
    let mut differing = 0usize;
    for ((&g, &w), &t) in got.iter().zip(want.iter()).zip(tiny.iter()) {
        if (g - w).abs() > 1e-6 {
            differing += 1;
            assert!(
                t <= threshold,
                "{what}: a pixel differs ({g} vs PyTorch {w}) although its smallest |gradient| {t:e} is not tiny \
                 (threshold {threshold:e})"
            );
        }
    }
    println!("{what}: {differing} of {} pixels differ by more than 1e-6", got.len());
    assert!(
        differing as f64 <= 1e-3 * got.len() as f64,
        "{what}: {differing} of {} pixels differ by more than 1e-6",
        got.len()
    );
}

/// One signed-gradient step of the fixtures' BIM, in f32 as PyTorch does it:
/// clamp(x + clamp(xₖ + α·sign(g) − x, −ε, ε), 0, 1).
fn bim_step(x: &ArrayD<f32>, xk: &ArrayD<f32>, g: &ArrayD<f32>, alpha: f32, eps: f32) -> ArrayD<f32> {
    let mut out = xk.clone();
    Zip::from(&mut out).and(x).and(g).for_each(|o, &x0, &gi| {
        let s = if gi > 0.0 {
            1.0
        } else if gi < 0.0 {
            -1.0
        } else {
            0.0
        };
        let delta = (*o + alpha * s - x0).clamp(-eps, eps);
        *o = (x0 + delta).clamp(0.0, 1.0);
    });
    out
}

fn cross_check(name: &str, layers: &[&str]) {
    let file = reference();
    let model = trained(name);
    let clf = classifier(&model);
    let x = file.f32("x").expect("x");
    let y = labels(&file);
    let xt = Tensor::new(x.clone());

    // Logits, through the classifier contract.
    let logits = clf.logits(&xt).expect("logits").into_dyn();
    assert_close(&format!("{name}.logits"), &logits, &file.f32(&format!("{name}.logits")).expect("logits"), 1e-4, 0.0);

    // Every activation, by the Sequential child's name.
    let acts = model.forward_collect(&xt, false).expect("forward_collect");
    for layer in layers {
        let key = format!("{name}.act.{layer}");
        let got = acts.iter().find(|(n, _)| n == layer).unwrap_or_else(|| panic!("{name} has no child '{layer}'"));
        assert_close(&key, &got.1.to_array(), &file.f32(&key).expect("activation"), 1e-4, 0.0);
    }

    // ∂/∂x of the summed cross-entropy.
    let (loss, grad) = clf.loss_gradient(&xt, &y).expect("loss_gradient");
    assert_eq!(loss.len(), 16, "one loss per sample");
    let grad = grad.to_array();
    let want_grad = file.f32(&format!("{name}.grad_ce_sum")).expect("grad");
    assert_close(&format!("{name}.grad_ce_sum"), &grad, &want_grad, 1e-4, 1e-3);
    let grad_scale = want_grad.iter().fold(0.0f32, |m, v| m.max(v.abs()));

    // The summed loss agrees with the per-sample losses the classifier reports.
    let summed = Tensor::new(logits.clone()).cross_entropy(&y, Reduction::Sum).expect("ce").item().expect("scalar");
    assert!((summed - loss.iter().sum::<f32>()).abs() <= 1e-4 * summed.abs().max(1.0), "summed CE");

    // FGSM with tensor ops: clamp(x + 0.1·sign(grad), 0, 1).
    let fgsm =
        xt.add(&Tensor::new(grad.clone()).sign().mul_scalar(0.1)).expect("same shape").clamp(0.0, 1.0).to_array();
    let tiny = grad.mapv(f32::abs);
    let want = file.f32(&format!("{name}.fgsm_eps0.1")).expect("fgsm");
    assert_attack_close(&format!("{name}.fgsm_eps0.1"), &fgsm, &want, &tiny, grad_scale);

    // BIM: 10 steps of 0.01 in the 0.1-ball, no random start.
    let mut xk = x.clone();
    let mut tiny = ArrayD::from_elem(x.raw_dim(), f32::INFINITY);
    for _ in 0..10 {
        let (_, g) = clf.loss_gradient(&Tensor::new(xk.clone()), &y).expect("bim gradient");
        let g = g.to_array();
        Zip::from(&mut tiny).and(&g).for_each(|t, &gi| *t = t.min(gi.abs()));
        xk = bim_step(&x, &xk, &g, 0.01, 0.1);
    }
    let key = format!("{name}.bim_eps0.1_alpha0.01_steps10");
    assert_attack_close(&key, &xk, &file.f32(&key).expect("bim"), &tiny, grad_scale);
    let bim_logits = clf.logits(&Tensor::new(xk)).expect("bim logits").into_dyn();
    let want = file.f32(&format!("{name}.bim_logits")).expect("bim_logits");
    assert_close(&format!("{name}.bim_logits"), &bim_logits, &want, 1e-4, 0.0);
}

#[test]
fn cnn_matches_pytorch() {
    cross_check("cnn", &["conv1_relu", "pool1", "conv2_relu", "pool2", "fc1_relu", "fc2"]);
}

#[test]
fn mlp_matches_pytorch() {
    cross_check("mlp", &["fc1_relu", "fc2_relu", "fc3"]);
}

#[test]
fn labels_read_as_int64() {
    let y = read_i64(fixture("reference.safetensors"), "y").expect("y");
    assert_eq!(y.len(), 16);
    assert!(y.iter().all(|v| (0..10).contains(v)));
    assert_eq!(reference().dtype("y").expect("y"), "I64");
}

/// A scratch path under Cargo's per-target temporary directory, unique to this test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fixtures_xcheck");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

fn values(m: &dyn Module) -> Vec<(String, ArrayD<f32>)> {
    m.named_params().into_iter().map(|(n, p)| (n, p.value().to_owned())).collect()
}

#[test]
fn save_load_round_trip_is_exact() {
    let path = scratch("round_trip.safetensors");
    let a = armoury::nn::cnn(7);
    save_module(&a, &path).expect("save");
    let b = armoury::nn::cnn(8);
    assert_ne!(values(&a), values(&b), "different seeds differ");
    load_module(&b, &path).expect("load");
    assert_eq!(values(&a), values(&b));
    // The file is PyTorch's layout: F32 under the state_dict names, nothing else.
    let f = SafetensorsFile::open(&path).expect("open");
    let mut names = f.names();
    names.sort();
    let mut want: Vec<String> = a.named_params().into_iter().map(|(n, _)| n).collect();
    want.sort();
    assert_eq!(names, want);
    assert!(names.iter().all(|n| f.dtype(n).expect("dtype") == "F32"));
    // No temporary file is left next to it.
    let dir = path.parent().expect("parent");
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // save_tensors / load_tensors keep names, shapes and bits.
    let t = vec![
        (
            "a".to_string(),
            ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0, -0.0, f32::MIN_POSITIVE, 3.5, 1e30, -7.25]).expect("6"),
        ),
        ("b".to_string(), ArrayD::from_elem(IxDyn(&[]), 42.0)),
    ];
    let path = scratch("tensors.safetensors");
    save_tensors(&path, &t).expect("save_tensors");
    let mut back = armoury::io::load_tensors(&path).expect("load_tensors");
    back.sort_by(|p, q| p.0.cmp(&q.0));
    assert_eq!(back.len(), 2);
    for ((n1, a1), (n2, a2)) in t.iter().zip(&back) {
        assert_eq!(n1, n2);
        assert_eq!(a1.shape(), a2.shape());
        assert!(a1.iter().zip(a2.iter()).all(|(p, q)| p.to_bits() == q.to_bits()), "{n1} bit-exact");
    }
}

#[test]
fn wrong_model_lists_every_difference_and_changes_nothing() {
    let cnn = armoury::nn::cnn(3);
    let before = values(&cnn);
    let err = load_module(&cnn, fixture("mlp.safetensors")).expect_err("mlp weights do not fit the cnn");
    let Error::ParameterMismatch(lines) = &err else { panic!("expected ParameterMismatch, got {err}") };
    let expect = [
        "missing in file: conv1.weight [16, 1, 5, 5]",
        "missing in file: conv1.bias [16]",
        "missing in file: conv2.weight [32, 16, 5, 5]",
        "missing in file: conv2.bias [32]",
        "shape of fc1.weight: model [128, 512], file [256, 784]",
        "shape of fc1.bias: model [128], file [256]",
        "shape of fc2.weight: model [10, 128], file [256, 256]",
        "shape of fc2.bias: model [10], file [256]",
        "unexpected in file: fc3.bias [10]",
        "unexpected in file: fc3.weight [10, 256]",
    ];
    assert_eq!(lines, &expect, "{err}");
    assert_eq!(values(&cnn), before, "nothing modified");

    // One shape difference alone is still reported, and still changes nothing.
    let mlp = armoury::nn::mlp(1);
    let path = scratch("one_off.safetensors");
    let mut t: Vec<(String, ArrayD<f32>)> = values(&armoury::nn::mlp(2));
    t[0].1 = ArrayD::zeros(IxDyn(&[256, 783]));
    save_tensors(&path, &t).expect("save");
    let before = values(&mlp);
    let err = load_module(&mlp, &path).expect_err("one shape differs");
    assert!(matches!(&err, Error::ParameterMismatch(l) if l.len() == 1 && l[0].contains("fc1.weight")), "{err}");
    assert_eq!(values(&mlp), before);
}

#[test]
fn truncated_or_corrupt_file_is_bad_file() {
    let bytes = std::fs::read(fixture("cnn.safetensors")).expect("fixture");
    let model = armoury::nn::cnn(5);
    let before = values(&model);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("header length only", bytes[..8].to_vec()),
        ("half the header", bytes[..64].to_vec()),
        ("half the data", bytes[..bytes.len() / 2].to_vec()),
        ("one byte short", bytes[..bytes.len() - 1].to_vec()),
        ("one byte long", bytes.iter().copied().chain([0]).collect()),
        ("header length too large", {
            let mut b = bytes.clone();
            b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        ("header not JSON", {
            let mut b = bytes.clone();
            b[8] = b'!';
            b
        }),
    ];
    for (what, b) in cases {
        let path = scratch(&format!("bad-{}.safetensors", what.replace(' ', "_")));
        std::fs::write(&path, &b).expect("write");
        let err = load_module(&model, &path).expect_err(what);
        assert!(matches!(err, Error::BadFile { .. }), "{what}: expected BadFile, got {err}");
    }
    assert_eq!(values(&model), before, "nothing modified");
    let err = load_module(&model, scratch("does-not-exist.safetensors")).expect_err("missing file");
    assert!(matches!(err, Error::Io { .. }), "{err}");
}

#[test]
fn batch_norm_counter_is_int64_and_round_trips() {
    let make = |seed| {
        Sequential::new()
            .add("conv", Conv2d::new(1, 4, 3, Conv2dParams::default(), false, seed).expect("conv"))
            .add("bn", BatchNorm::new(4))
            .add("relu", ReLU)
            .add("flatten", armoury::nn::Flatten)
            .add("fc", Linear::new(4 * 6 * 6, 3, true, seed + 1))
    };
    let a = make(0);
    let x = Tensor::uniform(&[5, 1, 8, 8], 0.0, 1.0, 9);
    for _ in 0..3 {
        a.forward_t(&x, true).expect("training step updates the running statistics");
    }
    let path = scratch("bn.safetensors");
    save_module(&a, &path).expect("save");
    let f = SafetensorsFile::open(&path).expect("open");
    assert_eq!(f.dtype("bn.num_batches_tracked").expect("counter"), "I64");
    assert_eq!(f.shape("bn.num_batches_tracked").expect("counter"), Vec::<usize>::new());
    assert_eq!(f.i64("bn.num_batches_tracked").expect("counter").iter().copied().collect::<Vec<_>>(), vec![3]);
    assert_eq!(f.dtype("bn.running_var").expect("var"), "F32");

    let b = make(1);
    load_module(&b, &path).expect("load");
    assert_eq!(values(&a), values(&b));
    let (ya, yb) = (a.forward_t(&x, false).expect("a"), b.forward_t(&x, false).expect("b"));
    assert_eq!(ya.to_vec(), yb.to_vec());
}
