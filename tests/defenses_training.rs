//! Adversarial training: every method trains, Madry's PGD-AT really buys robustness on real data, checkpoints
//! resume bit for bit, masking is flagged, and an imported ONNX model is attacked and fine-tuned end to end.

use std::sync::Arc;

use armoury::data::{self, Dataset};
use armoury::nn::{cnn, Module, ModuleExt, Sequential};
use armoury::onnx::OnnxModel;
use armoury::optim::{Adam, AdamConfig, LrSchedule};
use armoury::{Attack, Classifier, Goal, ModuleClassifier, Result, Tensor};
use armoury_attacks::Pgd;
use armoury_defenses::training::*;

fn sample() -> (Dataset, Dataset) {
    let s = data::sample().unwrap();
    (s.train, s.test)
}

fn trainer(epochs: usize, checkpoint: Option<std::path::PathBuf>) -> AdversarialTrainer {
    AdversarialTrainer {
        config: TrainerConfig { epochs, batch_size: 64, checkpoint, ..TrainerConfig::mnist_like() },
        evaluation: None,
    }
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
    let fixed = Arc::new(ModuleClassifier::new(cnn(9), &[1, 28, 28], 10, (0.0, 1.0)).unwrap());
    let methods: Vec<Box<dyn Method>> = vec![
        Box::new(Standard),
        Box::new(NaturalAdversarialDefense::default()),
        Box::new(AdversarialDefenseWithAttacks {
            attacks: vec![Arc::new(Pgd::fgsm(0.1)), Arc::new(Pgd { steps: 3, ..Pgd::linf(0.1) })],
            replace_ratio: 0.5,
        }),
        Box::new(ProjectedAdversarialDefense::madry(0.1, 0.025, 3)),
        Box::new(EnsembleAdversarialDefense {
            static_models: vec![fixed],
            attack: Arc::new(Pgd::fgsm(0.1)),
            replace_ratio: 0.5,
        }),
        Box::new(Trades::new(0.1, 0.025, 2)),
        Box::new(Mart::new(0.1, 0.025, 2)),
        Box::new(FastAt::new(0.1)),
        Box::new(FreeAt::new(0.1, 2)),
    ];
    for m in methods {
        let model: Arc<Sequential> = Arc::new(cnn(1));
        let mut opt = Adam::new(model.parameters(), AdamConfig::default()).unwrap();
        let before: Vec<f32> = model.parameters()[0].value().iter().copied().collect();
        let reports = trainer(2, None).fit(model.clone(), &mut opt, m.as_ref(), &small, 0, &mut ()).unwrap();
        let expected_epochs = 2 / m.epoch_divisor();
        assert_eq!(reports.len(), expected_epochs, "{}", m.name());
        assert!(reports.iter().all(|r| r.loss.is_finite() && r.loss > 0.0), "{}: loss", m.name());
        let after: Vec<f32> = model.parameters()[0].value().iter().copied().collect();
        assert_ne!(before, after, "{}: weights must change", m.name());
    }
}

#[test]
fn misuse_is_an_error() {
    let (train, _) = sample();
    let small = train.take(64).unwrap();
    let model: Arc<Sequential> = Arc::new(cnn(1));
    let mut opt = Adam::new(model.parameters(), AdamConfig::default()).unwrap();
    let bad = NaturalAdversarialDefense { eps: 0.1, replace_ratio: 1.5 };
    assert!(trainer(1, None).fit(model.clone(), &mut opt, &bad, &small, 0, &mut ()).is_err());
    assert!(trainer(1, None).fit(model.clone(), &mut opt, &FreeAt::new(0.1, 0), &small, 0, &mut ()).is_err());
    // Free training replays each batch m times and makes epochs / m passes: fewer epochs than m make none.
    let err = trainer(1, None).fit(model, &mut opt, &FreeAt::new(0.1, 2), &small, 0, &mut ()).unwrap_err();
    assert!(err.to_string().contains("1 epochs make none"), "{err}");
}

/// Madry PGD-AT on 2,000 real images for 3 epochs beats standard training under PGD on held-out images.
#[test]
fn pgd_training_buys_robustness() {
    let (train, test) = sample();
    let run = |method: &dyn Method| {
        let model: Arc<Sequential> = Arc::new(cnn(0));
        let mut opt = Adam::new(model.parameters(), AdamConfig::default()).unwrap();
        trainer(3, None).fit(model.clone(), &mut opt, method, &train, 0, &mut ()).unwrap();
        let clf = ModuleClassifier::new(model, &[1, 28, 28], 10, (0.0, 1.0)).unwrap();
        pgd_accuracy(&clf, &test, 300)
    };
    let standard = run(&Standard);
    let madry = run(&ProjectedAdversarialDefense::madry(0.1, 0.025, 5));
    assert!(madry > standard + 0.1, "PGD-20 robust accuracy: standard {standard}, PGD-AT {madry}");
}

#[test]
fn checkpoints_resume_bit_for_bit() {
    let (train, _) = sample();
    let small = train.take(192).unwrap();
    let dir = std::env::temp_dir().join(format!("armoury-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ckpt.safetensors");
    for method in
        [Box::new(FreeAt::new(0.1, 2)) as Box<dyn Method>, Box::new(ProjectedAdversarialDefense::madry(0.1, 0.03, 2))]
    {
        // straight through: epochs 0..4 (free: 2 passes)
        let straight: Arc<Sequential> = Arc::new(cnn(2));
        let mut opt = Adam::new(straight.parameters(), AdamConfig::default()).unwrap();
        trainer(4, None).fit(straight.clone(), &mut opt, method.as_ref(), &small, 0, &mut ()).unwrap();
        // half, checkpoint, fresh objects, resume
        let fresh_method: Box<dyn Method> = if method.epoch_divisor() > 1 {
            Box::new(FreeAt::new(0.1, 2))
        } else {
            Box::new(ProjectedAdversarialDefense::madry(0.1, 0.03, 2))
        };
        let first: Arc<Sequential> = Arc::new(cnn(2));
        let mut opt1 = Adam::new(first.parameters(), AdamConfig::default()).unwrap();
        trainer(2, Some(path.clone())).fit(first, &mut opt1, fresh_method.as_ref(), &small, 0, &mut ()).unwrap();
        let resumed: Arc<Sequential> = Arc::new(cnn(77));
        let mut opt2 = Adam::new(resumed.parameters(), AdamConfig::default()).unwrap();
        let again: Box<dyn Method> = if method.epoch_divisor() > 1 {
            Box::new(FreeAt::new(0.1, 2))
        } else {
            Box::new(ProjectedAdversarialDefense::madry(0.1, 0.03, 2))
        };
        let start = load_checkpoint(&path, resumed.as_ref(), &mut opt2, again.as_ref()).unwrap();
        assert_eq!(start, 2 / method.epoch_divisor());
        trainer(4, None).fit(resumed.clone(), &mut opt2, again.as_ref(), &small, start, &mut ()).unwrap();
        for (a, b) in straight.parameters().iter().zip(resumed.parameters()) {
            assert_eq!(a.value(), b.value(), "{}: resumed training differs", method.name());
        }
    }
    assert!(load_checkpoint(
        &dir.join("missing.safetensors"),
        &cnn(0),
        &mut Adam::new(vec![], AdamConfig::default()).unwrap(),
        &Standard
    )
    .is_err());
    std::fs::remove_dir_all(dir).ok();
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
        attacks: vec![("pgd".into(), Arc::new(Pgd { steps: 10, ..Pgd::linf(0.1) }))],
        unbounded_check: true,
        batch_size: 100,
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
    let t = AdversarialTrainer {
        config: TrainerConfig {
            epochs: 2,
            batch_size: 64,
            schedule: LrSchedule::Constant,
            ..TrainerConfig::mnist_like()
        },
        evaluation: Some(RobustnessConfig {
            data: test.take(500).unwrap(),
            robust_samples: 200,
            attacks: vec![("pgd".into(), Arc::new(Pgd { step_size: 0.01, steps: 20, ..Pgd::linf(0.1) }))],
            unbounded_check: false,
            batch_size: 200,
        }),
    };
    let reports =
        t.fit(onnx.clone(), &mut opt, &ProjectedAdversarialDefense::madry(0.1, 0.025, 5), &train, 0, &mut ()).unwrap();
    let last = reports.last().unwrap().eval.as_ref().unwrap();
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
        let mut ctx =
            StepContext { model: model.as_ref(), classifier: &clf, optimizer: &mut opt, epoch: 0, batch: 0, seed: 4 };
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
