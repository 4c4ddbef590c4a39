//! The benchmark workloads and the benchmark zoo, shared by `examples/bench.rs` and `benches/core.rs`.
//!
//! The zoo ([`Zoo`]) is the reference `cnn` and `mlp` plus three models of the shapes users bring: a VGG-style
//! net of 3×3 padded convolutions on 32×32 RGB, a small ResNet (BatchNorm, residual adds, a stride-2 stage with a
//! 1×1 projection) and a wide MLP. `benches/reference/zoo.py` defines the same models for PyTorch and
//! onnxruntime, with the same parameter names, and loads the weights [`export`] writes.

#![allow(dead_code)] // each of the two binaries that include this file uses part of it

use std::path::Path;
use std::time::Instant;

use armoury::data::Dataset;
use armoury::nn::{
    AvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, Module, ModuleExt, ReLU, ReferenceModel, Sequential,
};
use armoury::optim::{Adam, AdamConfig};
use armoury::seed::shuffled;
use armoury::train::train_step;
use armoury::{Classifier, Conv2dParams, ModuleClassifier, Param, Pool2dParams, Result, Tensor};

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
    Ok(median(times))
}

/// The median of measurements (the upper one of an even count); `v` must not be empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median wall time in milliseconds of as many runs of `f` as fit in about `budget_ms` (at least 3, at most
/// `max_reps`), after one warm-up run that also sizes the count.
pub fn median_ms_within(budget_ms: f64, max_reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    let once = t.elapsed().as_secs_f64() * 1e3;
    let reps = ((budget_ms / once.max(1e-3)) as usize).clamp(3, max_reps.max(3));
    median_ms(reps - 1, f)
}

fn row(model: &'static str, macs: u64, workload: &'static str, batch: usize, ms: f64, flop_factor: f64) -> Row {
    let images = batch as f64 / (ms / 1e3);
    let gflops = flop_factor * 2.0 * macs as f64 * images / 1e9;
    Row { model, workload, batch, ms, images_per_s: images, gflops }
}

/// Forward and forward + input gradient at the given batch sizes, median of `reps` runs (default: more the
/// smaller the batch).
pub fn inference(model: ReferenceModel, batches: &[usize], data: &Dataset, reps: Option<usize>) -> Result<Vec<Row>> {
    let net = model.build(0);
    let clf = ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0))?;
    let mut rows = Vec::new();
    for &b in batches {
        let (x, y) = data.batch(0..b)?;
        let reps = reps.unwrap_or(if b >= 1000 {
            9
        } else if b >= 128 {
            21
        } else {
            201
        });
        let macs = model.macs_per_image();
        let ms = median_ms(reps, || clf.logits(&x).map(|_| ()))?;
        rows.push(row(model.name(), macs, "forward", b, ms, 1.0));
        let ms = median_ms(reps, || clf.loss_gradient(&x, &y).map(|_| ()))?;
        rows.push(row(model.name(), macs, "forward_input_grad", b, ms, 2.0));
    }
    Ok(rows)
}

/// One Adam training step at batch 128 (median of `reps` runs, default 21), and one full epoch over `train` at
/// batch 128.
pub fn training(model: ReferenceModel, train: &Dataset, epoch: bool, reps: Option<usize>) -> Result<Vec<Row>> {
    let net: Sequential = model.build(0);
    let mut opt = Adam::new(net.parameters(), AdamConfig::default())?;
    let (x, y) = train.batch(0..128)?;
    let macs = model.macs_per_image();
    let ms = median_ms(reps.unwrap_or(21), || train_step(&net, &mut opt, &x, &y, None).map(|_| ()))?;
    let mut rows = vec![row(model.name(), macs, "train_step", 128, ms, 3.0)];
    if epoch {
        let t = Instant::now();
        let order = shuffled(train.len(), 0, 0);
        for idx in order.chunks(128) {
            let xb: Tensor = train.images().index_select(0, idx)?;
            let yb: Vec<usize> = idx.iter().map(|&i| train.labels()[i]).collect();
            train_step(&net, &mut opt, &xb, &yb, None)?;
        }
        let ms = t.elapsed().as_secs_f64() * 1e3;
        rows.push(row(model.name(), macs, "train_epoch", train.len(), ms, 3.0));
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

/// The attack workloads of the speed baselines (docs/reference.md, speed baselines) on the fixture `cnn`, median
/// of `reps` runs: FGSM and PGD-40 (ε = 0.1 L∞, 40 steps of 0.01, random start) on 1000 images, CW-L2 (c = 1, κ = 0,
/// 100 Adam steps) on 100; `reference_seconds` is torchattacks' time for the same run.
pub fn attacks(weights: &std::path::Path, test: &Dataset, reps: usize) -> armoury::Result<Vec<AttackRow>> {
    use armoury::{Attack, Goal, ModuleClassifier};
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
        let ms = median_ms(reps, || {
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

/// A residual block: `body(x) + shortcut(x)` (the identity without a shortcut), PyTorch-named `body.*` and
/// `shortcut.*`; with `pre` (a pre-activation block, He et al. 2016's identity mappings), `body` and a projection
/// shortcut read `pre(x)` (`pre.*`) while the identity shortcut still adds `x`. The ReLU after the sum is the next
/// child of the enclosing [`Sequential`].
pub struct Residual {
    pub pre: Option<Sequential>,
    pub body: Sequential,
    pub shortcut: Option<Sequential>,
}

impl Module for Residual {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let input = match &self.pre {
            Some(p) => p.forward_t(x, train)?,
            None => x.clone(),
        };
        let y = self.body.forward_t(&input, train)?;
        match &self.shortcut {
            Some(s) => y.add(&s.forward_t(&input, train)?),
            None => y.add(x),
        }
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        if let Some(p) = &self.pre {
            p.visit(&format!("{prefix}pre."), f);
        }
        self.body.visit(&format!("{prefix}body."), f);
        if let Some(s) = &self.shortcut {
            s.visit(&format!("{prefix}shortcut."), f);
        }
    }

    fn set_training(&self, training: bool) {
        if let Some(p) = &self.pre {
            p.set_training(training);
        }
        self.body.set_training(training);
        if let Some(s) = &self.shortcut {
            s.set_training(training);
        }
    }

    fn is_training(&self) -> bool {
        self.body.is_training()
    }

    fn batch_independent(&self, train: bool) -> bool {
        let part = |m: &Option<Sequential>| m.as_ref().is_none_or(|m| m.batch_independent(train));
        part(&self.pre) && self.body.batch_independent(train) && part(&self.shortcut)
    }
}

/// The models of the benchmark zoo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zoo {
    /// The reference `cnn` (28×28 grey).
    Cnn,
    /// The reference `mlp` (28×28 grey).
    Mlp,
    /// [`vgg`] (32×32 RGB).
    Vgg,
    /// [`resnet`] (32×32 RGB).
    ResNet,
    /// [`wide_mlp`] (32×32 RGB).
    WideMlp,
}

impl Zoo {
    pub const ALL: [Zoo; 5] = [Zoo::Cnn, Zoo::Mlp, Zoo::Vgg, Zoo::ResNet, Zoo::WideMlp];

    pub fn name(self) -> &'static str {
        match self {
            Zoo::Cnn => "cnn",
            Zoo::Mlp => "mlp",
            Zoo::Vgg => "vgg",
            Zoo::ResNet => "resnet",
            Zoo::WideMlp => "wide_mlp",
        }
    }

    pub fn parse(name: &str) -> Option<Zoo> {
        Zoo::ALL.into_iter().find(|z| z.name() == name)
    }

    /// One image's shape.
    pub fn input_shape(self) -> [usize; 3] {
        match self {
            Zoo::Cnn | Zoo::Mlp => [1, 28, 28],
            _ => [3, 32, 32],
        }
    }

    /// The model, PyTorch-initialised from `seed` (BatchNorm at γ = 1, β = 0 and unit running statistics).
    pub fn build(self, seed: u64) -> Sequential {
        match self {
            Zoo::Cnn => ReferenceModel::Cnn.build(seed),
            Zoo::Mlp => ReferenceModel::Mlp.build(seed),
            Zoo::Vgg => vgg(seed),
            Zoo::ResNet => resnet(seed),
            Zoo::WideMlp => wide_mlp(seed),
        }
    }

    /// Multiply-adds of one forward pass of one image in the convolutions and `Linear` layers (BatchNorm,
    /// activations, pooling and residual adds are not counted).
    pub fn macs_per_image(self) -> u64 {
        // A convolution's multiply-adds: output positions × output channels × taps per output.
        let conv = |cin: u64, cout: u64, k: u64, out: u64| out * out * cout * cin * k * k;
        match self {
            Zoo::Cnn => ReferenceModel::Cnn.macs_per_image(),
            Zoo::Mlp => ReferenceModel::Mlp.macs_per_image(),
            Zoo::Vgg => {
                conv(3, 16, 3, 32)
                    + conv(16, 16, 3, 32)
                    + conv(16, 32, 3, 16)
                    + conv(32, 32, 3, 16)
                    + conv(32, 64, 3, 8)
                    + 1024 * 128
                    + 128 * 10
            }
            Zoo::ResNet => {
                conv(3, 16, 3, 32)
                    + 2 * conv(16, 16, 3, 32)
                    + conv(16, 32, 3, 16)
                    + conv(32, 32, 3, 16)
                    + conv(16, 32, 1, 16)
                    + 32 * 10
            }
            Zoo::WideMlp => 3072 * 1024 + 1024 * 1024 + 1024 * 10,
        }
    }
}

/// A 3×3 convolution with padding 1 and the given stride.
fn conv3(cin: usize, cout: usize, stride: usize, bias: bool, seed: u64) -> Conv2d {
    let p = Conv2dParams { stride: (stride, stride), padding: (1, 1), ..Conv2dParams::default() };
    Conv2d::new(cin, cout, 3, p, bias, seed).expect("one group always divides")
}

/// `vgg`: conv1 3→16, conv2 16→16, pool, conv3 16→32, conv4 32→32, pool, conv5 32→64, pool (3×3 convolutions of
/// padding 1, each followed by a ReLU; 2×2 max pools), flatten, fc1 Linear(1024,128), ReLU, fc2 Linear(128,10).
pub fn vgg(seed: u64) -> Sequential {
    let pool = || MaxPool2d(Pool2dParams::square(2));
    Sequential::new()
        .add("conv1", conv3(3, 16, 1, true, seed))
        .add("conv1_relu", ReLU)
        .add("conv2", conv3(16, 16, 1, true, seed + 2))
        .add("conv2_relu", ReLU)
        .add("pool1", pool())
        .add("conv3", conv3(16, 32, 1, true, seed + 4))
        .add("conv3_relu", ReLU)
        .add("conv4", conv3(32, 32, 1, true, seed + 6))
        .add("conv4_relu", ReLU)
        .add("pool2", pool())
        .add("conv5", conv3(32, 64, 1, true, seed + 8))
        .add("conv5_relu", ReLU)
        .add("pool3", pool())
        .add("flatten", Flatten)
        .add("fc1", Linear::new(1024, 128, true, seed + 10))
        .add("fc1_relu", ReLU)
        .add("fc2", Linear::new(128, 10, true, seed + 12))
}

/// conv → BatchNorm → ReLU → conv → BatchNorm, the body of a basic ResNet block (He et al. 2016).
fn basic_body(cin: usize, cout: usize, stride: usize, seed: u64) -> Sequential {
    Sequential::new()
        .add("conv1", conv3(cin, cout, stride, false, seed))
        .add("bn1", BatchNorm2d::new(cout))
        .add("relu", ReLU)
        .add("conv2", conv3(cout, cout, 1, false, seed + 2))
        .add("bn2", BatchNorm2d::new(cout))
}

/// `resnet`: stem (3×3 conv 3→16, BatchNorm, ReLU), block1 (basic block 16→16 with the identity shortcut),
/// block2 (basic block 16→32 of stride 2 with a 1×1 stride-2 convolution and BatchNorm as the shortcut), each
/// followed by a ReLU, a 16×16 average pool, flatten and fc Linear(32,10).
pub fn resnet(seed: u64) -> Sequential {
    let projection =
        Conv2d::new(16, 32, 1, Conv2dParams { stride: (2, 2), ..Conv2dParams::default() }, false, seed + 8)
            .expect("one group always divides");
    Sequential::new()
        .add("stem", conv3(3, 16, 1, false, seed))
        .add("stem_bn", BatchNorm2d::new(16))
        .add("stem_relu", ReLU)
        .add("block1", Residual { pre: None, body: basic_body(16, 16, 1, seed + 2), shortcut: None })
        .add("block1_relu", ReLU)
        .add(
            "block2",
            Residual {
                pre: None,
                body: basic_body(16, 32, 2, seed + 4),
                shortcut: Some(Sequential::new().add("conv", projection).add("bn", BatchNorm2d::new(32))),
            },
        )
        .add("block2_relu", ReLU)
        .add("pool", AvgPool2d(Pool2dParams::square(16)))
        .add("flatten", Flatten)
        .add("fc", Linear::new(32, 10, true, seed + 10))
}

/// `wide_mlp`: flatten, fc1 Linear(3072,1024), ReLU, fc2 Linear(1024,1024), ReLU, fc3 Linear(1024,10).
pub fn wide_mlp(seed: u64) -> Sequential {
    Sequential::new()
        .add("flatten", Flatten)
        .add("fc1", Linear::new(3072, 1024, true, seed))
        .add("fc1_relu", ReLU)
        .add("fc2", Linear::new(1024, 1024, true, seed + 2))
        .add("fc2_relu", ReLU)
        .add("fc3", Linear::new(1024, 10, true, seed + 4))
}

/// `n` inputs for `zoo` and their labels: uniform in [0, 1) from `seed` (image content does not change the dense
/// kernels' work), labels `i mod 10`.
pub fn inputs(zoo: Zoo, n: usize, seed: u64) -> (Tensor, Vec<usize>) {
    let [c, h, w] = zoo.input_shape();
    (Tensor::uniform(&[n, c, h, w], 0.0, 1.0, seed), (0..n).map(|i| i % 10).collect())
}

/// The zoo rows of one model: forward and forward + input gradient (evaluation mode) and an Adam training step
/// (training mode: BatchNorm on batch statistics) at each batch size, each timed for about `budget_ms`.
pub fn zoo_rows(zoo: Zoo, batches: &[usize], budget_ms: f64) -> Result<Vec<Row>> {
    let (name, macs) = (zoo.name(), zoo.macs_per_image());
    let net = std::sync::Arc::new(zoo.build(0));
    net.eval();
    let clf = ModuleClassifier::new(net.clone(), &zoo.input_shape(), 10, (0.0, 1.0))?;
    let mut rows = Vec::new();
    for &b in batches {
        let (x, y) = inputs(zoo, b, 1);
        let ms = median_ms_within(budget_ms, 201, || clf.logits(&x).map(drop))?;
        rows.push(row(name, macs, "forward", b, ms, 1.0));
        let ms = median_ms_within(budget_ms, 201, || clf.loss_gradient(&x, &y).map(drop))?;
        rows.push(row(name, macs, "forward_input_grad", b, ms, 2.0));
    }
    // Training on its own copy, so the measured inference weights stay the exported ones.
    let train_net = zoo.build(0);
    train_net.train();
    let mut opt = Adam::new(train_net.parameters(), AdamConfig::default())?;
    for &b in batches {
        let (x, y) = inputs(zoo, b, 2);
        let ms = median_ms_within(budget_ms, 201, || train_step(&train_net, &mut opt, &x, &y, None).map(drop))?;
        rows.push(row(name, macs, "train_step", b, ms, 3.0));
    }
    Ok(rows)
}

/// Prints zoo rows as a table with each rate's share of `peak` GFLOP/s, then one JSON line.
pub fn print_zoo(rows: &[Row], peak: Option<f64>) {
    println!(
        "{:<9} {:<20} {:>6} {:>11} {:>12} {:>9} {:>7}",
        "model", "workload", "batch", "ms", "images/s", "GFLOP/s", "% peak"
    );
    for r in rows {
        let pct = peak.map_or("-".to_string(), |p| format!("{:.1}", 100.0 * r.gflops / p));
        println!(
            "{:<9} {:<20} {:>6} {:>11.3} {:>12.0} {:>9.1} {:>7}",
            r.model, r.workload, r.batch, r.ms, r.images_per_s, r.gflops, pct
        );
    }
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({"model": r.model, "workload": r.workload, "batch": r.batch,
                "ms": (r.ms * 1e4).round() / 1e4, "gflops": (r.gflops * 100.0).round() / 100.0})
        })
        .collect();
    println!("{}", serde_json::json!({"peak_gflops": peak, "zoo": json}));
}

/// Writes `dir/<model>.safetensors` (the weights, PyTorch names) and `dir/<model>_check.safetensors` (8 inputs,
/// the evaluation-mode logits and the input gradient of the summed cross-entropy) for every model in `models`,
/// so that `benches/reference/zoo.py` runs the same models and checks it computes the same function.
pub fn export(models: &[Zoo], dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| armoury::Error::invalid("bench export", e.to_string()))?;
    for &zoo in models {
        let net = std::sync::Arc::new(zoo.build(0));
        net.eval();
        armoury::io::save_module(&*net, dir.join(format!("{}.safetensors", zoo.name())))?;
        let clf = ModuleClassifier::new(net, &zoo.input_shape(), 10, (0.0, 1.0))?;
        let (x, y) = inputs(zoo, 8, 3);
        let logits = clf.logits(&x)?;
        let (_, grad) = clf.loss_gradient(&x, &y)?;
        let labels = ndarray::ArrayD::from_shape_vec(vec![8], y.iter().map(|&v| v as f32).collect()).expect("8 labels");
        let tensors = vec![
            ("x".to_string(), x.to_array()),
            ("labels".to_string(), labels),
            ("logits".to_string(), logits.into_dyn()),
            ("input_grad".to_string(), grad.to_array()),
        ];
        armoury::io::save_tensors(dir.join(format!("{}_check.safetensors", zoo.name())), &tensors)?;
    }
    Ok(())
}
