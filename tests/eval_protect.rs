//! `evaluate`'s defenses and detectors in sharded runs (examples/support/protect.rs, the code the example runs):
//! three shards' side files merge to the figures of the unsharded run, bit for bit, for a defense, a per-input
//! detector, the region classifier and the stateful query detector.

use std::sync::Arc;

use armoury::eval::{merge, run_cascade, shard_range, CascadeRun, Ledger, ThreatModel};
use armoury::Classifier;
use armoury_attacks::registry::from_spec;

use crate::attack_props::fixture_cnn;

#[allow(dead_code)]
#[path = "../examples/support/detectors.rs"]
mod detectors;
#[allow(dead_code)]
#[path = "../examples/support/guard.rs"]
mod guard;
#[allow(dead_code)]
#[path = "../examples/support/magnet.rs"]
mod magnet;
#[allow(dead_code)]
#[path = "../examples/support/protect.rs"]
mod protect;
#[allow(dead_code)]
#[path = "../examples/support/stateful.rs"]
mod stateful;

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
        out: &out,
        shard,
        eot: 2,
        fit: 100,
        progress: &|_| {},
    };
    let full: &'static Ledger = Box::leak(Box::new(ledger(model.as_ref(), &set, &tm, (0, N))));
    let whole = protect::run_slice(&cx(full, None), &defenses, &detectors).unwrap();
    let unsharded = protect::finalise(&cx(full, None), &protect::merge_slices(&tm, vec![whole]).unwrap()).unwrap();

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
    assert!(protect::merge_slices(&tm, slices[..2].to_vec()).is_err(), "a missing shard is an error");
    let merged_ledger: &'static Ledger =
        Box::leak(Box::new(merge(&tm, &crate::eval::identity("fixture cnn", "sample"), ledgers).unwrap()));
    let sharded = protect::finalise(&cx(merged_ledger, None), &protect::merge_slices(&tm, slices).unwrap()).unwrap();
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
    assert!(dets[0].protected_robust_adaptive.is_some());
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
