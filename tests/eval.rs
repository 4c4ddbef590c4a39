//! The evaluator (docs/evaluation.md): the threat model as data, the cascade's ledger, resuming an interrupted
//! run, shards merging to the unsharded result, and the gradient-masking audit on the fixture cnn and on three
//! deliberately masked wrappers of it.

use std::sync::atomic::{AtomicU64, Ordering};

use armoury::data;
use armoury::eval::{
    audit, ledger_file, load_shards, merge, run_cascade, shard_range, summarise, AuditConfig, CascadeRun, Identity,
    Ledger, ThreatModel,
};
use armoury::{Classifier, Counters, ModuleClassifier, Result, Tensor};
use armoury_attacks::registry::from_spec;

use crate::attack_props::fixture_cnn;

const TM: &str = r#"{
  "name": "test", "norm": "linf", "eps": [0.05, 0.1], "seed": 3, "batch_size": 10,
  "attacks": [{"name": "apgd-ce", "steps": 10}, {"name": "fab-t", "steps": 10, "targets": 2},
              {"name": "square", "queries": 100}],
  "minimal": [{"name": "deepfool"}]
}"#;

pub fn tm() -> ThreatModel {
    ThreatModel::from_json(TM).unwrap()
}

pub fn cascade<'a>(tm: &'a ThreatModel, range: (usize, usize), total: usize) -> CascadeRun<'a> {
    CascadeRun {
        threat: tm,
        build: &from_spec,
        model_name: "fixture cnn".into(),
        identity: identity("fixture cnn", "sample"),
        range,
        total_samples: total,
        chunk: 16,
        state: None,
        max_steps: None,
        progress: None,
    }
}

/// A stand-in identity of this process (kernel path and version) for a model and data named by `model`, `data`.
pub fn identity(model: &str, data: &str) -> Identity {
    Identity {
        model_hash: model.into(),
        data: data.into(),
        data_hash: data.into(),
        kernel: armoury::eval::kernel_path().into(),
        version: env!("CARGO_PKG_VERSION").into(),
    }
}

/// The ledger without its wall-clock times (the only field that differs between identical runs).
pub fn timeless(mut l: Ledger) -> Ledger {
    l.work.iter_mut().for_each(|w| w.seconds = 0.0);
    l
}

#[test]
fn threat_model_parses_hashes_and_names_bad_fields() {
    let t = tm();
    assert_eq!(t.attacks[1].targets, Some(2));
    assert_eq!(t.batch_size, 10);
    // The hash ignores spacing and key order, and changes with any setting.
    let reordered = TM.replace(r#""name": "test", "norm": "linf""#, r#""norm": "linf",   "name": "test""#);
    assert_eq!(ThreatModel::from_json(&reordered).unwrap().hash(), t.hash());
    assert_eq!(t.hash().len(), 64);
    let other = ThreatModel::from_json(&TM.replace("\"seed\": 3", "\"seed\": 4")).unwrap();
    assert_ne!(other.hash(), t.hash());
    // The default lists round-trip.
    for d in [ThreatModel::autoattack_linf(0.1), ThreatModel::autoattack_l2(0.5)] {
        let back = ThreatModel::from_json(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
        assert_eq!(
            d.attacks.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            ["apgd-ce", "apgd-t", "fab-t", "square"]
        );
    }
    let bad = [
        (TM.replace(r#""steps": 10, "targets""#, r#""steps": "ten", "targets""#), "attacks[1].steps"),
        (TM.replace("\"seed\": 3", "\"sed\": 3"), "sed"),
        (TM.replace("[0.05, 0.1]", "[0.1, 0.05]"), "eps[1]"),
        (TM.replace("[0.05, 0.1]", "[]"), "`eps`"),
        (TM.replace("\"linf\"", "\"l3\""), "`norm`"),
        (TM.replace(r#""queries": 100"#, r#""restarts": 0"#), "attacks[2].restarts"),
        (TM.replace(r#""name": "deepfool""#, r#""name": " ""#), "minimal[0].name"),
        (TM.replace("\"batch_size\": 10", "\"batch_size\": -1"), "batch_size"),
    ];
    for (text, field) in bad {
        let e = ThreatModel::from_json(&text).unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
    let e = t.check_bounds((0.0, 255.0));
    assert!(e.is_ok(), "no bounds in the file: any model");
    let bounded = ThreatModel { bounds: Some([0.0, 1.0]), ..t };
    assert!(bounded.check_bounds((0.0, 255.0)).unwrap_err().to_string().contains("bounds"));
}

#[test]
fn cascade_ledger_resume_and_shards() {
    let model = fixture_cnn();
    let set = data::sample().unwrap().test.take(48).unwrap();
    let t = tm();
    let full = run_cascade(&model, &set, &cascade(&t, (0, 48), 48)).unwrap();
    assert!(full.is_complete(&t));
    assert_eq!(full.records.len(), 48);
    // The ledger is honest: each broken sample's input is within its ε and is predicted as recorded.
    let mut broken = 0;
    for r in &full.records {
        if let Some(b) = &r.broken {
            broken += 1;
            let adv = Tensor::from_vec(r.adversarial.clone().unwrap(), &[1, 1, 28, 28]).unwrap();
            assert_eq!(model.predict(&adv).unwrap()[0], b.prediction);
            assert_ne!(b.prediction, r.label);
            assert!(r.margin < 0.0, "a broken sample has a negative margin");
            let x = set.image(r.index).unwrap();
            let linf = x.iter().zip(adv.to_vec()).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(linf <= t.eps[b.eps_index] as f32 * (1.0 + 1e-6), "sample {}: {linf}", r.index);
            assert!(r.gradients + r.queries > 0);
        } else if r.clean_correct() {
            assert!(r.margin > 0.0 && r.adversarial.is_none());
        }
    }
    assert!(broken > 10, "the fixture cnn breaks at ε = 0.1: {broken}");
    let s = summarise(&t, &full, 10);
    assert!(s.robust_accuracy[1].value <= s.robust_accuracy[0].value);
    assert!(s.robust_accuracy[0].value <= s.clean_accuracy.value);
    let after: Vec<f64> = s.per_attack.iter().map(|a| a.robust_after[1].value).collect();
    assert!(after.windows(2).all(|w| w[1] <= w[0]), "cumulative: {after:?}");
    assert_eq!(after[2], s.headline().value);
    assert_eq!(s.class_flips.iter().flatten().sum::<u64>() as usize, broken);
    assert!(s.minimal_norms[0].1.iter().flatten().count() > 0, "DeepFool finds minimal perturbations");
    let report = armoury::report::to_report(&model, &set, &t, &full, &s, Vec::new()).unwrap();
    assert_eq!(report.threat_model_hash, t.hash());
    assert_eq!(report.robust_accuracy, s.headline());
    assert_eq!(report.per_attack.len(), 3);
    assert_eq!(report.examples.len(), 8.min(broken));
    assert!(report.examples.iter().all(|e| e.adversarial_prediction != e.label && e.original.len() == 784));
    // MindArmour's misclassification rate of the cascade after its last attack: the broken share of the
    // correctly classified samples.
    let correct = full.records.iter().filter(|r| r.clean_correct()).count();
    let mr = report.attack_metrics[2].1.misclassification_rate;
    assert!((mr - broken as f64 / correct as f64).abs() < 1e-9, "{mr} vs {broken}/{correct}");
    assert_eq!(report.radar.as_ref().map(|r| r.series.len()), Some(3));

    // Interrupted after 5 steps, then after 7 more, then to the end: the uninterrupted ledger.
    let dir = std::env::temp_dir().join(format!("armoury-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    let _ = std::fs::remove_file(&state);
    for stop in [Some(5), Some(7), None] {
        let run = CascadeRun { state: Some(state.clone()), max_steps: stop, ..cascade(&t, (0, 48), 48) };
        let l = run_cascade(&model, &set, &run).unwrap();
        assert_eq!(l.is_complete(&t), stop.is_none());
    }
    assert_eq!(timeless(Ledger::load(&state).unwrap()), timeless(full.clone()));
    // A state file of another threat model is refused.
    let other = ThreatModel { seed: 9, ..t.clone() };
    let run = CascadeRun { state: Some(state.clone()), ..cascade(&other, (0, 48), 48) };
    assert!(run_cascade(&model, &set, &run).is_err());
    std::fs::remove_dir_all(&dir).unwrap();

    // Three shards (chunks not aligned with the unsharded run's) merge to the same ledger and summary.
    let shards: Vec<Ledger> =
        (0..3).map(|i| run_cascade(&model, &set, &cascade(&t, shard_range(48, i, 3).unwrap(), 48)).unwrap()).collect();
    assert!(
        merge(&t, &identity("fixture cnn", "sample"), shards[..2].to_vec()).is_err(),
        "a missing shard is an error"
    );
    let merged = timeless(merge(&t, &identity("fixture cnn", "sample"), shards).unwrap());
    assert_eq!(merged, timeless(full.clone()));
    assert_eq!(
        serde_json::to_string(&summarise(&t, &merged, 10)).unwrap(),
        serde_json::to_string(&summarise(&t, &timeless(full), 10)).unwrap()
    );
    assert_eq!(shard_range(10, 2, 3).unwrap(), (6, 10));
    assert!(shard_range(10, 3, 3).is_err());
}

#[test]
fn merge_names_every_unfinished_shard() {
    // Four shards of 16 samples, each one chunk: a clean pass and one attack, two steps.
    let t = ThreatModel::from_json(
        r#"{"name": "tiny", "norm": "linf", "eps": [0.1], "seed": 1, "batch_size": 4,
            "attacks": [{"name": "apgd-ce", "steps": 2}]}"#,
    )
    .unwrap();
    let model = fixture_cnn();
    let set = data::sample().unwrap().test.take(16).unwrap();
    let dir = std::env::temp_dir().join(format!("armoury-shards-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let shard = |i: usize, max_steps: Option<usize>| {
        let state = Some(ledger_file(&dir, Some((i, 4))));
        let run = CascadeRun { state, max_steps, ..cascade(&t, shard_range(16, i, 4).unwrap(), 16) };
        run_cascade(&model, &set, &run).unwrap()
    };
    // Shard 0 finished, 1 never started, 2 was stopped after its first step, 3 left a torn file.
    shard(0, None);
    shard(2, Some(1));
    std::fs::write(ledger_file(&dir, Some((3, 4))), "{\"threat_model_hash\": ").unwrap();
    let e = load_shards(&dir, 4, &t).unwrap_err();
    match &e {
        armoury::Error::UnfinishedShards { n, unfinished, .. } => {
            assert_eq!((*n, unfinished.as_slice()), (4, &[1, 2, 3][..]))
        }
        other => panic!("expected UnfinishedShards, got {other}"),
    }
    // The message names each shard and why, in a form a scheduler's merge step can cut the list from.
    let msg = e.to_string();
    for part in [
        "3 of 4 shards unfinished: 1,2,3 (",
        "shard 1: no ledger-1-of-4.json",
        "shard 2: 1 of 2 steps done",
        "shard 3: ",
    ] {
        assert!(msg.contains(part), "{part:?} in {msg}");
    }
    // Rerunning exactly those (the torn one from scratch) completes the set: the merge is the unsharded run.
    std::fs::remove_file(ledger_file(&dir, Some((3, 4)))).unwrap();
    (1..4).for_each(|i| drop(shard(i, None)));
    let merged = merge(&t, &identity("fixture cnn", "sample"), load_shards(&dir, 4, &t).unwrap()).unwrap();
    let full = run_cascade(&model, &set, &cascade(&t, (0, 16), 16)).unwrap();
    assert_eq!(timeless(merged), timeless(full));
    assert!(load_shards(&dir, 0, &t).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The fixture cnn behind an input layer that rounds to 4 grey levels: gradients are zero everywhere.
struct Quantised(ModuleClassifier, Counters);
/// The fixture cnn with its logits multiplied by 10⁴: the softmax saturates, the cross-entropy gradient is 0.
struct Scaled(ModuleClassifier, Counters);
/// The fixture cnn behind a fresh random input perturbation on every call (no EOT).
struct Randomised(ModuleClassifier, Counters, AtomicU64);

macro_rules! wrapper {
    ($t:ty, |$s:ident, $x:ident| $body:expr) => {
        impl Classifier for $t {
            fn input_shape(&self) -> &[usize] {
                self.0.input_shape()
            }
            fn num_classes(&self) -> usize {
                10
            }
            fn bounds(&self) -> (f32, f32) {
                (0.0, 1.0)
            }
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                let $s = self;
                $body
            }
            fn counters(&self) -> &Counters {
                &self.1
            }
        }
    };
}

wrapper!(Quantised, |s, x| s.0.forward(&Tensor::new(x.value().mapv(|v| (v * 3.0).round() / 3.0))));
wrapper!(Scaled, |s, x| Ok(s.0.forward(x)?.mul_scalar(1e4)));
wrapper!(Randomised, |s, x| {
    let noise = Tensor::uniform(x.shape(), -0.2, 0.2, s.2.fetch_add(1, Ordering::Relaxed));
    s.0.forward(&x.add(&noise)?)
});

#[test]
fn audit_passes_the_cnn_and_flags_masked_models() {
    let set = data::sample().unwrap().test;
    let (x, y) = set.batch(0..64).unwrap();
    let cfg = AuditConfig { square_queries: 300, ..AuditConfig::new(armoury::attack::Norm::Linf, 0.1) };
    let verdicts = |m: &dyn Classifier| audit(m, &x, &y, &from_spec, &cfg).unwrap();
    let failed = |v: &[armoury::eval::Verdict]| -> Vec<String> {
        v.iter().filter(|v| !v.pass).map(|v| format!("{}: {}", v.check, v.explanation)).collect()
    };
    let honest = verdicts(&fixture_cnn());
    assert_eq!(honest.len(), 8);
    assert!(failed(&honest).is_empty(), "the fixture cnn must pass: {:?}", failed(&honest));
    let flagged = |v: &[armoury::eval::Verdict], check: &str| v.iter().any(|v| v.check == check && !v.pass);
    let q = verdicts(&Quantised(fixture_cnn(), Counters::default()));
    assert!(flagged(&q, "gradients-finite"), "quantised: {:?}", failed(&q));
    let s = verdicts(&Scaled(fixture_cnn(), Counters::default()));
    assert!(flagged(&s, "gradients-finite"), "scaled: {:?}", failed(&s));
    let r = verdicts(&Randomised(fixture_cnn(), Counters::default(), AtomicU64::new(0)));
    assert!(flagged(&r, "deterministic-output"), "randomised: {:?}", failed(&r));
    for (name, v) in [("quantised", &q), ("scaled", &s), ("randomised", &r)] {
        println!("{name}: {:?}", failed(v));
    }
    // A softmax model is caught returning probabilities.
    struct Probs(ModuleClassifier, Counters);
    wrapper!(Probs, |s, x| s.0.forward(x)?.softmax(1));
    let p = verdicts(&Probs(fixture_cnn(), Counters::default()));
    assert!(flagged(&p, "logits-not-probabilities"), "{:?}", failed(&p));
}

/// The fixture cnn whose gradients point the wrong way (the input enters as `2x − x`, value x, gradient −I)
/// except within L∞ distance `radius` of one of the audited clean inputs: FGSM, differentiating at the clean
/// input, sees true gradients; PGD beyond the radius climbs the wrong way. Values are the cnn's bit for bit.
struct Masked(ModuleClassifier, Counters, Vec<Vec<f32>>, f32);
wrapper!(Masked, |s, x| {
    let n = x.shape()[0];
    let v = x.to_vec();
    let d = v.len() / n;
    let near: Vec<f32> = (0..n)
        .map(|i| {
            let row = &v[i * d..(i + 1) * d];
            let close = s.2.iter().any(|c| c.iter().zip(row).all(|(a, b)| (a - b).abs() <= s.3));
            if close {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let far: Vec<f32> = near.iter().map(|m| 1.0 - m).collect();
    let straight = s.0.forward(x)?;
    let reversed = s.0.forward(&x.detach().mul_scalar(2.0).sub(x)?)?;
    straight.mul(&Tensor::from_vec(near, &[n, 1])?)?.add(&reversed.mul(&Tensor::from_vec(far, &[n, 1])?)?)
});

/// The fixture cnn behind Gaussian noise (σ = 0.1) seeded from the input's own bits, as a user might write it:
/// the same input gives the same logits, any other input fresh noise.
struct InputKeyed(ModuleClassifier, Counters);
wrapper!(InputKeyed, |s, x| {
    let n = x.shape()[0];
    let v = x.to_vec();
    let d = v.len() / n;
    let mut noise = Vec::with_capacity(v.len());
    for i in 0..n {
        let mut rng = armoury::seed::rng(armoury::seed::sample_seed(7, 0, &v[i * d..(i + 1) * d]));
        noise.extend(armoury::seed::normal_vec(&mut rng, d).into_iter().map(|z| 0.1 * z));
    }
    s.0.forward(&x.add(&Tensor::from_vec(noise, x.shape())?)?)
});

/// What each check's explanation must contain: its threshold, and the conclusion of a pass or of a failure
/// (never the other).
const WORDING: [(&str, &str, &str, &str); 8] = [
    ("iterative-vs-single-step", "tolerance 0.02", "at least as strong as one step", "weaker than one step"),
    ("monotone-in-eps", "tolerance 0.02", "it never does", "a larger budget helped the model"),
    ("unbounded-eps", "fails above 0.05", "it reaches about 0", "it does not reach about 0"),
    ("noise-weaker", "tolerance 0.02", "noise is the weaker attack", "random noise beats the gradient attack"),
    ("black-box-weaker", "tolerance 0.02", "no stronger than the gradient attack", "beats the gradient attack"),
    ("gradients-finite", "fails above 1%", "were usable", "not measured"),
    ("deterministic-output", "ratio exceeds 0.05", "is deterministic", "randomised"),
    ("logits-not-probabilities", "within 0.001", "are logits", "returns probabilities"),
];

fn assert_wording(what: &str, v: &armoury::eval::Verdict) {
    let (_, threshold, pass, fail) = WORDING.iter().find(|w| w.0 == v.check).expect("a known check");
    let e = &v.explanation;
    assert!(e.contains(threshold), "{what} {}: no threshold '{threshold}' in: {e}", v.check);
    let (want, not) = if v.pass { (pass, fail) } else { (fail, pass) };
    assert!(e.contains(want) && !e.contains(not), "{what} {} (pass {}): wording disagrees: {e}", v.check, v.pass);
}

/// Every check once passed and once failed (by a model built to fail it), each explanation stating its threshold
/// and a conclusion that agrees with the verdict — "Square 0.650 beat PGD 0.670" under a pass hid the tolerance.
#[test]
fn audit_verdicts_state_their_thresholds_and_agree_with_them() {
    let set = data::sample().unwrap().test;
    let (x, y) = set.batch(0..64).unwrap();
    let rows: Vec<Vec<f32>> = x.to_vec().chunks(784).map(<[f32]>::to_vec).collect();
    let linf = |eps: f32| AuditConfig { square_queries: 300, ..AuditConfig::new(armoury::attack::Norm::Linf, eps) };
    let mut seen = std::collections::BTreeSet::new();
    let mut check = |what: &str, m: &dyn Classifier, cfg: &AuditConfig, must_fail: &[&str]| {
        let v = audit(m, &x, &y, &from_spec, cfg).unwrap();
        assert_eq!(v.len(), 8);
        for v in &v {
            println!("{what}: {} {}: {}", v.check, if v.pass { "pass" } else { "FAIL" }, v.explanation);
            assert_wording(what, v);
            seen.insert((v.check.clone(), v.pass));
        }
        for c in must_fail {
            assert!(v.iter().any(|v| v.check == *c && !v.pass), "{what} must fail {c}");
        }
    };
    check("cnn", &fixture_cnn(), &linf(0.1), &[]);
    check(
        "masked beyond 0.03",
        &Masked(fixture_cnn(), Counters::default(), rows.clone(), 0.03),
        &linf(0.1),
        &["iterative-vs-single-step", "monotone-in-eps", "black-box-weaker"],
    );
    check(
        "masked everywhere",
        &Masked(fixture_cnn(), Counters::default(), rows, 0.0),
        &linf(0.3),
        &["iterative-vs-single-step", "unbounded-eps"],
    );
    // Zero gradients: PGD is its random start, and ten independent noise draws beat one.
    check(
        "quantised",
        &Quantised(fixture_cnn(), Counters::default()),
        &linf(0.1),
        &["gradients-finite", "noise-weaker", "black-box-weaker"],
    );
    check("input-keyed noise", &InputKeyed(fixture_cnn(), Counters::default()), &linf(0.1), &["deterministic-output"]);
    struct Probs(ModuleClassifier, Counters);
    wrapper!(Probs, |s, x| s.0.forward(x)?.softmax(1));
    check("softmax", &Probs(fixture_cnn(), Counters::default()), &linf(0.1), &["logits-not-probabilities"]);
    for (c, ..) in WORDING {
        for pass in [true, false] {
            assert!(seen.contains(&(c.to_string(), pass)), "{c}: no {} case", if pass { "pass" } else { "fail" });
        }
    }
}

/// Randomness seeded from the input's own values answers the same input the same way, so asking twice cannot
/// see it; a move of 10⁻⁶ of the input range redraws the noise. Deterministic models (the cnn, the MLP, the cnn
/// behind a median filter, rounding or a softmax) pass; the noise wrapper above and Armoury's own randomised
/// transform (Gaussian noise, one draw or an EOT average of 4) fail.
#[test]
fn deterministic_output_catches_randomness_keyed_on_the_input() {
    use armoury::eval::audit::deterministic_output;
    use armoury_defenses::transforms::{Defended, GaussianNoise, MedianFilter};
    let set = data::sample().unwrap().test;
    let (x, _) = set.batch(0..32).unwrap();
    let mlp = {
        let net = armoury::nn::mlp(0);
        armoury::io::load_module(&net, crate::common::fixture("mlp.safetensors")).unwrap();
        ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0)).unwrap()
    };
    struct Probs(ModuleClassifier, Counters);
    wrapper!(Probs, |s, x| s.0.forward(x)?.softmax(1));
    let noise = GaussianNoise { sigma: 0.1, clip: true };
    let cases: Vec<(&str, Box<dyn Classifier>, bool)> = vec![
        ("cnn", Box::new(fixture_cnn()), true),
        ("mlp", Box::new(mlp), true),
        ("median filter", Box::new(Defended::new(fixture_cnn(), MedianFilter { size: 3 }).unwrap()), true),
        ("quantised", Box::new(Quantised(fixture_cnn(), Counters::default())), true),
        ("scaled", Box::new(Scaled(fixture_cnn(), Counters::default())), true),
        ("softmax", Box::new(Probs(fixture_cnn(), Counters::default())), true),
        ("input-keyed noise", Box::new(InputKeyed(fixture_cnn(), Counters::default())), false),
        ("GaussianNoise defense", Box::new(Defended::new(fixture_cnn(), noise).unwrap()), false),
        ("GaussianNoise, EOT 4", Box::new(Defended::new(fixture_cnn(), noise).unwrap().with_eot(4, 1).unwrap()), false),
        ("counter-seeded noise", Box::new(Randomised(fixture_cnn(), Counters::default(), AtomicU64::new(0))), false),
    ];
    for (what, m, deterministic) in cases {
        let v = deterministic_output(m.as_ref(), &x, 0).unwrap();
        println!("{what}: {}", v.explanation);
        assert_eq!(v.pass, deterministic, "{what}: {}", v.explanation);
        assert_wording(what, &v);
        assert!(v.explanation.contains("same 32 inputs gave bit-identical logits") || what == "counter-seeded noise");
    }
}

/// Every attack of the audit is built in the threat norm (FGM, not FGSM, outside L∞; PGD over the box's L2
/// diameter for `unbounded-eps`), and an attack built in another norm than asked (an L∞ Square for an L2 threat)
/// is an error, never audited silently.
#[test]
fn audit_builds_every_attack_in_the_threat_norm() {
    use armoury::attack::Norm;
    use std::sync::Mutex;
    let set = data::sample().unwrap().test;
    let (x, y) = set.batch(0..16).unwrap();
    let cfg = AuditConfig { square_queries: 100, steps: 10, ..AuditConfig::new(Norm::L2, 1.5) };
    let calls = Mutex::new(Vec::new());
    let recording = |spec: &armoury::eval::AttackSpec, norm: Norm, eps: f32| {
        calls.lock().unwrap().push((spec.name.clone(), norm, eps));
        from_spec(spec, norm, eps)
    };
    let v = audit(&fixture_cnn(), &x, &y, &recording, &cfg).unwrap();
    assert_eq!(v.len(), 8);
    let calls = calls.into_inner().unwrap();
    assert!(calls.iter().all(|c| c.1 == Norm::L2), "{calls:?}");
    let names: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    for want in ["fgm", "pgd", "noise", "square"] {
        assert!(names.contains(&want), "{want} not built: {names:?}");
    }
    assert!(!names.contains(&"fgsm"), "{names:?}");
    assert!(calls.iter().any(|c| c.0 == "pgd" && c.2 == 28.0), "the box's L2 diameter: {calls:?}");
    // A builder that falls back to L∞ for Square.
    let falls_back = |spec: &armoury::eval::AttackSpec, norm: Norm, eps: f32| {
        from_spec(spec, if spec.name == "square" { Norm::Linf } else { norm }, eps)
    };
    let err = audit(&fixture_cnn(), &x, &y, &falls_back, &cfg).expect_err("an L∞ Square in an L2 audit").to_string();
    assert!(err.contains("not built for the threat norm") && err.contains("Square"), "{err}");
}
