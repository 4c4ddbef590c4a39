//! Progress of an evaluation's steps, for a person at a terminal and for a log.

use indicatif::{ProgressBar, ProgressStyle};

/// The progress of a cascade (or of any run of [`armoury::eval::Progress`] steps): on a terminal, a bar naming
/// the step that runs (attack and ε) with the robust accuracy so far; in a log (stderr not a terminal: a batch
/// job, a pipe), one plain line per finished step with the elapsed time and the robust accuracy so far.
pub struct StepProgress {
    what: &'static str,
    bar: ProgressBar,
    plain: bool,
    start: std::time::Instant,
    first: std::sync::atomic::AtomicBool,
}

impl StepProgress {
    /// Progress of `what` ("cascade", "defenses"…).
    pub fn new(what: &'static str) -> Self {
        let plain = !std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = if plain { ProgressBar::hidden() } else { ProgressBar::new(0) };
        bar.set_style(
            ProgressStyle::with_template("[{bar:30}] {pos}/{len} steps ({elapsed}, eta {eta}) {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        let first = std::sync::atomic::AtomicBool::new(true);
        StepProgress { what, bar, plain, start: std::time::Instant::now(), first }
    }

    /// Shows where the run is.
    pub fn update(&self, p: &armoury::eval::Progress) {
        let robust = format!("robust so far {:.4} ({} of {} started)", p.robust_accuracy(), p.robust, p.started);
        if self.first.swap(false, std::sync::atomic::Ordering::Relaxed) && p.done > 0 {
            self.line(format!("{}: resuming: {} of {} steps done; {robust}", self.what, p.done, p.total));
        }
        if self.plain {
            if let Some(step) = &p.finished {
                let t = self.start.elapsed().as_secs_f64();
                eprintln!("{}: step {}/{} done ({step}) at {t:.1} s; {robust}", self.what, p.done, p.total);
            }
            return;
        }
        self.bar.set_length(p.total as u64);
        self.bar.set_position(p.done as u64);
        let next = p.next.as_deref().unwrap_or("done");
        self.bar.set_message(format!("{next} — {robust}"));
    }

    /// A line above the bar (or alone in a log).
    pub fn line(&self, text: String) {
        if self.plain {
            eprintln!("{text}");
        } else {
            self.bar.println(text);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
