//! Defenses and detectors in an evaluation (`armoury_defenses::eval`, what the `evaluate` example runs): three
//! shards' side files merge to the figures of the unsharded run, bit for bit, for a defense, a per-input
//! detector, the region classifier and the stateful query detector; a merge refuses a side file of another
//! evaluation; and the robust figures are per-sample worst cases over every attack.

use std::sync::Arc;

use armoury::eval::{merge, run_cascade, shard_range, CascadeRun, Ledger, SampleRecord, ThreatModel};
use armoury::Classifier;
use armoury_attacks::registry::from_spec;
use armoury_defenses::eval as protect;

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
