//! Layer taps (`Classifier::activations`): the fixture models' intermediate activations against PyTorch's
//! (`reference.safetensors`) for the native and the ONNX models, the zoo's against onnxruntime's
//! (`zoo_activations.safetensors`); fused ops never hide a tapped value; errors, no-grad, gradients through a tap,
//! chunking and counting.
//!
//! PyTorch's layer names map to the ONNX exports' value names as follows (the names `torch.onnx.export` gave):
//!
//! | PyTorch (cnn) | cnn.onnx | | PyTorch (mlp) | mlp.onnx |
//! |---|---|---|---|---|
//! | `conv1_relu` | `/Relu_output_0` | | `fc1_relu` | `/Relu_output_0` |
//! | `pool1` | `/MaxPool_output_0` | | `fc2_relu` | `/Relu_1_output_0` |
//! | `conv2_relu` | `/Relu_1_output_0` | | `fc3` | `logits` |
//! | `pool2` | `/MaxPool_1_output_0` | | | |
//! | `fc1_relu` | `/Relu_2_output_0` | | | |
//! | `fc2` | `logits` | | | |

use std::sync::Arc;

use armoury::io::{load_module, SafetensorsFile};
use armoury::nn::{Conv2d, Flatten, Linear, MaxPool2d, ReLU};
use armoury::onnx::OnnxModel;
use armoury::{
    no_grad, Classifier, Conv2dParams, Counters, Error, Module, ModuleClassifier, Pool2dParams, Sequential, Tensor,
};
use ndarray::ArrayD;

use crate::common::fixture;

const CNN_LAYERS: [&str; 6] = ["conv1_relu", "pool1", "conv2_relu", "pool2", "fc1_relu", "fc2"];
const MLP_LAYERS: [&str; 3] = ["fc1_relu", "fc2_relu", "fc3"];
const CNN_ONNX: [(&str, &str); 6] = [
    ("conv1_relu", "/Relu_output_0"),
    ("pool1", "/MaxPool_output_0"),
    ("conv2_relu", "/Relu_1_output_0"),
    ("pool2", "/MaxPool_1_output_0"),
    ("fc1_relu", "/Relu_2_output_0"),
    ("fc2", "logits"),
];
const MLP_ONNX: [(&str, &str); 3] =
    [("fc1_relu", "/Relu_output_0"), ("fc2_relu", "/Relu_1_output_0"), ("fc3", "logits")];

fn reference() -> SafetensorsFile {
    SafetensorsFile::open(fixture("reference.safetensors")).expect("reference fixture reads")
}

fn images() -> Tensor {
    Tensor::new(reference().f32("x").expect("x"))
}

fn native_model(name: &str) -> Arc<Sequential> {
    let m = if name == "cnn" { armoury::nn::cnn(0) } else { armoury::nn::mlp(0) };
    load_module(&m, fixture(&format!("{name}.safetensors"))).expect("fixture weights load");
    Arc::new(m)
}

fn native(name: &str) -> ModuleClassifier {
    let m: Arc<dyn Module> = native_model(name);
    ModuleClassifier::new(m, &[1, 28, 28], 10, (0.0, 1.0)).expect("classifier")
}

fn onnx(file: &str) -> ModuleClassifier {
    OnnxModel::load(fixture(file)).expect("fixture model loads").classifier((0.0, 1.0)).expect("classifier")
}

fn assert_close(what: &str, got: &ArrayD<f32>, want: &ArrayD<f32>, atol: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let worst = got.iter().zip(want.iter()).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
    assert!(worst <= atol, "{what}: max |diff| {worst:e} > {atol:e}");
}

/// Bit-for-bit equality of two tensors' values.
fn assert_same(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let same = got.value().iter().zip(want.value().iter()).all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "{what}: values differ");
}

/// The taps' logits are `logits(x)` bit for bit.
fn assert_logits_exact(what: &str, clf: &dyn Classifier, x: &Tensor, logits: &Tensor) {
    let want = clf.logits(x).expect("logits");
    assert_same(what, logits, &Tensor::new(want.into_dyn()));
}

fn check_against_pytorch(model: &str, clf: &dyn Classifier, pairs: &[(&str, &str)]) {
    let file = reference();
    let x = images();
    let names: Vec<&str> = pairs.iter().map(|p| p.1).collect();
    let acts = clf.activations(&x, &names).expect("activations");
    assert_eq!(acts.layers.len(), names.len());
    for ((torch, ours), (name, t)) in pairs.iter().zip(&acts.layers) {
        assert_eq!(name, ours, "order kept");
        let want = file.f32(&format!("{model}.act.{torch}")).expect("fixture activation");
        assert_close(&format!("{model}: {torch} as {ours}"), &t.to_array(), &want, 1e-4);
    }
    assert_close(
        &format!("{model}: logits"),
        &acts.logits.to_array(),
        &file.f32(&format!("{model}.logits")).expect("logits"),
        1e-4,
    );
    assert_logits_exact(model, clf, &x, &acts.logits);
}

#[test]
fn taps_native_models_match_pytorch() {
    let same = |l: &[&'static str]| l.iter().map(|&n| (n, n)).collect::<Vec<_>>();
    check_against_pytorch("cnn", &native("cnn"), &same(&CNN_LAYERS));
    check_against_pytorch("mlp", &native("mlp"), &same(&MLP_LAYERS));
}

#[test]
fn taps_onnx_exports_match_pytorch() {
    check_against_pytorch("cnn", &onnx("cnn.onnx"), &CNN_ONNX);
    check_against_pytorch("mlp", &onnx("mlp.onnx"), &MLP_ONNX);
}

#[test]
fn taps_zoo_matches_onnxruntime() {
    let file = SafetensorsFile::open(fixture("zoo_activations.safetensors")).expect("zoo activations read");
    let clf = onnx("zoo.onnx");
    let x = Tensor::new(file.f32("x").expect("x"));
    let names = [
        "getitem",
        "relu_1",
        "max_pool2d",
        "conv2d_3",
        "mul_6",
        "clamp",
        "cat",
        "avg_pool2d",
        "mean",
        "view",
        "logits",
    ];
    let acts = clf.activations(&x, &names).expect("zoo activations");
    for (name, t) in &acts.layers {
        assert_close(&format!("zoo: {name}"), &t.to_array(), &file.f32(name).expect("fixture value"), 1e-4);
    }
    assert_logits_exact("zoo", &clf, &x, &acts.logits);
    // The graph input is a tap too, and is the input.
    let input = clf.activations(&x, &["input"]).expect("input tap");
    assert_same("zoo input", &input.layers[0].1, &x);
}

/// A native tap inside a fused conv → ReLU → pool (or conv → ReLU) has the value of the layer-by-layer
/// computation, alone or with others, and the logits stay bit for bit those of the fused forward pass.
#[test]
fn taps_inside_fused_ops_are_the_unfused_values() {
    let model = native_model("cnn");
    let clf = native("cnn");
    let x = images();
    let reference = model.forward_collect(&x, false).expect("layer by layer");
    let every: Vec<String> = clf.layer_names();
    assert_eq!(
        every,
        ["conv1", "conv1_relu", "pool1", "conv2", "conv2_relu", "pool2", "flatten", "fc1", "fc1_relu", "fc2"]
    );
    let mut asks: Vec<Vec<&str>> = every.iter().map(|n| vec![n.as_str()]).collect();
    asks.push(every.iter().map(String::as_str).collect());
    asks.push(vec!["pool2", "conv1", "conv1"]);
    for ask in asks {
        let acts = clf.activations(&x, &ask).expect("activations");
        for (name, t) in &acts.layers {
            let want = &reference.iter().find(|(n, _)| n == name).expect("a child").1;
            assert_same(&format!("{ask:?}: {name}"), t, want);
        }
        assert_logits_exact(&format!("{ask:?}"), &clf, &x, &acts.logits);
    }
}

/// The same for the ONNX import, whose loader fuses Conv → Relu → MaxPool: a value inside the fused op equals the
/// separate ops applied to the tapped values around it.
#[test]
fn taps_inside_fused_onnx_nodes_are_the_unfused_values() {
    let clf = onnx("cnn.onnx");
    let x = images();
    let names = clf.layer_names();
    assert_eq!(names.first().map(String::as_str), Some("input"));
    for n in ["/conv1/Conv_output_0", "/Relu_output_0", "/MaxPool_output_0", "/conv2/Conv_output_0", "logits"] {
        assert!(names.iter().any(|v| v == n), "{n} is a tap: {names:?}");
    }
    let conv1 = "/conv1/Conv_output_0";
    for ask in [vec![conv1], vec!["/Relu_output_0"], vec![conv1, "/Relu_output_0", "/MaxPool_output_0"]] {
        let acts = clf.activations(&x, &ask).expect("activations");
        assert_logits_exact(&format!("{ask:?}"), &clf, &x, &acts.logits);
    }
    let acts =
        clf.activations(&x, &[conv1, "/Relu_output_0", "/MaxPool_output_0", "/conv2/Conv_output_0"]).expect("taps");
    let [conv, relu, pool, conv2] = [0, 1, 2, 3].map(|i| acts.layers[i].1.clone());
    assert_same("relu(conv1)", &conv.relu(), &relu);
    assert_same("pool(relu)", &relu.max_pool2d(Pool2dParams::square(2)).expect("pool"), &pool);
    // Against the native model's unfused pre-activation.
    let native = native_model("cnn").forward_collect(&x, false).expect("layer by layer");
    assert_close("conv1", &conv.to_array(), &native[0].1.to_array(), 1e-5);
    assert_close("conv2", &conv2.to_array(), &native[3].1.to_array(), 1e-5);
    // Tapping only the relu between conv and pool still gives every other value unchanged.
    let alone = clf.activations(&x, &["/Relu_output_0"]).expect("relu alone");
    assert_same("relu alone", &alone.layers[0].1, &relu);
}

/// A nested container's children are `outer.inner`; the container itself is its own output.
#[test]
fn taps_nested_sequential_by_dotted_names() {
    let conv = Conv2d::new(1, 4, 3, Conv2dParams::default(), true, 3).expect("conv");
    let block = Sequential::new().add("conv", conv).add("relu", ReLU).add("pool", MaxPool2d(Pool2dParams::square(2)));
    let net =
        Sequential::new().add("block", block).add("flatten", Flatten).add("fc", Linear::new(4 * 13 * 13, 10, true, 5));
    let net = Arc::new(net);
    let clf = ModuleClassifier::new(net.clone() as Arc<dyn Module>, &[1, 28, 28], 10, (0.0, 1.0)).expect("classifier");
    assert_eq!(clf.layer_names(), ["block", "block.conv", "block.relu", "block.pool", "flatten", "fc"]);
    let x = images();
    let acts = clf.activations(&x, &["block.relu", "block", "fc", "block.conv"]).expect("nested taps");
    let pre = net.children().next().expect("block").1.forward_t(&x, false).expect("block");
    assert_same("block", &acts.layers[1].1, &pre);
    let w = acts.layers[3].1.relu();
    assert_same("block.relu", &acts.layers[0].1, &w);
    assert_same("fc is the logits", &acts.layers[2].1, &acts.logits);
    assert_logits_exact("nested", &clf, &x, &acts.logits);
    let err = clf.activations(&x, &["block.nothing"]).expect_err("unknown nested name");
    assert!(err.to_string().contains("block.conv"), "{err}");
}

/// A classifier that cannot tap.
struct Opaque(ModuleClassifier, Counters);

impl Classifier for Opaque {
    fn input_shape(&self) -> &[usize] {
        self.0.input_shape()
    }
    fn num_classes(&self) -> usize {
        10
    }
    fn bounds(&self) -> (f32, f32) {
        (0.0, 1.0)
    }
    fn forward(&self, x: &Tensor) -> armoury::Result<Tensor> {
        self.0.forward(x)
    }
    fn counters(&self) -> &Counters {
        &self.1
    }
}

#[test]
fn taps_unknown_names_are_errors_listing_the_valid_ones() {
    let x = images();
    for (clf, valid) in [(native("cnn"), "conv1_relu"), (onnx("cnn.onnx"), "/MaxPool_1_output_0")] {
        let err = clf.activations(&x, &[valid, "nope"]).expect_err("unknown name");
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert!(msg.contains("'nope'") && msg.contains(valid), "{msg}");
        assert_eq!(clf.counters().snapshot().forward_calls, 0, "nothing ran");
    }
    let opaque = Opaque(native("cnn"), Counters::default());
    assert!(opaque.layer_names().is_empty());
    let err = opaque.activations(&x, &["fc1"]).expect_err("cannot tap");
    assert!(err.to_string().contains("no intermediate activations"), "{err}");
    // Asking for nothing is the logits, from any classifier.
    let acts = opaque.activations(&x, &[]).expect("logits only");
    assert!(acts.layers.is_empty());
    assert_logits_exact("opaque", &opaque, &x, &acts.logits);
}

#[test]
fn taps_check_the_input_and_count_one_forward() {
    let clf = native("cnn");
    let bad = Tensor::zeros(&[2, 1, 27, 28]);
    assert!(matches!(clf.activations(&bad, &["pool1"]), Err(Error::ShapeMismatch { .. })));
    let nan = Tensor::full(&[2, 1, 28, 28], f32::NAN);
    assert!(matches!(clf.activations(&nan, &["pool1"]), Err(Error::NonFinite { .. })));
    assert!(clf.activations(&Tensor::zeros(&[0, 1, 28, 28]), &["pool1"]).is_err());
    let x = Tensor::uniform(&[70, 1, 28, 28], 0.0, 1.0, 4);
    clf.activations(&x, &["pool1", "fc1"]).expect("activations");
    let c = clf.counters().snapshot();
    assert_eq!((c.forward_calls, c.forward_samples, c.backward_calls), (1, 70, 0));
}

/// Under no_grad, or for an untracked input, nothing is on the graph; for a tracked input everything is.
#[test]
fn taps_under_no_grad_record_nothing() {
    for clf in [native("cnn"), onnx("cnn.onnx")] {
        let names = clf.layer_names();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let x = images();
        let xv = x.variable();
        let quiet = no_grad(|| clf.activations(&xv, &names)).expect("no-grad taps");
        assert!(!quiet.logits.is_tracked() && quiet.layers.iter().all(|(_, t)| !t.is_tracked()));
        let untracked = clf.activations(&x, &names).expect("untracked taps");
        assert!(!untracked.logits.is_tracked() && untracked.layers.iter().all(|(_, t)| !t.is_tracked()));
        let tracked = clf.activations(&xv, &names).expect("tracked taps");
        for (name, t) in &tracked.layers {
            assert!(t.is_tracked(), "{name} is on the graph");
        }
        // The same values either way, and the logits bit for bit.
        for ((n, a), (_, b)) in quiet.layers.iter().zip(&tracked.layers) {
            assert_same(n, a, b);
        }
        assert_logits_exact("tracked", &clf, &x, &tracked.logits);
    }
}

/// ∂(Σ w ⊙ activation)/∂x through a tap against central finite differences (in f64 of f32 evaluations).
fn gradient_matches_finite_differences(clf: &dyn Classifier, layer: &str) {
    // Random pixels, not the fixture images: their flat black backgrounds tie the max poolings' windows, where the
    // function has no derivative.
    let x0 = Tensor::uniform(&[2, 1, 28, 28], 0.05, 0.95, 17);
    let shape = clf.activations(&x0, &[layer]).expect("shape").layers[0].1.shape().to_vec();
    let w = Tensor::uniform(&shape, -1.0, 1.0, 11);
    let f = |x: &Tensor| -> f64 {
        let a = clf.activations(x, &[layer]).expect("taps");
        a.layers[0].1.value().iter().zip(w.value().iter()).map(|(&a, &w)| f64::from(a) * f64::from(w)).sum()
    };
    let xv = x0.variable();
    let acts = clf.activations(&xv, &[layer]).expect("tracked taps");
    let g = acts.layers[0].1.mul(&w).expect("weighted").sum_all().grad_wrt(&[&xv]).expect("gradient").remove(0);
    let g = g.to_vec();
    let base = x0.to_vec();
    // f32 rounding in the sums makes a difference quotient noisy at about 1e-3 (absolute), and a ReLU or pooling
    // may switch within ±h: hence the tolerance.
    let h = 1e-3f32;
    let scale = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    // The pixels with the largest gradients, and a spread of others.
    let mut idx: Vec<usize> = (0..base.len()).collect();
    idx.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
    let picks: Vec<usize> = idx[..6].iter().copied().chain((0..base.len()).step_by(97).take(10)).collect();
    for i in picks {
        let at = |d: f32| {
            let mut v = base.clone();
            v[i] += d;
            f(&Tensor::from_vec(v, x0.shape()).expect("shape"))
        };
        let fd = (at(h) - at(-h)) / (2.0 * f64::from(h));
        let err = (fd - f64::from(g[i])).abs();
        assert!(
            err <= 5e-3 * f64::from(scale) + 1e-2 * fd.abs(),
            "{layer} pixel {i}: autodiff {} vs finite difference {fd}",
            g[i]
        );
    }
}

#[test]
fn taps_are_differentiable_and_match_finite_differences() {
    gradient_matches_finite_differences(&native("cnn"), "conv2_relu");
    gradient_matches_finite_differences(&native("cnn"), "fc1");
    gradient_matches_finite_differences(&native("mlp"), "fc2_relu");
    gradient_matches_finite_differences(&onnx("cnn.onnx"), "/conv2/Conv_output_0");
    gradient_matches_finite_differences(&onnx("cnn.onnx"), "/MaxPool_output_0");
}

/// The classifier run whole (no chunking).
struct Whole(ModuleClassifier);

impl Classifier for Whole {
    fn input_shape(&self) -> &[usize] {
        self.0.input_shape()
    }
    fn num_classes(&self) -> usize {
        self.0.num_classes()
    }
    fn bounds(&self) -> (f32, f32) {
        self.0.bounds()
    }
    fn forward(&self, x: &Tensor) -> armoury::Result<Tensor> {
        self.0.forward(x)
    }
    fn counters(&self) -> &Counters {
        self.0.counters()
    }
    fn chunk_size(&self) -> Option<usize> {
        None
    }
    fn layer_names(&self) -> Vec<String> {
        self.0.layer_names()
    }
    fn forward_activations(&self, x: &Tensor, layers: &[&str]) -> armoury::Result<(Tensor, Vec<Tensor>)> {
        self.0.forward_activations(x, layers)
    }
}

/// A batch split into pieces of 32 gives what the whole batch gives, values and gradients.
#[test]
fn taps_chunked_equal_unchunked() {
    let x = Tensor::uniform(&[70, 1, 28, 28], 0.0, 1.0, 21);
    for (chunked, names) in [
        (native("cnn"), vec!["conv1", "pool1", "fc1_relu"]),
        (onnx("cnn.onnx"), vec!["/Relu_output_0", "/Relu_2_output_0"]),
    ] {
        assert!(chunked.chunk_size().is_some_and(|c| c < 70));
        let whole = Whole(onnx_or_native_clone(&chunked));
        let a = chunked.activations(&x, &names).expect("chunked");
        let b = whole.activations(&x, &names).expect("whole");
        assert_same("logits", &a.logits, &b.logits);
        for ((n, ta), (_, tb)) in a.layers.iter().zip(&b.layers) {
            assert_same(n, ta, tb);
        }
        // On the graph: the gradient of a function of the taps through the pieces.
        let xv = x.variable();
        let grad = |clf: &dyn Classifier| {
            let acts = clf.activations(&xv, &names).expect("tracked");
            let mut total = acts.logits.sum_all();
            for (_, t) in &acts.layers {
                total = total.add(&t.powf(2.0).sum_all()).expect("sum");
            }
            total.grad_wrt(&[&xv]).expect("gradient").remove(0)
        };
        let (ga, gb) = (grad(&chunked), grad(&whole));
        assert_close(
            "gradient through pieces",
            &ga.to_array(),
            &gb.to_array(),
            1e-4 * gb.value().iter().fold(1.0f32, |m, v| m.max(v.abs())),
        );
        let tracked = chunked.activations(&xv, &names).expect("tracked");
        assert_same("tracked chunked logits", &tracked.logits, &a.logits);
    }
}

/// A second classifier over the same module (`Whole` takes ownership).
fn onnx_or_native_clone(c: &ModuleClassifier) -> ModuleClassifier {
    ModuleClassifier::new(c.module().clone(), c.input_shape(), c.num_classes(), c.bounds()).expect("classifier")
}

/// The similarity detector's tap when none is named (`detect --detector similarity` without `--tap`): chosen from
/// the model, the input of its head — `fc1_relu` was the native cnn's name only, `unknown layer` on any ONNX
/// model. A name that is not a tap is an error listing the valid ones.
#[test]
fn default_tap_is_the_input_of_the_head_for_native_and_onnx_models() {
    use armoury_defenses::detectors::{choose_tap, default_tap, Encoder, TapEncoder};
    let cases: [(&str, ModuleClassifier, &str); 4] = [
        ("cnn", native("cnn"), "fc1_relu"),
        ("cnn.onnx", onnx("cnn.onnx"), CNN_ONNX[4].1),
        ("mlp", native("mlp"), "fc2_relu"),
        ("mlp.onnx", onnx("mlp.onnx"), MLP_ONNX[1].1),
    ];
    for (what, clf, want) in cases {
        assert_eq!(default_tap(&clf).expect("a tap"), want, "{what}");
        assert_eq!(choose_tap(&clf, None).expect("a tap"), want, "{what}");
        assert_eq!(choose_tap(&clf, Some(want)).expect("a valid name"), want, "{what}");
    }
    let clf = onnx("cnn.onnx");
    let err = choose_tap(&clf, Some("fc1_relu")).expect_err("a native name on the ONNX model").to_string();
    assert!(
        err.contains("unknown layer 'fc1_relu'") && err.contains("valid layers") && err.contains(CNN_ONNX[4].1),
        "{err}"
    );
    let shared: Arc<dyn Classifier> = Arc::new(clf);
    let err = TapEncoder::new(shared.clone(), "fc1_relu").err().expect("unknown tap").to_string();
    assert!(err.contains(CNN_ONNX[4].1), "{err}");
    let enc = TapEncoder::default_for(shared).expect("default tap");
    assert_eq!(enc.layer(), CNN_ONNX[4].1);
    assert_eq!(enc.encode(&images().narrow(0, 0, 3).expect("3 images")).expect("encodes").dim(), (3, 128));
    // The zoo's head is a Gemm on the pooled features: the tap is an activation, not the logits' size.
    let zoo = onnx("zoo.onnx");
    assert_eq!(default_tap(&zoo).expect("a tap"), "view", "the flattened pooled features the Gemm reads");
}
