//! Where a pass spends its time: an opt-in timer of every ONNX graph step (forward) and every recorded op's
//! backward, summed per kind of step and shape.
//!
//! ```no_run
//! # use armoury::{onnx::OnnxModel, Classifier, Tensor};
//! let model = OnnxModel::load("model.onnx")?;
//! let clf = model.classifier((0.0, 1.0))?;
//! let x = Tensor::new(ndarray::ArrayD::<f32>::zeros(vec![4, 3, 224, 224]));
//! let (result, profile) = armoury::profile::record(|| clf.loss_gradient(&x, &[0, 1, 2, 3]));
//! result?;
//! for e in profile.entries.iter().take(10) {
//!     println!("{:>8.2} ms  {:?} {} {:?} → {:?} ×{}", e.ms, e.phase, e.op, e.input, e.output, e.calls);
//! }
//! # Ok::<(), armoury::Error>(())
//! ```
//!
//! Only one recording runs at a time (a second [`record`] waits for the first); while none runs, the hooks cost
//! one relaxed atomic load per step. Times are wall-clock: a step's kernels run on every thread, and steps that
//! run concurrently (chunks of a batch on different threads) each count their own time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which pass a time belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// A step of an ONNX graph's forward (a fused step counts once, under its nodes' operator types joined by
    /// `+`).
    Forward,
    /// The backward of one recorded op (by the op's name: `conv2d`, `add`, …).
    Backward,
}

/// The time of one kind of step at one shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The pass.
    pub phase: Phase,
    /// The operator type(s) (forward) or the op's name (backward).
    pub op: String,
    /// The shape of the step's first input.
    pub input: Vec<usize>,
    /// The shape of its (first) output.
    pub output: Vec<usize>,
    /// How many times it ran.
    pub calls: usize,
    /// Total milliseconds.
    pub ms: f64,
}

/// A recording's entries, the most expensive first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Per kind of step and shape.
    pub entries: Vec<Entry>,
}

impl Profile {
    /// The total milliseconds of one phase.
    pub fn total_ms(&self, phase: Phase) -> f64 {
        self.entries.iter().filter(|e| e.phase == phase).map(|e| e.ms).sum()
    }

    /// Milliseconds per operator type or op name in one phase (shapes summed), the most expensive first.
    pub fn by_op(&self, phase: Phase) -> Vec<(String, f64)> {
        let mut sums: HashMap<&str, f64> = HashMap::new();
        for e in self.entries.iter().filter(|e| e.phase == phase) {
            *sums.entry(&e.op).or_default() += e.ms;
        }
        let mut out: Vec<(String, f64)> = sums.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

type Key = (Phase, String, Vec<usize>, Vec<usize>);

static ON: AtomicBool = AtomicBool::new(false);
static TIMES: Mutex<Option<HashMap<Key, (usize, Duration)>>> = Mutex::new(None);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `f` with the timers on and returns its result with what they measured.
pub fn record<T>(f: impl FnOnce() -> T) -> (T, Profile) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    *TIMES.lock().unwrap_or_else(|e| e.into_inner()) = Some(HashMap::new());
    ON.store(true, Ordering::Relaxed);
    let out = f();
    ON.store(false, Ordering::Relaxed);
    let times = TIMES.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
    let mut entries: Vec<Entry> = times
        .into_iter()
        .map(|((phase, op, input, output), (calls, t))| Entry {
            phase,
            op,
            input,
            output,
            calls,
            ms: t.as_secs_f64() * 1e3,
        })
        .collect();
    entries.sort_by(|a, b| {
        b.ms.total_cmp(&a.ms)
            .then_with(|| (a.phase, &a.op, &a.input, &a.output).cmp(&(b.phase, &b.op, &b.input, &b.output)))
    });
    (out, Profile { entries })
}

/// Whether a recording is on (the hooks' fast check).
pub(crate) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Runs `f`, adding its time to the recording when one is on; `describe` gives the step's operator and its
/// first input's shape, and is called only then.
pub(crate) fn time<T>(
    phase: Phase,
    describe: impl FnOnce() -> (String, Vec<usize>),
    output: impl FnOnce(&T) -> Vec<usize>,
    f: impl FnOnce() -> T,
) -> T {
    if !on() {
        return f();
    }
    let t = Instant::now();
    let out = f();
    let elapsed = t.elapsed();
    let (op, input) = describe();
    let key = (phase, op, input, output(&out));
    if let Some(times) = TIMES.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        let e = times.entry(key).or_default();
        e.0 += 1;
        e.1 += elapsed;
    }
    out
}
