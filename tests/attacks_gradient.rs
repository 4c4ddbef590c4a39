//! The gradient family (FGSM, FGM, BIM, PGD L1/L2/L∞, MI, DI², M-DI², VMI, VNI, R+FGSM, LLC) through the shared
//! property checks (feasibility, honesty, determinism, zero budget), from one table; the linear-model oracle; the
//! golden FGSM value; PyTorch fixture cross-checks and the robust-accuracy gates on the fixture cnn; the paper
//! defects (VNI's look-ahead, FGM-L1, DI² under no_grad, sparse L1 on saturated pixels, first successes kept).

use std::sync::Mutex;

use armoury::nn::{cnn, mlp, Module, Sequential};
use armoury::{io, Attack, AttackResult, Classifier, Counters, Error, Goal, ModuleClassifier, Tensor};
use armoury_attacks::{Epsilon, Llc, Norm, Pgd, RFgsm, UniformNoise, VarianceTuning};

use crate::attack_props::*;

fn table() -> Vec<(Pgd, &'static str)> {
    let eps = 0.2;
    let vt = Some(VarianceTuning { samples: 3, beta: 1.5 });
    vec![
        (Pgd::fgsm(eps), "Linf"),
        (Pgd::fgm(Norm::L1, 0.5), "L1"),
        (Pgd::fgm(Norm::L2, 0.5), "L2"),
        (Pgd::fgm(Norm::Linf, eps), "Linf"),
        (Pgd::bim(eps, 0.05, 8), "Linf"),
        (Pgd { steps: 10, ..Pgd::linf(eps) }, "Linf"),
        (Pgd { steps: 10, restarts: 3, ..Pgd::linf(eps) }, "Linf"),
        (Pgd { steps: 10, ..Pgd::l2(0.8) }, "L2"),
        (Pgd { steps: 10, l1_quantile: 0.8, ..Pgd::l1(1.5) }, "L1"),
        (Pgd::mi_fgsm(eps), "Linf"),
        (Pgd::di_fgsm(eps), "Linf"),
        (Pgd::m_di_fgsm(eps), "Linf"),
        (Pgd { variance: vt, steps: 4, ..Pgd::vmi_fgsm(eps) }, "Linf"),
        (Pgd { variance: vt, steps: 4, ..Pgd::vni_fgsm(eps) }, "Linf"),
    ]
}

fn eps_of(p: &Pgd) -> f32 {
    match p.eps {
        Epsilon::Scalar(e) => e,
        Epsilon::PerSample(_) => unreachable!(),
    }
}

#[test]
fn property_table() {
    let model = tiny_model(1);
    let (x, y) = batch(&model, 12, 2);
    let x_before = x.to_vec();
    for (attack, norm) in table() {
        let name = attack.name();
        let e = eps_of(&attack);
        for goal in [Goal::Untargeted, Goal::RandomTarget { seed: 4 }, Goal::LeastLikely, Goal::Targeted(vec![0; 12])] {
            let r = attack.run(&model, &x, &y, &goal, 0).unwrap();
            check_feasible(&name, &model, &x, &r, norm, &[e; 12]);
            check_honest(&name, &model, &y, &r);
            assert_eq!(r.goal.is_targeted(), goal != Goal::Untargeted);
            check_deterministic(&name, &attack, &model, &x, &y, &goal);
        }
        // per-sample ε
        let per: Vec<f32> = (0..12).map(|i| e * (i as f32) / 11.0).collect();
        let cfg = Pgd { eps: Epsilon::PerSample(per.clone()), ..attack.clone() };
        let r = cfg.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
        check_feasible(&name, &model, &x, &r, norm, &per);
        assert_eq!(r.norms[0].linf, 0.0, "{name}: ε = 0 for sample 0");
        // zero budget and zero steps are the identity
        check_zero_budget(&name, &Pgd { eps: Epsilon::Scalar(0.0), ..attack.clone() }, &model, &x, &y);
        check_zero_budget(&name, &Pgd { steps: 0, ..attack.clone() }, &model, &x, &y);
        assert_eq!(x.to_vec(), x_before, "{name}: the caller's input must not change");
    }
    for (a, name) in [
        (&RFgsm::new(0.2) as &dyn Attack, "R+FGSM"),
        (&Llc { eps: 0.2, random: false }, "LLC"),
        (&Llc { eps: 0.2, random: true }, "R+LLC"),
    ] {
        let r = a.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
        check_feasible(name, &model, &x, &r, "Linf", &[0.2; 12]);
        check_honest(name, &model, &y, &r);
        check_deterministic(name, a, &model, &x, &y, &Goal::Untargeted);
    }
}

#[test]
fn monotone_in_eps_steps_and_restarts() {
    let model = tiny_model(5);
    let (x, y) = batch(&model, 40, 6);
    let eps = [0.0, 0.02, 0.05, 0.1, 0.2, 0.4];
    for attack in [Pgd::fgsm(0.1), Pgd { steps: 20, ..Pgd::linf(0.1) }, Pgd { steps: 20, ..Pgd::l2(0.5) }] {
        let accs: Vec<f32> =
            attack.sweep(&model, &x, &y, &Goal::Untargeted, &eps, 0).unwrap().iter().map(|r| accuracy(r, &y)).collect();
        assert!(accs.windows(2).all(|w| w[1] <= w[0]), "{}: robust accuracy rose with ε: {accs:?}", attack.name());
        assert_eq!(accs[0], 1.0);
    }
    let acc = |a: Pgd| accuracy(&a.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap(), &y);
    let by_restarts: Vec<f32> =
        [1, 2, 4].iter().map(|&r| acc(Pgd { steps: 5, restarts: r, ..Pgd::linf(0.08) })).collect();
    assert!(by_restarts.windows(2).all(|w| w[1] <= w[0]), "restarts: {by_restarts:?}");
    let by_steps: Vec<f32> = [1, 5, 20]
        .iter()
        .map(|&s| acc(Pgd { steps: s, random_start: false, step_size: 0.02, ..Pgd::linf(0.1) }))
        .collect();
    assert!(by_steps.windows(2).all(|w| w[1] <= w[0]), "steps: {by_steps:?}");
}

#[test]
fn strength_ordering_on_an_undefended_model() {
    let model = tiny_model(7);
    let (x, y) = batch(&model, 60, 8);
    let acc = |a: &dyn Attack| accuracy(&a.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap(), &y);
    let fgsm = acc(&Pgd::fgsm(0.1));
    let pgd = acc(&Pgd::linf(0.1));
    assert!(pgd <= fgsm, "PGD {pgd} vs FGSM {fgsm}");
    // uniform noise in the ε-ball: a random start with no steps
    let noise = acc(&UniformNoise { norm: Norm::Linf, eps: Epsilon::Scalar(0.1) });
    assert!(noise >= pgd, "noise {noise} vs PGD {pgd}");
    // a box-sized ε drives accuracy to about 0
    let boxed = acc(&Pgd { steps: 40, ..Pgd::linf(1.0) });
    assert!(boxed <= 0.05, "box-sized ε leaves accuracy {boxed}");
}

#[test]
fn linear_model_oracle() {
    // f(x) = Wx + b with wide bounds: ∇CE = Wᵀ(softmax − onehot); FGSM moves by exactly ε·sign(∇), FGM-L2 by
    // ε·∇/‖∇‖₂ and FGM-L1 by ε·∇/‖∇‖₁ (ART, Foolbox; it used to spread ε·sign(∇) evenly over the coordinates).
    let (model, w, b) = linear_model(11, (-100.0, 100.0));
    let x = Tensor::uniform(&[5, 1, 4, 4], -1.0, 1.0, 12);
    let y = vec![0, 1, 2, 0, 1];
    let flat = x.reshape(&[5, 16]).unwrap();
    let z = flat.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap();
    let p = z.softmax(1).unwrap().to_vec();
    let (wv, xv) = (w.to_vec(), flat.to_vec());
    for (attack, norm) in
        [(Pgd::fgsm(0.3), Norm::Linf), (Pgd::fgm(Norm::L2, 0.7), Norm::L2), (Pgd::fgm(Norm::L1, 0.7), Norm::L1)]
    {
        let adv = attack.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap().adversarial.to_vec();
        for i in 0..5 {
            let grad: Vec<f64> = (0..16)
                .map(|j| {
                    (0..3).map(|k| (p[i * 3 + k] as f64 - f64::from(u8::from(k == y[i]))) * wv[k * 16 + j] as f64).sum()
                })
                .collect();
            let gn = grad.iter().map(|g| g * g).sum::<f64>().sqrt();
            let g1 = grad.iter().map(|g| g.abs()).sum::<f64>();
            for j in 0..16 {
                let want = match norm {
                    Norm::Linf => 0.3 * grad[j].signum(),
                    Norm::L2 => 0.7 * grad[j] / gn,
                    Norm::L1 => 0.7 * grad[j] / g1,
                };
                let got = adv[i * 16 + j] as f64 - xv[i * 16 + j] as f64;
                assert!(
                    (got - want).abs() < 2e-6,
                    "{}: sample {i} feature {j}: moved {got}, expected {want}",
                    attack.name()
                );
            }
        }
    }
}

/// MindArmour's FGSM test: FGSM on the identity-ReLU "model" with cross-entropy, x = [0.1, 0.2, 0.7], label 2, ε = 0.07 →
/// [0.17, 0.27, 0.63].
#[test]
fn golden_fgsm_identity_relu() {
    struct IdentityRelu;
    impl Module for IdentityRelu {
        fn forward_t(&self, x: &Tensor, _: bool) -> armoury::Result<Tensor> {
            Ok(x.relu())
        }
        fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &armoury::Param)) {}
    }
    let model = ModuleClassifier::new(IdentityRelu, &[3], 3, (0.0, 1.0)).unwrap();
    let x = Tensor::from_vec(vec![0.1, 0.2, 0.7], &[1, 3]).unwrap();
    let r = Pgd::fgsm(0.07).run(&model, &x, &[2], &Goal::Untargeted, 0).unwrap();
    for (got, want) in r.adversarial.to_vec().iter().zip([0.17, 0.27, 0.63]) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
}

#[test]
fn misuse_is_an_error() {
    let model = tiny_model(1);
    let (x, y) = batch(&model, 4, 2);
    let run = |a: Pgd| a.run(&model, &x, &y, &Goal::Untargeted, 0);
    assert!(matches!(run(Pgd::linf(-0.1)), Err(Error::InvalidArgument { .. })));
    assert!(matches!(run(Pgd { step_size: 0.0, ..Pgd::linf(0.1) }), Err(Error::InvalidArgument { .. })));
    assert!(matches!(run(Pgd { restarts: 0, ..Pgd::linf(0.1) }), Err(Error::InvalidArgument { .. })));
    assert!(matches!(
        run(Pgd { eps: Epsilon::PerSample(vec![0.1; 3]), ..Pgd::linf(0.1) }),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        Pgd::linf(0.1).run(&model, &x, &[0, 1, 5, 0], &Goal::Untargeted, 0),
        Err(Error::LabelOutOfRange { .. })
    ));
    assert!(Pgd::linf(0.1).run(&model, &x, &y, &Goal::Targeted(vec![0, 9, 0, 0]), 0).is_err());
    assert!(matches!(Pgd::linf(0.1).run(&model, &x, &y[..3], &Goal::Untargeted, 0), Err(Error::ShapeMismatch { .. })));
    let wrong = Tensor::zeros(&[2, 1, 5, 5]);
    assert!(matches!(
        Pgd::linf(0.1).run(&model, &wrong, &[0, 0], &Goal::Untargeted, 0),
        Err(Error::ShapeMismatch { .. })
    ));
    let nan = Tensor::full(&[1, 1, 4, 4], f32::NAN);
    assert!(matches!(Pgd::linf(0.1).run(&model, &nan, &[0], &Goal::Untargeted, 0), Err(Error::NonFinite { .. })));
    assert!(matches!("l3".parse::<Norm>(), Err(Error::InvalidArgument { .. })));
    assert!(RFgsm { alpha: 0.5, ..RFgsm::new(0.1) }.run(&model, &x, &y, &Goal::Untargeted, 0).is_err());
}

fn fixture_model(name: &str) -> ModuleClassifier {
    let net: Sequential = if name == "cnn" { cnn(0) } else { mlp(0) };
    io::load_module(&net, crate::common::fixture(&format!("{name}.safetensors"))).unwrap();
    ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0)).unwrap()
}

/// FGSM and the 10-step BIM reproduce PyTorch's images (fixtures README tolerances: 1e-6 on ≥ 99.9% of pixels).
#[test]
fn fixture_fgsm_and_bim_match_pytorch() {
    let reference = io::SafetensorsFile::open(crate::common::fixture("reference.safetensors")).unwrap();
    let x = Tensor::new(reference.f32("x").unwrap());
    let y: Vec<usize> = reference.i64("y").unwrap().iter().map(|&v| v as usize).collect();
    for name in ["cnn", "mlp"] {
        let model = fixture_model(name);
        for (attack, key) in
            [(Pgd::fgsm(0.1), "fgsm_eps0.1"), (Pgd::bim(0.1, 0.01, 10), "bim_eps0.1_alpha0.01_steps10")]
        {
            let got = attack.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap().adversarial.to_vec();
            let want = reference.f32(&format!("{name}.{key}")).unwrap();
            let off = got.iter().zip(want.iter()).filter(|(a, b)| (*a - *b).abs() > 1e-6).count();
            assert!(off as f64 <= 0.001 * got.len() as f64, "{name} {key}: {off} of {} pixels differ", got.len());
        }
    }
}

/// Gates on the fixture cnn and the first 1000 Fashion-MNIST test images at ε = 0.1: FGSM robust accuracy
/// 0.13 ± 0.01 (PyTorch 0.130), PGD-40 (step 0.01, random start) ≤ 0.06.
#[test]
fn fixture_cnn_robust_accuracy_gates() {
    let model = fixture_model("cnn");
    let test = armoury::data::sample().unwrap().test;
    let (x, y) = test.batch(0..1000).unwrap();
    let fgsm = Pgd::fgsm(0.1).run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    let acc = fgsm.robust_accuracy(&y);
    assert!((acc - 0.13).abs() <= 0.01, "FGSM robust accuracy {acc}");
    let pgd = Pgd { step_size: 0.01, steps: 40, ..Pgd::linf(0.1) }.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    let acc = pgd.robust_accuracy(&y);
    assert!(acc <= 0.06, "PGD-40 robust accuracy {acc}");
    assert_eq!(pgd.total_gradients(), 40 * 1000);
    let clean = model.predict(&x).unwrap().iter().zip(&y).filter(|(p, l)| p == l).count();
    assert!((clean as f32 / 1000.0) > 0.85);
}

/// A classifier that records every batch its forward pass sees.
struct Recorder {
    inner: ModuleClassifier,
    seen: Mutex<Vec<Vec<f32>>>,
}

impl Classifier for Recorder {
    fn input_shape(&self) -> &[usize] {
        self.inner.input_shape()
    }
    fn num_classes(&self) -> usize {
        self.inner.num_classes()
    }
    fn bounds(&self) -> (f32, f32) {
        self.inner.bounds()
    }
    fn forward(&self, x: &Tensor) -> armoury::Result<Tensor> {
        self.seen.lock().unwrap().push(x.to_vec());
        self.inner.forward(x)
    }
    fn counters(&self) -> &Counters {
        self.inner.counters()
    }
}

/// NI/VNI-FGSM look ahead by α·μ·g with g accumulating ∇/mean|∇| (Wang & He 2021's code, torchattacks): after one
/// step the gradient is taken on average α·μ away from the iterate, per pixel. With the ‖∇‖₁ normaliser it was d
/// times closer (α/16 here), so VNI behaved like VMI.
#[test]
fn nesterov_looks_ahead_by_alpha_per_pixel() {
    let (model, _, _) = linear_model(21, (-100.0, 100.0));
    let x = Tensor::uniform(&[4, 1, 4, 4], -1.0, 1.0, 22);
    let y = model.predict(&x).unwrap();
    let (eps, alpha) = (10.0, 1.0);
    let first = Pgd::bim(eps, alpha, 1).run(&model, &x, &y, &Goal::Untargeted, 0).unwrap().adversarial.to_vec();
    let rec = Recorder { inner: model, seen: Mutex::new(Vec::new()) };
    let ni = Pgd { nesterov: true, steps: 2, step_size: alpha, ..Pgd::mi_fgsm(eps) };
    ni.run(&rec, &x, &y, &Goal::Untargeted, 0).unwrap();
    let seen = rec.seen.lock().unwrap();
    assert_eq!(seen[0], x.to_vec(), "the first look-ahead is the clean input");
    for i in 0..4 {
        let ahead: f64 =
            (0..16).map(|j| (seen[1][i * 16 + j] as f64 - first[i * 16 + j] as f64).abs()).sum::<f64>() / 16.0;
        assert!(
            (ahead - alpha as f64).abs() < 1e-4,
            "sample {i}: looked ahead {ahead} per pixel, expected α = {alpha}"
        );
    }
}

/// DI²'s gradient goes through the classifier's gradient entry: inside a caller's no_grad scope it is the same
/// (it used to be no gradient at all), every sample moves and no gradient is degenerate.
#[test]
fn input_diversity_ignores_a_callers_no_grad_scope() {
    let model = tiny_model(3);
    let (x, y) = batch(&model, 40, 4);
    for a in [Pgd::di_fgsm(0.2), Pgd::m_di_fgsm(0.2)] {
        let outside = a.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
        let inside = armoury::no_grad(|| a.run(&model, &x, &y, &Goal::Untargeted, 0)).unwrap();
        assert_eq!(inside.adversarial.to_vec(), outside.adversarial.to_vec(), "{}", a.name());
        assert!(inside.gradient_faults.iter().all(|f| !f.any()), "{}: degenerate gradients", a.name());
        assert!(inside.norms.iter().all(|n| n.linf > 0.0), "{}: a sample did not move", a.name());
        assert_eq!(inside.total_gradients(), 10 * 40);
    }
}

/// Sparse L1 descent drops the gradient entries that push a pixel at the box edge outward before it picks its
/// top-q coordinates (Foolbox's SparseL1DescentAttack), so on images whose pixels are all 0 or 1 a full step
/// spends the whole budget; it used to spend part of it on moves the box clipped away.
#[test]
fn sparse_l1_spends_no_budget_on_saturated_pixels() {
    let (model, _, _) = linear_model(31, (0.0, 1.0));
    let vals: Vec<f32> = (0..8 * 16).map(|k| ((k * 7 + k / 16 + k / 5) % 2) as f32).collect();
    let x = Tensor::from_vec(vals, &[8, 1, 4, 4]).unwrap();
    let y = model.predict(&x).unwrap();
    let eps = 1.0;
    let one =
        Pgd { steps: 1, step_size: eps, random_start: false, keep_success: false, l1_quantile: 0.5, ..Pgd::l1(eps) };
    let r = one.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    for (i, n) in r.norms.iter().enumerate() {
        assert!((n.l1 - eps).abs() < 1e-4, "sample {i}: a full step moved ‖δ‖₁ = {} of ε = {eps}", n.l1);
    }
    // Several steps stay feasible (exact projection onto the L1 ball ∩ box) and keep the budget spent.
    let many =
        Pgd { steps: 10, step_size: 0.25, random_start: false, keep_success: false, l1_quantile: 0.5, ..Pgd::l1(eps) };
    let r = many.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    check_feasible("PGD-L1", &model, &x, &r, "L1", &[eps; 8]);
    assert!(r.norms.iter().all(|n| n.l1 > 0.9 * eps), "{:?}", r.norms);
}

fn successes_only_grow(what: &str, runs: &[AttackResult]) {
    for w in runs.windows(2) {
        for (i, (a, b)) in w[0].success.iter().zip(&w[1].success).enumerate() {
            assert!(!a || *b, "{what}: sample {i} was broken, then not");
        }
    }
}

/// PGD keeps each sample's latest successful iterate and its sweep carries successes: on the fixture cnn, robust
/// accuracy never rises with ε or with the step count, per sample (a sample broken at a smaller ε or with fewer
/// steps stays broken). It used to return the last iterate, adversarial or not.
#[test]
fn fixture_cnn_robust_accuracy_never_rises_with_eps_or_steps() {
    let model = fixture_model("cnn");
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..200).unwrap();
    let eps = [0.0, 0.02, 0.05, 0.1, 0.2];
    let by_eps = Pgd { steps: 10, ..Pgd::linf(0.1) }.sweep(&model, &x, &y, &Goal::Untargeted, &eps, 0).unwrap();
    // Steps of ε: the iterate jumps between corners of the ball, and a last one can lose what an earlier found
    // (with the last iterate returned, one of these 200 images lost its success as the steps grew).
    let by_steps: Vec<AttackResult> = [1, 5, 20, 40]
        .iter()
        .map(|&s| Pgd { steps: s, step_size: 0.1, ..Pgd::linf(0.1) }.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap())
        .collect();
    let acc = |rs: &[AttackResult]| rs.iter().map(|r| r.robust_accuracy(&y)).collect::<Vec<_>>();
    println!("robust accuracy by ε {eps:?}: {:?}; by steps 1, 5, 20, 40: {:?}", acc(&by_eps), acc(&by_steps));
    successes_only_grow("ε", &by_eps);
    successes_only_grow("steps", &by_steps);
}
