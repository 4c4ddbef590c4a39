//! Armoury's main job, end to end on a fresh machine: train the reference `cnn` (on full Fashion-MNIST when it
//! is installed, else on the sample embedded in the repository), report its test accuracy and confusion matrix,
//! save it, and end with one JSON line of the figures.
//!
//! `cargo run --release --example quickstart`

#[path = "support/progress.rs"]
mod progress;

use std::time::Instant;

use armoury::nn::{cnn, ModuleExt};
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{evaluate, fit, TrainConfig};
use armoury::{data, io};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let set = data::load_default(std::env::var_os("ARMOURY_DATA").as_deref().map(std::path::Path::new))?;
    println!("data: {} — {} training / {} test images ({})", set.name, set.train.len(), set.test.len(), set.source);

    // SPEC §2's recipe: 3 epochs of Adam, lr 1e-3, batch 128, seeded.
    let model = cnn(0);
    println!("model: cnn, {} parameters", model.num_parameters());
    let mut opt = Adam::new(model.parameters(), AdamConfig::default())?;
    let cfg = TrainConfig { epochs: 3, batch_size: 128, seed: 0, ..Default::default() };
    let reports = fit(&model, &mut opt, &set.train, None, &cfg, &mut progress::TrainProgress::new())?;
    let train_seconds: f64 = reports.iter().map(|r| r.seconds).sum();

    let eval = evaluate(&model, &set.test, 1000)?;
    println!("\ntest accuracy {:.4} on {} images; confusion matrix (rows: true class):", eval.accuracy, eval.samples);
    for row in eval.confusion.rows() {
        println!("  {}", row.iter().map(|v| format!("{v:>5}")).collect::<String>());
    }

    std::fs::create_dir_all("out")?;
    let path = std::path::Path::new("out/quickstart-cnn.safetensors");
    io::save_module(&model, path)?;
    println!("saved {}", path.display());

    println!("\n{:<28} {:>10}", "figure", "value");
    println!("{:<28} {:>10}", "data", set.name);
    println!("{:<28} {:>10}", "training images", set.train.len());
    println!("{:<28} {:>10.4}", "clean test accuracy", eval.accuracy);
    println!("{:<28} {:>10.1}", "training seconds", train_seconds);
    println!(
        "{{\"example\":\"quickstart\",\"data\":\"{}\",\"train_images\":{},\"test_images\":{},\"epochs\":3,\"test_accuracy\":{:.4},\"train_seconds\":{:.2},\"seconds\":{:.2},\"model_file\":\"{}\"}}",
        set.name,
        set.train.len(),
        eval.samples,
        eval.accuracy,
        train_seconds,
        start.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(())
}
