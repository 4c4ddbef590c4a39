//! `cargo bench --bench adv_train -- [MODEL…] [--batch N] [--steps K] [--weights DIR] [--profile] [--export DIR]`: one PGD-7 adversarial
//! training step (Madry et al. 2018, with Rice et al. 2020's CIFAR settings) on PreAct-ResNet-18 and ResNet-18
//! (`benches/support/resnets.rs`, 32×32 RGB, batch 32 by default), through the defenses crate's
//! `ProjectedAdversarialDefense`: 7 steps of L∞ PGD (ε = 8/255, α = 2/255, random start) against the model in
//! evaluation mode, then one SGD step (lr 0.1, momentum 0.9, weight decay 5e-4) on the all-adversarial batch in
//! training mode (BatchNorm on batch statistics).
//!
//! Prints, per model, the median over `K` steps (after one warm-up step) of the whole step, and of its two parts
//! timed apart (the attack's 7 input-gradient passes; the training step's forward, backward to the weights and
//! update), then one JSON line. `benches/reference/adv_train_step.py` does the same in PyTorch; docs/performance.md
//! has the protocol (interleaved runs of the two).
//!
//! `--profile` times one step's backward ops instead (armoury::profile: per op and shape).
//!
//! `--export DIR` writes, per model, `<model>.safetensors` (the weights), `<model>_batch.safetensors` (`x`,
//! `labels`) and `<model>_check.safetensors`: one step without the random start — the adversarial batch `x_adv`,
//! the training `loss` and the evaluation-mode `logits_after` the update — for the script's `check`. Timing runs
//! load the weights and batch from `--weights DIR` when given, so both sides time the same numbers.

#[path = "support/bench.rs"]
mod bench;
#[path = "support/resnets.rs"]
mod resnets;

use std::path::{Path, PathBuf};
use std::time::Instant;

use armoury::nn::{Module, ModuleExt, Sequential};
use armoury::optim::{Sgd, SgdConfig};
use armoury::train::{Method, ModelView, StepContext};
use armoury::{Attack, Goal, Result, Tensor};
use armoury_attacks::Pgd;
use armoury_defenses::training::ProjectedAdversarialDefense;
use ndarray::ArrayD;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

const MODELS: [&str; 2] = ["preact_resnet18", "resnet18"];

fn build(name: &str) -> Option<Sequential> {
    match name {
        "preact_resnet18" => Some(resnets::preact_resnet18(0)),
        "resnet18" => Some(resnets::resnet18(0)),
        _ => None,
    }
}

/// PGD-7 at ε = 8/255, α = 2/255 (Rice et al.), returning the last iterate (no success bookkeeping: what a
/// training loop uses).
fn pgd7(random_start: bool) -> Pgd {
    Pgd { steps: 7, step_size: 2.0 / 255.0, random_start, keep_success: false, ..Pgd::linf(8.0 / 255.0) }
}

fn sgd(net: &Sequential) -> Result<Sgd> {
    Sgd::new(net.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, weight_decay: 5e-4, ..SgdConfig::default() })
}

/// The batch: uniform pixels in [0, 1) and labels `i mod 10` (the kernels' work does not depend on the content).
fn batch(n: usize) -> (Tensor, Vec<usize>) {
    (Tensor::uniform(&[n, 3, 32, 32], 0.0, 1.0, 1), (0..n).map(|i| i % 10).collect())
}

fn load_batch(path: &Path) -> Result<(Tensor, Vec<usize>)> {
    let t = armoury::io::load_tensors(path)?;
    let get = |k: &str| t.iter().find(|(n, _)| n == k).map(|(_, a)| a.clone());
    let x = get("x").ok_or_else(|| armoury::Error::invalid("adv_train", "batch file without x"))?;
    let y = get("labels").ok_or_else(|| armoury::Error::invalid("adv_train", "batch file without labels"))?;
    Ok((Tensor::new(x), y.iter().map(|&v| v as usize).collect()))
}

/// One adversarial-training step through the defenses crate's method.
fn step(net: &Sequential, opt: &mut Sgd, pgd: &Pgd, x: &Tensor, y: &[usize], seed: u64) -> Result<f32> {
    let view = ModelView::new(net, &[3, 32, 32], 10, (0.0, 1.0))?;
    let method = ProjectedAdversarialDefense::madry(Box::new(pgd.clone()));
    let mut ctx =
        StepContext { model: net, classifier: &view, optimizer: opt, clip_grad_norm: None, epoch: 0, batch: 0, seed };
    Ok(method.step(&mut ctx, x, y)?.loss)
}

fn export(dir: &Path, models: &[&str], n: usize) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| armoury::Error::invalid("adv_train export", e.to_string()))?;
    for &name in models {
        let net = build(name).expect("known model");
        armoury::io::save_module(&net, dir.join(format!("{name}.safetensors")))?;
        let (x, y) = batch(n);
        let labels = ArrayD::from_shape_vec(vec![n], y.iter().map(|&v| v as f32).collect()).expect("n labels");
        armoury::io::save_tensors(
            dir.join(format!("{name}_batch.safetensors")),
            &[("x".into(), x.to_array()), ("labels".into(), labels)],
        )?;
        // The check: the attack, then the training step on its output, both deterministic (no random start).
        let view = ModelView::new(&net, &[3, 32, 32], 10, (0.0, 1.0))?;
        let x_adv = pgd7(false).generate(&view, &x, &y, &Goal::Untargeted, 0)?;
        let mut opt = sgd(&net)?;
        let (loss, _) = armoury::train::train_step(&net, &mut opt, &x_adv, &y, None)?;
        let logits = armoury::no_grad(|| net.forward_t(&x, false))?;
        armoury::io::save_tensors(
            dir.join(format!("{name}_check.safetensors")),
            &[
                ("x_adv".into(), x_adv.to_array()),
                ("loss".into(), ArrayD::from_elem(vec![1], loss)),
                ("logits_after".into(), logits.to_array()),
            ],
        )?;
        println!("{name}: exported (training loss {loss:.6})");
    }
    Ok(())
}

/// One step's backward time per op (all shapes) and its costliest ops per shape.
fn print_profile(name: &str, ms: f64, p: &armoury::profile::Profile) {
    use armoury::profile::Phase;
    println!(
        "{name}: one step {ms:.1} ms, of which forward ops {:.1} ms, backward ops {:.1} ms:",
        p.total_ms(Phase::Forward),
        p.total_ms(Phase::Backward)
    );
    for (op, t) in p.by_op(Phase::Forward) {
        println!("  {t:>9.1} ms  forward {op}");
    }
    for (op, t) in p.by_op(Phase::Backward) {
        println!("  {t:>9.1} ms  {op}");
    }
    for e in p.entries.iter().take(30) {
        println!("  {:>9.1} ms  {:?} {} {:?} -> {:?} x{}", e.ms, e.phase, e.op, e.input, e.output, e.calls);
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let (mut models, mut n, mut steps) = (Vec::new(), 32usize, 3usize);
    let mut weights: Option<PathBuf> = None;
    let (mut profile, mut profile_train) = (false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--batch" => n = args.next().ok_or("--batch needs a number")?.parse()?,
            "--steps" => steps = args.next().ok_or("--steps needs a number")?.parse()?,
            "--profile" => profile = true,
            "--profile-train" => profile_train = true,
            "--weights" => weights = Some(args.next().ok_or("--weights needs a directory")?.into()),
            "--export" => {
                let dir = PathBuf::from(args.next().ok_or("--export needs a directory")?);
                let all: Vec<&str> = if models.is_empty() { MODELS.to_vec() } else { models };
                export(&dir, &all, n)?;
                return Ok(());
            }
            name => models.push(MODELS.into_iter().find(|m| *m == name).ok_or_else(|| format!("unknown '{name}'"))?),
        }
    }
    if models.is_empty() {
        models = MODELS.to_vec();
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{} threads, kernels {}, load average {}",
        rayon::current_num_threads(),
        armoury::ops::simd_level_name(),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!("{:<16} {:>5} {:>10} {:>10} {:>10}", "model", "batch", "step ms", "attack ms", "train ms");
    let mut json = Vec::new();
    for name in models {
        let net = build(name).expect("known model");
        let (x, y) = match &weights {
            Some(dir) => {
                armoury::io::load_module(&net, dir.join(format!("{name}.safetensors")))?;
                load_batch(&dir.join(format!("{name}_batch.safetensors")))?
            }
            None => batch(n),
        };
        let mut opt = sgd(&net)?;
        let pgd = pgd7(true);
        if profile_train {
            // The training half alone (forward in training mode, backward to the weights, update), forward and
            // backward ops both.
            let x_adv =
                pgd.generate(&ModelView::new(&net, &[3, 32, 32], 10, (0.0, 1.0))?, &x, &y, &Goal::Untargeted, 0)?;
            armoury::train::train_step(&net, &mut opt, &x_adv, &y, None)?;
            let t = Instant::now();
            let (r, p) = armoury::profile::record(|| armoury::train::train_step(&net, &mut opt, &x_adv, &y, None));
            r?;
            print_profile(name, t.elapsed().as_secs_f64() * 1e3, &p);
            continue;
        }
        if profile {
            step(&net, &mut opt, &pgd, &x, &y, 0)?;
            let t = Instant::now();
            let (r, p) = armoury::profile::record(|| step(&net, &mut opt, &pgd, &x, &y, 1));
            r?;
            print_profile(name, t.elapsed().as_secs_f64() * 1e3, &p);
            continue;
        }
        let (mut whole, mut attack, mut train) = (Vec::new(), Vec::new(), Vec::new());
        for s in 0..=steps {
            let t = Instant::now();
            step(&net, &mut opt, &pgd, &x, &y, s as u64)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            // The two parts apart: the attack alone, then the training step on its output.
            let view = ModelView::new(&net, &[3, 32, 32], 10, (0.0, 1.0))?;
            let t = Instant::now();
            let x_adv = pgd.generate(&view, &x, &y, &Goal::Untargeted, s as u64)?;
            let a = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            armoury::train::train_step(&net, &mut opt, &x_adv, &y, None)?;
            let tr = t.elapsed().as_secs_f64() * 1e3;
            if s > 0 {
                whole.push(ms);
                attack.push(a);
                train.push(tr);
            }
        }
        let (w, a, t) = (bench::median(whole), bench::median(attack), bench::median(train));
        println!("{name:<16} {:>5} {w:>10.1} {a:>10.1} {t:>10.1}", x.shape()[0]);
        json.push(
            serde_json::json!({"model": name, "batch": x.shape()[0], "step_ms": w, "attack_ms": a, "train_ms": t}),
        );
    }
    println!("{}", serde_json::json!({"adv_train": json}));
    Ok(())
}
