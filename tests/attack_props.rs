//! Shared property checks of SPEC §4 for any attack, and the small models they run on.
#![allow(dead_code)]

use armoury::nn::{Flatten, Linear, ReLU, Sequential};
use armoury::{Attack, AttackResult, Classifier, Goal, ModuleClassifier, Tensor};

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

/// Feasibility (§4.1): within bounds and budget, finite, same shape; the input tensor is unchanged.
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

/// Honest success flags (§4.4): re-running the model on the returned inputs reproduces every flag.
pub fn check_honest(name: &str, model: &dyn Classifier, labels: &[usize], r: &AttackResult) {
    let preds = model.predict(&r.adversarial).unwrap();
    assert_eq!(preds, r.predictions, "{name}: predictions");
    for (i, (&p, &s)) in preds.iter().zip(&r.success).enumerate() {
        assert_eq!(r.goal.is_success(i, labels[i], p), s, "{name}: success flag of sample {i}");
    }
    assert!(r.norms.len() == labels.len() && r.gradients.len() == labels.len(), "{name}: per-sample fields");
}

/// Determinism and independence (§4.7): same output twice, with 1 and 2 threads, alone and in a batch, and
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

/// Zero budget (§4.2): x returned bit for bit, success = already misclassified.
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
