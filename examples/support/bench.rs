//! The core benchmark workloads, shared by `examples/bench.rs` and `benches/core.rs`.
#![allow(dead_code)]

use std::time::Instant;

use armoury::data::Dataset;
use armoury::nn::{ModuleExt, ReferenceModel, Sequential};
use armoury::optim::{Adam, AdamConfig};
use armoury::seed::shuffled;
use armoury::train::train_step;
use armoury::{Classifier, ModuleClassifier, Result, Tensor};

/// One measured workload.
#[derive(Clone, Debug)]
pub struct Row {
    pub model: &'static str,
    pub workload: &'static str,
    pub batch: usize,
    pub ms: f64,
    pub images_per_s: f64,
    pub gflops: f64,
}

impl Row {
    pub fn json(&self) -> String {
        format!(
            "{{\"model\":\"{}\",\"workload\":\"{}\",\"batch\":{},\"ms\":{:.4},\"images_per_s\":{:.1},\"gflops\":{:.2}}}",
            self.model, self.workload, self.batch, self.ms, self.images_per_s, self.gflops
        )
    }
}

/// Median wall time in milliseconds of `reps` runs of `f` after one warm-up run.
pub fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn row(model: ReferenceModel, workload: &'static str, batch: usize, ms: f64, flop_factor: f64) -> Row {
    let images = batch as f64 / (ms / 1e3);
    let gflops = flop_factor * 2.0 * model.macs_per_image() as f64 * images / 1e9;
    Row { model: model.name(), workload, batch, ms, images_per_s: images, gflops }
}

/// Forward and forward + input gradient at the given batch sizes.
pub fn inference(model: ReferenceModel, batches: &[usize], data: &Dataset) -> Result<Vec<Row>> {
    let net = model.build(0);
    let clf = ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0))?;
    let mut rows = Vec::new();
    for &b in batches {
        let (x, y) = data.batch(0..b)?;
        let reps = if b >= 1000 {
            9
        } else if b >= 128 {
            21
        } else {
            201
        };
        let ms = median_ms(reps, || clf.logits(&x).map(|_| ()))?;
        rows.push(row(model, "forward", b, ms, 1.0));
        let ms = median_ms(reps, || clf.loss_gradient(&x, &y).map(|_| ()))?;
        rows.push(row(model, "forward_input_grad", b, ms, 2.0));
    }
    Ok(rows)
}

/// One Adam training step at batch 128, and one full epoch over `train` at batch 128.
pub fn training(model: ReferenceModel, train: &Dataset, epoch: bool) -> Result<Vec<Row>> {
    let net: Sequential = model.build(0);
    let mut opt = Adam::new(net.parameters(), AdamConfig::default())?;
    let (x, y) = train.batch(0..128)?;
    let ms = median_ms(21, || train_step(&net, &mut opt, &x, &y, None).map(|_| ()))?;
    let mut rows = vec![row(model, "train_step", 128, ms, 3.0)];
    if epoch {
        let t = Instant::now();
        let order = shuffled(train.len(), 0, 0);
        for idx in order.chunks(128) {
            let xb: Tensor = train.images().index_select(0, idx)?;
            let yb: Vec<usize> = idx.iter().map(|&i| train.labels()[i]).collect();
            train_step(&net, &mut opt, &xb, &yb, None)?;
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        rows.push(row(model, "train_epoch", train.len(), ms, 3.0));
    }
    Ok(rows)
}

/// One measured attack.
#[derive(Clone, Debug)]
pub struct AttackRow {
    pub attack: &'static str,
    pub images: usize,
    pub seconds: f64,
    pub robust_accuracy: f32,
    pub success_rate: f32,
    pub mean_l2: f32,
    pub reference_seconds: f64,
}

impl AttackRow {
    pub fn json(&self) -> String {
        format!(
            "{{\"attack\":\"{}\",\"images\":{},\"seconds\":{:.4},\"images_per_s\":{:.1},\"robust_accuracy\":{:.4},\"success_rate\":{:.4},\"mean_l2\":{:.4},\"torchattacks_seconds\":{},\"speedup\":{:.2}}}",
            self.attack,
            self.images,
            self.seconds,
            self.images as f64 / self.seconds,
            self.robust_accuracy,
            self.success_rate,
            self.mean_l2,
            self.reference_seconds,
            self.reference_seconds / self.seconds
        )
    }
}

/// SPEC §6's attack workloads on the fixture `cnn` (median of 3 runs): FGSM and PGD-40 on 1000 images, CW-L2
/// (c = 1, κ = 0, 100 Adam steps) on 100.
pub fn attacks(weights: &std::path::Path, test: &Dataset) -> Result<Vec<AttackRow>> {
    use armoury::{Attack, Goal};
    use armoury_attacks::{CarliniWagnerL2, Pgd};
    let net = ReferenceModel::Cnn.build(0);
    armoury::io::load_module(&net, weights)?;
    let clf = ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0))?;
    let runs: Vec<(&'static str, Box<dyn Attack>, usize, f64)> = vec![
        ("fgsm", Box::new(Pgd::fgsm(0.1)), 1000, 0.132),
        ("pgd40", Box::new(Pgd { step_size: 0.01, steps: 40, ..Pgd::linf(0.1) }), 1000, 5.4),
        ("cw_l2", Box::new(CarliniWagnerL2::torchattacks()), 100, 0.95),
    ];
    let mut rows = Vec::new();
    for (name, attack, n, reference) in runs {
        let (x, y) = test.batch(0..n)?;
        let mut last = None;
        let ms = median_ms(3, || {
            last = Some(attack.run(&clf, &x, &y, &Goal::Untargeted, 0)?);
            Ok(())
        })?;
        let r = last.expect("ran at least once");
        let l2: Vec<f32> = r.norms.iter().zip(&r.success).filter(|(_, &s)| s).map(|(m, _)| m.l2).collect();
        rows.push(AttackRow {
            attack: name,
            images: n,
            seconds: ms / 1e3,
            robust_accuracy: r.robust_accuracy(&y),
            success_rate: r.success_rate(),
            mean_l2: if l2.is_empty() { 0.0 } else { l2.iter().sum::<f32>() / l2.len() as f32 },
            reference_seconds: reference,
        });
    }
    Ok(rows)
}
