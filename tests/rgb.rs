//! RGB data for RGB models (`armoury::load`): image folders fitted to the model's input as torchvision evaluates
//! (shorter side resized, the centre cut out), `train/` + `val/` splits or evaluation images alone, class folders
//! matched to the model's classes by name, and the errors that keep a wrong label set from giving a figure.

use std::path::{Path, PathBuf};

use armoury::data::{is_image_folder, load_image_folder_set, ImageFolderOptions};
use armoury::load::{load_data, load_data_for, load_model, ModelChoice};
use armoury::Classifier;

use crate::common::fixture;

/// A fresh directory under the system's temporary directory.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("armoury-rgb-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `n` images of `w×h` in `dir/class`, image `i` a flat colour (10·i + 1, 100, 200): a resize leaves it exact.
fn flat_images(dir: &Path, class: &str, n: u32, (w, h): (u32, u32)) {
    let d = dir.join(class);
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..n {
        let img = image::RgbImage::from_pixel(w, h, image::Rgb([(10 * i + 1) as u8, 100, 200]));
        img.save(d.join(format!("{i:03}.png"))).unwrap();
    }
}

/// The ten CIFAR-10 class names in the zoo model's output order.
fn cifar_names() -> Vec<String> {
    ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
        .map(String::from)
        .to_vec()
}

#[test]
fn image_folders_are_fitted_to_the_models_input() {
    let root = scratch("fit");
    for split in ["train", "val"] {
        flat_images(&root.join(split), "cat", 2, (48, 40));
        flat_images(&root.join(split), "dog", 3, (40, 60));
    }
    assert!(is_image_folder(&root) && is_image_folder(&root.join("val")));
    assert!(!is_image_folder(&root.join("val").join("cat")), "a folder of images is one class, not a data set");
    let zoo = ModelChoice::Onnx(fixture("zoo.onnx"));
    let input = zoo.input_shape().unwrap();
    assert_eq!(input, Some([3, 32, 32]));
    // Shorter side round(32·8/7) = 37 (48×40 → 44×37, 40×60 → 37×55), then the 32×32 centre.
    let set = load_data_for(Some(&root), input, None).unwrap();
    assert!(set.has_train);
    assert_eq!((set.train.len(), set.test.len()), (5, 5));
    assert_eq!(set.test.image_shape(), [3, 32, 32]);
    assert_eq!(set.test.labels(), &[0, 0, 1, 1, 1]);
    assert_eq!(set.class_names.as_deref(), Some(&["cat".to_string(), "dog".to_string()][..]));
    let px = set.test.image(3).unwrap();
    assert_eq!((px[0], px[1024], px[2048]), (11.0 / 255.0, 100.0 / 255.0, 200.0 / 255.0), "flat colours stay exact");
    // Grey models get luma; an explicit resize is the shorter side.
    let grey = load_data_for(Some(&root), Some([1, 28, 28]), Some(28)).unwrap();
    assert_eq!(grey.test.image_shape(), [1, 28, 28]);
    assert!(load_data_for(Some(&root), Some([2, 28, 28]), None).unwrap_err().to_string().contains("1 (grey) or 3"));
    // Without the model's shape, image folders load as stored, and these differ in size.
    assert!(load_data(Some(&root)).is_err());
    // train/ without val/ or test/ is refused.
    let lone = scratch("lone");
    flat_images(&lone.join("train"), "cat", 1, (32, 32));
    assert!(load_data_for(Some(&lone), input, None).unwrap_err().to_string().contains("no val/ or test/"));
}

#[test]
fn evaluation_images_alone_refuse_every_fit_and_mismatched_classes() {
    let root = scratch("alone");
    flat_images(&root, "cat", 2, (32, 32));
    flat_images(&root, "frog", 2, (32, 32));
    let set = load_image_folder_set(&root, ImageFolderOptions::default()).unwrap();
    assert!(!set.has_train);
    assert!(set.source.contains("evaluation images only"), "{}", set.source);
    let err = set.training("fitting the detectors").unwrap_err().to_string();
    assert!(err.contains("fitting the detectors needs training images") && err.contains("train/ and val/"), "{err}");
    // Two class folders for a ten-class model: the folders' positions (0, 1) are not its classes.
    let zoo = ModelChoice::Onnx(fixture("zoo.onnx"));
    let err = load_model(&zoo, None, (0.0, 1.0), &set, 0, &mut ()).err().expect("refused").to_string();
    assert!(err.contains("2 class folders") && err.contains("10 classes") && err.contains("by name"), "{err}");
    // Matched by name: cat is the model's class 3, frog 6.
    let named = set.relabel_by_name(&cifar_names()).unwrap();
    assert_eq!(named.test.labels(), &[3, 3, 6, 6]);
    assert_eq!(named.test.num_classes(), 10);
    let (_, clf) = load_model(&zoo, None, (0.0, 1.0), &named, 0, &mut ()).unwrap();
    assert_eq!(clf.num_classes(), 10);
    let mut wrong = cifar_names();
    wrong[6] = "toad".into();
    let err = set.relabel_by_name(&wrong).unwrap_err().to_string();
    assert!(err.contains("class 'frog'") && err.contains("not one of the model's 10 classes"), "{err}");
}

/// Detectors and coverage that read activations find an ONNX model's taps by node name: LID and Mahalanobis on
/// the default layers of the RGB zoo model score every input (finite, the same twice), and NC over those taps
/// equals a count made here from the raw activations.
#[test]
fn detectors_and_coverage_read_an_onnx_models_taps_by_name() {
    use std::sync::Arc;

    use armoury::coverage::{CoverageConfig, NeuronTaps, Tracker};
    use armoury::{Detector, Tensor};
    use armoury_defenses::detectors::{Lid, Mahalanobis};
    use armoury_defenses::registry::default_layers;

    let model = armoury::onnx::OnnxModel::load(fixture("zoo.onnx")).unwrap();
    let clf: Arc<dyn Classifier> = Arc::new(model.classifier((0.0, 1.0)).unwrap());
    let layers = default_layers(clf.as_ref());
    let names = clf.layer_names();
    assert_eq!(layers.len(), 4, "{layers:?}");
    assert!(layers.iter().all(|l| names.contains(l)), "{layers:?} are taps of {names:?}");
    assert_eq!(layers.last().map(String::as_str), names.last().map(String::as_str), "the output is read");
    let pixels: Vec<f32> = (0..24 * 3072).map(|k| ((k * 37 + k / 3072 * 101) % 256) as f32 / 255.0).collect();
    let x = Tensor::from_vec(pixels, &[24, 3, 32, 32]).unwrap();
    let (reference, probe) = (x.narrow(0, 0, 16).unwrap(), x.narrow(0, 16, 8).unwrap());
    let ref_y = clf.predict(&reference).unwrap();
    let l: Vec<&str> = layers.iter().map(String::as_str).collect();
    let mut detectors: Vec<Box<dyn Detector>> = vec![
        Box::new(Lid::new(clf.clone(), &l, 5, &reference).unwrap()),
        Box::new(Mahalanobis::new(clf.clone(), &l, &reference, &ref_y, 1e-3).unwrap()),
    ];
    for d in &mut detectors {
        d.fit(&reference, 0.05).unwrap();
        let s = d.score(&probe).unwrap();
        assert_eq!(s.len(), 8);
        assert!(s.iter().all(|v| v.is_finite()), "{s:?}");
        assert_eq!(s, d.score(&probe).unwrap(), "deterministic");
    }
    // NC (threshold 0.1): a channel-mean neuron is covered when, for some input, its value scaled by the min and
    // max over every element of its layer for that input exceeds 0.1.
    let taps = NeuronTaps::new(&layers);
    let bounds = armoury::coverage::Bounds::fit(clf.as_ref(), &taps, &reference, 8).unwrap();
    let mut tracker = Tracker::new(&bounds, CoverageConfig::default()).unwrap();
    tracker.add(&taps.read(clf.as_ref(), &probe).unwrap().0).unwrap();
    let acts = clf.activations(&probe, &l).unwrap();
    let (mut covered, mut neurons) = (0usize, 0usize);
    for (_, t) in &acts.layers {
        let v = t.value();
        let per_input: Vec<Vec<f32>> = v.outer_iter().map(|a| a.iter().copied().collect()).collect();
        let channels = t.shape()[1];
        let plane = per_input[0].len() / channels;
        let mut hit = vec![false; channels];
        for a in &per_input {
            let (lo, hi) = a.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &e| (l.min(e), h.max(e)));
            for (c, hit) in hit.iter_mut().enumerate() {
                let mean = a[c * plane..(c + 1) * plane].iter().sum::<f32>() / plane as f32;
                *hit |= hi > lo && (mean - lo) / (hi - lo) > 0.1;
            }
        }
        covered += hit.iter().filter(|&&h| h).count();
        neurons += channels;
    }
    assert_eq!(tracker.neurons(), neurons);
    assert!(
        (tracker.values().nc - covered as f64 / neurons as f64).abs() < 1e-12,
        "{} vs {covered}/{neurons}",
        tracker.values().nc
    );
}

/// `--normalize` puts torchvision's Normalize inside the model: logits are the bare model's on (x − mean) / std
/// computed here, the input gradient is the bare model's divided by each channel's std (the chain rule), the
/// model's parameter names and taps are unchanged, and the statistics are buffers of the model's identity.
#[test]
fn normalisation_sits_inside_the_model() {
    use armoury::data::{Dataset, TrainTest};
    use armoury::load::{load_model_with, Normalization};
    use armoury::nn::ModuleExt;
    use armoury::Tensor;

    assert_eq!("ImageNet".parse::<Normalization>().unwrap(), Normalization::imagenet());
    let n: Normalization = "0.5, 0.25,0/0.5,0.25,2".parse().unwrap();
    assert_eq!((n.mean.clone(), n.std.clone()), (vec![0.5, 0.25, 0.0], vec![0.5, 0.25, 2.0]));
    for bad in ["0.5/0", "1,2", "0.5,0.5/0.5", "a/b"] {
        assert!(bad.parse::<Normalization>().is_err(), "{bad}");
    }
    let pixels: Vec<f32> = (0..4 * 3072).map(|k| ((k * 53 + 7) % 256) as f32 / 255.0).collect();
    let x = Tensor::from_vec(pixels.clone(), &[4, 3, 32, 32]).unwrap();
    let d = Dataset::new(x.clone(), vec![1, 2, 3, 4], 10).unwrap();
    let set = TrainTest::new(d.clone(), d, "t", "made here").unwrap();
    let zoo = ModelChoice::Onnx(fixture("zoo.onnx"));
    let (module, clf) = load_model_with(&zoo, None, (0.0, 1.0), Some(&n), &set, 0, &mut ()).unwrap();
    let (bare_module, bare) = load_model(&zoo, None, (0.0, 1.0), &set, 0, &mut ()).unwrap();
    let normalised: Vec<f32> =
        pixels.iter().enumerate().map(|(k, &v)| (v - n.mean[k / 1024 % 3]) / n.std[k / 1024 % 3]).collect();
    let xn = Tensor::from_vec(normalised, &[4, 3, 32, 32]).unwrap();
    let (a, b) = (clf.logits(&x).unwrap(), bare.logits(&xn).unwrap());
    let diff = a.iter().zip(b.iter()).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
    assert!(diff < 1e-4, "logits differ by {diff}");
    let y = [1, 2, 3, 4];
    let (_, g) = clf.loss_gradient(&x, &y).unwrap();
    let (_, gn) = bare.loss_gradient(&xn, &y).unwrap();
    let (g, gn) = (g.value(), gn.value());
    for (k, (p, q)) in g.iter().zip(gn.iter()).enumerate() {
        let want = q / n.std[k / 1024 % 3];
        assert!((p - want).abs() <= 1e-4 * (1.0 + want.abs()), "gradient {k}: {p} vs {want}");
    }
    let names: Vec<String> = module.named_params().into_iter().map(|(s, _)| s).collect();
    let bare_names: Vec<String> = bare_module.named_params().into_iter().map(|(s, _)| s).collect();
    assert_eq!(names[..bare_names.len()], bare_names[..]);
    assert_eq!(names[bare_names.len()..], ["normalize.mean".to_string(), "normalize.std".to_string()]);
    assert_eq!(module.tap_names(), bare_module.tap_names());
    // Three means for a one-channel model's data: refused when it runs, not silently broadcast.
    let fm = armoury::data::sample().unwrap();
    let cnn = ModelChoice::Reference(armoury::nn::ReferenceModel::Cnn);
    let w = fixture("cnn.safetensors");
    assert!(load_model_with(&cnn, Some(&w), (0.0, 1.0), Some(&n), &fm, 0, &mut ()).is_err());
}
