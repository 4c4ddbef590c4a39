// Scratch profiler (temporary; deleted after the performance work).
use std::time::Instant;
use armoury::data;
use armoury::nn::ReferenceModel;
use armoury::{Classifier, ModuleClassifier};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model: ReferenceModel = args[1].parse()?;
    let work = args[2].clone();
    let b: usize = args[3].parse()?;
    let reps: usize = args[4].parse()?;
    let set = data::load_default(None)?;
    let probe = set.test.repeat_to(1000)?;
    let clf = ModuleClassifier::new(model.build(0), &[1, 28, 28], 10, (0.0, 1.0))?;
    let (x, y) = probe.batch(0..b)?;
    let mut times = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        if work == "f" { clf.logits(&x)?; } else { clf.loss_gradient(&x, &y)?; }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!("{} {} b={} median {:.3} ms min {:.3}", args[1], work, b, times[reps / 2], times[0]);
    Ok(())
}
