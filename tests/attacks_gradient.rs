//! The gradient family (FGSM, FGM, BIM, PGD L1/L2/L∞, MI, DI², M-DI², VMI, VNI, R+FGSM, LLC) through the SPEC §4
//! property checks, from one table; the linear-model oracle; the golden FGSM value; PyTorch fixture cross-checks
//! and the robust-accuracy gates on the fixture cnn.

use armoury::nn::{cnn, mlp, Module, Sequential};
use armoury::{io, Attack, Classifier, Error, Goal, ModuleClassifier, Tensor};
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
    // ε·∇/‖∇‖₂.
    let (model, w, b) = linear_model(11, (-100.0, 100.0));
    let x = Tensor::uniform(&[5, 1, 4, 4], -1.0, 1.0, 12);
    let y = vec![0, 1, 2, 0, 1];
    let flat = x.reshape(&[5, 16]).unwrap();
    let z = flat.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap();
    let p = z.softmax(1).unwrap().to_vec();
    let (wv, xv) = (w.to_vec(), flat.to_vec());
    for (attack, l2) in [(Pgd::fgsm(0.3), false), (Pgd::fgm(Norm::L2, 0.7), true)] {
        let adv = attack.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap().adversarial.to_vec();
        for i in 0..5 {
            let grad: Vec<f64> = (0..16)
                .map(|j| {
                    (0..3).map(|k| (p[i * 3 + k] as f64 - f64::from(u8::from(k == y[i]))) * wv[k * 16 + j] as f64).sum()
                })
                .collect();
            let gn = grad.iter().map(|g| g * g).sum::<f64>().sqrt();
            for j in 0..16 {
                let want = if l2 { 0.7 * grad[j] / gn } else { 0.3 * grad[j].signum() };
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

/// SPEC §5: FGSM on the identity-ReLU "model" with cross-entropy, x = [0.1, 0.2, 0.7], label 2, ε = 0.07 →
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

/// SPEC gates on the fixture cnn and the first 1000 Fashion-MNIST test images at ε = 0.1: FGSM robust accuracy
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
