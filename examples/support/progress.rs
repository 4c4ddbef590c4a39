//! Progress bars for training (indicatif), shared by the examples.

use armoury::train::{EpochReport, StepReport, TrainCallback};
use indicatif::{ProgressBar, ProgressStyle};

/// A bar per epoch, with the running loss and accuracy; prints a line per epoch.
pub struct TrainProgress {
    bar: Option<ProgressBar>,
    loss: f64,
    correct: usize,
    seen: usize,
}

impl TrainProgress {
    pub fn new() -> Self {
        TrainProgress { bar: None, loss: 0.0, correct: 0, seen: 0 }
    }
}

impl TrainCallback for TrainProgress {
    fn on_step(&mut self, r: &StepReport) {
        let bar = self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::new(r.batches as u64);
            bar.set_style(
                ProgressStyle::with_template("epoch {prefix:>2} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                    .expect("static template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(format!("{}", r.epoch + 1));
            bar
        });
        self.loss += r.loss as f64 * r.size as f64;
        self.correct += r.correct;
        self.seen += r.size;
        bar.set_message(format!(
            "loss {:.4} acc {:.4}",
            self.loss / self.seen as f64,
            self.correct as f64 / self.seen as f64
        ));
        bar.inc(1);
    }

    fn on_epoch(&mut self, r: &EpochReport) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.loss = 0.0;
        self.correct = 0;
        self.seen = 0;
        let test = r.test.as_ref().map(|t| format!(", test accuracy {:.4}", t.accuracy)).unwrap_or_default();
        println!(
            "epoch {:>2}: loss {:.4}, train accuracy {:.4}{test}, lr {:.2e}, {:.1} s",
            r.epoch + 1,
            r.train_loss,
            r.train_accuracy,
            r.lr,
            r.seconds
        );
    }
}
