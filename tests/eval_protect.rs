//! Defenses and detectors in an evaluation (`armoury_defenses::eval`, what the `evaluate` example runs): three
//! shards' side files merge to the figures of the unsharded run, bit for bit, for a defense, a per-input
//! detector, the region classifier and the stateful query detector; a merge refuses a side file of another
//! evaluation; and the robust figures are per-sample worst cases over every attack. One detector on its own
//! (`armoury_defenses::eval::detect`, what the `detect` example runs): the figures the example printed before
//! its evaluation moved into the library, and its helpers on hand-checked values.

use std::sync::Arc;

use armoury::eval::{merge, run_cascade, shard_range, CascadeRun, Ledger, SampleRecord, ThreatModel};
use armoury::Classifier;
use armoury_attacks::registry::from_spec;
use armoury_defenses::eval as protect;
use armoury_defenses::eval::detect;

use crate::attack_props::fixture_cnn;

const TM: &str = r#"{ "name": "shards", "norm": "linf", "eps": [0.1], "seed": 5, "batch_size": 7,
  "attacks": [{"name": "apgd-ce", "steps": 5}, {"name": "square", "queries": 60}] }"#;

const N: usize = 24;

fn ledger(model: &dyn Classifier, set: &armoury::data::TrainTest, tm: &ThreatModel, range: (usize, usize)) -> Ledger {
    let run = CascadeRun {
        threat: tm,
        build: &from_spec,
        model_name: "fixture cnn".into(),
        identity: crate::eval::identity("fixture cnn", "sample"),
        range,
        total_samples: N,
        chunk: tm.batch_size,
        state: None,
        max_steps: None,
        progress: None,
    };
    run_cascade(model, &set.test, &run).unwrap()
}

/// The figures as JSON, without wall-clock seconds (the one field that differs between runs).
fn timeless(v: impl serde::Serialize) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("seconds");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(v).unwrap();
    strip(&mut v);
    v
}

#[test]
fn eval_protect_shards_merge_to_the_unsharded_figures() {
    let model: Arc<dyn Classifier> = Arc::new(fixture_cnn());
    let set = armoury::data::sample().unwrap();
    let tm = ThreatModel::from_json(TM).unwrap();
    let out = std::env::temp_dir().join(format!("armoury-eval-protect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let defenses = ["median".to_string()];
    let detectors = ["squeeze", "region", "similarity"].map(String::from);
    let cx = |l: &'static Ledger, shard| protect::Context {
        model: &model,
        set: &set,
        threat: &tm,
        ledger: l,
        build: &from_spec,
        out: &out,
        shard,
        eot: 2,
        fit: 100,
        progress: &|_| {},
        notify: &|_| {},
    };
    let id = crate::eval::identity("fixture cnn", "sample");
    let full: &'static Ledger = Box::leak(Box::new(ledger(model.as_ref(), &set, &tm, (0, N))));
    let whole = protect::run_slice(&cx(full, None), &defenses, &detectors).unwrap();
    let unsharded = protect::finalise(&cx(full, None), &protect::merge_slices(&tm, &id, vec![whole]).unwrap()).unwrap();

    let mut ledgers = Vec::new();
    for i in 0..3 {
        let l: &'static Ledger = Box::leak(Box::new(ledger(model.as_ref(), &set, &tm, shard_range(N, i, 3).unwrap())));
        protect::run_slice(&cx(l, Some((i, 3))), &defenses, &detectors).unwrap();
        ledgers.push(l.clone());
    }
    // As `--merge 3` does: the side files read back, in any order.
    let slices: Vec<protect::Slice> = [2, 0, 1]
        .iter()
        .map(|&i| protect::load_slice(&protect::side_file(&out, "protect", Some((i, 3)))).unwrap())
        .collect();
    assert!(protect::merge_slices(&tm, &id, slices[..2].to_vec()).is_err(), "a missing shard is an error");
    // A side file of another model, other data or another threat model is refused.
    let other_model = crate::eval::identity("another cnn", "sample");
    let err = protect::merge_slices(&tm, &other_model, slices.clone()).unwrap_err().to_string();
    assert!(err.contains("another evaluation") && err.contains("model"), "{err}");
    let err = protect::merge_slices(&tm, &crate::eval::identity("fixture cnn", "other"), slices.clone()).unwrap_err();
    assert!(err.to_string().contains("data"), "{err}");
    let other_tm = ThreatModel { eps: vec![0.2], ..tm.clone() };
    assert!(protect::merge_slices(&other_tm, &id, slices.clone()).is_err(), "another threat model");
    let mut forged = slices.clone();
    forged[1].identity.model_hash = "forged".into();
    assert!(protect::merge_slices(&tm, &id, forged).is_err(), "one slice of another model");
    let merged_ledger: &'static Ledger = Box::leak(Box::new(merge(&tm, &id, ledgers).unwrap()));
    let sharded =
        protect::finalise(&cx(merged_ledger, None), &protect::merge_slices(&tm, &id, slices).unwrap()).unwrap();
    assert_eq!(timeless(&sharded), timeless(&unsharded));
    // The one call the `evaluate` example makes for `--merge 3`: the same figures.
    let merged = protect::evaluate(&cx(merged_ledger, None), &defenses, &detectors, Some(3)).unwrap().unwrap();
    assert_eq!(timeless(&merged), timeless(&unsharded));

    // The figures are those of each part: the median filter's cascade and the region classifier as defenses,
    // feature squeezing as a detector, the similarity detector with its two attacks on the 24 samples.
    let (defs, dets, stateful) = unsharded;
    assert_eq!(defs.len(), 2);
    assert!(defs[0].name.contains("MedianFilter") && defs[1].name.contains("RegionClassifier"));
    for d in &defs {
        assert!(d.robust_accuracy.value <= d.clean_accuracy.value, "{}", d.name);
    }
    assert_eq!(defs[1].per_attack.len(), 2, "non-adaptive, then the adaptive EOT attack");
    assert!(defs[1].per_attack[1].robust_accuracy_after.value <= defs[1].per_attack[0].robust_accuracy_after.value);
    assert_eq!(defs[1].per_attack[1].mean_gradients, 320.0, "40 steps, each differentiating 8 noisy copies");
    assert_eq!(dets.len(), 1);
    assert_eq!(dets[0].clean_scored, N);
    let broken = full.records.iter().filter(|r| r.broken.is_some()).count();
    assert_eq!(dets[0].adversarial_scored, broken);
    let adaptive = dets[0].protected_robust_adaptive.expect("the adaptive attack ran");
    assert!(dets[0].protected_robust_accuracy <= adaptive.min(dets[0].protected_robust_non_adaptive));
    for d in &defs {
        assert!(d.robust_accuracy.value <= d.transfer_accuracy.value, "{}: every attack counts", d.name);
        assert_eq!(d.robust_accuracy, d.per_attack.last().unwrap().robust_accuracy_after, "{}", d.name);
    }
    assert_eq!(stateful.len(), 1);
    let correct = full.records.iter().filter(|r| r.clean_correct()).count();
    assert_eq!(stateful[0].attacks.len(), 2);
    for a in &stateful[0].attacks {
        assert_eq!(a.attacked, correct, "{}", a.attack);
        assert!(a.flagged + a.evaded <= a.attacked);
    }
    assert!(stateful[0].attacks[1].adaptive && stateful[0].attacks[1].attack.contains("query blinding"));
    let _ = std::fs::remove_dir_all(&out);
}

/// The defense's robust accuracy is per sample over every attack run against it: the adaptive cascade and the
/// transferred worst-case inputs. A cascade that breaks sample 1 and a transfer that breaks sample 0 leave
/// nothing robust — 0, where the cascade's figure alone said 0.5.
#[test]
fn eval_protect_defense_robust_accuracy_is_per_sample_over_every_attack() {
    let tm = ThreatModel::from_json(TM).unwrap();
    let record = |index: usize, broken: bool| SampleRecord {
        index,
        label: 0,
        clean_prediction: 0,
        broken: broken.then_some(armoury::eval::Break { eps_index: 0, attack_index: 1, prediction: 1 }),
        margin: if broken { -1.0 } else { 1.0 },
        gradients: 0,
        queries: 0,
        gradient_faults: 0,
        adversarial: None,
        minimal_norms: Vec::new(),
    };
    let dtm = protect::defense_threat(&tm, "MedianFilter(size=3)").unwrap();
    let ledger = Ledger {
        threat_model_hash: dtm.hash(),
        model: "hand-made".into(),
        identity: crate::eval::identity("m", "d"),
        total_samples: 2,
        range: (0, 2),
        chunk: 2,
        steps_done: 3,
        records: vec![record(0, false), record(1, true)],
        work: vec![Default::default(); 2],
    };
    let slice = protect::DefenseSlice {
        spec: "median".into(),
        name: "MedianFilter(size=3)".into(),
        ledger,
        transfer_ok: vec![false, true],
        raw: vec![0.9, 0.1, 0.9, 0.1],
        defended: vec![0.4, 0.6, 0.8, 0.2],
    };
    let r = slice.report(&tm, &[0, 0], 2).unwrap();
    assert_eq!(r.clean_accuracy.value, 1.0);
    assert_eq!(r.transfer_accuracy.value, 0.5);
    assert_eq!(r.per_attack[1].robust_accuracy_after.value, 0.5, "the cascade alone");
    assert_eq!(r.robust_accuracy.value, 0.0, "per sample: the cascade breaks 1, the transfer breaks 0");
    assert_eq!(r.per_attack.last().unwrap().robust_accuracy_after, r.robust_accuracy);
    assert_eq!(r.per_attack.last().unwrap().broken, 1);
    let short = protect::DefenseSlice { transfer_ok: vec![true], ..slice };
    assert!(short.report(&tm, &[0, 0], 2).is_err(), "per-sample results of different lengths");
}

/// A detector's protected robust accuracy is per sample: right or rejecting under the non-adaptive *and* the
/// adaptive attack. Results [T, F] and [F, T] give 0, not min(0.5, 0.5).
#[test]
fn eval_protect_detector_robust_accuracy_is_per_sample_over_every_attack() {
    let g = protect::GuardSlice {
        name: "hand-made".into(),
        threshold: 0.5,
        fit_samples: 2,
        clean_scores: vec![0.1, 0.2],
        adversarial_scores: vec![0.9],
        clean_ok: vec![true, true],
        non_adaptive_ok: vec![true, false],
        adaptive_ok: Some(vec![false, true]),
        adaptive_attack: "AdaptivePgd".into(),
    };
    let r = g.report().unwrap();
    assert_eq!((r.protected_robust_non_adaptive, r.protected_robust_adaptive), (0.5, Some(0.5)));
    assert_eq!(r.protected_robust_accuracy, 0.0);
    let r = protect::GuardSlice { adaptive_ok: None, ..g.clone() }.report().unwrap();
    assert_eq!(r.protected_robust_accuracy, 0.5, "without the adaptive attack: the non-adaptive one");
    let r = protect::GuardSlice { adaptive_ok: Some(vec![true, true]), ..g.clone() }.report().unwrap();
    assert_eq!(r.protected_robust_accuracy, 0.5);
    assert!(protect::GuardSlice { adaptive_ok: Some(vec![true]), ..g }.report().is_err(), "lengths differ");
    assert_eq!(protect::survived_all(&[&[true, false], &[false, true]]).unwrap(), vec![false, false]);
    assert_eq!(protect::survived_all(&[&[true, true], &[true, false]]).unwrap(), vec![true, false]);
}

/// `detect --detector squeeze --attack fgsm --adaptive --limit 100` printed, on the fixture cnn and the first
/// 1000 training / 100 test images of Fashion-MNIST (the embedded sample's), before its evaluation moved into
/// `eval::detect`: `"auc":0.6636,"tpr_at_1fpr":0.0,"tpr_at_5fpr":0.0602,"protected_clean_accuracy":0.84,
/// "protected_robust_accuracy":0.08`.
#[test]
fn eval_protect_detect_squeeze_fgsm_matches_the_example() {
    use armoury_attacks::registry::{by_name, default_goal, detection_params, run_in_batches};
    use armoury_defenses::detectors::{AdaptivePgd, MagnetConfig};
    use armoury_defenses::registry::DetectorBuild;
    let model: Arc<dyn Classifier> = Arc::new(fixture_cnn());
    let set = armoury::data::sample().unwrap();
    let fgsm = by_name("fgsm", &detection_params("fgsm", 0.1)).unwrap();
    let attack = |x: &armoury::Tensor, y: &[usize]| {
        run_in_batches(fgsm.as_ref(), model.as_ref(), (x, y), &default_goal("fgsm", 0), 0, detect::ATTACK_BATCH)
    };
    let lines = std::sync::Mutex::new(Vec::new());
    let run = detect::DetectRun {
        detector: "squeeze",
        build: DetectorBuild {
            model: &model,
            set: &set,
            fit: 1000,
            layers: &armoury_defenses::registry::CNN_LAYERS,
            attack: &attack,
            magnet: MagnetConfig::default(),
            magnet_progress: &|_| {},
        },
        limit: 100,
        attack: &attack,
        adaptive: Some(AdaptivePgd { eps: 0.1, ..AdaptivePgd::default() }),
        seed: 0,
        notify: &|l: &str| lines.lock().unwrap().push(l.to_string()),
    };
    let e = detect::evaluate(&run).unwrap();
    let round = |v: f64| (v * 1e4).round() / 1e4;
    let figures = [e.metrics.auc, e.metrics.tpr_at_1fpr, e.metrics.tpr_at_5fpr, e.protected_clean];
    assert_eq!(figures.map(round), [0.6636, 0.0, 0.0602, 0.84]);
    assert_eq!(round(e.protected_robust_accuracy), 0.08);
    assert_eq!((e.fit_samples, e.fooled), (1000, 83), "TPR 0.0602 = 5 of 83 fooling examples");
    let adaptive = e.protected_robust_adaptive.unwrap();
    assert!(e.protected_robust_accuracy <= adaptive.min(e.protected_robust_non_adaptive));
    assert!(lines.lock().unwrap()[0].starts_with("detector feature-squeezing: threshold"));
    let chart = e.metrics.roc_chart("ROC".into(), &e.name);
    assert_eq!((chart.series[0].points.clone(), chart.diagonal), (e.metrics.roc.clone(), true));
}

/// The attack helpers of the `detect` example's attacks and the rejection scale, on hand-checked values.
#[test]
fn eval_protect_detect_helpers_by_hand() {
    use armoury_attacks::registry::{by_name, default_goal, detection_params, run_in_batches};
    let p = detection_params("pgd", 0.2);
    assert_eq!((p.eps, p.steps, p.step_size, p.queries), (0.2, Some(40), Some(0.01), None));
    assert_eq!(detection_params("square", 0.1).queries, Some(200));
    assert_eq!(detection_params("fgsm", 0.1), armoury_attacks::registry::AttackParams::default());
    assert!(matches!(default_goal("jsma", 3), armoury::Goal::RandomTarget { seed: 3 }));
    assert!(matches!(default_goal("pgd", 3), armoury::Goal::Untargeted));
    // Batches of 3 give what one batch gives (FGSM is deterministic).
    let model = fixture_cnn();
    let (x, y) = armoury::data::sample().unwrap().test.batch(0..7).unwrap();
    let fgsm = by_name("fgsm", &detection_params("fgsm", 0.1)).unwrap();
    let goal = armoury::Goal::Untargeted;
    let whole = fgsm.run(&model, &x, &y, &goal, 0).unwrap().adversarial;
    let batched = run_in_batches(fgsm.as_ref(), &model, (&x, &y), &goal, 0, 3).unwrap();
    assert_eq!(batched.shape(), whole.shape());
    assert_eq!(batched.to_vec(), whole.to_vec());
    // Median of [0, 1, 2, 3, 4] is 2: τ = 4 gives 1 / (4 − 2); a threshold not above the median gives 1.
    assert_eq!(protect::guard::rejection_scale(&[4.0, 0.0, 3.0, 1.0, 2.0], 4.0), 0.5);
    assert_eq!(protect::guard::rejection_scale(&[0.0, 1.0, 2.0], 1.0), 1.0);
    assert_eq!(protect::guard::rejection_scale(&[0.0, 1.0, f32::NAN], f32::INFINITY), 1.0);
    assert_eq!(protect::guard::rejection_scale(&[], 1.0), 1.0);
}

/// The stateful detector's figures of one run, on hand-made samples: 3 of 4 attacked, flagged at queries 5 and
/// 150 (1-based: 6 and 151), one not flagged; 1 of 20 benign streams flagged.
#[test]
fn eval_protect_detect_similarity_figures_by_hand() {
    let w = |attacked, first_flag| protect::Watched { attacked, first_flag, fooled: true };
    let e = detect::SimilarityEvaluation {
        tap: "fc1_relu".into(),
        threshold: -1.0,
        calibration_streams: 10,
        calibration_per_second: 1.0,
        benign_streams: 20,
        benign_flagged: 1,
        watched: vec![w(true, Some(5)), w(true, Some(150)), w(true, None), w(false, None)],
        attack_seconds: 0.0,
    };
    assert_eq!(e.attacked(), 3);
    assert_eq!((e.flagged_within(100), e.flagged()), (1.0 / 3.0, 2.0 / 3.0));
    assert_eq!((e.mean_queries_to_flag(), e.benign_flag_rate()), (Some(78.5), 0.05));
    assert_eq!(protect::stateful::mean_queries_to_flag(&e.watched[2..]), None);
}
