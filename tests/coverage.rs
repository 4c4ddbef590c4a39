//! Neuron coverage (`armoury::coverage`): hand-computed values on tiny activation sets, the incremental tracker
//! against the from-scratch definitions, streaming bounds, and the fixture cnn against an independent numpy
//! computation (`tests/fixtures/scripts/coverage_reference.py` → `coverage_reference.json`) on PyTorch's
//! activations and on Armoury's own taps of the native and the ONNX model.

use std::sync::Arc;

use armoury::coverage::{
    from_scratch, Bounds, ConvNeurons, CoverageConfig, CoverageValues, Metric, NeuronBatch, NeuronTaps, Tracker,
};
use armoury::io::{load_module, SafetensorsFile};
use armoury::onnx::OnnxModel;
use armoury::{Classifier, Module, ModuleClassifier, Tensor};
use ndarray::{array, Array2};
use rand::Rng;

use crate::common::fixture;

const CNN_LAYERS: [&str; 6] = ["conv1_relu", "pool1", "conv2_relu", "pool2", "fc1_relu", "fc2"];
const CNN_ONNX: [&str; 6] =
    ["/Relu_output_0", "/MaxPool_output_0", "/Relu_1_output_0", "/MaxPool_1_output_0", "/Relu_2_output_0", "logits"];

fn config() -> CoverageConfig {
    CoverageConfig { nc_threshold: 0.5, tknc_k: 1, kmnc_k: 4 }
}

/// Training range [0, 1], [0, 2], [0, 1] for three neurons of one dense layer.
fn tiny_bounds() -> Bounds {
    Bounds::from_batch(&NeuronBatch::dense(array![[0.0f32, 0.0, 0.0], [1.0, 2.0, 1.0]])).expect("bounds")
}

fn assert_values(got: CoverageValues, want: [f64; 5], what: &str) {
    let g = [got.nc, got.tknc, got.nbc, got.snac, got.kmnc];
    for (m, (a, b)) in Metric::ALL.iter().zip(g.iter().zip(want)) {
        assert!((a - b).abs() < 1e-12, "{what}: {} = {a}, expected {b}", m.name());
    }
}

/// Input A = [0.5, 2.5, −1]: layer min −1, max 2.5, so scaled [3/7, 1, 0] — NC covers neuron 1 (> 0.5); top-1 is
/// neuron 1; neuron 1 is above its maximum 2 (upper), neuron 2 below its minimum 0 (lower); KMNC (4 sections):
/// neuron 0 at 0.5 → section ⌊0.5 · 4⌋ = 2, the others are outside their range.
/// Input B = [1, 1, 0.25]: scaled [1, 1, 0] — NC adds neuron 0; the top-1 value 1 is tied, both count (adds
/// neuron 0); nothing outside the bounds; KMNC: neuron 0 at its maximum 1 → the last section 3 (closed),
/// neuron 1 at 1/2 of [0, 2] → 2, neuron 2 at 0.25 → 1: three new sections, four in all of 12.
#[test]
fn coverage_hand_computed_on_a_tiny_layer() {
    let bounds = tiny_bounds();
    let mut t = Tracker::new(&bounds, config()).expect("tracker");
    let a = NeuronBatch::dense(array![[0.5f32, 2.5, -1.0]]);
    let b = NeuronBatch::dense(array![[1.0f32, 1.0, 0.25]]);
    t.add(&a).expect("add A");
    assert_values(t.values(), [1.0 / 3.0, 1.0 / 3.0, 2.0 / 6.0, 1.0 / 3.0, 1.0 / 12.0], "after A");
    let g = t.gain(&b, 0).expect("gain of B");
    assert_eq!((g.nc, g.tknc, g.upper, g.lower, g.kmnc), (1, 1, 0, 0, 3));
    assert_eq!(t.inputs(), 1, "gain does not add");
    assert_values(t.values(), [1.0 / 3.0, 1.0 / 3.0, 2.0 / 6.0, 1.0 / 3.0, 1.0 / 12.0], "gain leaves A's values");
    assert!((t.delta(&g, Metric::Kmnc) - 3.0 / 12.0).abs() < 1e-15);
    t.commit(&b, 0).expect("commit B");
    assert_values(t.values(), [2.0 / 3.0, 2.0 / 3.0, 2.0 / 6.0, 1.0 / 3.0, 4.0 / 12.0], "after A and B");
    // A again adds nothing.
    assert_eq!(t.add(&a).expect("add A again")[0], Default::default());
    let both = NeuronBatch::dense(array![[0.5f32, 2.5, -1.0], [1.0, 1.0, 0.25]]);
    assert_values(
        from_scratch(&both, &bounds, config()).expect("from scratch"),
        [2.0 / 3.0, 2.0 / 3.0, 2.0 / 6.0, 1.0 / 3.0, 4.0 / 12.0],
        "from scratch",
    );
}

/// A constant layer output scales to 0 (NC never covers it), and a neuron whose training range has zero width
/// has no KMNC section to cover, though it can leave its range (NBC, SNAC).
#[test]
fn coverage_degenerate_layers_and_ranges() {
    let bounds = Bounds::from_batch(&NeuronBatch::dense(array![[0.0f32, 0.0], [0.0, 1.0]])).expect("bounds");
    let mut t = Tracker::new(&bounds, CoverageConfig { nc_threshold: 0.0, tknc_k: 2, kmnc_k: 10 }).expect("tracker");
    t.add(&NeuronBatch::dense(array![[0.0f32, 0.0], [0.3, 0.3]])).expect("add");
    let v = t.values();
    assert_eq!(v.nc, 0.0, "constant layer outputs scale to 0");
    assert_eq!(v.tknc, 1.0, "a layer of 2 ≤ k neurons: all are top-k");
    assert_eq!(v.kmnc, 2.0 / 20.0, "neuron 1: sections 0 and 3; neuron 0: none (zero width)");
    t.add(&NeuronBatch::dense(array![[0.5f32, 0.0]])).expect("add");
    assert_eq!((t.values().snac, t.values().nbc), (0.5, 0.25), "the zero-width neuron above its range");
    assert_eq!(t.values().nc, 0.5, "scaled [1, 0] > 0 for neuron 0");
}

fn random_batch(rng: &mut impl Rng, n: usize) -> NeuronBatch {
    // Two layers: a 4-channel conv [n, 4, 3, 3] and a dense [n, 5], with ties (values rounded to 0.25).
    let conv: Vec<f32> = (0..n * 36).map(|_| (rng.random_range(-4..8) as f32) * 0.25).collect();
    let dense: Vec<f32> = (0..n * 5).map(|_| (rng.random_range(-4..8) as f32) * 0.25).collect();
    let c = Tensor::from_vec(conv, &[n, 4, 3, 3]).expect("conv");
    let d = Tensor::from_vec(dense, &[n, 5]).expect("dense");
    NeuronBatch::from_taps(&[("conv", &c), ("dense", &d)], ConvNeurons::ChannelMean).expect("neurons")
}

/// Inputs added one batch at a time (of random sizes) give, after every batch, exactly the values of the
/// definitions computed from scratch over all inputs so far; the gains add up to the counts.
#[test]
fn coverage_incremental_equals_from_scratch() {
    let mut rng = armoury::seed::rng(11);
    let train = random_batch(&mut rng, 30);
    let bounds = Bounds::from_batch(&train).expect("bounds");
    assert_eq!(bounds.neurons(), 9);
    for cfg in [CoverageConfig::default(), CoverageConfig { nc_threshold: 0.3, tknc_k: 2, kmnc_k: 7 }] {
        let mut t = Tracker::new(&bounds, cfg).expect("tracker");
        let mut seen: Vec<NeuronBatch> = Vec::new();
        let mut kmnc_cells = 0;
        for _ in 0..8 {
            let size = rng.random_range(1..6);
            let b = random_batch(&mut rng, size);
            kmnc_cells += t.add(&b).expect("add").iter().map(|g| g.kmnc).sum::<usize>();
            seen.push(b);
            let all = concat(&seen);
            assert_eq!(t.values(), from_scratch(&all, &bounds, cfg).expect("from scratch"), "{cfg:?}");
        }
        assert_eq!(kmnc_cells as f64 / (9.0 * cfg.kmnc_k as f64), t.values().kmnc);
        assert!(t.values().nbc > 0.0 && t.values().kmnc > 0.0, "the random inputs cover something");
    }
}

fn concat(parts: &[NeuronBatch]) -> NeuronBatch {
    let cat = |f: fn(&NeuronBatch) -> &Array2<f32>| {
        let views: Vec<_> = parts.iter().map(|p| f(p).view()).collect();
        ndarray::concatenate(ndarray::Axis(0), &views).expect("same widths")
    };
    NeuronBatch {
        values: cat(|p| &p.values),
        layer_min: cat(|p| &p.layer_min),
        layer_max: cat(|p| &p.layer_max),
        layers: parts[0].layers.clone(),
    }
}

#[test]
fn coverage_rejects_bad_settings_and_mismatched_layers() {
    let bounds = tiny_bounds();
    for bad in [
        CoverageConfig { nc_threshold: 1.0, ..Default::default() },
        CoverageConfig { tknc_k: 0, ..Default::default() },
        CoverageConfig { kmnc_k: 0, ..Default::default() },
    ] {
        assert!(Tracker::new(&bounds, bad).is_err(), "{bad:?}");
    }
    let mut t = Tracker::new(&bounds, CoverageConfig::default()).expect("tracker");
    assert!(t.add(&NeuronBatch::dense(array![[0.0f32, 1.0]])).is_err(), "two neurons, not three");
    assert!(t.gain(&NeuronBatch::dense(array![[0.0f32, 1.0, 2.0]]), 1).is_err(), "row out of range");
    assert!("kmnc".parse::<Metric>().is_ok() && "KMNC".parse::<Metric>().is_ok() && "xyz".parse::<Metric>().is_err());
}

fn reference() -> SafetensorsFile {
    SafetensorsFile::open(fixture("reference.safetensors")).expect("reference fixture reads")
}

fn expected(mode: &str) -> (CoverageValues, usize) {
    let text = std::fs::read_to_string(fixture("coverage_reference.json")).expect("coverage_reference.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let m = &v[mode];
    let f = |k: &str| m[k].as_f64().expect("value");
    let values = CoverageValues { nc: f("nc"), tknc: f("tknc"), nbc: f("nbc"), snac: f("snac"), kmnc: f("kmnc") };
    (values, m["neurons"].as_u64().expect("neurons") as usize)
}

/// Bounds from images 0..8, coverage of 8..16, with NC at 0.1, TKNC top-3, KMNC k = 100 (the script's).
fn measure(train: &NeuronBatch, test: &NeuronBatch) -> CoverageValues {
    let bounds = Bounds::from_batch(train).expect("bounds");
    let mut t = Tracker::new(&bounds, CoverageConfig::default()).expect("tracker");
    t.add(test).expect("add");
    assert_eq!(t.values(), from_scratch(test, &bounds, CoverageConfig::default()).expect("from scratch"));
    t.values()
}

fn close(got: CoverageValues, want: CoverageValues, tol: f64, what: &str) {
    let g = [got.nc, got.tknc, got.nbc, got.snac, got.kmnc];
    let w = [want.nc, want.tknc, want.nbc, want.snac, want.kmnc];
    for (m, (a, b)) in Metric::ALL.iter().zip(g.iter().zip(w)) {
        assert!((a - b).abs() <= tol, "{what}: {} = {a}, numpy {b}", m.name());
    }
}

/// PyTorch's activations of the fixture images, through Armoury's coverage, give the numpy script's values.
#[test]
fn coverage_fixture_cnn_matches_numpy_on_pytorch_activations() {
    let file = reference();
    let acts: Vec<Tensor> =
        CNN_LAYERS.iter().map(|l| Tensor::new(file.f32(&format!("cnn.act.{l}")).expect("activation"))).collect();
    for (mode, conv) in [("channel_mean", ConvNeurons::ChannelMean), ("per_position", ConvNeurons::PerPosition)] {
        let part = |s: usize| {
            let t: Vec<Tensor> = acts.iter().map(|a| a.narrow(0, s, 8).expect("narrow")).collect();
            let named: Vec<(&str, &Tensor)> = CNN_LAYERS.iter().copied().zip(t.iter()).collect();
            NeuronBatch::from_taps(&named, conv).expect("neurons")
        };
        let (want, neurons) = expected(mode);
        let (train, test) = (part(0), part(8));
        assert_eq!(train.neurons(), neurons, "{mode}: neuron count");
        close(measure(&train, &test), want, 1e-12, mode);
    }
}

fn native_cnn() -> ModuleClassifier {
    let m = armoury::nn::cnn(0);
    load_module(&m, fixture("cnn.safetensors")).expect("fixture weights load");
    let m: Arc<dyn Module> = Arc::new(m);
    ModuleClassifier::new(m, &[1, 28, 28], 10, (0.0, 1.0)).expect("classifier")
}

/// Armoury's own taps (native model and ONNX export) give the numpy values on PyTorch's activations: the
/// activations agree within 1e-4, which moves no neuron across a threshold, bound or KMNC section here. Bounds
/// from the streaming pass (batches of 3) equal those of one batch.
#[test]
fn coverage_fixture_cnn_through_the_taps_of_native_and_onnx_models() {
    let x = Tensor::new(reference().f32("x").expect("x"));
    let (train_x, test_x) = (x.narrow(0, 0, 8).expect("train"), x.narrow(0, 8, 8).expect("test"));
    let onnx = OnnxModel::load(fixture("cnn.onnx")).expect("onnx").classifier((0.0, 1.0)).expect("classifier");
    let native = native_cnn();
    let models: [(&str, &dyn Classifier, [&str; 6]); 2] = [("native", &native, CNN_LAYERS), ("onnx", &onnx, CNN_ONNX)];
    for (name, model, layers) in models {
        let taps = NeuronTaps::new(&layers);
        let bounds = Bounds::fit(model, &taps, &train_x, 3).expect("streaming bounds");
        let (train, _) = taps.read(model, &train_x).expect("read");
        let whole = Bounds::from_batch(&train).expect("bounds");
        assert_eq!((&bounds.low, &bounds.high, bounds.samples), (&whole.low, &whole.high, 8), "{name}");
        let (test, logits) = taps.read(model, &test_x).expect("read test");
        assert_eq!(logits, model.logits(&test_x).expect("logits"), "{name}: the taps' logits");
        let mut t = Tracker::new(&bounds, CoverageConfig::default()).expect("tracker");
        t.add(&test).expect("add");
        close(t.values(), expected("channel_mean").0, 1e-12, name);
    }
}
