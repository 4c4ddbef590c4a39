//! `cargo bench`: the core workloads of the `bench` example (forward, forward + input gradient, training
//! step) on the reference models, printed as time, images/s and GFLOP/s.

#[path = "../examples/support/bench.rs"]
mod bench;

use armoury::data;
use armoury::nn::ReferenceModel;

fn main() -> armoury::Result<()> {
    let set = data::sample()?;
    let probe = set.test.repeat_to(1000)?;
    for model in [ReferenceModel::Cnn, ReferenceModel::Mlp] {
        let mut rows = bench::inference(model, &[1, 128, 1000], &probe)?;
        rows.extend(bench::training(model, &set.train, false)?);
        for r in rows {
            println!(
                "{:<4} {:<20} batch {:>5}: {:>9.3} ms {:>10.0} images/s {:>7.1} GFLOP/s",
                r.model, r.workload, r.batch, r.ms, r.images_per_s, r.gflops
            );
        }
    }
    Ok(())
}
