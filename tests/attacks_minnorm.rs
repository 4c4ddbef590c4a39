//! The minimum-norm attacks (DeepFool L2/L∞, Carlini–Wagner L2, EAD, box-constrained L-BFGS) through the property
//! checks (docs/testing.md#attack-properties), the binary linear-model oracle, MindArmour's DeepFool golden value, and
//! the CW numbers of the torchattacks baseline on the fixture cnn (docs/reference.md#gates-on-the-fixture-cnn;
//! torchattacks: success 0.77, mean L2 0.72 on the first 100 test images).

use std::time::Instant;

use armoury::{Attack, AttackResult, Classifier, Counters, Goal, Result, Tensor};
use armoury_attacks::{CarliniWagnerL2, DeepFool, EadRule, ElasticNet, Fab, LbfgsB, Norm, Pgd};

use crate::attack_props::*;

fn table() -> Vec<(&'static str, Box<dyn Attack>)> {
    vec![
        ("DeepFool-L2", Box::new(DeepFool::default())),
        ("DeepFool-Linf", Box::new(DeepFool { candidates: 2, ..DeepFool::linf() })),
        (
            "CW",
            Box::new(CarliniWagnerL2 { c: 0.1, steps: 100, lr: 0.05, binary_search_steps: 4, ..Default::default() }),
        ),
        (
            "CW-kappa",
            Box::new(CarliniWagnerL2 {
                c: 1.0,
                kappa: 0.2,
                steps: 100,
                lr: 0.05,
                binary_search_steps: 3,
                abort_early: false,
            }),
        ),
        ("EAD-EN", Box::new(ElasticNet { c: 0.1, steps: 100, lr: 0.05, binary_search_steps: 4, ..Default::default() })),
        (
            "EAD-L1",
            Box::new(ElasticNet {
                c: 0.1,
                steps: 100,
                lr: 0.05,
                binary_search_steps: 4,
                decision: EadRule::L1,
                ..Default::default()
            }),
        ),
        ("L-BFGS", Box::new(LbfgsB { c: 0.1, max_iter: 30, binary_search_steps: 4, ..Default::default() })),
    ]
}

fn is_deepfool(name: &str) -> bool {
    name.starts_with("DeepFool")
}

fn rows_of(t: &Tensor) -> Vec<Vec<f32>> {
    let n = t.shape()[0];
    let v = t.to_vec();
    v.chunks(v.len() / n).map(<[f32]>::to_vec).collect()
}

#[test]
fn property_table() {
    let model = tiny_model(11);
    let (x, mut y) = batch(&model, 12, 12);
    // Two samples the model already gets wrong: every minimum-norm attack returns them untouched.
    y[3] = (y[3] + 1) % 3;
    y[7] = (y[7] + 2) % 3;
    let x_before = x.to_vec();
    let xr = rows_of(&x);
    // What a box-sized PGD reaches, per goal (the least-likely class is out of the tiny model's reach).
    let reach = |goal: &Goal| Pgd { steps: 100, ..Pgd::linf(1.0) }.run(&model, &x, &y, goal, 0).unwrap().success_rate();
    for (name, attack) in table() {
        let goals: Vec<Goal> = if is_deepfool(name) {
            vec![Goal::Untargeted]
        } else {
            vec![Goal::Untargeted, Goal::RandomTarget { seed: 5 }, Goal::LeastLikely]
        };
        for goal in goals {
            let r = attack.run(&model, &x, &y, &goal, 0).unwrap();
            check_feasible(name, &model, &x, &r, "L2", &[f32::INFINITY; 12]);
            check_honest(name, &model, &y, &r);
            check_deterministic(name, attack.as_ref(), &model, &x, &y, &goal);
            let ar = rows_of(&r.adversarial);
            if goal == Goal::Untargeted && name != "CW-kappa" {
                for i in [3, 7] {
                    assert_eq!(ar[i], xr[i], "{name}: an already misclassified sample must come back unchanged");
                    assert_eq!(r.gradients[i], 0, "{name}: no gradient for an already misclassified sample");
                    assert!(r.success[i]);
                }
            }
            // Minimum-norm attacks never end above their start: a failure is the clean input (DeepFool returns
            // its last iterate, as in the paper).
            if !is_deepfool(name) {
                for i in 0..12 {
                    if !r.success[i] {
                        assert_eq!(ar[i], xr[i], "{name}: an unsuccessful sample must come back unchanged");
                    }
                }
            }
            let rate = r.success_rate();
            let want = reach(&goal) - 1.0 / 12.0;
            println!("{name} {goal:?}: success {rate}, box-sized PGD {}", reach(&goal));
            assert!(rate >= want, "{name} {goal:?}: success rate {rate}, box-sized PGD {}", reach(&goal));
        }
        // The template's minimum-norm sweep (Foolbox's): one run, its perturbation clipped to each ε, successes
        // carried forward; at ε = 0 only the two misclassified samples count.
        let sweep = attack.sweep(&model, &x, &y, &Goal::Untargeted, &[0.0, 0.1, 100.0], 0).unwrap();
        let wins: Vec<usize> = sweep.iter().map(|r| r.success.iter().filter(|&&s| s).count()).collect();
        assert!(wins.windows(2).all(|w| w[0] <= w[1]) && wins[0] == 2, "{name}: sweep successes {wins:?}");
        assert_eq!(x.to_vec(), x_before, "{name}: the caller's input must not change");
    }
}

/// More binary-search steps never lose a success nor lengthen a perturbation: each sample keeps its best so far
/// and the first runs are the same.
#[test]
fn more_search_never_hurts() {
    let model = tiny_model(21);
    let (x, y) = batch(&model, 16, 22);
    let pairs: Vec<(Box<dyn Attack>, Box<dyn Attack>)> = vec![
        (
            Box::new(CarliniWagnerL2 { c: 0.01, steps: 30, binary_search_steps: 2, ..Default::default() }),
            Box::new(CarliniWagnerL2 { c: 0.01, steps: 30, binary_search_steps: 4, ..Default::default() }),
        ),
        (
            Box::new(ElasticNet { c: 0.01, steps: 30, binary_search_steps: 2, ..Default::default() }),
            Box::new(ElasticNet { c: 0.01, steps: 30, binary_search_steps: 4, ..Default::default() }),
        ),
        (
            Box::new(LbfgsB { c: 0.01, max_iter: 15, binary_search_steps: 2, ..Default::default() }),
            Box::new(LbfgsB { c: 0.01, max_iter: 15, binary_search_steps: 4, ..Default::default() }),
        ),
    ];
    for (short, long) in pairs {
        let a = short.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
        let b = long.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
        for i in 0..16 {
            assert!(!a.success[i] || b.success[i], "{}: sample {i} lost its success", long.name());
            if a.success[i] {
                assert!(
                    b.norms[i].l2 <= a.norms[i].l2,
                    "{}: sample {i} {} > {}",
                    long.name(),
                    b.norms[i].l2,
                    a.norms[i].l2
                );
            }
        }
        assert!(b.success_rate() >= a.success_rate());
    }
}

/// f(x) = [0, w·x + b]: a binary linear classifier, whose class-1-minus-class-0 logit is linear.
struct BinaryLinear {
    w: Vec<f32>,
    b: f32,
    bounds: (f32, f32),
    counters: Counters,
}

impl Classifier for BinaryLinear {
    fn input_shape(&self) -> &[usize] {
        std::slice::from_ref(&10)
    }
    fn num_classes(&self) -> usize {
        2
    }
    fn bounds(&self) -> (f32, f32) {
        self.bounds
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // [N, 10] · [[0, w₀], [0, w₁], …] + [0, b]
        let w2: Vec<f32> = self.w.iter().flat_map(|&v| [0.0, v]).collect();
        x.matmul(&Tensor::from_vec(w2, &[10, 2])?)?.add(&Tensor::from_slice(&[0.0, self.b], &[2])?)
    }
    fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// Linear-model oracle (docs/testing.md#linear-model-oracle): the minimal distance to the boundary of a binary linear
/// classifier is |w·x + b|/‖w‖₂ (L2) and |w·x + b|/‖w‖₁ (L∞); the attacks land within tolerance above it, never below.
#[test]
fn linear_oracle() {
    let w = Tensor::normal(&[10], 0.0, 1.0, 31).to_vec();
    // Inputs in [−1, 1]: the box [−2, 2] never binds (distances are below 1), yet keeps CW's tanh-space Adam
    // steps (∝ (hi − lo)·lr) fine enough to approach the boundary.
    let model = BinaryLinear { w: w.clone(), b: 0.3, bounds: (-2.0, 2.0), counters: Counters::default() };
    let n = 16;
    let x = Tensor::uniform(&[n, 10], -1.0, 1.0, 32);
    let y = model.predict(&x).unwrap();
    let xs = rows_of(&x);
    let margin: Vec<f64> =
        xs.iter().map(|r| (r.iter().zip(&w).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() + 0.3).abs()).collect();
    let l2w = w.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
    let l1w = w.iter().map(|&v| (v as f64).abs()).sum::<f64>();
    let l2_min: Vec<f64> = margin.iter().map(|m| m / l2w).collect();
    let linf_min: Vec<f64> = margin.iter().map(|m| m / l1w).collect();
    let below = 1.0 - 1e-5;
    let cases: Vec<(&str, Box<dyn Attack>, f64)> = vec![
        ("DeepFool-L2", Box::new(DeepFool::default()), 1.02 + 1e-4),
        ("DeepFool-Linf", Box::new(DeepFool::linf()), 1.02 + 1e-4),
        ("CW", Box::new(CarliniWagnerL2 { c: 1.0, steps: 300, binary_search_steps: 6, ..Default::default() }), 1.03),
        ("L-BFGS", Box::new(LbfgsB { c: 1.0, max_iter: 50, binary_search_steps: 10, ..Default::default() }), 1.05),
        ("FAB-L2", Box::new(Fab::l2()), 1.01),
        ("FAB-Linf", Box::new(Fab::linf()), 1.01),
        ("FAB-T-Linf", Box::new(Fab { target_classes: 1, ..Fab::linf() }), 1.01),
    ];
    for (name, attack, above) in cases {
        let r = attack.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
        check_honest(name, &model, &y, &r);
        for i in 0..n {
            assert!(r.success[i], "{name}: sample {i} failed");
            let (got, min) = if name.ends_with("Linf") {
                (r.norms[i].linf as f64, linf_min[i])
            } else {
                (r.norms[i].l2 as f64, l2_min[i])
            };
            assert!(got >= min * below, "{name}: sample {i} at {got}, below the minimum {min}");
            assert!(got <= min * above, "{name}: sample {i} at {got}, more than {above}× the minimum {min}");
        }
        let ratio: Vec<f64> = (0..n)
            .map(|i| {
                if name.ends_with("Linf") {
                    r.norms[i].linf as f64 / linf_min[i]
                } else {
                    r.norms[i].l2 as f64 / l2_min[i]
                }
            })
            .collect();
        println!(
            "{name}: norm / minimum, mean {:.5}, max {:.5}",
            ratio.iter().sum::<f64>() / n as f64,
            ratio.iter().fold(0f64, |a, &b| a.max(b))
        );
    }
    // EAD: its L1 can't beat the L1 minimum |w·x + b|/‖w‖∞.
    let linf_w = w.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
    let r = ElasticNet { c: 1.0, steps: 300, binary_search_steps: 6, ..Default::default() }
        .run(&model, &x, &y, &Goal::Untargeted, 0)
        .unwrap();
    check_honest("EAD", &model, &y, &r);
    for (i, m) in margin.iter().enumerate() {
        assert!(r.success[i], "EAD: sample {i} failed");
        assert!(r.norms[i].l1 as f64 >= m / linf_w * below, "EAD: L1 below the minimum");
    }
    // FAB-L1: the projection moves the coordinate of largest |w| alone, so it lands just above the L1 minimum.
    let r = Fab::l1().run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    check_honest("FAB-L1", &model, &y, &r);
    for (i, m) in margin.iter().enumerate() {
        assert!(r.success[i], "FAB-L1: sample {i} failed");
        let (got, min) = (r.norms[i].l1 as f64, m / linf_w);
        assert!(got >= min * below && got <= min * 1.01, "FAB-L1: sample {i} at {got}, minimum {min}");
    }
}

/// softmax over a 5-vector, as MindArmour's DeepFool test "model".
struct Softmax5(Counters);

impl Classifier for Softmax5 {
    fn input_shape(&self) -> &[usize] {
        std::slice::from_ref(&5)
    }
    fn num_classes(&self) -> usize {
        5
    }
    fn bounds(&self) -> (f32, f32) {
        (0.0, 1.0)
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.softmax(1)
    }
    fn counters(&self) -> &Counters {
        &self.0
    }
}

/// MindArmour's DeepFool test, recomputed (docs/reference.md#from-mindarmours-tests): the logits are softmax(x); one
/// iteration to class 3.
#[test]
fn deepfool_golden() {
    let model = Softmax5(Counters::default());
    let x = Tensor::from_vec(vec![0.1, 0.2, 0.7, 0.5, 0.4], &[1, 5]).unwrap();
    let attack = DeepFool { norm: Norm::L2, overshoot: 0.02, max_iter: 10, candidates: 5 };
    let r = attack.run(&model, &x, &[2], &Goal::Untargeted, 0).unwrap();
    let want = [0.10300991f32, 0.20332647, 0.59308802, 0.596_512_6, 0.40406296]; // 0.59651263 in MindArmour's test
    let got = r.adversarial.to_vec();
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-6, "DeepFool golden: got {got:?}, want {want:?}");
    }
    assert_eq!(r.predictions, vec![3]);
    assert_eq!(r.gradients, vec![4], "one iteration, one backward per other class");
}

#[test]
fn misuse_is_an_error() {
    let model = tiny_model(41);
    let (x, y) = batch(&model, 4, 42);
    let bad_labels = [0, 1, 7, 2];
    let ok = |a: &dyn Attack| a.run(&model, &x, &y, &Goal::Untargeted, 0);
    assert!(DeepFool::default().run(&model, &x, &y, &Goal::Targeted(vec![0; 4]), 0).is_err());
    assert!(DeepFool::default().run(&model, &x, &y, &Goal::LeastLikely, 0).is_err());
    assert!(ok(&DeepFool { candidates: 1, ..DeepFool::default() }).is_err());
    assert!(ok(&DeepFool { max_iter: 0, ..DeepFool::default() }).is_err());
    assert!(ok(&DeepFool { norm: Norm::L1, ..DeepFool::default() }).is_err());
    assert!(ok(&DeepFool { overshoot: -0.1, ..DeepFool::default() }).is_err());
    let cw = CarliniWagnerL2 { steps: 5, binary_search_steps: 1, ..Default::default() };
    for bad in [
        CarliniWagnerL2 { steps: 0, ..cw.clone() },
        CarliniWagnerL2 { lr: 0.0, ..cw.clone() },
        CarliniWagnerL2 { lr: -1.0, ..cw.clone() },
        CarliniWagnerL2 { c: 0.0, ..cw.clone() },
        CarliniWagnerL2 { c: f32::NAN, ..cw.clone() },
        CarliniWagnerL2 { kappa: -1.0, ..cw.clone() },
        CarliniWagnerL2 { binary_search_steps: 0, ..cw.clone() },
    ] {
        assert!(ok(&bad).is_err(), "{bad:?}");
    }
    let ead = ElasticNet { steps: 5, binary_search_steps: 1, ..Default::default() };
    for bad in [
        ElasticNet { steps: 0, ..ead.clone() },
        ElasticNet { lr: 0.0, ..ead.clone() },
        ElasticNet { c: -1.0, ..ead.clone() },
        ElasticNet { beta: -0.1, ..ead.clone() },
        ElasticNet { kappa: -1.0, ..ead.clone() },
    ] {
        assert!(ok(&bad).is_err(), "{bad:?}");
    }
    let lb = LbfgsB { max_iter: 5, binary_search_steps: 1, ..Default::default() };
    for bad in [
        LbfgsB { c: 0.0, ..lb.clone() },
        LbfgsB { max_iter: 0, ..lb.clone() },
        LbfgsB { memory: 0, ..lb.clone() },
        LbfgsB { binary_search_steps: 0, ..lb.clone() },
    ] {
        assert!(ok(&bad).is_err(), "{bad:?}");
    }
    let all: [&dyn Attack; 4] = [&DeepFool::default(), &cw, &ead, &lb];
    for a in all {
        assert!(ok(a).is_ok(), "{}", a.name());
        assert!(a.run(&model, &x, &bad_labels, &Goal::Untargeted, 0).is_err(), "{}: label out of range", a.name());
        assert!(a.run(&model, &x, &y[..3], &Goal::Untargeted, 0).is_err(), "{}: label count", a.name());
        let nan = Tensor::full(&[4, 1, 4, 4], f32::NAN);
        assert!(a.run(&model, &nan, &y, &Goal::Untargeted, 0).is_err(), "{}: NaN input", a.name());
    }
}

fn mean_l2(r: &AttackResult, keep: &[bool]) -> f32 {
    let v: Vec<f32> = (0..keep.len()).filter(|&i| keep[i] && r.success[i]).map(|i| r.norms[i].l2).collect();
    v.iter().sum::<f32>() / v.len().max(1) as f32
}

/// The torchattacks baseline (docs/reference.md#speed-baselines): CW-L2 (c = 1, κ = 0, 100 Adam steps of 0.01, no
/// search) on the fixture cnn and the first 100 test images — torchattacks: success 0.77, mean L2 0.72. With a binary
/// search every image falls. DeepFool and CW with a search need smaller L2 perturbations than PGD-L2 does.
#[test]
fn fixture_cnn_cw_deepfool_vs_pgd() {
    let model = fixture_cnn();
    let test = armoury::data::load_default(None).unwrap().test;
    let (x, y) = test.batch(0..100).unwrap();
    let correct: Vec<bool> = model.predict(&x).unwrap().iter().zip(&y).map(|(p, l)| p == l).collect();
    let all = vec![true; 100];

    let t = Instant::now();
    let cw = CarliniWagnerL2::torchattacks().run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    let (rate, l2) = (cw.success_rate(), mean_l2(&cw, &all));
    println!(
        "CW c=1, 100 steps: success {rate}, mean L2 of successes {l2:.4} (originally correct: {:.4}), {} gradients, {:.2?}",
        mean_l2(&cw, &correct),
        cw.total_gradients(),
        t.elapsed()
    );
    check_honest("CW", &model, &y, &cw);
    assert!(rate >= 0.77, "CW success {rate} < torchattacks' 0.77");
    assert!(l2 <= 0.72, "CW mean L2 {l2} > torchattacks' 0.72");

    // With a per-sample binary search over c (5 runs of 100 Adam steps from c = 1, lr 0.05) every image falls,
    // with a mean L2 below torchattacks' no-search figure. (lr 0.01 needs longer runs: the paper's 9 × 1000
    // steps also reach 1.0 at mean L2 0.66, measured with the `attack` example; 3 × 100 steps reach 0.96.)
    let t = Instant::now();
    let cws = CarliniWagnerL2 { c: 1.0, steps: 100, binary_search_steps: 5, lr: 0.05, ..Default::default() }
        .run(&model, &x, &y, &Goal::Untargeted, 0)
        .unwrap();
    println!(
        "CW with 5 search steps: success {}, mean L2 {:.4} (originally correct {:.4}), {} gradients, {:.2?}",
        cws.success_rate(),
        mean_l2(&cws, &all),
        mean_l2(&cws, &correct),
        cws.total_gradients(),
        t.elapsed()
    );
    check_honest("CW search", &model, &y, &cws);
    assert_eq!(cws.success_rate(), 1.0, "CW with a binary search fools every image");
    assert!(mean_l2(&cws, &all) <= 0.72, "CW with a binary search: mean L2 {}", mean_l2(&cws, &all));

    let t = Instant::now();
    let df = DeepFool::default().run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    println!(
        "DeepFool-L2: success {}, mean L2 {:.4} (originally correct {:.4}), {} gradients, {:.2?}",
        df.success_rate(),
        mean_l2(&df, &all),
        mean_l2(&df, &correct),
        df.total_gradients(),
        t.elapsed()
    );
    check_honest("DeepFool", &model, &y, &df);
    assert!(df.success_rate() >= 0.95);

    // Against PGD-L2 (40 steps of ε/4, random start): the smallest ε of a sweep that fools each image (an upper
    // bound on what PGD needs, rounded up to the grid), and PGD at the median L2 of the minimum-norm attack.
    // Measured (see the report): DeepFool's and the searched CW's L2 are below PGD's grid ε on most images;
    // 100-step CW without a search is on a par with it, not below — in tanh space the background pixels at
    // exactly 0 barely move in 100 Adam steps of 0.01 — and at either attack's median L2, PGD fools more images
    // than the attack did within that budget.
    let t = Instant::now();
    let grid = [0.25f32, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0];
    let sweep = Pgd::l2(1.0).sweep(&model, &x, &y, &Goal::Untargeted, &grid, 0).unwrap();
    let pgd_eps: Vec<Option<f32>> =
        (0..100).map(|i| grid.iter().zip(&sweep).find(|(_, r)| r.success[i]).map(|(&e, _)| e)).collect();
    println!("PGD-L2 sweep {:.2?}", t.elapsed());
    for (name, r, max_ratio, min_smaller) in
        [("CW", &cw, 1.1, 0.4), ("CW search", &cws, 1.0, 0.6), ("DeepFool", &df, 1.0, 0.6)]
    {
        let both: Vec<usize> = (0..100).filter(|&i| correct[i] && r.success[i] && pgd_eps[i].is_some()).collect();
        let mine = both.iter().map(|&i| r.norms[i].l2).sum::<f32>() / both.len() as f32;
        let pgd = both.iter().map(|&i| pgd_eps[i].expect("kept")).sum::<f32>() / both.len() as f32;
        let smaller = both.iter().filter(|&&i| r.norms[i].l2 <= pgd_eps[i].expect("kept")).count();
        let mut l2s: Vec<f32> = (0..100).filter(|&i| correct[i] && r.success[i]).map(|i| r.norms[i].l2).collect();
        l2s.sort_by(f32::total_cmp);
        let med = l2s[l2s.len() / 2];
        let within = (0..100).filter(|&i| correct[i] && r.success[i] && r.norms[i].l2 <= med).count();
        let p = Pgd::l2(med).run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
        let pgd_n = (0..100).filter(|&i| correct[i] && p.success[i]).count();
        println!(
            "{name}: on {} images fooled by both, mean L2 {mine:.4} vs PGD's grid ε {pgd:.4}, smaller on {smaller}; \
             median L2 {med:.4}: {within} fooled within it, PGD-L2 at that ε fools {pgd_n}",
            both.len()
        );
        assert!(both.len() >= 60, "{name}: {} images fooled by both", both.len());
        assert!(mine < max_ratio * pgd, "{name}: mean L2 {mine} vs PGD-L2's grid ε {pgd}");
        assert!(smaller as f32 >= min_smaller * both.len() as f32, "{name}: below PGD on {smaller} of {}", both.len());
    }
}

/// EAD targets L1: on the fixture cnn its perturbations are sparser (smaller L1) than L-BFGS's and DeepFool's,
/// and both EAD and L-BFGS fool every image (first 30 test images).
#[test]
fn fixture_cnn_ead_lbfgs() {
    let model = fixture_cnn();
    let test = armoury::data::load_default(None).unwrap().test;
    let (x, y) = test.batch(0..30).unwrap();
    let t = Instant::now();
    let ead = ElasticNet { c: 10.0, steps: 100, binary_search_steps: 2, decision: EadRule::L1, ..Default::default() };
    let e = ead.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    println!("EAD-L1: {:.2?}", t.elapsed());
    let t = Instant::now();
    let l = LbfgsB { c: 0.1, max_iter: 50, binary_search_steps: 3, ..Default::default() }
        .run(&model, &x, &y, &Goal::Untargeted, 0)
        .unwrap();
    println!("L-BFGS: {:.2?}", t.elapsed());
    let d = DeepFool::default().run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    for (name, r) in [("EAD-L1", &e), ("L-BFGS", &l), ("DeepFool", &d)] {
        check_honest(name, &model, &y, r);
        let n = r.norms.iter().map(|n| n.l1).sum::<f32>() / 30.0;
        let m = r.norms.iter().map(|n| n.l2).sum::<f32>() / 30.0;
        println!(
            "{name}: success {}, mean L1 {n:.3}, mean L2 {m:.4}, {} gradients",
            r.success_rate(),
            r.total_gradients()
        );
        assert_eq!(r.success_rate(), 1.0, "{name}");
    }
    let l1 = |r: &AttackResult| r.norms.iter().map(|n| n.l1).sum::<f32>();
    assert!(l1(&e) < 0.8 * l1(&l) && l1(&e) < 0.8 * l1(&d), "EAD's L1 must be clearly the smallest");
}
