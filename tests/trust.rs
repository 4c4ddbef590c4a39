//! An evaluation never reports a figure it did not measure (docs/evaluation.md#identity, #the-norm-contract):
//! stale or mismatched ledgers and shards are refused, the threat model's norm and the input box are enforced,
//! a lying attack cannot record a break, meaningless runs are refused, and one success rule decides every
//! attack's success under a rejection class.

use std::sync::Arc;

use armoury::attack::{Attack, AttackResult, Budget, Goal, Norm, Resolved};
use armoury::data::{self, Dataset};
use armoury::eval::identity::{data_hash, model_hash};
use armoury::eval::{merge, run_cascade, AttackSpec, CascadeRun, Identity, Ledger, ThreatModel};
use armoury::nn::{cnn, Module, ModuleExt};
use armoury::{io, Classifier, Detector, Guarded, ModuleClassifier, Result, Tensor};
use armoury_attacks::registry::{by_name, from_spec, names, names_for, AttackParams};

const TM: &str = r#"{ "name": "trust", "norm": "linf", "eps": [0.1], "seed": 1, "batch_size": 8,
  "attacks": [{"name": "pgd", "steps": 3}] }"#;

fn tm() -> ThreatModel {
    ThreatModel::from_json(TM).unwrap()
}

fn net() -> Arc<dyn Module> {
    let net = cnn(0);
    io::load_module(&net, crate::common::fixture("cnn.safetensors")).unwrap();
    Arc::new(net)
}

fn classifier(net: Arc<dyn Module>, bounds: (f32, f32)) -> ModuleClassifier {
    ModuleClassifier::new(net, &[1, 28, 28], 10, bounds).unwrap()
}

fn run<'a>(tm: &'a ThreatModel, identity: Identity, total: usize, state: Option<std::path::PathBuf>) -> CascadeRun<'a> {
    CascadeRun {
        threat: tm,
        build: &from_spec,
        model_name: "fixture cnn".into(),
        identity,
        range: (0, total),
        total_samples: total,
        chunk: 8,
        state,
        max_steps: None,
        progress: None,
    }
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("armoury-trust-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn identity_hashes_the_model_content_and_the_samples() {
    let a = net();
    let b = net();
    assert_eq!(model_hash(a.as_ref(), &[]), model_hash(b.as_ref(), &[]), "same weights, same hash");
    // One weight moved by one ulp: another model.
    let p = &b.parameters()[0];
    let mut v = p.value();
    if let Some(w) = v.iter_mut().next() {
        *w = f32::from_bits(w.to_bits() + 1);
    }
    p.set(v).unwrap();
    assert_ne!(model_hash(a.as_ref(), &[]), model_hash(b.as_ref(), &[]));
    // The extra bytes (an ONNX file's graph) count too.
    assert_ne!(model_hash(a.as_ref(), b"graph"), model_hash(a.as_ref(), &[]));
    let set = data::sample().unwrap().test;
    let h = data_hash(&set, 16).unwrap();
    assert_eq!(h, data_hash(&set.take(20).unwrap(), 16).unwrap(), "only the evaluated samples count");
    assert_ne!(h, data_hash(&set, 17).unwrap());
    let moved = Dataset::new(set.images().clone(), set.labels().iter().map(|&l| (l + 1) % 10).collect(), 10).unwrap();
    assert_ne!(h, data_hash(&moved, 16).unwrap(), "labels count");
    assert!(data_hash(&set, set.len() + 1).is_err());
}

#[test]
fn a_rerun_refuses_the_ledger_of_other_weights_data_or_kernel_path() {
    let set = data::sample().unwrap().test.take(32).unwrap();
    let t = tm();
    let n = 16;
    let m = net();
    let id = |m: &dyn Module, d: &Dataset| Identity::new(model_hash(m, &[]), d, n, "sample").unwrap();
    let dir = tmp("stale");
    let state = dir.join("ledger.json");
    let first =
        run_cascade(&classifier(m.clone(), (0.0, 1.0)), &set, &run(&t, id(m.as_ref(), &set), n, Some(state.clone())))
            .unwrap();
    assert!(first.is_complete(&t));
    assert_eq!(Ledger::load(&state).unwrap().identity, id(m.as_ref(), &set));
    // The same command again: resumed (nothing left to do), the same ledger.
    let again =
        run_cascade(&classifier(m.clone(), (0.0, 1.0)), &set, &run(&t, id(m.as_ref(), &set), n, Some(state.clone())))
            .unwrap();
    assert_eq!(again.records, first.records);

    // Other weights in the same file (retrained): refused, saying the model differs.
    let other = net();
    let p = &other.parameters()[0];
    p.set(p.value().mapv(|w| w * 0.5)).unwrap();
    let e = run_cascade(
        &classifier(other.clone(), (0.0, 1.0)),
        &set,
        &run(&t, id(other.as_ref(), &set), n, Some(state.clone())),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("the model differs"), "{e}");
    // Other data into the same output directory: refused, saying the data differ.
    let shifted = set.subset(&(8..32).collect::<Vec<_>>()).unwrap();
    let e = run_cascade(
        &classifier(m.clone(), (0.0, 1.0)),
        &shifted,
        &run(&t, id(m.as_ref(), &shifted), n, Some(state.clone())),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("the data differ"), "{e}");
    // A ledger computed on another kernel path: refused, naming both paths.
    let mut foreign = Ledger::load(&state).unwrap();
    foreign.identity.kernel = if foreign.identity.kernel == "portable" { "avx512".into() } else { "portable".into() };
    foreign.save(&state).unwrap();
    let e =
        run_cascade(&classifier(m.clone(), (0.0, 1.0)), &set, &run(&t, id(m.as_ref(), &set), n, Some(state.clone())))
            .unwrap_err()
            .to_string();
    assert!(e.contains("kernel path") && e.contains(&foreign.identity.kernel), "{e}");
    // A ledger written before identities were recorded: refused.
    let mut old = serde_json::to_value(&first).unwrap();
    old.as_object_mut().unwrap().remove("identity");
    std::fs::write(&state, serde_json::to_vec(&old).unwrap()).unwrap();
    let e =
        run_cascade(&classifier(m.clone(), (0.0, 1.0)), &set, &run(&t, id(m.as_ref(), &set), n, Some(state.clone())))
            .unwrap_err()
            .to_string();
    assert!(e.contains("none recorded"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn merge_refuses_shards_of_another_model_data_or_kernel_path() {
    let set = data::sample().unwrap().test.take(16).unwrap();
    let t = tm();
    let m = net();
    let id = Identity::new(model_hash(m.as_ref(), &[]), &set, 16, "sample").unwrap();
    let clf = classifier(m.clone(), (0.0, 1.0));
    let shard = |range: (usize, usize), id: Identity| {
        run_cascade(&clf, &set, &CascadeRun { range, ..run(&t, id, 16, None) }).unwrap()
    };
    let (a, b) = (shard((0, 8), id.clone()), shard((8, 16), id.clone()));
    assert!(merge(&t, &id, vec![b.clone(), a.clone()]).is_ok());
    for (field, change) in [
        ("the model differs", Identity { model_hash: "0".repeat(64), ..id.clone() }),
        ("the data differ", Identity { data_hash: "1".repeat(64), ..id.clone() }),
        ("kernel path", Identity { kernel: "portable-or-other".into(), ..id.clone() }),
        ("version", Identity { version: "0.0.0".into(), ..id.clone() }),
    ] {
        // One shard of another evaluation, or the command's own identity differing from both.
        let mut odd = b.clone();
        odd.identity = change.clone();
        let e = merge(&t, &id, vec![a.clone(), odd]).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains("(8, 16)"), "{field}: {e}");
        let e = merge(&t, &change, vec![a.clone(), b.clone()]).unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
}

#[test]
fn the_registry_refuses_an_attack_in_a_norm_it_does_not_have() {
    let spec = |n: &str| AttackSpec::named(n);
    // FGSM is L∞ only: in L2 or L1 it is an error listing the attacks that can.
    for norm in [Norm::L2, Norm::L1] {
        let Err(e) = from_spec(&spec("fgsm"), norm, 0.5) else { panic!("fgsm in {norm:?}") };
        let e = e.to_string();
        assert!(e.contains("cannot run in") && e.contains("pgd") && !e.contains(", fgsm,"), "{e}");
    }
    let linf_only = ["fgsm", "rfgsm", "llc", "rllc", "bim", "mifgsm", "difgsm", "mdifgsm", "vmifgsm", "vnifgsm"];
    for n in linf_only {
        assert!(from_spec(&spec(n), Norm::Linf, 0.1).is_ok(), "{n} in L∞");
        assert!(from_spec(&spec(n), Norm::L2, 0.5).is_err(), "{n} in L2");
        assert!(!names_for(Norm::L2).contains(&n) && names_for(Norm::Linf).contains(&n), "{n}");
    }
    for n in ["pgd", "fab", "fab-t", "apgd-ce", "apgd-t", "square"] {
        for norm in [Norm::Linf, Norm::L2] {
            let a = from_spec(&spec(n), norm, 0.5).unwrap();
            assert_eq!(a.budget_kind().and_then(|b| b.norm()), Some(norm), "{n} in {norm:?}");
        }
    }
    // DeepFool has no L1 version; FAB has.
    assert!(from_spec(&spec("deepfool"), Norm::L1, 5.0).is_err());
    assert!(from_spec(&spec("fab"), Norm::L1, 5.0).is_ok());
    // Attacks without a norm budget are never a threat model's.
    assert!(from_spec(&spec("jsma"), Norm::Linf, 0.1).is_err());
    // by_name with an explicit norm refuses too; without one it keeps the attack's own.
    assert!(by_name("fgsm", &AttackParams { norm: Some(Norm::L2), ..AttackParams::default() }).is_err());
    assert!(by_name("fgsm", &AttackParams::default()).is_ok());
    // Every name either builds in a norm with a budget in it, or is refused.
    for n in names() {
        for norm in [Norm::Linf, Norm::L2, Norm::L1] {
            if let Ok(a) = from_spec(&spec(n), norm, 1.0) {
                assert_eq!(a.budget_kind().and_then(|b| b.norm()), Some(norm), "{n} in {norm:?}");
            }
        }
    }
}

#[test]
fn the_cascade_refuses_attacks_of_another_norm_and_fixed_budget_minimal_attacks() {
    let set = data::sample().unwrap().test.take(8).unwrap();
    let m = net();
    let clf = classifier(m.clone(), (0.0, 1.0));
    let id = Identity::new(model_hash(m.as_ref(), &[]), &set, 8, "sample").unwrap();
    let cases = [
        // An L∞-only attack in an L2 list (it would report robust 0.20 at L2 ε = 0.1 with perturbations of L2 2.6).
        (TM.replace("\"linf\"", "\"l2\"").replace("\"pgd\", \"steps\": 3", "\"fgsm\""), "attacks[0]"),
        // A fixed-budget attack as a minimum-norm one.
        (TM.replace("\"seed\"", "\"minimal\": [{\"name\": \"pgd\"}], \"seed\""), "minimal[0]"),
    ];
    for (text, field) in cases {
        let t = ThreatModel::from_json(&text).unwrap();
        let e = run_cascade(&clf, &set, &run(&t, id.clone(), 8, None)).unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
}

/// An attack that claims a budget in L∞ and lies: its "adversarial" inputs are other samples of the data set
/// (of another class), whatever ε says, or the clean input itself claimed as a success.
struct Liar {
    others: Tensor,
    claim_clean: bool,
}

impl Attack for Liar {
    fn name(&self) -> String {
        "liar".into()
    }
    fn budget_kind(&self) -> Option<Budget> {
        Some(Budget::Fixed { norm: Norm::Linf, eps: armoury::attack::Epsilon::Scalar(0.1) })
    }
    fn run(&self, model: &dyn Classifier, x: &Tensor, y: &[usize], _: &Goal, _: u64) -> Result<AttackResult> {
        let n = y.len();
        let adv = if self.claim_clean { x.clone() } else { self.others.narrow(0, 0, n)? };
        let mut r = AttackResult::evaluate(model, x, adv, y, Resolved::Untargeted, vec![0; n], vec![0; n])?;
        r.success = vec![true; n];
        Ok(r)
    }
    fn sweep(
        &self,
        m: &dyn Classifier,
        x: &Tensor,
        y: &[usize],
        g: &Goal,
        eps: &[f32],
        s: u64,
    ) -> Result<Vec<AttackResult>> {
        eps.iter().map(|_| self.run(m, x, y, g, s)).collect()
    }
}

#[test]
fn the_cascade_cannot_record_a_break_outside_the_threat_model() {
    let all = data::sample().unwrap().test;
    let set = all.take(8).unwrap();
    let m = net();
    let clf = classifier(m.clone(), (0.0, 1.0));
    let id = Identity::new(model_hash(m.as_ref(), &[]), &set, 8, "sample").unwrap();
    let t = tm();
    let (others, _) = all.batch(100..108).unwrap();
    for (claim_clean, want) in [(false, "norm is"), (true, "not a success")] {
        let liar = Liar { others: others.clone(), claim_clean };
        let build = |_: &AttackSpec, _: Norm, _: f32| -> Result<Box<dyn Attack>> {
            Ok(Box::new(Liar { others: liar.others.clone(), claim_clean }))
        };
        let r = CascadeRun { build: &build, ..run(&t, id.clone(), 8, None) };
        let e = run_cascade(&clf, &set, &r).unwrap_err().to_string();
        assert!(e.contains("pgd(steps=3) reported sample") && e.contains(want), "{e}");
    }
}

#[test]
fn inputs_outside_the_model_bounds_are_refused_on_entry() {
    let set = data::sample().unwrap().test.take(8).unwrap();
    let m = net();
    let t = tm();
    // 0–255 images on a [0, 1] model.
    let scaled = Dataset::new(set.images().mul_scalar(255.0), set.labels().to_vec(), 10).unwrap();
    let id = Identity::new(model_hash(m.as_ref(), &[]), &scaled, 8, "x255").unwrap();
    let e = run_cascade(&classifier(m.clone(), (0.0, 1.0)), &scaled, &run(&t, id, 8, None)).unwrap_err().to_string();
    assert!(e.contains("0–255") && e.contains("[0, 1]") && e.contains("255"), "{e}");
    // Declared bounds the data violate (--bounds 0.5,1 on [0, 1] data).
    let id = Identity::new(model_hash(m.as_ref(), &[]), &set, 8, "sample").unwrap();
    let e = run_cascade(&classifier(m.clone(), (0.5, 1.0)), &set, &run(&t, id, 8, None)).unwrap_err().to_string();
    assert!(e.contains("[0.5, 1]"), "{e}");
    // Attacks refuse them too.
    let pgd = by_name("pgd", &AttackParams { steps: Some(2), ..AttackParams::default() }).unwrap();
    let (x, y) = scaled.batch(0..4).unwrap();
    let e = pgd.run(&classifier(m, (0.0, 1.0)), &x, &y, &Goal::Untargeted, 0).unwrap_err().to_string();
    assert!(e.contains("bounds"), "{e}");
}

#[test]
fn meaningless_runs_are_refused() {
    let set = data::sample().unwrap().test.take(8).unwrap();
    let m = net();
    let clf = classifier(m.clone(), (0.0, 1.0));
    let id = Identity::new(model_hash(m.as_ref(), &[]), &set, 8, "sample").unwrap();
    // No samples.
    let t = tm();
    let e = run_cascade(&clf, &set, &CascadeRun { range: (0, 0), total_samples: 0, ..run(&t, id.clone(), 8, None) });
    assert!(e.unwrap_err().to_string().contains("no samples"));
    // Zero steps, zero queries, ε ≤ 0: refused by the threat model.
    for (text, field) in [
        (TM.replace("\"steps\": 3", "\"steps\": 0"), "attacks[0].steps"),
        (TM.replace("\"steps\": 3", "\"queries\": 0"), "attacks[0].queries"),
        (TM.replace("[0.1]", "[0]"), "eps[0]"),
        (TM.replace("[0.1]", "[-0.1]"), "eps[0]"),
    ] {
        let e = ThreatModel::from_json(&text).unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
    // ε beyond the box: L∞ 1.5 on [0, 1]; L2 29 > √784; L1 800 > 784.
    for (norm, eps) in [("linf", 1.5), ("l2", 29.0), ("l1", 800.0)] {
        let text = TM.replace("\"linf\"", &format!("\"{norm}\"")).replace("[0.1]", &format!("[{eps}]"));
        let t = ThreatModel::from_json(&text).unwrap();
        let e = run_cascade(&clf, &set, &run(&t, id.clone(), 8, None)).unwrap_err().to_string();
        assert!(e.contains("larger than the whole input box"), "{norm}: {e}");
    }
}

/// Flags every input except the clean ones it was built with: every perturbation is "rejected".
struct OnlyClean {
    clean: Vec<Vec<f32>>,
    threshold: Option<f32>,
}

impl Detector for OnlyClean {
    fn name(&self) -> &str {
        "only-clean"
    }
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        let n = x.shape()[0];
        (0..n).map(|i| Ok(if self.clean.contains(&armoury::attack::sample(x, i)?) { 0.0 } else { 1.0 })).collect()
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, t: f32) {
        self.threshold = Some(t);
    }
}

#[test]
fn no_attack_succeeds_by_reaching_the_rejection_class() {
    let set = data::sample().unwrap().test;
    let (x, y) = set.batch(0..3).unwrap();
    let clean = (0..3).map(|i| armoury::attack::sample(&x, i).unwrap()).collect();
    let detector = Arc::new(OnlyClean { clean, threshold: Some(0.5) });
    let guarded = Guarded::new(Arc::new(classifier(net(), (0.0, 1.0))), detector).unwrap();
    let params = AttackParams { eps: 0.2, steps: Some(3), queries: Some(60), ..AttackParams::default() };
    for name in names() {
        let a = by_name(name, &params).unwrap();
        let goal = if name == "jsma" { Goal::RandomTarget { seed: 0 } } else { Goal::Untargeted };
        let r = a.run(&guarded, &x, &y, &goal, 0).unwrap();
        assert!(r.success.iter().all(|&s| !s), "{name}: a rejected input counted as a success");
        // Decision-based attacks need an adversarial start; "rejected" is none, so they return x unchanged
        // (they used to start from a rejected noise image and walk toward x).
        if ["hsj", "hsj-grid", "boundary", "pointwise"].contains(&name) {
            assert_eq!(r.adversarial.to_vec(), x.to_vec(), "{name}: started from a rejected input");
        }
    }
}

#[test]
fn the_l1_list_runs_real_l1_attacks_and_the_deploy_files_are_autoattacks_lists() {
    let read =
        |f: &str| ThreatModel::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(f)).unwrap();
    assert_eq!(read("threat-autoattack-l2.json").hash(), ThreatModel::autoattack_l2(1.5).hash());
    assert_eq!(read("threat-autoattack-l1.json").hash(), ThreatModel::autoattack_l1(10.0).hash());
    let set = data::sample().unwrap().test.take(8).unwrap();
    let m = net();
    let clf = classifier(m.clone(), (0.0, 1.0));
    let id = Identity::new(model_hash(m.as_ref(), &[]), &set, 8, "sample").unwrap();
    let mut t = ThreatModel::autoattack_l1(10.0);
    for a in &mut t.attacks {
        (a.steps, a.queries) = (a.steps.map(|_| 5), a.queries.map(|_| 50));
    }
    let l = run_cascade(&clf, &set, &run(&t, id, 8, None)).unwrap();
    let mut broken = 0;
    for r in &l.records {
        if let Some(adv) = &r.adversarial {
            broken += 1;
            let x = set.image(r.index).unwrap();
            let l1: f64 = x.iter().zip(adv).map(|(a, b)| (*a as f64 - *b as f64).abs()).sum();
            assert!(l1 <= 10.0 * (1.0 + 1e-5), "sample {}: L1 {l1}", r.index);
        }
    }
    assert!(broken >= 3, "L1 ε = 10 breaks most of the fixture cnn's samples: {broken}");
    assert!(l.records.iter().filter(|r| r.clean_correct()).all(|r| r.minimal_norms[0].is_some()), "FAB-L1 finds all");
}

#[test]
fn the_report_states_what_it_measured() {
    let set = data::sample().unwrap().test.take(8).unwrap();
    let m = net();
    let clf = classifier(m.clone(), (0.0, 1.0));
    let id = Identity::new(model_hash(m.as_ref(), &[]), &set, 8, "sample").unwrap();
    let t = tm();
    let l = run_cascade(&clf, &set, &run(&t, id.clone(), 8, None)).unwrap();
    let s = armoury::eval::summarise(&t, &l, 10);
    let report = armoury::report::to_report(&clf, &set, &t, &l, &s, Vec::new()).unwrap();
    assert_eq!(report.identity.as_ref(), Some(&id));
    let dir = tmp("report");
    let files = armoury::report::write(&report, &dir).unwrap();
    for (what, path) in [("markdown", &files.markdown), ("html", &files.html), ("json", &files.json)] {
        let text = std::fs::read_to_string(path).unwrap();
        for field in [&id.model_hash, &id.data_hash, &id.kernel, &id.version] {
            assert!(text.contains(field.as_str()), "{what} lacks {field}");
        }
    }
    assert_eq!(armoury::report::read(&files.json).unwrap().identity, Some(id));
    std::fs::remove_dir_all(&dir).unwrap();
}
