//! `armoury::profile`: every graph step and every backward op of a pass is counted, under the names the
//! importer and the fuser give them, and nothing is recorded outside `record`.

use armoury::onnx::OnnxModel;
use armoury::profile::{record, Phase};
use armoury::{Classifier, Tensor};

fn resnet() -> armoury::ModuleClassifier {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/zoo/resnet18_ts17.onnx");
    OnnxModel::load(path).unwrap().classifier((0.0, 1.0)).unwrap()
}

#[test]
fn counts_every_step_and_backward_op_of_a_pass() {
    let clf = resnet();
    let x = Tensor::new(ndarray::ArrayD::<f32>::from_elem(vec![2, 3, 32, 32], 0.5));
    let (logits, p) = record(|| clf.logits(&x));
    logits.unwrap();
    assert!(p.entries.iter().all(|e| e.phase == Phase::Forward && e.calls > 0 && e.ms >= 0.0));
    // The fixture's basic blocks: the stem and each block's first conv run fused with their ReLU, each residual
    // add with the ReLU after it; 8 blocks of two convs, a stem and 3 projections: 20 convs in all.
    let calls = |op: &str| p.entries.iter().filter(|e| e.op == op).map(|e| e.calls).sum::<usize>();
    assert_eq!(calls("Add+Relu"), 8, "{:?}", p.by_op(Phase::Forward));
    assert_eq!(calls("Conv+Relu") + calls("Conv"), 20, "{:?}", p.by_op(Phase::Forward));
    let gemm = p.entries.iter().find(|e| e.op == "Gemm").expect("the classifier head");
    assert_eq!((gemm.input.len(), gemm.output.as_slice()), (2, &[2, 10][..]));
    let (_, p) = record(|| clf.loss_gradient(&x, &[0, 1]).unwrap());
    let backward = p.by_op(Phase::Backward);
    let names: Vec<&str> = backward.iter().map(|(op, _)| op.as_str()).collect();
    assert!(names.contains(&"conv2d_relu") && names.contains(&"conv2d"), "{names:?}");
    let convs: usize =
        p.entries.iter().filter(|e| e.phase == Phase::Backward && e.op.starts_with("conv2d")).map(|e| e.calls).sum();
    assert_eq!(convs, 20);
    assert!(p.total_ms(Phase::Backward) > 0.0 && p.total_ms(Phase::Forward) > 0.0);
    // Outside a recording nothing is kept: the next recording starts empty.
    clf.logits(&x).unwrap();
    let (_, p) = record(|| ());
    assert!(p.entries.is_empty());
}
