//! Optimisers against hand-computed steps, schedules, clipping, and training: it learns, it is reproducible
//! bit for bit, and the thread count does not change the result.

use armoury::data;
use armoury::nn::{cnn, mlp, Linear, Module, ModuleExt};
use armoury::optim::{clip_grad_norm, Adam, AdamConfig, LrSchedule, Optimizer, Sgd, SgdConfig};
use armoury::train::{evaluate, fit, train_step, TrainConfig};
use armoury::{Param, Reduction, Tensor};

fn close(a: &[f32], b: &[f32], tol: f32) {
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

/// loss = Σ w ⊙ c for a constant c: ∂loss/∂w = c.
fn linear_loss(p: &Param, c: &[f32]) -> armoury::Gradients {
    p.tensor().mul(&Tensor::from_slice(c, &[c.len()]).unwrap()).unwrap().sum_all().backward().unwrap()
}

#[test]
fn sgd_momentum_and_nesterov_match_hand_computation() {
    let p = Param::new(Tensor::from_slice(&[1.0, -1.0], &[2]).unwrap().to_array());
    let mut opt = Sgd::new(vec![p.clone()], SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() }).unwrap();
    // step 1: v = g = [1, 2]; θ = θ − 0.1 v
    opt.step(&linear_loss(&p, &[1.0, 2.0])).unwrap();
    close(&p.value().iter().copied().collect::<Vec<_>>(), &[0.9, -1.2], 1e-6);
    // step 2: v = 0.9 v + g = [1.9, 3.8]
    opt.step(&linear_loss(&p, &[1.0, 2.0])).unwrap();
    close(&p.value().iter().copied().collect::<Vec<_>>(), &[0.71, -1.58], 1e-6);

    let q = Param::new(Tensor::from_slice(&[0.0], &[1]).unwrap().to_array());
    let cfg = SgdConfig { lr: 0.1, momentum: 0.5, nesterov: true, weight_decay: 0.1, ..Default::default() };
    let mut opt = Sgd::new(vec![q.clone()], cfg).unwrap();
    // g = 2 + 0.1·0 = 2; v = 2; update d = g + 0.5 v = 3 → θ = −0.3
    opt.step(&linear_loss(&q, &[2.0])).unwrap();
    close(&q.value().iter().copied().collect::<Vec<_>>(), &[-0.3], 1e-6);
    assert!(Sgd::new(vec![], SgdConfig { lr: -1.0, ..Default::default() }).is_err());
    assert!(Sgd::new(vec![], SgdConfig { nesterov: true, ..Default::default() }).is_err());
}

#[test]
fn adam_and_adamw_match_hand_computation() {
    // First Adam step: m̂ = g, v̂ = g², so θ −= lr·g/(|g| + ε) ≈ lr·sign(g).
    let p = Param::new(Tensor::from_slice(&[1.0, 1.0], &[2]).unwrap().to_array());
    let mut opt = Adam::new(vec![p.clone()], AdamConfig { lr: 0.01, ..Default::default() }).unwrap();
    opt.step(&linear_loss(&p, &[3.0, -0.5])).unwrap();
    close(&p.value().iter().copied().collect::<Vec<_>>(), &[0.99, 1.01], 1e-6);
    // Second step with the same gradient: m̂ = g and v̂ = g² again.
    opt.step(&linear_loss(&p, &[3.0, -0.5])).unwrap();
    close(&p.value().iter().copied().collect::<Vec<_>>(), &[0.98, 1.02], 1e-6);
    // AdamW: θ ← θ(1 − lr·λ) − lr·sign(g) on the first step.
    let q = Param::new(Tensor::from_slice(&[2.0], &[1]).unwrap().to_array());
    let mut opt = Adam::new(vec![q.clone()], AdamConfig { weight_decay: 0.5, ..AdamConfig::adamw(0.1) }).unwrap();
    opt.step(&linear_loss(&q, &[1.0])).unwrap();
    close(&q.value().iter().copied().collect::<Vec<_>>(), &[2.0 * (1.0 - 0.05) - 0.1], 1e-5);
    // State round trip: a restored optimiser takes the identical next step.
    let state = opt.state();
    let r = Param::new(q.value().to_owned());
    let mut opt2 = Adam::new(vec![r.clone()], AdamConfig { weight_decay: 0.5, ..AdamConfig::adamw(0.1) }).unwrap();
    opt2.load_state(&state).unwrap();
    opt.step(&linear_loss(&q, &[0.3])).unwrap();
    opt2.step(&linear_loss(&r, &[0.3])).unwrap();
    assert_eq!(q.value(), r.value());
}

#[test]
fn schedules_and_clipping() {
    let step = LrSchedule::Step { step_size: 2, gamma: 0.5 };
    close(&[step.lr_at(1.0, 0.0), step.lr_at(1.0, 2.0), step.lr_at(1.0, 5.0)], &[1.0, 0.5, 0.25], 1e-7);
    let cos = LrSchedule::Cosine { t_max: 10.0, eta_min: 0.0 };
    close(&[cos.lr_at(1.0, 0.0), cos.lr_at(1.0, 5.0), cos.lr_at(1.0, 10.0)], &[1.0, 0.5, 0.0], 1e-6);
    let multi = LrSchedule::MultiStep { milestones: vec![1, 3], gamma: 0.1 };
    close(&[multi.lr_at(1.0, 0.0), multi.lr_at(1.0, 1.0), multi.lr_at(1.0, 3.0)], &[1.0, 0.1, 0.01], 1e-7);
    let tri = LrSchedule::Triangular { peak: 2.0, total: 4.0 };
    close(&[tri.lr_at(0.2, 1.0), tri.lr_at(0.2, 2.0), tri.lr_at(0.2, 3.0)], &[0.1, 0.2, 0.1], 1e-7);

    // ‖(3, 4)‖ = 5 → scaled to norm 1
    let p = Param::new(Tensor::from_slice(&[0.0, 0.0], &[2]).unwrap().to_array());
    let mut g = linear_loss(&p, &[3.0, 4.0]);
    let norm = clip_grad_norm(&mut g, std::slice::from_ref(&p), 1.0).unwrap();
    close(&[norm], &[5.0], 1e-5);
    close(&g.get(&p.tensor()).unwrap().iter().copied().collect::<Vec<_>>(), &[0.6, 0.8], 1e-5);
    assert!(clip_grad_norm(&mut g, &[p], 0.0).is_err());
}

#[test]
fn backward_reaches_every_parameter_and_only_parameters() {
    let model = cnn(3);
    let x = Tensor::uniform(&[2, 1, 28, 28], 0.0, 1.0, 1);
    let loss = model.forward_t(&x, true).unwrap().cross_entropy(&[1, 7], Reduction::Mean).unwrap();
    let grads = loss.backward().unwrap();
    let params = model.parameters();
    assert_eq!(params.len(), 8);
    assert_eq!(grads.len(), 8, "backward returns exactly the parameters' gradients (no input gradient)");
    for p in &params {
        assert_eq!(grads.get(&p.tensor()).unwrap().shape(), p.shape().as_slice());
    }
    assert_eq!(model.num_parameters(), 80_202);
    assert_eq!(mlp(0).num_parameters(), 269_322);
    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "conv1.weight",
            "conv1.bias",
            "conv2.weight",
            "conv2.bias",
            "fc1.weight",
            "fc1.bias",
            "fc2.weight",
            "fc2.bias"
        ]
    );
}

#[test]
fn pytorch_default_init_bounds() {
    // U(−1/√fan_in, 1/√fan_in): fan_in 784 → bound 0.0357; conv1 fan_in 25 → 0.2
    let l = Linear::new(784, 256, true, 5);
    let w = l.weight.value();
    let bound = 1.0 / 784f32.sqrt();
    assert!(w.iter().all(|v| v.abs() <= bound));
    assert!(w.iter().cloned().fold(0.0f32, f32::max) > 0.95 * bound, "uses the whole range");
    let c = cnn(0);
    let conv1 = &c.named_params()[0].1;
    assert!(conv1.value().iter().all(|v| v.abs() <= 0.2) && conv1.value().iter().any(|v| v.abs() > 0.19));
    // explicit seeds: same seed same weights, different seed different
    assert_eq!(Linear::new(4, 3, true, 9).weight.value(), Linear::new(4, 3, true, 9).weight.value());
    assert_ne!(Linear::new(4, 3, true, 9).weight.value(), Linear::new(4, 3, true, 10).weight.value());
}

fn train_sample(seed: u64, epochs: usize) -> (Vec<Vec<f32>>, f32) {
    let set = data::sample().unwrap();
    let model = cnn(seed);
    let mut opt = Adam::new(model.parameters(), AdamConfig::default()).unwrap();
    let cfg = TrainConfig { epochs, batch_size: 64, seed, ..Default::default() };
    let reports = fit(&model, &mut opt, &set.train, Some(&set.test), &cfg, &mut ()).unwrap();
    let weights = model.parameters().iter().map(|p| p.value().iter().copied().collect()).collect();
    (weights, reports.last().unwrap().test.as_ref().unwrap().accuracy)
}

#[test]
fn training_learns_and_is_reproducible_across_thread_counts() {
    let (w2, acc) = train_sample(0, 2);
    // Never evaluated on what it trained on: the sample's test split is disjoint from its training split.
    assert!(acc > 0.65, "cnn on 2,000 Fashion-MNIST images, 2 epochs: test accuracy {acc}");
    let (again, acc_again) = train_sample(0, 2);
    assert_eq!(w2, again, "same seed, same weights bit for bit");
    assert_eq!(acc, acc_again);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let (one_thread, _) = pool.install(|| train_sample(0, 2));
    assert_eq!(w2, one_thread, "the thread count must not change the result");
    let (other, _) = train_sample(1, 1);
    assert_ne!(w2, other);
}

#[test]
fn evaluate_reports_accuracy_and_confusion() {
    let set = data::sample().unwrap();
    let model = mlp(0);
    let mut opt = Adam::new(model.parameters(), AdamConfig::default()).unwrap();
    let (x, y) = set.train.batch(0..256).unwrap();
    let before = evaluate(&model, &set.test, 300).unwrap();
    for _ in 0..30 {
        train_step(&model, &mut opt, &x, &y, Some(5.0)).unwrap();
    }
    let after = evaluate(&model, &set.test, 1000).unwrap();
    assert!(after.accuracy > before.accuracy + 0.3, "{} → {}", before.accuracy, after.accuracy);
    assert_eq!(after.confusion.sum() as usize, set.test.len());
    let diag: u64 = (0..10).map(|i| after.confusion[[i, i]]).sum();
    assert!((diag as f32 / set.test.len() as f32 - after.accuracy).abs() < 1e-6);
    assert!(after.loss < before.loss);
    assert!(evaluate(&model, &set.test, 0).is_err());
}

/// `backward_in_pieces` (pieces of 32 samples in parallel, summed in order) gives the gradients of the whole-batch
/// loss, and a model with batch-coupled layers (BatchNorm in training mode) runs as one piece: bit-identical to
/// the plain backward.
#[test]
fn backward_in_pieces_matches_the_whole_batch() {
    use armoury::train::backward_in_pieces;
    let x = Tensor::uniform(&[100, 1, 28, 28], 0.0, 1.0, 5);
    let y: Vec<usize> = (0..100).map(|i| i * 7 % 10).collect();
    let model = cnn(3);
    let whole = model.forward_t(&x, true).unwrap().cross_entropy(&y, Reduction::Mean).unwrap().backward().unwrap();
    let (pieces, loss, extras) = backward_in_pieces(&model, 100, |r| {
        let z = model.forward_t(&x.narrow(0, r.start, r.len())?, true)?;
        Ok((z.cross_entropy(&y[r.clone()], Reduction::Sum)?.mul_scalar(0.01), r.len()))
    })
    .unwrap();
    assert_eq!(extras, vec![32, 32, 32, 4], "pieces of 32 in order");
    let want = model.forward_t(&x, true).unwrap().cross_entropy(&y, Reduction::Mean).unwrap().item().unwrap();
    assert!((loss - want).abs() <= 1e-5 * want.abs(), "loss {loss} vs {want}");
    for p in model.parameters() {
        let (a, b) = (pieces.get(&p.tensor()).unwrap(), whole.get(&p.tensor()).unwrap());
        let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
        let diff = a.iter().zip(b).fold(0.0f32, |m, (u, v)| m.max((u - v).abs()));
        assert!(diff <= 1e-5 * scale, "gradient differs by {diff} (scale {scale})");
    }

    let bn = armoury::nn::Sequential::new()
        .add("flat", armoury::nn::Flatten)
        .add("fc", Linear::new(784, 10, true, 1))
        .add("bn", armoury::nn::BatchNorm1d::new(10));
    assert!(!bn.batch_independent(true) && bn.batch_independent(false));
    let whole = bn.forward_t(&x, true).unwrap().cross_entropy(&y, Reduction::Mean).unwrap().backward().unwrap();
    let (pieces, _, extras) = backward_in_pieces(&bn, 100, |r| {
        let z = bn.forward_t(&x.narrow(0, r.start, r.len())?, true)?;
        Ok((z.cross_entropy(&y[r.clone()], Reduction::Mean)?, r.len()))
    })
    .unwrap();
    assert_eq!(extras, vec![100], "one piece");
    for p in bn.parameters() {
        assert_eq!(pieces.get(&p.tensor()), whole.get(&p.tensor()));
    }
}
