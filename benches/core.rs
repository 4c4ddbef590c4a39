//! `cargo bench --bench core [-- [MODEL…] [--batches 1,128,1000] [--budget-ms N] [--export DIR]]`: the benchmark
//! zoo (`examples/support/bench.rs`) — the reference `cnn` and `mlp`, a VGG-style 3×3 net and a small ResNet on
//! 32×32 RGB, and a wide MLP — forward, forward + input gradient and an Adam training step at batch 1, 128 and
//! 1000, as time, images/s, GFLOP/s and the share of the machine's f32 peak measured first (a tight loop of
//! fused multiply-adds on every thread).
//!
//! `--export DIR` writes every model's weights and a check batch for `benches/reference/zoo.py` (PyTorch and
//! onnxruntime on the same models and weights) and exits.

#[path = "../examples/support/bench.rs"]
mod bench;

use bench::Zoo;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut models = Vec::new();
    let mut batches = vec![1, 128, 1000];
    let mut budget_ms = 1500.0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--export" => {
                let dir = args.next().ok_or("--export needs a directory")?;
                let all = if models.is_empty() { Zoo::ALL.to_vec() } else { models };
                bench::export(&all, std::path::Path::new(&dir))?;
                println!("exported {} models to {dir}", all.len());
                return Ok(());
            }
            "--batches" => {
                let list = args.next().ok_or("--batches needs a list")?;
                batches = list.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--budget-ms" => budget_ms = args.next().ok_or("--budget-ms needs a number")?.parse()?,
            name => models.push(Zoo::parse(name).ok_or_else(|| format!("unknown model or flag '{name}'"))?),
        }
    }
    if models.is_empty() {
        models = Zoo::ALL.to_vec();
    }
    let peak = armoury::ops::measured_peak_gflops(1.0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{} threads, measured f32 peak {}, load average {}",
        rayon::current_num_threads(),
        peak.map_or("n/a (portable kernels)".to_string(), |p| format!("{p:.1} GFLOP/s")),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut rows = Vec::new();
    for zoo in models {
        rows.extend(bench::zoo_rows(zoo, &batches, budget_ms)?);
    }
    bench::print_zoo(&rows, peak);
    Ok(())
}
