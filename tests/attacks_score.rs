//! Score-based black-box attacks (Square L∞/L2/L1, SimBA pixel/DCT, NES in its three settings, SPSA, GenAttack,
//! particle swarm) through the shared property checks (feasibility, honest flags, determinism, zero budget) from
//! one table, exact query accounting against the classifier's own counter, the least-likely target's query, and
//! robustness gates on the fixture cnn and the first Fashion-MNIST test images.

use armoury::nn::{cnn, Sequential};
use armoury::{io, Attack, Classifier, Counters, Error, Goal, ModuleClassifier, Tensor};
use armoury_attacks::registry::AttackParams;
use armoury_attacks::{
    Epsilon, GenAttack, Nes, NesSetting, Norm, ParticleSwarm, Pgd, SimBA, SimbaBasis, Spsa, SquareAttack,
};

use crate::attack_props::*;

/// An attack of the table, its norm, its ε and its query budget; `with` rebuilds it with another ε and budget.
struct Case {
    attack: Box<dyn Attack>,
    norm: &'static str,
    eps: f32,
    queries: u64,
    with: fn(Epsilon, u64) -> Box<dyn Attack>,
}

impl Case {
    /// Whether the attack sees labels only (NES's label-only setting), so that it refuses a least-likely target.
    fn label_only(&self) -> bool {
        self.attack.name().starts_with("NES-LO")
    }
}

fn case(norm: &'static str, eps: f32, queries: u64, with: fn(Epsilon, u64) -> Box<dyn Attack>) -> Case {
    Case { attack: with(Epsilon::Scalar(eps), queries), norm, eps, queries, with }
}

fn table() -> Vec<Case> {
    vec![
        case("Linf", 0.2, 120, |eps, q| Box::new(SquareAttack { eps, max_queries: q, ..SquareAttack::linf(0.0) })),
        case("L2", 0.8, 120, |eps, q| Box::new(SquareAttack { eps, max_queries: q, ..SquareAttack::l2(0.0) })),
        case("L1", 2.0, 120, |eps, q| Box::new(SquareAttack { eps, max_queries: q, ..SquareAttack::l1(0.0) })),
        case("Linf", 0.2, 120, |eps, q| Box::new(SimBA { eps, max_queries: q, ..SimBA::pixel(0.0) })),
        case("Linf", 0.2, 120, |eps, q| {
            Box::new(SimBA { eps, max_queries: q, basis: SimbaBasis::Dct { freq: 2, stride: 1 }, ..SimBA::dct(0.0) })
        }),
        case("Linf", 0.2, 150, |eps, q| Box::new(Nes { eps, max_queries: q, samples: 10, ..Nes::query_limited(0.0) })),
        case("Linf", 0.2, 150, |eps, q| {
            Box::new(Nes { eps, max_queries: q, samples: 10, ..Nes::partial_info(0.0, 2, None) })
        }),
        case("Linf", 0.2, 150, |eps, q| {
            Box::new(Nes {
                eps,
                max_queries: q,
                samples: 4,
                setting: NesSetting::LabelOnly { mu: 0.2, copies: 5, starts: None, decay: 0.05 },
                ..Nes::label_only(0.0, None)
            })
        }),
        case("Linf", 0.2, 150, |eps, q| Box::new(Spsa { eps, max_queries: q, pairs: 8, ..Spsa::new(0.0) })),
        case("Linf", 0.2, 150, |eps, q| {
            Box::new(GenAttack { eps, max_queries: q, reduction_queries: 30, ..GenAttack::new(0.0) })
        }),
        case("Linf", 0.2, 150, |eps, q| {
            Box::new(ParticleSwarm { eps, max_queries: q, reduction_queries: 30, ..ParticleSwarm::new(0.0) })
        }),
    ]
}

/// Runs `attack` and checks the query accounting: the per-sample counts add up to the classifier's own count
/// (minus the final evaluation pass) and none exceeds the budget.
fn run_counted(
    attack: &dyn Attack,
    model: &dyn Classifier,
    x: &Tensor,
    y: &[usize],
    goal: &Goal,
    budget: u64,
) -> armoury::AttackResult {
    let before = model.counters().snapshot().forward_samples;
    let r = attack.run(model, x, y, goal, 0).unwrap();
    let spent = model.counters().snapshot().forward_samples - before;
    let name = attack.name();
    assert_eq!(
        spent,
        r.queries.iter().sum::<u64>() + y.len() as u64,
        "{name} {goal:?}: reported queries vs the classifier's count"
    );
    assert!(r.queries.iter().all(|&q| q <= budget), "{name} {goal:?}: budget {budget} exceeded: {:?}", r.queries);
    r
}

#[test]
fn property_table() {
    let model = tiny_model(1);
    let (x, y) = batch(&model, 12, 2);
    let x_before = x.to_vec();
    for c in table() {
        let name = c.attack.name();
        let mut successes = 0;
        for goal in [Goal::Untargeted, Goal::RandomTarget { seed: 4 }, Goal::LeastLikely, Goal::Targeted(vec![0; 12])] {
            if goal == Goal::LeastLikely && c.label_only() {
                assert!(
                    c.attack.run(&model, &x, &y, &goal, 0).is_err(),
                    "{name}: label-only with a least-likely target"
                );
                continue;
            }
            let r = run_counted(c.attack.as_ref(), &model, &x, &y, &goal, c.queries);
            check_feasible(&name, &model, &x, &r, c.norm, &[c.eps; 12]);
            check_honest(&name, &model, &y, &r);
            assert_eq!(r.goal.is_targeted(), goal != Goal::Untargeted, "{name}");
            check_deterministic(&name, c.attack.as_ref(), &model, &x, &y, &goal);
            successes += r.success.iter().filter(|&&s| s).count();
        }
        assert!(successes > 0, "{name}: never succeeded on the tiny model");
        // Per-sample ε (sample 0 has none).
        let per: Vec<f32> = (0..12).map(|i| c.eps * i as f32 / 11.0).collect();
        let a = (c.with)(Epsilon::PerSample(per.clone()), c.queries);
        let r = run_counted(a.as_ref(), &model, &x, &y, &Goal::Untargeted, c.queries);
        check_feasible(&name, &model, &x, &r, c.norm, &per);
        assert_eq!(r.norms[0].linf, 0.0, "{name}: ε = 0 for sample 0");
        assert_eq!(r.queries[0], 0, "{name}: ε = 0 costs no query");
        // Zero budget: ε = 0 or no queries is the identity.
        check_zero_budget(&name, (c.with)(Epsilon::Scalar(0.0), c.queries).as_ref(), &model, &x, &y);
        check_zero_budget(&name, (c.with)(Epsilon::Scalar(c.eps), 0).as_ref(), &model, &x, &y);
        // A budget of one query only re-evaluates the clean input.
        let r = run_counted((c.with)(Epsilon::Scalar(c.eps), 1).as_ref(), &model, &x, &y, &Goal::Untargeted, 1);
        assert_eq!(r.adversarial.to_vec(), x.to_vec(), "{name}: one query cannot move");
        // Sweeps: one result per ε, ε = 0 first.
        let s = c.attack.sweep(&model, &x, &y, &Goal::Untargeted, &[0.0, c.eps], 0).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].adversarial.to_vec(), x.to_vec(), "{name}: sweep ε = 0");
    }
    assert_eq!(x.to_vec(), x_before, "the input must not change");
}

/// A least-likely target costs each sample exactly one query of the clean scores, charged to its budget: the
/// run equals, bit for bit, a run toward the same targets given explicitly with one query less, plus that query;
/// no sample exceeds the budget, a sweep charges the query in every result, and a budget of 0 cannot pay for it
/// (an error, not a query reported over the budget).
#[test]
fn least_likely_costs_one_counted_query() {
    let model = tiny_model(1);
    let (x, y) = batch(&model, 12, 2);
    let z = model.logits(&x).unwrap();
    let least: Vec<usize> =
        z.rows().into_iter().map(|r| (0..r.len()).fold(0, |b, c| if r[c] < r[b] { c } else { b })).collect();
    for c in table().into_iter().filter(|c| !c.label_only()) {
        let name = c.attack.name();
        let ll = run_counted(c.attack.as_ref(), &model, &x, &y, &Goal::LeastLikely, c.queries);
        assert_eq!(ll.goal, armoury::attack::Resolved::Targeted(least.clone()), "{name}");
        let fewer = (c.with)(Epsilon::Scalar(c.eps), c.queries - 1);
        let explicit = run_counted(fewer.as_ref(), &model, &x, &y, &Goal::Targeted(least.clone()), c.queries - 1);
        assert_eq!(ll.adversarial.to_vec(), explicit.adversarial.to_vec(), "{name}: the same search");
        let plus_one: Vec<u64> = explicit.queries.iter().map(|q| q + 1).collect();
        assert_eq!(ll.queries, plus_one, "{name}: one resolution query per sample");
        let swept = c.attack.sweep(&model, &x, &y, &Goal::LeastLikely, &[c.eps], 0).unwrap();
        assert_eq!(swept[0].queries, ll.queries, "{name}: a sweep charges the resolution query too");
        // One query: the resolution alone; none: refused before any score is read.
        let one = run_counted((c.with)(Epsilon::Scalar(c.eps), 1).as_ref(), &model, &x, &y, &Goal::LeastLikely, 1);
        assert_eq!((one.queries, one.adversarial.to_vec()), (vec![1; 12], x.to_vec()), "{name}: budget 1");
        let before = model.counters().snapshot().forward_samples;
        let zero = (c.with)(Epsilon::Scalar(c.eps), 0).run(&model, &x, &y, &Goal::LeastLikely, 0);
        assert!(matches!(zero, Err(Error::InvalidArgument { .. })), "{name}: budget 0 with a least-likely target");
        assert_eq!(model.counters().snapshot().forward_samples, before, "{name}: refused before a query");
    }
}

/// Already-misclassified inputs come back unchanged after one query.
#[test]
fn misclassified_inputs_cost_one_query() {
    let model = tiny_model(1);
    let (x, y) = batch(&model, 6, 3);
    let wrong: Vec<usize> = y.iter().map(|&l| (l + 1) % 3).collect();
    for c in table() {
        let r = run_counted(c.attack.as_ref(), &model, &x, &wrong, &Goal::Untargeted, c.queries);
        assert_eq!(r.adversarial.to_vec(), x.to_vec(), "{}", c.attack.name());
        assert!(r.queries.iter().all(|&q| q == 1) && r.success.iter().all(|&s| s), "{}", c.attack.name());
    }
}

#[test]
fn misuse_is_an_error() {
    let model = tiny_model(1);
    let (x, y) = batch(&model, 3, 5);
    let run = |a: &dyn Attack| a.run(&model, &x, &y, &Goal::Untargeted, 0);
    assert!(matches!(run(&SquareAttack::linf(-0.1)), Err(Error::InvalidArgument { .. })));
    assert!(matches!(
        run(&SquareAttack { p_init: 0.0, ..SquareAttack::linf(0.1) }),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(run(&SimBA { step: Some(-1.0), ..SimBA::pixel(0.1) }), Err(Error::InvalidArgument { .. })));
    assert!(matches!(run(&Nes { samples: 1, ..Nes::query_limited(0.1) }), Err(Error::InvalidArgument { .. })));
    assert!(matches!(run(&Nes::partial_info(0.1, 0, None)), Err(Error::InvalidArgument { .. })));
    let bad_starts = Tensor::zeros(&[2, 1, 4, 4]);
    assert!(matches!(run(&Nes::partial_info(0.1, 2, Some(bad_starts))), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(run(&Spsa { pairs: 0, ..Spsa::new(0.1) }), Err(Error::InvalidArgument { .. })));
    assert!(matches!(run(&GenAttack { population: 1, ..GenAttack::new(0.1) }), Err(Error::InvalidArgument { .. })));
    assert!(matches!(
        run(&ParticleSwarm { particles: 0, ..ParticleSwarm::new(0.1) }),
        Err(Error::InvalidArgument { .. })
    ));
    let per = Epsilon::PerSample(vec![0.1; 2]);
    assert!(matches!(run(&Spsa { eps: per, ..Spsa::new(0.1) }), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(
        SimBA::pixel(0.1).run(&model, &x, &[0, 1, 7], &Goal::Untargeted, 0),
        Err(Error::LabelOutOfRange { .. })
    ));
}

/// Partial information with start images (ε-decay from an image of the target class) and label-only with
/// start images reach targets the plain search does not need to start from.
#[test]
fn nes_targeted_from_start_images() {
    let model = tiny_model(1);
    // One image per class the model predicts somewhere in the box (a class it never predicts gets any image:
    // a start that is not admissible falls back to the clean input).
    let pool = Tensor::uniform(&[2000, 1, 4, 4], 0.0, 1.0, 11);
    let preds = model.predict(&pool).unwrap();
    let pick: Vec<usize> = (0..3).map(|c| preds.iter().position(|&p| p == c).unwrap_or(0)).collect();
    let seen: Vec<usize> = (0..3).filter(|&c| preds.contains(&c)).collect();
    assert!(seen.len() >= 2, "the tiny model predicts at least two classes");
    let starts = pool.index_select(0, &pick).unwrap();
    let (x, y) = batch(&model, 8, 6);
    let goal = Goal::Targeted(y.iter().map(|&l| *seen.iter().find(|&&c| c != l).unwrap()).collect());
    let pi = Nes { max_queries: 1000, samples: 10, ..Nes::partial_info(0.3, 2, Some(starts.clone())) };
    let lo = Nes { max_queries: 1000, samples: 4, ..Nes::label_only(0.3, Some(starts)) };
    for (attack, floor) in [(pi, 0.5), (lo, 0.1)] {
        let name = attack.name();
        let r = run_counted(&attack, &model, &x, &y, &goal, 1000);
        check_feasible(&name, &model, &x, &r, "Linf", &[0.3; 8]);
        check_honest(&name, &model, &y, &r);
        let again = attack.run(&model, &x, &y, &goal, 0).unwrap();
        assert_eq!(again.adversarial.to_vec(), r.adversarial.to_vec(), "{name}: deterministic");
        assert!(r.success_rate() >= floor, "{name}: success {}", r.success_rate());
    }
}

fn fixture_cnn() -> ModuleClassifier {
    let net: Sequential = cnn(0);
    io::load_module(&net, crate::common::fixture("cnn.safetensors")).unwrap();
    ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0)).unwrap()
}

/// Square L∞, ε = 0.1, 1,000 queries with the schedule rescaled to them (as ART's is), on all of the first 200
/// test images: robust accuracy within 0.05 of white-box PGD-40's (ART 1.20 measures 0.110–0.115 against
/// PGD-40's 0.065–0.070 in these settings). AutoAttack's standard schedule is not rescaled and meant for 5,000
/// queries: at 1,000 it leaves p ≥ p_init/16 and 0.14 robust accuracy here, at 5,000 0.08 (rescaled at 1,000:
/// 0.095; PGD-40: 0.065).
#[test]
fn fixture_cnn_square_gate() {
    let model = fixture_cnn();
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..200).unwrap();
    let pgd = Pgd { step_size: 0.01, ..Pgd::linf(0.1) }.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    let art = SquareAttack { rescale_schedule: true, ..SquareAttack::linf(0.1) };
    let sq = run_counted(&art, &model, &x, &y, &Goal::Untargeted, 1000);
    let standard = SquareAttack { max_queries: 5000, ..SquareAttack::linf(0.1) };
    let aa = run_counted(&standard, &model, &x, &y, &Goal::Untargeted, 5000);
    let (a_pgd, a_sq, a_aa) = (pgd.robust_accuracy(&y), sq.robust_accuracy(&y), aa.robust_accuracy(&y));
    assert!(a_sq <= a_pgd + 0.05, "Square {a_sq} vs PGD-40 {a_pgd}");
    assert!(a_aa <= a_pgd + 0.05, "AutoAttack's standard Square {a_aa} vs PGD-40 {a_pgd}");
    check_feasible("square", &model, &x, &sq, "Linf", &[0.1; 200]);
}

/// Square on the fixture cnn, L∞, L2 and L1, 24 test images and 300 queries: the batch's adversarial rows and
/// per-sample query counts equal those of each image attacked alone, bit for bit. The attack sends all samples'
/// candidates of a step to the model as one batch, so this holds the conv kernels to row independence.
#[test]
fn fixture_cnn_square_batched_equals_alone() {
    let model = fixture_cnn();
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..24).unwrap();
    for attack in [SquareAttack::linf(0.1), SquareAttack::l2(1.5), SquareAttack::l1(10.0)] {
        let attack = SquareAttack { max_queries: 300, ..attack };
        let all = attack.run(&model, &x, &y, &Goal::Untargeted, 7).unwrap();
        let d = x.numel() / y.len();
        let rows = all.adversarial.to_vec();
        for i in 0..y.len() {
            let one = attack.run(&model, &x.narrow(0, i, 1).unwrap(), &y[i..i + 1], &Goal::Untargeted, 7).unwrap();
            assert_eq!(&rows[i * d..(i + 1) * d], &one.adversarial.to_vec()[..], "{}: sample {i}", attack.name());
            assert_eq!(all.queries[i], one.queries[0], "{}: queries of sample {i}", attack.name());
        }
        assert!(all.success.iter().any(|&s| s), "{}: never succeeded", attack.name());
        assert!(all.queries.contains(&300), "{}: no sample used the whole budget", attack.name());
    }
}

/// NES and SimBA at ε = 0.1 within 10,000 queries: robust accuracy below 0.2. On the first 60 test images to
/// keep the suite short (on all 200 with the `attack` example: NES 0.12, SimBA pixel 0.065). SimBA-DCT meets it
/// here (0.183) but not on all 200 (0.235): its low-frequency directions saturate the L∞ box after a few steps,
/// and steps of 1.5–10ε or other frequency schedules did not help (measured 0.18–0.23 on these 60).
#[test]
fn fixture_cnn_nes_simba_gate() {
    let model = fixture_cnn();
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..60).unwrap();
    for attack in
        [Box::new(Nes::query_limited(0.1)) as Box<dyn Attack>, Box::new(SimBA::pixel(0.1)), Box::new(SimBA::dct(0.1))]
    {
        let r = run_counted(attack.as_ref(), &model, &x, &y, &Goal::Untargeted, 10_000);
        check_feasible(&attack.name(), &model, &x, &r, "Linf", &[0.1; 60]);
        assert!(r.robust_accuracy(&y) < 0.2, "{}: robust accuracy {}", attack.name(), r.robust_accuracy(&y));
    }
}

/// GenAttack and the particle swarm at ε = 0.15 within 10,000 queries succeed on at least 90% of the correctly
/// classified images, the reduction step included. On the first 60 test images (report: all 200).
#[test]
fn fixture_cnn_genattack_pso_gate() {
    let model = fixture_cnn();
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..60).unwrap();
    let clean = model.predict(&x).unwrap();
    let correct: Vec<usize> = (0..60).filter(|&i| clean[i] == y[i]).collect();
    for attack in [Box::new(GenAttack::new(0.15)) as Box<dyn Attack>, Box::new(ParticleSwarm::new(0.15))] {
        let r = run_counted(attack.as_ref(), &model, &x, &y, &Goal::Untargeted, 10_000);
        check_feasible(&attack.name(), &model, &x, &r, "Linf", &[0.15; 60]);
        let rate = correct.iter().filter(|&&i| r.success[i]).count() as f32 / correct.len() as f32;
        assert!(rate >= 0.9, "{}: success {rate} on the correctly classified", attack.name());
    }
}

/// The fixture cnn with its logits multiplied by 10⁴ (a distilled or temperature-scaled model): the softmax
/// saturates, so a loss on f32 probabilities is flat, while the logit margin only scales.
struct Scaled {
    inner: ModuleClassifier,
    counters: Counters,
}

impl Classifier for Scaled {
    armoury::delegate_classifier!(inner, counters);
    fn forward(&self, x: &Tensor) -> armoury::Result<Tensor> {
        Ok(self.inner.forward(x)?.mul_scalar(1e4))
    }
}

/// Square's decisions read the logit margin (AutoAttack's `margin_and_loss`), which scales with the logits: on
/// the fixture cnn and on the same cnn with logits × 10⁴, L∞ and L2 Square break nearly the same share of the
/// first 100 test images (a margin of f32 log-probabilities is flat beyond a logit margin of ~87: the scaled
/// model was almost never broken).
#[test]
fn fixture_cnn_square_is_scale_invariant() {
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..100).unwrap();
    let model = fixture_cnn();
    let clean = model.predict(&x).unwrap();
    let correct: Vec<usize> = (0..100).filter(|&i| clean[i] == y[i]).collect();
    let scaled = Scaled { inner: fixture_cnn(), counters: Counters::default() };
    let rate = |m: &dyn Classifier, a: &SquareAttack| {
        let r = a.run(m, &x, &y, &Goal::Untargeted, 0).unwrap();
        correct.iter().filter(|&&i| r.success[i]).count() as f32 / correct.len() as f32
    };
    let mut failures = Vec::new();
    for attack in [SquareAttack::linf(0.1), SquareAttack::l2(1.5)] {
        let attack = SquareAttack { max_queries: 300, ..attack };
        let (plain, big) = (rate(&model, &attack), rate(&scaled, &attack));
        eprintln!("{}: plain {plain}, logits x 1e4 {big} ({} correct)", attack.name(), correct.len());
        if plain < 0.5 || (plain - big).abs() > 0.03 {
            failures.push(format!("{}: plain {plain} vs logits x 1e4 {big}", attack.name()));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Square's schedule of `p` is AutoAttack's `p_selection` (autoattack/square.py): `p_init` until iteration 10,
/// halved past 10, 50, 200, 500, 1000, 2000, 4000, 6000 and 8000, on the raw iteration number by default
/// (AutoAttack's standard `resc_schedule=False`) whatever the budget; rescaled, iteration `it` of `n` reads as
/// `int(it / n * 10000)`. Golden values written by hand from the authors' code, at and past each threshold.
#[test]
fn square_p_schedule_is_autoattacks() {
    let sq = SquareAttack::linf(0.1);
    assert_eq!((sq.p_init, sq.rescale_schedule), (0.8, false), "AutoAttack's standard defaults");
    assert_eq!((SquareAttack::l2(0.5).p_init, SquareAttack::l1(5.0).p_init), (0.8, 0.8));
    let golden: [(u64, f32); 21] = [
        (0, 0.8),
        (10, 0.8),
        (11, 0.4),
        (50, 0.4),
        (51, 0.2),
        (200, 0.2),
        (201, 0.1),
        (500, 0.1),
        (501, 0.05),
        (1000, 0.05),
        (1001, 0.025),
        (2000, 0.025),
        (2001, 0.0125),
        (4000, 0.0125),
        (4001, 0.00625),
        (6000, 0.00625),
        (6001, 0.003125),
        (8000, 0.003125),
        (8001, 0.0015625),
        (10_000, 0.0015625),
        (1_000_000, 0.0015625),
    ];
    for (it, p) in golden {
        // Not rescaled: the budget (here 1,000 or 5,000 iterations) does not matter.
        assert_eq!(sq.p_selection(it, 1000), p, "iteration {it} of 1000");
        assert_eq!(sq.p_selection(it, 5000), p, "iteration {it} of 5000");
    }
    let resc = SquareAttack { rescale_schedule: true, p_init: 0.5, ..SquareAttack::l2(0.5) };
    // int(it / 1000 * 10000): 1 -> 10, 2 -> 20, 5 -> 50, 6 -> 60, 100 -> 1000, 101 -> 1010, 999 -> 9990.
    for (it, p) in
        [(1, 0.5), (2, 0.25), (5, 0.25), (6, 0.125), (100, 0.5 / 16.0), (101, 0.5 / 32.0), (999, 0.5 / 512.0)]
    {
        assert_eq!(resc.p_selection(it, 1000), p, "rescaled iteration {it} of 1000");
    }
}

/// A classifier whose rejection class is the only other class it can predict: the fixture cnn with every logit
/// but those of class 0 (T-shirt) and 6 (shirt) pushed down by 10⁴, class 6 being the rejection class.
struct RejectingShirt {
    inner: ModuleClassifier,
    counters: Counters,
    rejection: Option<usize>,
}

impl Classifier for RejectingShirt {
    armoury::delegate_classifier!(inner, counters);
    fn forward(&self, x: &Tensor) -> armoury::Result<Tensor> {
        let mask: Vec<f32> = (0..10).map(|j| if j == 0 || j == 6 { 0.0 } else { -1e4 }).collect();
        self.inner.forward(x)?.add(&Tensor::from_vec(mask, &[1, 10])?)
    }
    fn rejection_class(&self) -> Option<usize> {
        self.rejection
    }
}

/// Reaching the rejection class is never a success, inside Square too: on T-shirts whose best other class is
/// the rejection class, Square (L∞, L2, L1) never stops early on it — every sample spends the whole budget
/// searching — and reports no success; without the rejection class the same runs do break some of them.
#[test]
fn square_never_succeeds_on_the_rejection_class() {
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..200).unwrap();
    let plain = RejectingShirt { inner: fixture_cnn(), counters: Counters::default(), rejection: None };
    let clean = plain.predict(&x).unwrap();
    let keep: Vec<usize> = (0..200).filter(|&i| y[i] == 0 && clean[i] == 0).take(12).collect();
    assert!(keep.len() >= 8, "T-shirts in the sample: {}", keep.len());
    let x = x.index_select(0, &keep).unwrap();
    let y = vec![0; keep.len()];
    let rejecting = RejectingShirt { rejection: Some(6), ..plain };
    for attack in [SquareAttack::linf(0.2), SquareAttack::l2(3.0), SquareAttack::l1(30.0)] {
        let attack = SquareAttack { max_queries: 500, ..attack };
        let name = attack.name();
        let free = RejectingShirt { inner: fixture_cnn(), counters: Counters::default(), rejection: None };
        let broken = attack.run(&free, &x, &y, &Goal::Untargeted, 0).unwrap();
        assert!(broken.success.iter().any(|&s| s), "{name}: never reached class 6 without a rejection class");
        let r = attack.run(&rejecting, &x, &y, &Goal::Untargeted, 0).unwrap();
        assert!(r.success.iter().all(|&s| !s), "{name}: success on the rejection class");
        assert!(r.queries.iter().all(|&q| q == 500), "{name}: stopped early: {:?}", r.queries);
    }
}

/// L1 Square (AutoAttack's L1 branch) on the fixture cnn at ε = 10 (28×28 images in [0, 1]), 1,000 queries, the
/// first 60 test images: exactly feasible (‖δ‖₁ ≤ ε, in the box), breaks at least half of the correctly
/// classified images, and the same seed gives the same answer.
#[test]
fn fixture_cnn_square_l1() {
    let model = fixture_cnn();
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..60).unwrap();
    let clean = model.predict(&x).unwrap();
    let correct: Vec<usize> = (0..60).filter(|&i| clean[i] == y[i]).collect();
    let attack = SquareAttack::l1(10.0);
    let r = run_counted(&attack, &model, &x, &y, &Goal::Untargeted, 1000);
    check_feasible("square-l1", &model, &x, &r, "L1", &[10.0; 60]);
    check_honest("square-l1", &model, &y, &r);
    let rate = correct.iter().filter(|&&i| r.success[i]).count() as f32 / correct.len() as f32;
    eprintln!("L1 Square, eps = 10: success {rate} on the {} correctly classified", correct.len());
    assert!(rate >= 0.5, "L1 Square: success {rate} on the correctly classified");
    let again = attack.run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    assert_eq!(again.adversarial.to_vec(), r.adversarial.to_vec(), "same seed, same answer");
    let other = attack.run(&model, &x, &y, &Goal::Untargeted, 1).unwrap();
    assert_ne!(other.adversarial.to_vec(), r.adversarial.to_vec(), "another seed, another search");
    // The registry builds it for an L1 threat model (it used to fall back to L∞).
    let p = AttackParams { eps: 10.0, norm: Some(Norm::L1), queries: Some(1000), ..AttackParams::default() };
    let built = armoury_attacks::registry::by_name("square", &p).unwrap();
    assert_eq!(built.name(), attack.name());
}
