//! Resource limits: how much memory model execution and file readers may ask for, checked *before* anything is
//! allocated, so that a hostile or corrupt file is an [`Error::ResourceLimit`] instead of an abort.
//!
//! - [`max_memory`]: the memory budget in bytes. The default is half of the machine's physical memory (read from
//!   `/proc/meminfo`; 4 GiB where that is not available), or the value of `$ARMOURY_MAX_MEMORY` (e.g. `8G`) when it
//!   is set; [`set_max_memory`] changes it for the process (the examples' `--max-memory`). ONNX import checks
//!   every intermediate value against it at load ([`crate::onnx::LoadOptions`]) and every node again before it
//!   runs; constant folding and the IDX reader respect it.
//! - [`checked_numel`]: the element count of a shape, refused when it (or the product of its non-zero
//!   dimensions, which `ndarray` also requires to fit) exceeds `isize::MAX` — a shape like `[0, 2^40, 2^40]` holds
//!   no element but is still not a valid array.
//! - [`MAX_CLASSES`]: the largest class count a data set or a model may declare.
//! - [`reuse_freed_memory`]: keeps freed tensor memory in the process instead of handing it back to the system on
//!   every free (the examples and benchmarks call it first).
//!
//! See `docs/reliability.md` for what each reader guarantees.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::{Error, Result};

/// The largest number of classes a label file, a data set or a model's declared output may have (ImageNet-21k
/// has 21,841). More is refused: per-class tables (confusion matrices, vote counts) would be absurd.
pub const MAX_CLASSES: usize = 1 << 16;

/// The environment variable that sets the default memory budget (a size such as `512M`, `8G` or `8GiB`).
pub const MAX_MEMORY_ENV_VAR: &str = "ARMOURY_MAX_MEMORY";

/// 0: not set by [`set_max_memory`]; the default applies.
static MAX_MEMORY: AtomicU64 = AtomicU64::new(0);

/// The memory budget in bytes: what [`set_max_memory`] set, else [`default_max_memory`].
pub fn max_memory() -> u64 {
    match MAX_MEMORY.load(Ordering::Relaxed) {
        0 => default_max_memory(),
        m => m,
    }
}

/// Sets the memory budget of this process (bytes, at least 1 MiB: anything smaller is raised to 1 MiB).
pub fn set_max_memory(bytes: u64) {
    MAX_MEMORY.store(bytes.max(1 << 20), Ordering::Relaxed);
}

/// The default budget: `$ARMOURY_MAX_MEMORY` if it is set and valid, else half of the physical memory, else
/// 4 GiB. Computed once.
pub fn default_max_memory() -> u64 {
    static DEFAULT: OnceLock<u64> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        if let Some(v) = std::env::var(MAX_MEMORY_ENV_VAR).ok().and_then(|s| parse_size(&s).ok()) {
            return v.max(1 << 20);
        }
        physical_memory().map_or(4 << 30, |m| m / 2)
    })
}

/// The machine's physical memory in bytes (Linux: `MemTotal` of `/proc/meminfo`).
pub fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Parses a size: a number of bytes, optionally with a unit `K`, `M`, `G`, `T` (powers of 1024; `KiB`, `MB`, …
/// are read the same way) and a fraction (`1.5G`).
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = || Error::invalid("parse_size", format!("'{s}' is not a size (e.g. 512M, 8G, 1073741824)"));
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_uppercase();
    let shift = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// The number of elements of `shape`: the product of every dimension, refused (an [`Error::ResourceLimit`]
/// naming `what`) when it or the product of the non-zero dimensions exceeds `isize::MAX` — zero dimensions
/// included, so `[0, 2^40, 2^40]` is refused although it holds nothing.
pub fn checked_numel(what: &str, shape: &[usize]) -> Result<usize> {
    let mut all: u128 = 1;
    let mut nonzero: u128 = 1;
    for &d in shape {
        all = all.saturating_mul(d as u128);
        nonzero = nonzero.saturating_mul(d.max(1) as u128);
    }
    if nonzero > isize::MAX as u128 {
        return Err(Error::ResourceLimit {
            what: format!("{what}: shape {shape:?}"),
            needed: nonzero,
            limit: isize::MAX as u128,
            unit: "elements",
        });
    }
    Ok(all as usize)
}

/// The bytes of an f32 tensor of `shape`, checked with [`checked_numel`].
pub fn f32_bytes(what: &str, shape: &[usize]) -> Result<u128> {
    Ok(checked_numel(what, shape)? as u128 * 4)
}

/// Refuses `bytes` more than `limit` for `what`.
pub fn check_bytes(what: impl FnOnce() -> String, bytes: u128, limit: u64) -> Result<()> {
    if bytes > u128::from(limit) {
        return Err(Error::ResourceLimit { what: what(), needed: bytes, limit: u128::from(limit), unit: "bytes" });
    }
    Ok(())
}

/// Refuses a class count above [`MAX_CLASSES`] (`what` names where it came from).
pub fn check_classes(what: &str, classes: usize) -> Result<()> {
    if classes > MAX_CLASSES {
        return Err(Error::ResourceLimit {
            what: what.to_string(),
            needed: classes as u128,
            limit: MAX_CLASSES as u128,
            unit: "classes",
        });
    }
    Ok(())
}

/// Keeps the memory of freed tensors in the process for the next ones, instead of returning it to the operating
/// system on every free; returns whether it applied (with glibc; elsewhere it does nothing).
///
/// glibc gives a block above its mmap threshold (128 KB at first, adjusted up to 32 MB) its own mapping and unmaps
/// it when freed, so every pass of a model that allocates a fresh output per layer faults each page of each output
/// in again: a MobileNetV2 forward + input gradient at batch 4 × 224² spent 40% of its CPU time in the kernel,
/// 40,000 page faults per pass. This sets the mmap threshold to glibc's maximum (32 MB) and the trim threshold to
/// 1 GiB, so blocks up to 32 MB come from the heap and stay there when freed (ONNX Runtime keeps an arena for the
/// same reason). The settings are process-wide and stay; call it once, before any work.
pub fn reuse_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes the allocator's parameters; both values are in the ranges glibc documents.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freed blocks of 12 MB are reused without faulting their pages in again. With glibc's defaults they are
    /// unmapped or trimmed from the heap when freed, and faulted in again by the next cycle (every page of every cycle
    /// here: 73,504 in the 8 cycles); after [`reuse_freed_memory`] the later cycles fault (almost) none. Counted per thread, so other
    /// tests' allocations do not count.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_blocks_are_reused_without_page_faults() {
        fn thread_faults() -> i64 {
            // SAFETY: getrusage writes the struct it is given.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
            u.ru_minflt
        }
        assert!(reuse_freed_memory());
        let faults = std::thread::spawn(|| {
            // A layer's worth of outputs, as a pass allocates and frees them: three blocks of 12 MB.
            let cycle = || {
                let mut blocks: Vec<Vec<u8>> = (0..3).map(|_| vec![0u8; 12 << 20]).collect();
                blocks.iter_mut().flat_map(|v| v.iter_mut().step_by(4096)).for_each(|b| *b = 1);
                std::hint::black_box(&blocks);
            };
            cycle();
            let before = thread_faults();
            (0..8).for_each(|_| cycle());
            thread_faults() - before
        })
        .join()
        .unwrap();
        assert!(faults < 1000, "{faults} page faults in 8 cycles of 3 × 3,072 pages");
    }

    #[test]
    fn sizes_parse_in_powers_of_1024() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2K").unwrap(), 2048);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        for bad in ["", "G", "-1G", "1X", "0", "nan"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn numel_counts_zero_dimensions_but_checks_the_others() {
        assert_eq!(checked_numel("t", &[2, 3, 4]).unwrap(), 24);
        assert_eq!(checked_numel("t", &[]).unwrap(), 1);
        assert_eq!(checked_numel("t", &[0, 7]).unwrap(), 0);
        assert!(checked_numel("t", &[0, 1 << 40, 1 << 40]).is_err());
        assert!(checked_numel("t", &[u32::MAX as usize, u32::MAX as usize, 0]).is_err());
        assert!(checked_numel("t", &[1 << 62, 4]).is_err());
    }
}
