//! The evaluation as one call on tensors (`armoury_attacks::autoattack`, `eval::Evaluator`): the same ledger as
//! the cascade it wraps, AutoAttack's standard threat model, labels checked against the model, and a default
//! identity that tells two models apart.

use armoury::attack::Norm;
use armoury::data;
use armoury::eval::{merge, run_cascade, Evaluator, ThreatModel};
use armoury::nn::cnn;
use armoury::{Classifier, ModuleClassifier, Tensor};
use armoury_attacks::registry::from_spec;

use crate::attack_props::fixture_cnn;
use crate::eval::{cascade as cascade_run, identity, timeless, tm as small_threat_model};

fn tensors(n: usize) -> (Tensor, Vec<usize>) {
    data::sample().unwrap().test.batch(0..n).unwrap()
}

#[test]
fn the_evaluator_on_tensors_is_the_cascade() {
    let model = fixture_cnn();
    let (x, y) = tensors(24);
    let tm = small_threat_model();
    let id = identity("fixture cnn", "sample");
    let ours = Evaluator::new(tm.clone(), &from_spec)
        .identity(id.clone())
        .model_name("fixture cnn")
        .chunk(16)
        .run(&model, &x, &y)
        .unwrap();
    let set = data::sample().unwrap().test.take(24).unwrap();
    let direct = run_cascade(&model, &set, &cascade_run(&tm, (0, 24), 24)).unwrap();
    assert_eq!(timeless(ours.ledger.clone()), timeless(direct));
    // Its figures are the ledger's, per sample.
    let robust = ours.robust();
    let share = robust.iter().filter(|&&r| r).count() as f64 / 24.0;
    assert!((ours.robust_accuracy() - share).abs() < 1e-12, "{} vs {share}", ours.robust_accuracy());
    assert!(ours.robust_accuracy() < ours.clean_accuracy(), "the attacks break something at ε 0.1");
    // Shards of the builder merge to the whole.
    let shards = (0..2)
        .map(|i| {
            let e = Evaluator::new(tm.clone(), &from_spec).identity(id.clone()).model_name("fixture cnn").chunk(16);
            e.shard(i, 2).run(&model, &x, &y).unwrap().ledger
        })
        .collect();
    assert_eq!(timeless(merge(&tm, &id, shards).unwrap()), timeless(ours.ledger));
}

#[test]
fn autoattack_is_one_call_with_the_authors_standard_list() {
    let model = fixture_cnn();
    let (x, y) = tensors(6);
    for (norm, eps, tm) in [
        (Norm::Linf, 0.1, ThreatModel::autoattack_linf(0.1f32 as f64)),
        (Norm::L2, 1.5, ThreatModel::autoattack_l2(1.5f32 as f64)),
    ] {
        let r = armoury_attacks::autoattack(&model, &x, &y, norm, eps).unwrap();
        assert_eq!(r.ledger.threat_model_hash, tm.hash(), "{norm:?}: the standard threat model");
        assert_eq!(r.summary.samples, 6);
        assert!(r.robust_accuracy() <= r.clean_accuracy());
        for rec in r.ledger.records.iter().filter(|r| r.broken.is_some()) {
            let adv = rec.adversarial.as_ref().unwrap();
            let clean = x.value().as_slice().unwrap()[rec.index * 784..(rec.index + 1) * 784].to_vec();
            let d: Vec<f32> = adv.iter().zip(&clean).map(|(a, c)| a - c).collect();
            let size = match norm {
                Norm::Linf => d.iter().fold(0f32, |m, v| m.max(v.abs())),
                _ => d.iter().map(|v| v * v).sum::<f32>().sqrt(),
            };
            assert!(size <= eps * (1.0 + 1e-5), "{norm:?} sample {}: {size} > {eps}", rec.index);
            let pred = model.predict(&Tensor::from_vec(adv.clone(), &[1, 1, 28, 28]).unwrap()).unwrap()[0];
            assert_ne!(pred, rec.label);
        }
    }
}

#[test]
fn labels_outside_the_models_classes_are_refused_by_name() {
    let model = fixture_cnn();
    let (x, mut y) = tensors(4);
    y[2] = 10;
    let err = armoury_attacks::autoattack(&model, &x, &y, Norm::Linf, 0.1).unwrap_err().to_string();
    assert!(err.contains("sample 2") && err.contains("label 10") && err.contains("10 classes"), "{err}");
    let err = armoury_attacks::autoattack(&model, &x, &y[..3], Norm::Linf, 0.1).unwrap_err().to_string();
    assert!(err.contains("4 images but 3 labels"), "{err}");
}

#[test]
fn the_default_identity_tells_two_models_apart() {
    let dir = tempdir();
    let state = dir.join("state.json");
    let (x, y) = tensors(8);
    let tm = small_threat_model();
    let run = |m: &dyn Classifier| Evaluator::new(tm.clone(), &from_spec).state(&state).run(m, &x, &y);
    let trained = fixture_cnn();
    run(&trained).unwrap();
    // The same model resumes (a complete state file: nothing to do, the same ledger).
    run(&trained).unwrap();
    // Other weights of the same architecture: refused, naming the model.
    let other = ModuleClassifier::new(cnn(1), &[1, 28, 28], 10, (0.0, 1.0)).unwrap();
    let err = run(&other).unwrap_err().to_string();
    assert!(err.contains("model differs"), "{err}");
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("armoury-eval-api-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn progress_names_each_step_and_the_robust_accuracy_so_far() {
    let model = fixture_cnn();
    let (x, y) = tensors(20);
    let tm = small_threat_model();
    let seen = std::sync::Mutex::new(Vec::new());
    let record = |p: &armoury::eval::Progress| seen.lock().unwrap().push(p.clone());
    let r = Evaluator::new(tm.clone(), &from_spec).chunk(10).progress(&record).run(&model, &x, &y).unwrap();
    let seen = seen.into_inner().unwrap();
    // Once before the first step, then after each: 2 chunks × (clean + 2 ε × 3 attacks + 1 minimal) steps.
    let per = 1 + 2 * 3 + 1;
    assert_eq!(seen.len(), 1 + 2 * per);
    assert_eq!((seen[0].done, seen[0].finished.as_deref(), seen[0].next.as_deref()), (0, None, Some("clean pass")));
    assert_eq!(seen[1].finished.as_deref(), Some("clean pass"));
    assert_eq!(seen[1].next.as_deref(), Some("apgd-ce(steps=10) at ε = 0.05"));
    assert_eq!(seen[3].finished.as_deref(), Some("fab-t(steps=10, targets=2) at ε = 0.05"));
    assert_eq!(seen[4].finished.as_deref(), Some("square(queries=100) at ε = 0.05"));
    assert_eq!(seen[4].next.as_deref(), Some("apgd-ce(steps=10) at ε = 0.1"));
    assert_eq!(seen[7].next.as_deref(), Some("deepfool (minimal norms)"));
    assert_eq!(seen[per].started, 10, "the first chunk is done");
    let last = seen.last().unwrap();
    assert_eq!((last.done, last.total, last.next.as_deref()), (2 * per, 2 * per, None));
    assert_eq!(last.robust, r.robust().iter().filter(|&&b| b).count());
    assert_eq!((last.started, last.robust_accuracy()), (20, r.robust_accuracy()));
    // Robust so far never grows while a chunk's attacks run.
    for w in seen[1..per].windows(2) {
        assert!(w[1].robust <= w[0].robust, "{w:?}");
    }
}
