//! `cargo bench --bench blackbox`: black-box attacks on the fixture cnn — queries per second and wall time per
//! image for the Square Attack (L∞, ε = 0.1, 1,000 queries, first 200 test images) and HopSkipJump (L2,
//! untargeted, 2,500 queries, first 20 test images — the settings of the ART figures the tests compare with).

use std::time::Instant;

use armoury::nn::{cnn, Sequential};
use armoury::{data, io, Attack, Goal, ModuleClassifier};
use armoury_attacks::{HopSkipJump, SquareAttack};

/// Large blocks freed a moment ago come back first, still in cache (`armoury::alloc`).
#[global_allocator]
static ALLOC: armoury::alloc::WarmBlocks = armoury::alloc::WarmBlocks::new();

fn main() -> armoury::Result<()> {
    let net: Sequential = cnn(0);
    io::load_module(&net, std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cnn.safetensors"))?;
    let model = ModuleClassifier::new(net, &[1, 28, 28], 10, (0.0, 1.0))?;
    let test = data::sample()?.test;
    let hsj = HopSkipJump { max_queries: 2500, ..HopSkipJump::l2() };
    let runs: Vec<(Box<dyn Attack>, usize)> = vec![(Box::new(SquareAttack::linf(0.1)), 200), (Box::new(hsj), 20)];
    println!(
        "{:<48} {:>6} {:>10} {:>12} {:>10} {:>12} {:>9}",
        "attack", "images", "queries", "queries/s", "ms/image", "median L2", "success"
    );
    for (attack, n) in runs {
        let (x, y) = test.batch(0..n)?;
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..3 {
            let start = Instant::now();
            let r = attack.run(&model, &x, &y, &Goal::Untargeted, 0)?;
            times.push(start.elapsed().as_secs_f64());
            last = Some(r);
        }
        times.sort_by(f64::total_cmp);
        let secs = times[1];
        let r = last.expect("three runs");
        let queries: u64 = r.queries.iter().sum();
        let mut l2: Vec<f32> = r.norms.iter().zip(&r.success).filter(|(_, &s)| s).map(|(m, _)| m.l2).collect();
        l2.sort_by(f32::total_cmp);
        let med = l2.get(l2.len() / 2).copied().unwrap_or(f32::NAN);
        println!(
            "{:<48} {:>6} {:>10} {:>12.0} {:>10.2} {:>12.3} {:>9.3}",
            attack.name(),
            n,
            queries,
            queries as f64 / secs,
            secs * 1000.0 / n as f64,
            med,
            r.success_rate()
        );
    }
    Ok(())
}
