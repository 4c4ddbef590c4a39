//! Models and data by spec (`armoury::load`): the spec's forms, and the number of classes from the model's
//! output width — never from the largest label of the data.

use std::path::PathBuf;

use armoury::data::{Dataset, TrainTest};
use armoury::load::{load_model, output_classes, parse_bounds, ModelChoice, ModelSpec};
use armoury::nn::ReferenceModel;
use armoury::train::{EpochReport, TrainCallback};
use armoury::Classifier;

use crate::common::fixture;

#[test]
fn load_specs_parse() {
    let spec: ModelSpec = "cnn".parse().unwrap();
    assert_eq!(spec, ModelSpec { model: ModelChoice::Reference(ReferenceModel::Cnn), weights: None });
    let spec: ModelSpec = "mlp".parse().unwrap();
    assert_eq!(spec.model, ModelChoice::Reference(ReferenceModel::Mlp));
    let spec: ModelSpec = "dir/net.onnx".parse().unwrap();
    assert_eq!(spec.model, ModelChoice::Onnx(PathBuf::from("dir/net.onnx")));
    assert_eq!(spec.model.name(), "dir/net.onnx");
    let spec: ModelSpec = "w/cnn-pgd.safetensors".parse().unwrap();
    assert_eq!(spec.model, ModelChoice::Reference(ReferenceModel::Cnn));
    assert_eq!(spec.weights, Some(PathBuf::from("w/cnn-pgd.safetensors")));
    assert!("resnet".parse::<ModelSpec>().is_err());
    assert_eq!(parse_bounds(" -1, 1").unwrap(), (-1.0, 1.0));
    assert!(parse_bounds("0;1").is_err() && parse_bounds("0,x").is_err());
    assert!(ModelChoice::Reference(ReferenceModel::Cnn).graph_bytes().unwrap().is_empty());
    let onnx = ModelChoice::Onnx(fixture("cnn.onnx"));
    assert_eq!(onnx.graph_bytes().unwrap(), std::fs::read(fixture("cnn.onnx")).unwrap());
}

/// The sample's splits relabelled by `relabel` and declared with the largest label + 1 classes, as an IDX
/// directory's would be.
fn relabelled(relabel: &dyn Fn(usize, usize) -> usize) -> TrainTest {
    let set = armoury::data::sample().unwrap();
    let split = |d: &Dataset| {
        let labels: Vec<usize> = d.labels().iter().enumerate().map(|(i, &l)| relabel(i, l)).collect();
        let k = labels.iter().max().unwrap() + 1;
        Dataset::new(d.images().clone(), labels, k).unwrap()
    };
    TrainTest::new(split(&set.train), split(&set.test), "relabelled", "test").unwrap()
}

#[test]
fn load_classes_come_from_the_model_not_the_labels() {
    // No class 9 anywhere: the data declare 9 classes, the model has 10.
    let set = relabelled(&|_, l| if l == 9 { 0 } else { l });
    assert_eq!(set.test.num_classes(), 9);
    let cnn = ModelChoice::Reference(ReferenceModel::Cnn);
    let weights = fixture("cnn.safetensors");
    let (module, clf) = load_model(&cnn, Some(&weights), (0.0, 1.0), &set, 0, &mut ()).unwrap();
    assert_eq!(clf.num_classes(), 10);
    assert_eq!(output_classes(module.as_ref(), [1, 28, 28]).unwrap(), 10);
    let (x, _) = set.test.batch(0..8).unwrap();
    assert_eq!(clf.logits(&x).unwrap().shape(), &[8, 10]);
    let onnx = ModelChoice::Onnx(fixture("cnn.onnx"));
    let (_, clf) = load_model(&onnx, None, (0.0, 1.0), &set, 0, &mut ()).unwrap();
    assert_eq!(clf.num_classes(), 10, "an ONNX model's output width");
}

#[test]
fn load_a_label_outside_the_models_classes_is_an_error_naming_it() {
    // A stray label 255 in test sample 3: the data declare 256 classes; the model has 10.
    let set = relabelled(&|i, l| if i == 3 { 255 } else { l });
    assert_eq!(set.test.num_classes(), 256);
    let cnn = ModelChoice::Reference(ReferenceModel::Cnn);
    let weights = fixture("cnn.safetensors");
    let err = load_model(&cnn, Some(&weights), (0.0, 1.0), &set, 0, &mut ()).err().expect("refused").to_string();
    assert!(err.contains("sample 3") && err.contains("255") && err.contains("10 classes"), "{err}");
    let err = set.test.check_labels(10, "test").unwrap_err().to_string();
    assert!(err.contains("test sample 3 has label 255"), "{err}");
    assert!(set.test.check_labels(256, "test").is_ok());
}

#[derive(Default)]
struct Epochs(usize);

impl TrainCallback for Epochs {
    fn on_epoch(&mut self, _: &EpochReport) {
        self.0 += 1;
    }
}

/// Without weights a reference model is trained with the reference recipe (3 epochs), reporting to the
/// caller's callback.
#[test]
fn load_trains_a_reference_model_without_weights() {
    let mut set = armoury::data::sample().unwrap();
    set.train = set.train.take(256).unwrap();
    let mut epochs = Epochs::default();
    let mlp = ModelChoice::Reference(ReferenceModel::Mlp);
    let (_, clf) = load_model(&mlp, None, (0.0, 1.0), &set, 0, &mut epochs).unwrap();
    assert_eq!((epochs.0, clf.num_classes()), (3, 10));
}

/// The trainer and its evaluation take the classes from the model too: a training set without class 9 trains
/// and evaluates a ten-class model (a 10×10 confusion matrix), and a stray label is an error naming it.
#[test]
fn load_training_takes_the_classes_from_the_model() {
    use armoury::optim::{Adam, AdamConfig};
    use armoury::train::{evaluate, fit, TrainConfig};
    let mut set = relabelled(&|_, l| if l == 9 { 0 } else { l });
    set.train = set.train.take(256).unwrap();
    assert_eq!(set.train.num_classes(), 9);
    let net = armoury::nn::cnn(0);
    armoury::io::load_module(&net, fixture("cnn.safetensors")).unwrap();
    let mut opt = Adam::new(armoury::ModuleExt::parameters(&net), AdamConfig::default()).unwrap();
    let cfg = TrainConfig { epochs: 1, ..Default::default() };
    let reports = fit(&net, &mut opt, &set.train, Some(&set.test), &cfg, &mut ()).unwrap();
    let test = reports[0].test.as_ref().unwrap();
    assert_eq!(test.confusion.dim(), (10, 10));
    assert_eq!(evaluate(&net, &set.test, 100).unwrap().confusion.dim(), (10, 10));
    let stray = relabelled(&|i, l| if i == 5 { 255 } else { l });
    let err = fit(&net, &mut opt, &stray.train.take(64).unwrap(), None, &cfg, &mut ()).unwrap_err().to_string();
    assert!(err.contains("training sample 5 has label 255"), "{err}");
    let err = evaluate(&net, &stray.test, 100).unwrap_err().to_string();
    assert!(err.contains("evaluation sample 5 has label 255"), "{err}");
}

/// Data of another shape than the model takes is refused at load, in the user's terms — for a reference model
/// and for an ONNX model's declared input — and CIFAR directories load through the same call.
#[test]
fn load_refuses_data_of_another_shape_naming_both() {
    let dir = std::env::temp_dir().join(format!("armoury-load-cifar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let record = |label: u8| std::iter::once(label).chain((0..3072).map(|i| (i % 251) as u8)).collect::<Vec<u8>>();
    std::fs::write(dir.join("data_batch_1.bin"), [record(1), record(2)].concat()).unwrap();
    std::fs::write(dir.join("test_batch.bin"), [record(3)].concat()).unwrap();
    let set = armoury::load::load_data(Some(&dir)).unwrap();
    assert_eq!((set.name.as_str(), set.test.image_shape()), ("cifar-10", [3, 32, 32]));
    for choice in [ModelChoice::Reference(ReferenceModel::Cnn), ModelChoice::Onnx(fixture("cnn.onnx"))] {
        let err = load_model(&choice, None, (0.0, 1.0), &set, 0, &mut ()).err().expect("refused").to_string();
        assert!(err.contains("expects 1×28×28 images; the data are 3×32×32"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(armoury::load::load_data(Some(std::path::Path::new("sample"))).unwrap().name, "fashion-mnist-sample");
}
