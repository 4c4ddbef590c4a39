//! Randomized smoothing (Cohen, Rosenfeld & Kolter 2019) on Fashion-MNIST: certified accuracy at L2 radii 0,
//! 0.25 and 0.5 with CERTIFY (n0 selection draws, n estimation draws, α), for the fixture cnn and — unless
//! `--finetune-epochs 0` — for the fixture cnn fine-tuned with Gaussian noise augmentation at the same σ.
//!
//! `cargo run --release --example randomized_smoothing -- [--images 500] [--sigma 0.25] [--n 10000]`
//! (`--help` lists every flag)
//!
//! Prints a table and one JSON line per model.

#[path = "support/args.rs"]
mod args;
#[path = "support/cli.rs"]
mod cli;

use armoury::load as model;
use std::path::PathBuf;
use std::time::Instant;

use armoury::data::Dataset;
use armoury::nn::{cnn, ModuleExt, Sequential};
use armoury::optim::{Adam, AdamConfig};
use armoury::train::{EpochReport, Method, StepContext, StepReport, TrainCallback, TrainConfig, Trainer};
use armoury::{io, ModuleClassifier, Tensor};
use armoury_defenses::transforms::{certified_accuracy, RandomizedSmoothing};
use clap::Parser;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

/// Randomized smoothing (Cohen et al. 2019): certified accuracy at L2 radii 0, 0.25 and 0.5 of the fixture cnn
/// and of the same cnn fine-tuned with Gaussian noise, as a table and one JSON line per model.
#[derive(Parser)]
#[command(
    name = "randomized_smoothing",
    after_help = "Example:\n  cargo run --release --example randomized_smoothing -- --images 100 --n 1000 --finetune-epochs 0"
)]
struct Args {
    /// Certify the first N test images
    #[arg(long, value_name = "N", default_value_t = 500)]
    images: usize,
    /// Standard deviation σ of the Gaussian noise (smoothing and fine-tuning)
    #[arg(long, value_name = "S", default_value_t = 0.25)]
    sigma: f32,
    /// Noise draws per image for the estimate
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    n: usize,
    /// Noise draws per image for selecting the class
    #[arg(long, value_name = "N", default_value_t = 100)]
    n0: usize,
    /// Failure probability α of the certificate
    #[arg(long, value_name = "A", default_value_t = 0.001)]
    alpha: f64,
    /// Noisy images per forward pass
    #[arg(long, value_name = "B", default_value_t = 1000)]
    batch: usize,
    /// Epochs of Gaussian-noise fine-tuning (0: only the fixture cnn)
    #[arg(long, value_name = "E", default_value_t = 2)]
    finetune_epochs: usize,
    #[command(flatten)]
    data: args::DataArgs,
    #[command(flatten)]
    run: args::RunArgs,
}

fn fixture_cnn() -> Result<Sequential, armoury::Error> {
    let net = cnn(0);
    io::load_module(&net, PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cnn.safetensors"))?;
    Ok(net)
}

/// Cohen et al.'s training recipe as a training method: cross-entropy on the batch with Gaussian noise N(0, σ²)
/// added.
struct GaussianNoise {
    sigma: f32,
    seed: u64,
}

impl Method for GaussianNoise {
    fn kind(&self) -> &'static str {
        "gaussian-noise"
    }
    fn name(&self) -> String {
        format!("gaussian-noise(sigma {})", self.sigma)
    }
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport, armoury::Error> {
        let noise_seed = self.seed ^ ((ctx.epoch as u64) << 32) ^ ctx.batch as u64;
        let noisy = x.add(&Tensor::normal(x.shape(), 0.0, self.sigma, noise_seed))?;
        ctx.cross_entropy_step(&noisy, y)
    }
}

/// Prints each fine-tuning epoch.
struct Log;

impl TrainCallback for Log {
    fn on_epoch(&mut self, r: &EpochReport) {
        let clean = r.test.as_ref().map_or(f32::NAN, |t| t.accuracy);
        println!(
            "  fine-tune epoch {}: noisy training loss {:.4}, clean test accuracy {clean:.4} ({:.1} s)",
            r.epoch + 1,
            r.train_loss,
            r.seconds
        );
    }
}

/// Fine-tunes `net` with Gaussian noise N(0, σ²) added to every training batch (Cohen et al.'s training recipe).
fn finetune(
    net: &Sequential,
    train: &Dataset,
    test: &Dataset,
    sigma: f32,
    epochs: usize,
    seed: u64,
) -> Result<(), armoury::Error> {
    let mut opt = Adam::new(net.parameters(), AdamConfig { lr: 1e-3, ..Default::default() })?;
    let config = TrainConfig { epochs, batch_size: 128, seed, ..Default::default() };
    let method = GaussianNoise { sigma, seed };
    Trainer::new(config).method(&method).test(Some(test)).fit(net, &mut opt, train, &mut Log)?;
    Ok(())
}

fn measure(
    name: &str,
    net: Sequential,
    x: &Tensor,
    y: &[usize],
    rs: &RandomizedSmoothing,
) -> Result<(), Box<dyn std::error::Error>> {
    let model = ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0))?;
    let clean = {
        use armoury::Classifier;
        model.predict(x)?.iter().zip(y).filter(|(p, l)| p == l).count() as f32 / y.len() as f32
    };
    let start = Instant::now();
    let mut certs = Vec::with_capacity(y.len());
    let step = 50;
    for s in (0..y.len()).step_by(step) {
        let e = (s + step).min(y.len());
        certs.extend(rs.certify(&model, &x.narrow(0, s, e - s)?)?);
        eprint!("\r  {name}: certified {e}/{} images ({:.0} s)", y.len(), start.elapsed().as_secs_f64());
    }
    eprintln!();
    let seconds = start.elapsed().as_secs_f64();
    let radii = [0.0f32, 0.25, 0.5];
    let acc = certified_accuracy(&radii, &certs, y)?;
    let abstain = certs.iter().filter(|c| c.class.is_none()).count() as f32 / y.len() as f32;
    let mean_radius = {
        let ok: Vec<f32> = certs.iter().zip(y).filter(|(c, &l)| c.class == Some(l)).map(|(c, _)| c.radius).collect();
        ok.iter().sum::<f32>() / ok.len().max(1) as f32
    };
    println!(
        "\n{name}: σ = {}, n0 = {}, n = {}, α = {}, {} images, {seconds:.1} s",
        rs.sigma,
        rs.n0,
        rs.n,
        rs.alpha,
        y.len()
    );
    println!("| base clean accuracy | certified r=0 | r=0.25 | r=0.5 | abstain | mean radius (correct) |");
    println!("|---|---|---|---|---|---|");
    println!("| {clean:.3} | {:.3} | {:.3} | {:.3} | {abstain:.3} | {mean_radius:.3} |", acc[0], acc[1], acc[2]);
    let line = Summary {
        defense: "randomized_smoothing",
        model: name,
        sigma: rs.sigma,
        n0: rs.n0,
        n: rs.n,
        alpha: rs.alpha,
        images: y.len(),
        certified_accuracy: Certified {
            r0: rounded(f64::from(acc[0]), 4),
            r025: rounded(f64::from(acc[1]), 4),
            r05: rounded(f64::from(acc[2]), 4),
        },
        abstain: rounded(f64::from(abstain), 4),
        clean_accuracy: rounded(f64::from(clean), 4),
        seconds: rounded(seconds, 1),
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}

/// The JSON line of one measured model.
#[derive(serde::Serialize)]
struct Summary<'a> {
    defense: &'static str,
    model: &'a str,
    sigma: f32,
    n0: usize,
    n: usize,
    alpha: f64,
    images: usize,
    certified_accuracy: Certified,
    abstain: f64,
    clean_accuracy: f64,
    seconds: f64,
}

/// Certified accuracy at L2 radius 0, 0.25 and 0.5.
#[derive(serde::Serialize)]
struct Certified {
    #[serde(rename = "0")]
    r0: f64,
    #[serde(rename = "0.25")]
    r025: f64,
    #[serde(rename = "0.5")]
    r05: f64,
}

/// `v` to `decimals` places, so the JSON line carries the figures the table prints.
fn rounded(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

fn main() -> std::process::ExitCode {
    cli::finish(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    args.run.apply()?;
    let set = model::load_data(args.data.data.as_deref())?;
    println!("data: {} ({} train / {} test images; {})", set.name, set.train.len(), set.test.len(), set.source);
    let images = args.images.min(set.test.len());
    let (x, y) = set.test.batch(0..images)?;
    let rs = RandomizedSmoothing {
        sigma: args.sigma,
        n0: args.n0,
        n: args.n,
        alpha: args.alpha,
        batch: args.batch,
        seed: args.run.seed,
    };
    rs.validate()?;
    measure("fixture_cnn", fixture_cnn()?, &x, &y, &rs)?;
    if args.finetune_epochs > 0 {
        println!(
            "\nfine-tuning the fixture cnn with Gaussian noise σ = {} for {} epochs",
            args.sigma, args.finetune_epochs
        );
        let net = fixture_cnn()?;
        finetune(
            &net,
            set.training("fine-tuning under noise")?,
            &set.test,
            args.sigma,
            args.finetune_epochs,
            args.run.seed,
        )?;
        measure("fixture_cnn_noise_finetuned", net, &x, &y, &rs)?;
    }
    Ok(())
}
