//! The bodies of Armoury's fuzz targets, shared by the cargo-fuzz binaries (`fuzz/fuzz_targets/*.rs`) and by the
//! test that replays the corpora and the minimised crashers (`tests/reliability.rs`). Each takes any bytes and
//! must return: every reader answers an input with a value or a typed error, never a panic, an abort, an
//! allocation beyond the budget or a hang. See docs/reliability.md.

use std::io::Write;
use std::path::{Path, PathBuf};

use armoury::data::{load_image_folder, Idx, ImageFolderOptions};
use armoury::io::{load_module_from, SafetensorsFile};
use armoury::onnx::{LoadOptions, OnnxModel};
use armoury::{Classifier, Module, Tensor};

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// The targets by name (the names of `fuzz/fuzz_targets/<name>.rs`, `fuzz/corpus/<name>/` and
/// `tests/fixtures/crashers/<name>/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("idx", idx),
    ("idx_gzip", idx_gzip),
    ("safetensors", safetensors),
    ("onnx", onnx),
    ("image_folder", image_folder),
    ("threat_model", threat_model),
    ("fuzz_config", fuzz_config),
];

/// The memory budget the fuzz binaries run with ([`armoury::limits::set_max_memory`]) and ONNX models are
/// loaded with: far below the machine's memory, so an input that gets past a check shows up as an abort.
pub const BUDGET: u64 = 256 << 20;

/// Sets the process-wide budget to [`BUDGET`] (the fuzz binaries call it once).
pub fn init() {
    armoury::limits::set_max_memory(BUDGET);
}

/// IDX bytes (plain, or gzip when they start with the gzip magic): decoded, converted to images and labels,
/// re-encoded and decoded again.
pub fn idx(data: &[u8]) {
    let src = Path::new("<fuzz idx>");
    if let Ok(idx) = Idx::decode(data, src) {
        let _ = idx.to_images(src);
        let _ = idx.to_labels(src);
        // Compared as bytes: a float file may hold NaNs, which are never equal as values.
        let bytes = idx.encode();
        let again = Idx::decode(&bytes, src).expect("an encoded IDX file decodes");
        assert_eq!(again.encode(), bytes, "IDX round trip");
    }
}

/// The input gzip-compressed (one member, or two when the first byte is odd), so that mutations reach the IDX
/// parser behind the decoder, then through [`idx`].
pub fn idx_gzip(data: &[u8]) {
    let split = if data.first().is_some_and(|b| b % 2 == 1) { data.len() / 2 } else { data.len() };
    let mut gz = Vec::new();
    for part in [&data[..split], &data[split..]] {
        if part.is_empty() && !gz.is_empty() {
            continue;
        }
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(part).expect("writing to a Vec");
        gz.extend(e.finish().expect("writing to a Vec"));
    }
    idx(&gz);
}

/// A safetensors file: every tensor read in every form, and loaded into a small native model.
pub fn safetensors(data: &[u8]) {
    let Ok(f) = SafetensorsFile::from_bytes(data.to_vec(), "<fuzz safetensors>") else { return };
    for n in f.names() {
        let _ = f.shape(&n);
        let _ = f.dtype(&n);
        let _ = f.f32(&n);
        let _ = f.i64(&n);
    }
    let _ = f.tensors();
    let _ = f.metadata();
    let model = armoury::nn::Sequential::new().add("fc", armoury::nn::Linear::new(4, 3, true, 0));
    let _ = load_module_from(&model, &f);
}

/// An ONNX model: loaded within [`BUDGET`], then (when its input is small) a forward pass, the gradient of the
/// summed output with respect to the input and to the parameters, and the classifier view's predictions.
pub fn onnx(data: &[u8]) {
    let options = LoadOptions { max_memory: BUDGET, batch_size: 2 };
    let Ok(model) = OnnxModel::from_bytes_with(data, options) else { return };
    let mut shape: Vec<usize> =
        model.input_dims().iter().enumerate().map(|(i, d)| d.unwrap_or(if i == 0 { 2 } else { 1 })).collect();
    if shape.is_empty() {
        shape = vec![2, 4];
    }
    if armoury::limits::checked_numel("fuzz input", &shape).map_or(true, |n| n > 1 << 16) {
        return;
    }
    let x = Tensor::full(&shape, 0.5).variable();
    if let Ok(y) = model.forward_t(&x, false) {
        let s = y.sum_all();
        let _ = s.grad_wrt(&[&x]);
        let _ = s.backward();
    }
    if let Ok(clf) = model.classifier((0.0, 1.0)) {
        let _ = clf.predict(&x.detach());
        let _ = clf.loss_gradient(&x.detach(), &vec![0; shape[0]]);
    }
}

/// An image folder of two classes, the input split into one image file per class; the first byte picks the
/// options (resize or not, grey or RGB).
pub fn image_folder(data: &[u8]) {
    let Some((&opt, rest)) = data.split_first() else { return };
    let dir = scratch_dir();
    let half = rest.len() / 2;
    for (class, bytes) in [("a", &rest[..half]), ("b", &rest[half..])] {
        let d = dir.join(class);
        std::fs::create_dir_all(&d).expect("creating the scratch folder");
        std::fs::write(d.join(if opt & 4 == 0 { "0.png" } else { "0.jpg" }), bytes).expect("writing the scratch file");
    }
    let options = ImageFolderOptions {
        size: (opt & 1 == 1).then_some((8, 8)),
        channels: if opt & 2 == 0 { 1 } else { 3 },
        ..Default::default()
    };
    let _ = load_image_folder(&dir, options);
    for class in ["a", "b"] {
        let _ = std::fs::remove_dir_all(dir.join(class));
    }
}

/// A threat model (JSON): parsed and checked; one that parses hashes, names its norm, checks bounds against [0, 1],
/// and survives a round trip through its own JSON with the same hash.
pub fn threat_model(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(tm) = armoury::eval::ThreatModel::from_json(text) else { return };
    let hash = tm.hash();
    tm.norm().expect("a checked threat model has a norm");
    let _ = tm.check_bounds((0.0, 1.0));
    let again = serde_json::to_string(&tm).expect("a threat model serialises");
    let back = armoury::eval::ThreatModel::from_json(&again).expect("a threat model's own JSON parses");
    assert_eq!(back.hash(), hash, "threat model round trip");
}

/// A fuzzer mutation configuration (JSON): parsed; one that parses draws every method's parameters a few times
/// and lists its attacks.
pub fn fuzz_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = armoury::fuzz::config::MutationConfig::from_json(text) else { return };
    let mut rng = armoury::seed::rng(0);
    for m in &config.methods {
        for _ in 0..4 {
            let p = m.draw(&mut rng);
            assert!(p.iter().all(|v| v.is_finite()), "{:?} drew {p:?}", m.method);
        }
    }
    let _ = config.attack_names();
}

/// A folder of this process and thread under the temporary directory.
fn scratch_dir() -> PathBuf {
    let id = format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_ascii_alphanumeric(), "");
    std::env::temp_dir().join(format!("armoury-fuzz-{}-{id}", std::process::id()))
}
