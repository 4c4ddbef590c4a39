//! Adversarial training: every method trains, Madry's PGD-AT really buys robustness on real data, checkpoints
//! resume bit for bit, masking is flagged, and an imported ONNX model is attacked and fine-tuned end to end.

use std::sync::Arc;

use armoury::data::{self, Dataset};
use armoury::nn::{cnn, Module, ModuleExt, Sequential};
use armoury::onnx::OnnxModel;
use armoury::optim::{Adam, AdamConfig, LrSchedule};
use armoury::robustness::{robust_evaluation, RobustnessConfig};
use armoury::train::{load_checkpoint, TrainConfig, Trainer};
use armoury::{Attack, Classifier, Goal, ModuleClassifier, Result, Tensor};
use armoury_attacks::Pgd;
use armoury_defenses::training::*;

fn sample() -> (Dataset, Dataset) {
    let s = data::sample().unwrap();
    (s.train, s.test)
}

fn config(epochs: usize, checkpoint: Option<std::path::PathBuf>) -> TrainConfig {
    TrainConfig { epochs, batch_size: 64, checkpoint, ..TrainConfig::default() }
}

/// Trains `model` with `method` under `config` from scratch.
fn train_with(
    config: TrainConfig,
    method: &dyn Method,
    model: &dyn Module,
    data: &Dataset,
) -> Result<Vec<armoury::train::EpochReport>> {
    let mut opt = Adam::new(model.parameters(), AdamConfig::default())?;
    Trainer::new(config).method(method).fit(model, &mut opt, data, &mut ())
}

fn pgd(eps: f32, step_size: f32, steps: usize) -> Box<Pgd> {
    Box::new(Pgd { step_size, steps, ..Pgd::linf(eps) })
}

fn madry(eps: f32, step_size: f32, steps: usize) -> ProjectedAdversarialDefense {
    ProjectedAdversarialDefense::madry(pgd(eps, step_size, steps))
}

fn weights(model: &dyn Module) -> Vec<Vec<f32>> {
    model.parameters().iter().map(|p| p.value().iter().copied().collect()).collect()
}

fn pgd_accuracy(model: &dyn Classifier, test: &Dataset, n: usize) -> f32 {
    let (x, y) = test.batch(0..n).unwrap();
    Pgd { step_size: 0.01, steps: 20, ..Pgd::linf(0.1) }
        .run(model, &x, &y, &Goal::Untargeted, 0)
        .unwrap()
        .robust_accuracy(&y)
}

#[test]
fn every_method_trains() {
    let (train, _) = sample();
    let small = train.take(128).unwrap();
    let fixed: Arc<dyn Classifier> = Arc::new(ModuleClassifier::new(cnn(9), &[1, 28, 28], 10, (0.0, 1.0)).unwrap());
    let methods: Vec<Box<dyn Method>> = vec![
        Box::new(Standard),
        Box::new(NaturalAdversarialDefense::default()),
        Box::new(AdversarialDefenseWithAttacks {
            attacks: vec![Box::new(Pgd::fgsm(0.1)), Box::new(Pgd { steps: 3, ..Pgd::linf(0.1) })],
            replace_ratio: 0.5,
        }),
        Box::new(madry(0.1, 0.025, 3)),
        Box::new(EnsembleAdversarialDefense::new(vec![fixed.clone()], Box::new(Pgd::fgsm(0.1)))),
        Box::new(EnsembleAdversarialDefense::mixed(vec![fixed], Box::new(Pgd::fgsm(0.1)), 0.5)),
        Box::new(Trades::new(0.1, 0.025, 2)),
        Box::new(Mart::new(pgd(0.1, 0.025, 2))),
        Box::new(FastAt::new(0.1)),
        Box::new(FreeAt::new(0.1, 2)),
    ];
    for m in methods {
        let model = cnn(1);
        let before: Vec<f32> = model.parameters()[0].value().iter().copied().collect();
        let reports = train_with(config(2, None), m.as_ref(), &model, &small).unwrap();
        let expected_epochs = 2usize.div_ceil(m.replays());
        assert_eq!(reports.len(), expected_epochs, "{}", m.name());
        assert!(reports.iter().all(|r| r.train_loss.is_finite() && r.train_loss > 0.0), "{}: loss", m.name());
        let after: Vec<f32> = model.parameters()[0].value().iter().copied().collect();
        assert_ne!(before, after, "{}: weights must change", m.name());
    }
}

#[test]
fn misuse_is_an_error() {
    let (train, _) = sample();
    let small = train.take(64).unwrap();
    let model = cnn(1);
    let before = weights(&model);
    let bad = NaturalAdversarialDefense { eps: 0.1, replace_ratio: 1.5 };
    let err = train_with(config(1, None), &bad, &model, &small).unwrap_err();
    assert!(err.to_string().contains("replace ratio 1.5"), "{err}");
    let err = train_with(config(1, None), &FreeAt::new(0.1, 0), &model, &small).unwrap_err();
    assert!(err.to_string().contains("replays must be ≥ 1"), "{err}");
    let err =
        train_with(config(1, None), &Trades { beta: -1.0, ..Trades::new(0.1, 0.025, 1) }, &model, &small).unwrap_err();
    assert!(err.to_string().contains("β = -1"), "{err}");
    assert_eq!(weights(&model), before, "settings are checked before anything trains");
}

/// Madry PGD-AT on 2,000 real images for 3 epochs beats standard training under PGD on held-out images.
#[test]
fn pgd_training_buys_robustness() {
    let (train, test) = sample();
    let run = |method: &dyn Method| {
        let model: Arc<Sequential> = Arc::new(cnn(0));
        train_with(config(3, None), method, model.as_ref(), &train).unwrap();
        let clf = ModuleClassifier::new(model, &[1, 28, 28], 10, (0.0, 1.0)).unwrap();
        pgd_accuracy(&clf, &test, 300)
    };
    let standard = run(&Standard);
    let madry = run(&madry(0.1, 0.025, 5));
    assert!(madry > standard + 0.1, "PGD-20 robust accuracy: standard {standard}, PGD-AT {madry}");
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("armoury-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn checkpoints_resume_bit_for_bit() {
    let (train, _) = sample();
    let small = train.take(192).unwrap();
    let dir = temp_dir("ckpt");
    let path = dir.join("ckpt.safetensors");
    let methods: [fn() -> Box<dyn Method>; 2] = [|| Box::new(FreeAt::new(0.1, 2)), || Box::new(madry(0.1, 0.03, 2))];
    for make in methods {
        let method = make();
        // straight through: epochs 0..4 (free: 2 passes)
        let straight = cnn(2);
        train_with(config(4, None), method.as_ref(), &straight, &small).unwrap();
        // half, checkpoint, fresh objects, resume
        let first = cnn(2);
        train_with(config(2, Some(path.clone())), make().as_ref(), &first, &small).unwrap();
        let again = make();
        let resumed = cnn(77);
        let mut opt = Adam::new(resumed.parameters(), AdamConfig::default()).unwrap();
        let reports = Trainer::new(config(4, None))
            .method(again.as_ref())
            .resume(&path)
            .fit(&resumed, &mut opt, &small, &mut ())
            .unwrap();
        assert_eq!(reports[0].epoch, 2usize.div_ceil(method.replays()), "resumes after the saved pass");
        assert_eq!(weights(&straight), weights(&resumed), "{}: resumed training differs", method.name());
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, [std::ffi::OsString::from("ckpt.safetensors")], "written atomically: no temporary left");
    let missing = dir.join("missing.safetensors");
    let mut opt = Adam::new(vec![], AdamConfig::default()).unwrap();
    assert!(load_checkpoint(&missing, &cnn(0), &mut opt, &Standard, &TrainConfig::default()).is_err());
    std::fs::remove_dir_all(dir).ok();
}

/// A checkpoint records the run's seed, batch size, method and settings: resuming under other ones is an error
/// that names what differs, and touches nothing.
#[test]
fn resuming_another_run_is_an_error_naming_what_differs() {
    let (train, _) = sample();
    let small = train.take(64).unwrap();
    let dir = temp_dir("ckpt-mismatch");
    let path = dir.join("ckpt.safetensors");
    train_with(config(1, Some(path.clone())), &madry(0.1, 0.03, 1), &cnn(2), &small).unwrap();
    let resume = |cfg: TrainConfig, method: &dyn Method| {
        let model = cnn(5);
        let before = weights(&model);
        let mut opt = Adam::new(model.parameters(), AdamConfig::default()).unwrap();
        let err = Trainer::new(cfg).method(method).resume(&path).fit(&model, &mut opt, &small, &mut ()).unwrap_err();
        assert_eq!(weights(&model), before, "a refused checkpoint is not loaded");
        err.to_string()
    };
    let err = resume(TrainConfig { seed: 1, ..config(2, None) }, &madry(0.1, 0.03, 1));
    assert!(err.contains("seed: checkpoint '0', this run '1'") && !err.contains("settings"), "{err}");
    let err = resume(TrainConfig { batch_size: 32, ..config(2, None) }, &madry(0.1, 0.03, 1));
    assert!(err.contains("batch_size: checkpoint '64', this run '32'"), "{err}");
    let err = resume(config(2, None), &madry(0.1, 0.03, 3));
    assert!(
        err.contains("settings: checkpoint 'pgd-at(") && err.contains("steps=3") && !err.contains("method:"),
        "{err}"
    );
    let err = resume(config(2, None), &Trades::new(0.1, 0.03, 1));
    assert!(err.contains("method: checkpoint 'pgd-at', this run 'trades'"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

/// Free AT runs ⌈epochs / m⌉ passes: with fewer epochs than replays, one pass (not an error, not nothing).
#[test]
fn free_at_runs_the_ceiling_of_epochs_over_replays() {
    let (train, _) = sample();
    let small = train.take(64).unwrap();
    for (epochs, m, passes) in [(1, 2, 1), (3, 2, 2), (4, 2, 2), (5, 4, 2)] {
        let model = cnn(1);
        let reports = train_with(config(epochs, None), &FreeAt::new(0.1, m), &model, &small).unwrap();
        assert_eq!(reports.len(), passes, "{epochs} epochs, m = {m}");
    }
}

/// Free AT's schedule is in epochs: a pass of m replays advances it m epochs, so a milestone at epoch 2 with m = 2
/// is reached at the second pass (per epoch and per step).
#[test]
fn free_at_reaches_milestones_given_in_epochs() {
    #[derive(Default)]
    struct Rates(Vec<(usize, f32)>);
    impl armoury::train::TrainCallback for Rates {
        fn on_step(&mut self, r: &StepReport) {
            self.0.push((r.epoch, r.lr));
        }
    }
    let (train, _) = sample();
    let small = train.take(64).unwrap();
    for lr_per_step in [false, true] {
        let schedule = LrSchedule::MultiStep { milestones: vec![2], gamma: 0.1 };
        let cfg = TrainConfig { epochs: 4, batch_size: 32, schedule, lr_per_step, ..TrainConfig::default() };
        let model = cnn(1);
        let mut opt = Adam::new(model.parameters(), AdamConfig { lr: 0.01, ..Default::default() }).unwrap();
        let mut rates = Rates::default();
        Trainer::new(cfg).method(&FreeAt::new(0.1, 2)).fit(&model, &mut opt, &small, &mut rates).unwrap();
        let want = [(0, 0.01), (0, 0.01), (1, 0.001), (1, 0.001)];
        assert_eq!(rates.0.len(), want.len());
        for ((e, lr), (we, wlr)) in rates.0.iter().zip(want) {
            assert!(*e == we && (lr - wlr).abs() < 1e-7, "per step {lr_per_step}: {:?}", rates.0);
        }
    }
}

/// Every call an attack gets: the seed, the labels and the inputs.
#[derive(Default)]
struct Recorder {
    calls: std::sync::Mutex<Vec<(u64, Vec<usize>, Tensor)>>,
}

impl Attack for Recorder {
    fn name(&self) -> String {
        "recorder".into()
    }
    fn run(
        &self,
        model: &dyn Classifier,
        x: &Tensor,
        y: &[usize],
        _goal: &Goal,
        seed: u64,
    ) -> Result<armoury::AttackResult> {
        self.calls.lock().unwrap().push((seed, y.to_vec(), x.clone()));
        let zeros = vec![0; y.len()];
        armoury::AttackResult::evaluate(model, x, x.clone(), y, armoury::Resolved::Untargeted, zeros.clone(), zeros)
    }
}

/// An attack shared with the test: the method owns a box, the test keeps the records.
struct Shared(Arc<Recorder>);

impl Attack for Shared {
    fn name(&self) -> String {
        self.0.name()
    }
    fn run(&self, m: &dyn Classifier, x: &Tensor, y: &[usize], g: &Goal, seed: u64) -> Result<armoury::AttackResult> {
        self.0.run(m, x, y, g, seed)
    }
}

/// The seeds each image was attacked with, by its values.
fn seeds_per_image(rec: &Recorder) -> std::collections::HashMap<Vec<u32>, Vec<u64>> {
    let mut out: std::collections::HashMap<Vec<u32>, Vec<u64>> = Default::default();
    for (seed, _, x) in rec.calls.lock().unwrap().iter() {
        for i in 0..x.shape()[0] {
            let key = armoury::attack::sample(x, i).unwrap().iter().map(|v| v.to_bits()).collect();
            out.entry(key).or_default().push(*seed);
        }
    }
    out
}

/// The same image, trained on in two epochs, gets a fresh seed — so a fresh random start — each time, from
/// `AdversarialDefenseWithAttacks` and `EnsembleAdversarialDefense` alike (Madry's start is fresh each time);
/// and a real PGD's random start does follow the seed.
#[test]
fn every_epoch_gives_an_image_a_fresh_random_start() {
    let (train, test) = sample();
    let small = train.take(32).unwrap();
    let cfg = TrainConfig { epochs: 2, batch_size: 16, ..TrainConfig::default() };
    let with_attacks = |r: &Arc<Recorder>| -> Box<dyn Method> {
        Box::new(AdversarialDefenseWithAttacks { attacks: vec![Box::new(Shared(r.clone()))], replace_ratio: 1.0 })
    };
    let ensemble = |r: &Arc<Recorder>| -> Box<dyn Method> {
        Box::new(EnsembleAdversarialDefense::new(vec![], Box::new(Shared(r.clone()))))
    };
    for make in [with_attacks, ensemble] {
        let rec = Arc::new(Recorder::default());
        let method = make(&rec);
        train_with(cfg.clone(), method.as_ref(), &cnn(1), &small).unwrap();
        let seeds = seeds_per_image(&rec);
        assert_eq!(seeds.len(), 32, "{}", method.name());
        for s in seeds.values() {
            assert_eq!(s.len(), 2, "attacked once per epoch");
            assert_ne!(s[0], s[1], "{}: the same seed in both epochs", method.name());
        }
    }
    // Those seeds reach PGD's random start: the same image, two seeds, two starts.
    let clf = ModuleClassifier::new(cnn(1), &[1, 28, 28], 10, (0.0, 1.0)).unwrap();
    let (x, y) = test.batch(0..4).unwrap();
    let start = Pgd { steps: 1, step_size: 1e-6, ..Pgd::linf(0.1) };
    let (a, b) = (
        start.generate(&clf, &x, &y, &Goal::Untargeted, 1).unwrap(),
        start.generate(&clf, &x, &y, &Goal::Untargeted, 2).unwrap(),
    );
    assert_ne!(a.to_array(), b.to_array());
}

/// Same seed, same weights bit for bit — with 1 and 2 threads — for PGD-AT and the ensemble.
#[test]
fn adversarial_training_is_reproducible_across_thread_counts() {
    let (train, _) = sample();
    let small = train.take(64).unwrap();
    let fixed: Arc<dyn Classifier> = Arc::new(ModuleClassifier::new(cnn(9), &[1, 28, 28], 10, (0.0, 1.0)).unwrap());
    let run = |threads: usize, seed: u64| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let cfg = TrainConfig { epochs: 2, batch_size: 32, seed, ..TrainConfig::default() };
            let a = cnn(3);
            train_with(cfg.clone(), &madry(0.1, 0.03, 2), &a, &small).unwrap();
            let b = cnn(3);
            let ensemble = EnsembleAdversarialDefense::new(vec![fixed.clone()], pgd(0.1, 0.03, 1));
            train_with(cfg, &ensemble, &b, &small).unwrap();
            (weights(&a), weights(&b))
        })
    };
    let one = run(1, 0);
    assert!(one == run(2, 0), "the thread count changed the weights");
    assert!(one != run(2, 1), "another seed, other weights");
}

/// The paper's ensemble recipe attacks a static model with that model's predictions, not the true labels (no
/// label leaking), and the model being trained with the true labels; batches rotate between the sources.
#[test]
fn ensemble_attacks_static_models_with_their_predicted_labels() {
    let (train, _) = sample();
    let small = train.take(64).unwrap();
    let fixed: Arc<dyn Classifier> = Arc::new(ModuleClassifier::new(cnn(9), &[1, 28, 28], 10, (0.0, 1.0)).unwrap());
    let cfg = TrainConfig { epochs: 1, batch_size: 16, ..TrainConfig::default() };
    let order = armoury::seed::shuffled(small.len(), cfg.seed, 0);
    for paper in [true, false] {
        let rec = Arc::new(Recorder::default());
        let attack = Box::new(Shared(rec.clone()));
        let method = if paper {
            EnsembleAdversarialDefense::new(vec![fixed.clone()], attack)
        } else {
            EnsembleAdversarialDefense::mixed(vec![fixed.clone()], attack, 1.0)
        };
        train_with(cfg.clone(), &method, &cnn(1), &small).unwrap();
        let calls = rec.calls.lock().unwrap();
        assert_eq!(calls.len(), 4, "one attack per batch");
        let mut leaked = 0;
        for (b, (_, labels, x)) in calls.iter().enumerate() {
            let truth: Vec<usize> = order[b * 16..(b + 1) * 16].iter().map(|&i| small.labels()[i]).collect();
            let want = if b % 2 == 1 && paper { fixed.predict(x).unwrap() } else { truth.clone() };
            assert_eq!(labels, &want, "batch {b}, paper recipe {paper}");
            leaked += usize::from(b % 2 == 1 && labels != &truth);
        }
        assert_eq!(leaked > 0, paper, "the untrained static model's predictions differ from the truth");
    }
}

/// A model that hides its gradients (the input is detached) looks robust to PGD; the box-sized check flags it.
#[test]
fn gradient_masking_is_flagged() {
    struct Masked(Sequential);
    impl Module for Masked {
        fn forward_t(&self, x: &Tensor, t: bool) -> Result<Tensor> {
            self.0.forward_t(&x.detach(), t)
        }
        fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &armoury::Param)) {
            self.0.visit(p, f)
        }
    }
    let net = cnn(0);
    armoury::io::load_module(&net, crate::common::fixture("cnn.safetensors")).unwrap();
    let clf = ModuleClassifier::new(Masked(net), &[1, 28, 28], 10, (0.0, 1.0)).unwrap();
    let (_, test) = sample();
    let cfg = RobustnessConfig {
        data: test.take(200).unwrap(),
        robust_samples: 100,
        attacks: vec![("pgd".into(), Box::new(Pgd { steps: 10, ..Pgd::linf(0.1) }))],
        unbounded_check: Some(Box::new(Pgd { steps: 20, step_size: 0.1, ..Pgd::linf(1.0) })),
        batch_size: 100,
        seed: 0,
    };
    let eval = robust_evaluation(&clf, &cfg).unwrap();
    assert!(eval.robust("pgd").unwrap() > 0.5, "masked gradients: PGD makes no progress");
    assert!(!eval.warnings.is_empty(), "the unbounded check must flag it: {eval:?}");
}

/// Issue 6 end to end: cnn.onnx imported, attacked, evaluated and fine-tuned with adversarial training.
#[test]
fn onnx_model_attacked_evaluated_and_fine_tuned() {
    let onnx = Arc::new(OnnxModel::load(crate::common::fixture("cnn.onnx")).unwrap());
    let clf = onnx.classifier((0.0, 1.0)).unwrap();
    let (train, test) = sample();
    let before = pgd_accuracy(&clf, &test, 200);
    assert!(before < 0.15, "the imported cnn is fragile: {before}");
    let mut opt = Adam::new(onnx.parameters(), AdamConfig::default()).unwrap();
    let robustness = RobustnessConfig {
        data: test.take(500).unwrap(),
        robust_samples: 200,
        attacks: vec![("pgd".into(), Box::new(Pgd { step_size: 0.01, steps: 20, ..Pgd::linf(0.1) }))],
        unbounded_check: None,
        batch_size: 200,
        seed: 0,
    };
    let cfg = TrainConfig { epochs: 2, batch_size: 64, schedule: LrSchedule::Constant, ..TrainConfig::default() };
    let reports = Trainer::new(cfg)
        .method(&madry(0.1, 0.025, 5))
        .robustness(&robustness)
        .fit(onnx.as_ref(), &mut opt, &train, &mut ())
        .unwrap();
    let last = reports.last().unwrap().robust.as_ref().unwrap();
    let after = last.robust("pgd").unwrap();
    assert!(after > before + 0.15, "fine-tuning the imported model: PGD robust accuracy {before} → {after}");
    assert!(last.clean_accuracy > 0.5);
}

/// A model that hides whether its modes agree (it forwards everything else), so TRADES must run its own clean
/// forwards rather than keep the loss's.
struct ModesUnknown(Sequential);

impl Module for ModesUnknown {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.0.forward_t(x, train)
    }
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &armoury::nn::Param)) {
        self.0.visit(prefix, f)
    }
}

#[test]
fn trades_keeps_its_clean_forward_only_where_the_modes_agree() {
    use armoury::nn::{Dropout, Flatten, Linear};
    assert!(cnn(1).mode_independent());
    assert!(!ModesUnknown(cnn(1)).mode_independent());
    let with_dropout = Sequential::new()
        .add("0", Flatten)
        .add("1", Dropout::new(0.5, 0).unwrap())
        .add("2", Linear::new(784, 10, true, 0));
    assert!(!with_dropout.mode_independent());
    assert!(!armoury::nn::BatchNorm::new(4).mode_independent());
    let boxed: Box<dyn Module> = Box::new(Arc::new(cnn(1)));
    assert!(boxed.mode_independent(), "containers and pointers pass it on");

    // One TRADES step from the same weights, with the kept forward and with separate ones: the same update.
    let (train, _) = sample();
    let (x, y) = train.batch(0..96).unwrap();
    let step = |model: Arc<dyn Module>| -> Vec<Vec<f32>> {
        let clf = ModuleClassifier::new(model.clone(), &[1, 28, 28], 10, (0.0, 1.0)).unwrap();
        let mut opt = Adam::new(model.parameters(), AdamConfig::default()).unwrap();
        let mut ctx = StepContext {
            model: model.as_ref(),
            classifier: &clf,
            optimizer: &mut opt,
            clip_grad_norm: None,
            epoch: 0,
            batch: 0,
            seed: 4,
        };
        let report = Trades::new(0.1, 0.025, 3).step(&mut ctx, &x, &y).unwrap();
        assert!(report.loss.is_finite() && report.loss > 0.0);
        model.parameters().iter().map(|p| p.value().iter().copied().collect()).collect()
    };
    let kept = step(Arc::new(cnn(1)));
    let separate = step(Arc::new(ModesUnknown(cnn(1))));
    let fresh: Vec<Vec<f32>> = cnn(1).parameters().iter().map(|p| p.value().iter().copied().collect()).collect();
    assert_ne!(kept, fresh, "the step must change the weights");
    // Same kernels on the same pieces: the same bits.
    assert!(kept == separate, "the kept forward changed the update");
}
