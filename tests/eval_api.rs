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
