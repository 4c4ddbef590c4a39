//! `armoury::profile`: every graph step and every backward op of a pass is counted, under the names the
//! importer and the fuser give them, and nothing is recorded outside `record`.
//!
//! A recording counts every pass in the process while it runs, and the other tests of this binary run at the same
//! time (some on the same fixture), so the counts below are of this test's own entries: its batch of 7, a size no
//! other test uses, is the first dimension of each.

use armoury::onnx::OnnxModel;
use armoury::profile::{record, Phase, Profile};
use armoury::{Classifier, Tensor};

fn resnet() -> armoury::ModuleClassifier {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/zoo/resnet18_ts17.onnx");
    OnnxModel::load(path).unwrap().classifier((0.0, 1.0)).unwrap()
}

const BATCH: usize = 7;

/// The entries of this test's passes: those whose input has its batch first.
fn own(mut p: Profile) -> Profile {
    p.entries.retain(|e| e.input.first() == Some(&BATCH));
    p
}

#[test]
fn counts_every_step_and_backward_op_of_a_pass() {
    let clf = resnet();
    let x = Tensor::new(ndarray::ArrayD::<f32>::from_elem(vec![BATCH, 3, 32, 32], 0.5));
    let (logits, p) = record(|| clf.logits(&x));
    logits.unwrap();
    let p = own(p);
    assert!(p.entries.iter().all(|e| e.phase == Phase::Forward && e.calls > 0 && e.ms >= 0.0));
    // The fixture's basic blocks: the stem and each block's first conv run fused with their ReLU, each block's
    // residual add and the ReLU after it in the convolution before the add; 8 blocks of two convs, a stem and 3
    // projections: 20 convs in all.
    let calls = |op: &str| p.entries.iter().filter(|e| e.op == op).map(|e| e.calls).sum::<usize>();
    assert_eq!(calls("Conv+Add+Relu"), 8, "{:?}", p.by_op(Phase::Forward));
    assert_eq!(calls("Add+Relu"), 0, "{:?}", p.by_op(Phase::Forward));
    assert_eq!(calls("Conv+Relu") + calls("Conv") + calls("Conv+Add+Relu"), 20, "{:?}", p.by_op(Phase::Forward));
    let gemm = p.entries.iter().find(|e| e.op == "Gemm").expect("the classifier head");
    assert_eq!((gemm.input.len(), gemm.output.as_slice()), (2, &[BATCH, 10][..]));
    let (_, p) = record(|| clf.loss_gradient(&x, &[0, 1, 2, 3, 4, 5, 6]).unwrap());
    let p = own(p);
    let backward = p.by_op(Phase::Backward);
    let names: Vec<&str> = backward.iter().map(|(op, _)| op.as_str()).collect();
    assert!(["conv2d_relu", "conv2d", "conv2d_add_relu"].iter().all(|n| names.contains(n)), "{names:?}");
    let convs: usize =
        p.entries.iter().filter(|e| e.phase == Phase::Backward && e.op.starts_with("conv2d")).map(|e| e.calls).sum();
    assert_eq!(convs, 20);
    assert!(p.total_ms(Phase::Backward) > 0.0 && p.total_ms(Phase::Forward) > 0.0);
    // Outside a recording nothing is kept: the next recording starts without this test's entries.
    clf.logits(&x).unwrap();
    let (_, p) = record(|| ());
    assert!(own(p).entries.is_empty());
}
