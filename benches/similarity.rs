//! `cargo bench --bench similarity [-- TABLES BITS CAPACITY]`: the stateful similarity detector's index — wall
//! time of one query's score and insert, candidates compared and recall of the 20 nearest neighbours against
//! the exhaustive search — for the default index (or the one given) and the exact search (which grows
//! linearly: the cost the index is there to avoid), on two histories: structureless Gaussian encodings of 128
//! values at 1k, 10k and 100k, and the fixture cnn's `fc1_relu` encodings of shuffled Fashion-MNIST training
//! images (probes: test images) at 1k, 10k and all of them.

use std::sync::Arc;

use armoury::nn::cnn;
use armoury::{data, io, Classifier, ModuleClassifier};
use armoury_defenses::detectors::{gaussian_encodings, measure_index, Encoder, IndexConfig, TapEncoder};
use ndarray::Array2;

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn table(name: &str, config: IndexConfig, history: &Array2<f32>, probes: &Array2<f32>, sizes: &[usize]) -> Res<()> {
    for m in measure_index(20, config, history, probes, sizes)? {
        println!("{:<58} {:>8} {:>10.1} {:>11.0} {:>8.3}", name, m.history, m.micros_per_query, m.candidates, m.recall);
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let mut config = IndexConfig::default();
    if let [tables, bits, capacity] = args[..] {
        config = IndexConfig { tables, bits, bucket_capacity: capacity, ..config };
    }
    let lsh = format!("{} tables × {} bits, buckets of {}", config.tables, config.bits, config.bucket_capacity);
    println!("{:<58} {:>8} {:>10} {:>11} {:>8}", "index", "history", "µs/query", "candidates", "recall");
    let (gh, gp) = (gaussian_encodings(100_000, 128, 0), gaussian_encodings(1050, 128, 1));
    table(&format!("Gaussian, {lsh}"), config, &gh, &gp, &[1_000, 10_000, 100_000])?;
    table("Gaussian, exact", IndexConfig::exact(), &gh, &gaussian_encodings(150, 128, 1), &[1_000, 10_000, 100_000])?;

    let net = cnn(0);
    io::load_module(&net, std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cnn.safetensors"))?;
    let clf: Arc<dyn Classifier> = Arc::new(ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0))?);
    let set = data::load_default(None)?;
    let encoder = TapEncoder::new(clf, "fc1_relu")?;
    let order = armoury::seed::shuffled(set.train.len(), 0, 1);
    let history = encoder.encode(&set.train.images().index_select(0, &order)?)?;
    let probes = encoder.encode(&set.test.images().narrow(0, 0, 1050.min(set.test.len()))?)?;
    let n = history.nrows();
    let sizes: Vec<usize> = [1_000, 10_000, n].into_iter().filter(|&s| s <= n).collect();
    table(&format!("cnn fc1_relu ({}), {lsh}", set.name), config, &history, &probes, &sizes)?;
    table(
        &format!("cnn fc1_relu ({}), exact", set.name),
        IndexConfig::exact(),
        &history,
        &probes.slice(ndarray::s![..150, ..]).to_owned(),
        &sizes,
    )?;
    Ok(())
}
