//! Shared property checks for any attack (feasibility, honest success flags, determinism, zero budget), the
//! small models they run on, and the gradient-fault reports of every white-box attack.
#![allow(dead_code)]

use armoury::nn::{cnn, Flatten, Linear, Module, ReLU, Sequential};
use armoury::{io, Attack, AttackResult, Classifier, Goal, ModuleClassifier, Tensor};
use armoury_attacks::{
    Apgd, ApgdTargeted, CarliniWagnerL2, DeepFool, ElasticNet, Jsma, LbfgsB, Llc, Loss, Norm, Pgd, RFgsm,
    VarianceTuning,
};

/// A tiny seeded MLP on [N,1,4,4] inputs in [0,1] with 3 classes.
pub fn tiny_model(seed: u64) -> ModuleClassifier {
    let net = Sequential::new()
        .add("flatten", Flatten)
        .add("fc1", Linear::new(16, 12, true, seed))
        .add("relu", ReLU)
        .add("fc2", Linear::new(12, 3, true, seed + 2));
    ModuleClassifier::new(net, &[1, 4, 4], 3, (0.0, 1.0)).unwrap()
}

/// An analytic linear model f(x) = Wx + b on [N,1,4,4] with wide bounds (the box never binds).
pub fn linear_model(seed: u64, bounds: (f32, f32)) -> (ModuleClassifier, Tensor, Tensor) {
    let fc = Linear::new(16, 3, true, seed);
    let (w, b) = (fc.weight.tensor().detach(), fc.bias.as_ref().unwrap().tensor().detach());
    let net = Sequential::new().add("flatten", Flatten).add("fc", fc);
    (ModuleClassifier::new(net, &[1, 4, 4], 3, bounds).unwrap(), w, b)
}

/// A batch of `n` random inputs and labels = the model's own predictions (so the clean accuracy is 1).
pub fn batch(model: &dyn Classifier, n: usize, seed: u64) -> (Tensor, Vec<usize>) {
    let x = Tensor::uniform(&[n, 1, 4, 4], 0.05, 0.95, seed);
    let y = model.predict(&x).unwrap();
    (x, y)
}

/// Feasibility: within bounds and budget, finite, same shape; the input tensor is unchanged.
pub fn check_feasible(name: &str, model: &dyn Classifier, x: &Tensor, r: &AttackResult, norm: &str, eps: &[f32]) {
    let (lo, hi) = model.bounds();
    assert_eq!(r.adversarial.shape(), x.shape(), "{name}: shape");
    assert!(r.adversarial.value().iter().all(|v| v.is_finite() && *v >= lo && *v <= hi), "{name}: out of bounds");
    let n = x.shape()[0];
    let d = x.numel() / n;
    let xs = x.to_vec();
    let a = r.adversarial.to_vec();
    for i in 0..n {
        let delta: Vec<f64> = (0..d).map(|j| a[i * d + j] as f64 - xs[i * d + j] as f64).collect();
        let got = match norm {
            "L1" => delta.iter().map(|v| v.abs()).sum::<f64>(),
            "L2" => delta.iter().map(|v| v * v).sum::<f64>().sqrt(),
            _ => delta.iter().fold(0.0f64, |m, v| m.max(v.abs())),
        };
        assert!(got <= eps[i] as f64 * (1.0 + 1e-6), "{name}: sample {i} has {norm} {got} > ε = {}", eps[i]);
    }
}

/// Honest success flags: re-running the model on the returned inputs reproduces every flag.
pub fn check_honest(name: &str, model: &dyn Classifier, labels: &[usize], r: &AttackResult) {
    let preds = model.predict(&r.adversarial).unwrap();
    assert_eq!(preds, r.predictions, "{name}: predictions");
    for (i, (&p, &s)) in preds.iter().zip(&r.success).enumerate() {
        assert_eq!(r.goal.fulfilled_by(model, i, labels[i], p), s, "{name}: success flag of sample {i}");
    }
    assert!(r.norms.len() == labels.len() && r.gradients.len() == labels.len(), "{name}: per-sample fields");
}

/// Determinism and independence: same output twice, with 1 and 2 threads, alone and in a batch, and
/// permuting the batch permutes the outputs.
pub fn check_deterministic(
    name: &str,
    attack: &dyn Attack,
    model: &dyn Classifier,
    x: &Tensor,
    y: &[usize],
    goal: &Goal,
) {
    let a = attack.run(model, x, y, goal, 0).unwrap().adversarial.to_vec();
    let b = attack.run(model, x, y, goal, 0).unwrap().adversarial.to_vec();
    assert_eq!(a, b, "{name}: same seed, same output");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let c = pool.install(|| attack.run(model, x, y, goal, 0).unwrap().adversarial.to_vec());
    assert_eq!(a, c, "{name}: one thread vs two");
    let n = y.len();
    let d = x.numel() / n;
    if matches!(goal, Goal::Targeted(_)) {
        return; // targets are tied to positions; the single-sample checks below need per-sample goals
    }
    // Sample 1 alone.
    let x1 = x.narrow(0, 1, 1).unwrap();
    let alone = attack.run(model, &x1, &y[1..2], goal, 0).unwrap().adversarial.to_vec();
    assert_eq!(&a[d..2 * d], &alone[..], "{name}: a sample's result depends on its batch");
    // Reversed batch.
    let order: Vec<usize> = (0..n).rev().collect();
    let xr = x.index_select(0, &order).unwrap();
    let yr: Vec<usize> = order.iter().map(|&i| y[i]).collect();
    let rev = attack.run(model, &xr, &yr, goal, 0).unwrap().adversarial.to_vec();
    for (k, &i) in order.iter().enumerate() {
        assert_eq!(&rev[k * d..(k + 1) * d], &a[i * d..(i + 1) * d], "{name}: permuting samples must permute outputs");
    }
}

/// Zero budget: x returned bit for bit, success = already misclassified.
pub fn check_zero_budget(name: &str, attack: &dyn Attack, model: &dyn Classifier, x: &Tensor, y: &[usize]) {
    let r = attack.run(model, x, y, &Goal::Untargeted, 0).unwrap();
    assert_eq!(r.adversarial.to_vec(), x.to_vec(), "{name}: zero budget must return the input");
    let preds = model.predict(x).unwrap();
    let already: Vec<bool> = preds.iter().zip(y).map(|(p, l)| p != l).collect();
    assert_eq!(r.success, already, "{name}: zero-budget success must equal 'already misclassified'");
}

/// Fraction of `labels` still predicted.
pub fn accuracy(r: &AttackResult, labels: &[usize]) -> f32 {
    r.robust_accuracy(labels)
}

/// The fixture cnn (tests/fixtures/cnn.safetensors) on 28×28 images in [0, 1].
pub fn fixture_cnn() -> ModuleClassifier {
    let net = cnn(0);
    io::load_module(&net, crate::common::fixture("cnn.safetensors")).unwrap();
    ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0)).unwrap()
}

/// Every white-box attack of the attack crate, in small settings, with the goal it is run for (`k` classes).
fn white_box(y: &[usize], k: usize) -> Vec<(Box<dyn Attack>, Goal)> {
    let u = Goal::Untargeted;
    let targets = Goal::Targeted(y.iter().map(|&c| (c + 1) % k).collect());
    let vt = Some(VarianceTuning { samples: 2, beta: 1.5 });
    let dlr = Apgd { steps: 3, loss: Loss::Dlr, ..Apgd::linf(0.1) };
    let attacks: Vec<Box<dyn Attack>> = vec![
        Box::new(Pgd::fgsm(0.1)),
        Box::new(Pgd::fgm(Norm::L1, 0.5)),
        Box::new(Pgd::fgm(Norm::L2, 0.5)),
        Box::new(Pgd::bim(0.1, 0.02, 3)),
        Box::new(Pgd { steps: 3, ..Pgd::linf(0.1) }),
        Box::new(Pgd { steps: 3, ..Pgd::l2(0.5) }),
        Box::new(Pgd { steps: 3, ..Pgd::l1(1.0) }),
        Box::new(Pgd { steps: 3, ..Pgd::mi_fgsm(0.1) }),
        Box::new(Pgd { steps: 3, ..Pgd::di_fgsm(0.1) }),
        Box::new(Pgd { steps: 3, ..Pgd::m_di_fgsm(0.1) }),
        Box::new(Pgd { steps: 3, variance: vt, ..Pgd::vmi_fgsm(0.1) }),
        Box::new(Pgd { steps: 3, variance: vt, ..Pgd::vni_fgsm(0.1) }),
        Box::new(RFgsm::new(0.1)),
        Box::new(Llc { eps: 0.1, random: false }),
        Box::new(Llc { eps: 0.1, random: true }),
        Box::new(Apgd { steps: 3, ..Apgd::linf(0.1) }),
        Box::new(Apgd { steps: 3, ..Apgd::l2(0.5) }),
        Box::new(Apgd { steps: 3, restarts: 1, ..Apgd::l1(1.0) }),
        Box::new(ApgdTargeted { base: Apgd { steps: 3, ..ApgdTargeted::l1(1.0).base }, target_classes: 2 }),
        Box::new(ApgdTargeted { base: dlr, target_classes: 2 }),
        Box::new(CarliniWagnerL2 { steps: 3, binary_search_steps: 1, ..Default::default() }),
        Box::new(DeepFool { max_iter: 3, ..Default::default() }),
        Box::new(DeepFool { max_iter: 3, ..DeepFool::linf() }),
        Box::new(ElasticNet { steps: 3, binary_search_steps: 1, ..Default::default() }),
        Box::new(LbfgsB { max_iter: 3, binary_search_steps: 1, ..Default::default() }),
    ];
    let mut all: Vec<(Box<dyn Attack>, Goal)> = attacks.into_iter().map(|a| (a, u.clone())).collect();
    all.push((Box::new(Jsma { gamma: 0.02, ..Jsma::increase() }), targets));
    all
}

/// Constant logits behind a dead ReLU (zero on the whole box), or, with `nan`, logits xW + b computed as
/// (√(x − x̄) + x)W + b with x̄ = x detached: the values are finite, the gradient is ∞·W.
struct Degenerate {
    nan: bool,
}

impl Module for Degenerate {
    fn forward_t(&self, x: &Tensor, _: bool) -> armoury::Result<Tensor> {
        let n = x.shape()[0];
        let f = x.reshape(&[n, 16])?;
        let h = if self.nan { f.sub(&f.detach())?.sqrt().add(&f)? } else { f.neg().add_scalar(-1.0).relu() };
        let w = Tensor::from_vec((0..48).map(|k| (k % 5) as f32 - 2.0).collect(), &[16, 3])?;
        h.matmul(&w)?.add(&Tensor::from_vec(vec![1.0, 0.0, -1.0], &[3])?)
    }
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &armoury::Param)) {}
}

/// A zero gradient (sign(0) = 0: no step) or a NaN one no longer passes as robustness: every white-box attack
/// reports the faults of every sample on a model with a dead ReLU in front and on one whose gradient is infinite,
/// and none on the fixture cnn and clean test images.
#[test]
fn every_white_box_attack_reports_gradient_faults() {
    for nan in [false, true] {
        let model = ModuleClassifier::new(Degenerate { nan }, &[1, 4, 4], 3, (0.0, 1.0)).unwrap();
        let x = Tensor::uniform(&[6, 1, 4, 4], 0.05, 0.95, 9);
        let y = model.predict(&x).unwrap();
        for (attack, goal) in white_box(&y, 3) {
            let r = attack.run(&model, &x, &y, &goal, 0).unwrap();
            for (i, f) in r.gradient_faults.iter().enumerate() {
                let kind = if nan { f.non_finite } else { f.zero };
                assert!(kind > 0, "{} (nan: {nan}): sample {i} reports {f:?}", attack.name());
            }
            check_honest(&attack.name(), &model, &y, &r);
        }
    }
    let model = fixture_cnn();
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..8).unwrap();
    for (attack, goal) in white_box(&y, 10) {
        let r = attack.run(&model, &x, &y, &goal, 0).unwrap();
        assert!(r.gradient_faults.iter().all(|f| !f.any()), "{}: {:?}", attack.name(), r.gradient_faults);
    }
}
