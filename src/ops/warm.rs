//! Keeping rayon's workers awake between the ops of a pass.
//!
//! rayon puts an idle worker to sleep after a few dozen rounds of looking for work (tens of microseconds), and a
//! parallel op started from outside the pool then waits for a sleeping worker to wake. On this project's 2-core
//! KVM machine that took 70–100 µs: a 5 µs parallel copy took a median 76 µs when the calling thread had worked
//! alone for 200 µs before it, 9 µs when it had not. A model's pass is hundreds of ops with a little serial
//! work between them (the graph's bookkeeping, allocation, an op too small to split), so its workers fell asleep
//! between ops and many ops paid the wake-up; rayon's own idling patched to last longer made DenseNet-121's
//! forward and forward + input gradient 8–9% faster and EfficientNet-B0's and ResNet-18's 4–5%.
//!
//! [`poke`], called as each op with a large value (`PAR_THRESHOLD` elements or more) is recorded and before the
//! backward of each large gradient, starts a spinner on every worker of the global pool unless they run already: a
//! spinner runs the pool's work as it comes (`rayon::yield_now`) and gives its core to the operating system in
//! between (`std::thread::yield_now`), until it has found no work for [`IDLE`]; then the worker returns to rayon's
//! own idling. onnxruntime's and OpenMP's thread pools spin the same way between parallel regions. Only which
//! thread runs a job, and when, changes — never a result. Small values do not poke: the first poke starts rayon's
//! global pool, and a program that has done a little arithmetic may still mean to size the pool
//! (`ThreadPoolBuilder::build_global`), where an op on many values has run on the pool already. The environment
//! variable `ARMOURY_NO_SPIN` (any value) turns spinning off, for a machine shared with other work.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a spinner looks for work before it stops: longer than the serial work between two ops of a pass,
/// short enough that a program that has finished its passes stops spinning at once.
const IDLE: Duration = Duration::from_millis(2);

/// The spinners of one pool: how many run, whether a broadcast of them has been asked for and not started, and
/// how long each looks for work before it stops.
struct Spinners {
    alive: AtomicUsize,
    pending: AtomicBool,
    idle: Duration,
}

/// The global pool's.
static GLOBAL: Spinners = Spinners::new(IDLE);

thread_local! {
    /// Whether this thread runs a spinner (a spinner's `yield_now` may pick up another's job).
    static SPINNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether spinning is on (`ARMOURY_NO_SPIN` unset), read once.
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ARMOURY_NO_SPIN").is_none())
}

/// Starts a spinner on every worker of the global pool unless they run or have been asked for (see
/// [`Spinners::start`]), for an op on (or a gradient of) `values` values: not below `PAR_THRESHOLD` of them,
/// which may not have used the pool yet (see the module's notes).
pub(crate) fn poke(values: usize) {
    if values >= super::PAR_THRESHOLD && enabled() {
        GLOBAL.start(None);
    }
}

impl Spinners {
    const fn new(idle: Duration) -> Spinners {
        Spinners { alive: AtomicUsize::new(0), pending: AtomicBool::new(false), idle }
    }

    /// A spinner on every worker of `pool` (the global pool for `None`) unless they run or have been asked for,
    /// the pool has one thread, or this is a job of the pool (any pool, for the global one): the pool is at work
    /// already, and its parallel ops run in place.
    fn start(&'static self, pool: Option<&rayon::ThreadPool>) {
        if self.alive.load(Ordering::Relaxed) > 0 || self.pending.load(Ordering::Relaxed) {
            return;
        }
        let (threads, inside) = match pool {
            Some(p) => (p.current_num_threads(), p.current_thread_index().is_some()),
            None => (rayon::current_num_threads(), rayon::current_thread_index().is_some()),
        };
        if threads < 2 || inside || self.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        match pool {
            Some(pool) => pool.spawn_broadcast(move |_| self.spin()),
            None => rayon::spawn_broadcast(move |_| self.spin()),
        }
    }

    /// Runs the pool's jobs as they come until none has come for `idle`.
    fn spin(&self) {
        if SPINNING.replace(true) {
            return;
        }
        self.alive.fetch_add(1, Ordering::AcqRel);
        self.pending.store(false, Ordering::Release);
        let mut last = Instant::now();
        loop {
            match rayon::yield_now() {
                Some(rayon::Yield::Executed) => last = Instant::now(),
                _ if last.elapsed() >= self.idle => break,
                _ => std::thread::yield_now(),
            }
        }
        self.alive.fetch_sub(1, Ordering::AcqRel);
        SPINNING.set(false);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use super::{Spinners, IDLE};

    /// Waits up to `most` for `until` to hold.
    fn wait(most: Duration, until: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while !until() && start.elapsed() < most {
            std::thread::sleep(Duration::from_micros(200));
        }
        until()
    }

    /// Started, every worker of the pool runs one spinner (not two on one worker); the spinners run the pool's
    /// work (a parallel sum gives the serial sum's values); they stop once idle for their time, not much later; from
    /// inside the pool, or on a one-thread pool, nothing starts. The spinners here look for work for 300 ms, so that
    /// a loaded machine's scheduling cannot stop one before the other has started.
    #[test]
    fn spinners_run_the_work_and_stop_when_idle() {
        use rayon::prelude::*;
        const LONG: Duration = Duration::from_millis(300);
        static TWO: Spinners = Spinners::new(LONG);
        static ONE: Spinners = Spinners::new(LONG);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let alive = || TWO.alive.load(Ordering::Acquire);
        TWO.start(Some(&pool));
        assert!(wait(Duration::from_secs(5), || alive() == 2), "a spinner on each of the two workers, got {}", alive());
        TWO.start(Some(&pool));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(alive(), 2, "a second start while they run adds none");
        let v: Vec<f64> = (0..1 << 16).map(|i| (i as f64).sin()).collect();
        let serial: Vec<f64> = v.chunks(1024).map(|c| c.iter().sum()).collect();
        let parallel: Vec<f64> = pool.install(|| v.par_chunks(1024).map(|c| c.iter().sum()).collect());
        assert_eq!(parallel, serial);
        let done = Instant::now();
        assert!(wait(10 * LONG, || alive() == 0), "the spinners stop when idle");
        assert!(done.elapsed() >= LONG / 2, "not before they have been idle for their time");
        let started = pool.install(|| {
            TWO.start(Some(&pool));
            std::thread::sleep(Duration::from_millis(20));
            alive() > 0 || TWO.pending.load(Ordering::Acquire)
        });
        assert!(!started, "nothing starts from inside the pool");
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        ONE.start(Some(&one));
        std::thread::sleep(Duration::from_millis(20));
        assert!(ONE.alive.load(Ordering::Acquire) == 0 && !ONE.pending.load(Ordering::Acquire), "one thread: none");
        assert!(IDLE < LONG, "the global pool's spinners stop sooner");
    }

    /// A small op does not start rayon's global pool, so a program can still size it afterwards (in a process of
    /// its own: this binary again, running this test alone).
    #[test]
    fn a_small_op_leaves_the_global_pool_to_be_sized() {
        const NAME: &str = "ops::warm::tests::a_small_op_leaves_the_global_pool_to_be_sized";
        if std::env::var_os("ARMOURY_WARM_CHILD").is_some() {
            let x = crate::Tensor::uniform(&[4, 8], -1.0, 1.0, 1);
            let y = x.relu().add(&x).unwrap();
            assert_eq!(y.shape(), &[4, 8]);
            rayon::ThreadPoolBuilder::new().num_threads(3).build_global().expect("the global pool not yet started");
            assert_eq!(rayon::current_num_threads(), 3);
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args(["--exact", NAME, "--test-threads", "1"])
            .env("ARMOURY_WARM_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }
}
