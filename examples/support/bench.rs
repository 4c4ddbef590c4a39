//! The core benchmark workloads, shared by `examples/bench.rs` and `benches/core.rs`.

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
