//! What a result measured: the model's content, the evaluated samples, the threat model, the kernel path and the
//! crate version — recorded in every ledger, state file, shard and report, and compared before a run is resumed
//! or shards are merged, so that a figure is never carried over from another model, other data or another
//! kernel path (docs/evaluation.md#identity).
//!
//! - the model: SHA-256 of every named parameter and buffer (name, shape, f32 bits, in definition order), plus
//!   any bytes the caller adds (an ONNX file: its graph, not only its weights) — [`model_hash`];
//! - the data: SHA-256 of the evaluated samples' values and labels, in order — [`data_hash`];
//! - the kernel path ([`kernel_path`]): AVX-512 and AVX2 sum products in different orders (16- and 8-lane
//!   accumulators), so their logits differ in the last bits and a sample on the decision boundary can fall either
//!   way; the portable path differs again. Results of different paths are never mixed.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::data::Dataset;
use crate::nn::{Module, ModuleExt};
use crate::{Error, Result};

/// The identity of an evaluation (see the module doc).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Identity {
    /// SHA-256 (hex) of the model's content ([`model_hash`]).
    pub model_hash: String,
    /// The data set's name (for people; not compared).
    #[serde(default)]
    pub data: String,
    /// SHA-256 (hex) of the evaluated samples ([`data_hash`]) — of the whole evaluation, not of one shard, so that
    /// every shard of a run records the same value.
    pub data_hash: String,
    /// The kernel path the figures were computed on ([`kernel_path`]).
    pub kernel: String,
    /// The version of Armoury that computed them.
    pub version: String,
}

/// A hash shortened for reading: its first 12 hex digits (`(none recorded)` when empty).
pub fn short_hash(hash: &str) -> String {
    if hash.is_empty() {
        "(none recorded)".to_string()
    } else {
        hash.chars().take(12).collect()
    }
}

impl std::fmt::Display for Identity {
    /// `model sha256 0e380cfc427a, data fashion-mnist (sha256 cb19a2782362), kernels avx512, armoury 0.1.0`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = short_hash;
        write!(
            f,
            "model sha256 {}, data {} (sha256 {}), kernels {}, armoury {}",
            short(&self.model_hash),
            self.data,
            short(&self.data_hash),
            self.kernel,
            self.version
        )
    }
}

impl Identity {
    /// The identity of an evaluation of the model hashed as `model_hash` on samples `0..n` of `data`, on this
    /// process's kernel path and crate version.
    pub fn new(model_hash: String, data: &Dataset, n: usize, data_name: &str) -> Result<Identity> {
        Ok(Identity {
            model_hash,
            data: data_name.to_string(),
            data_hash: data_hash(data, n)?,
            kernel: kernel_path().to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        })
    }

    /// The first field in which `saved` (what a ledger or shard recorded) differs from `self` (this run), as a
    /// sentence for an error message; `None` when they are the same evaluation.
    pub fn difference(&self, saved: &Identity) -> Option<String> {
        let short = short_hash;
        if saved.model_hash != self.model_hash {
            return Some(format!(
                "the model differs (content hash {} recorded, {} now: other weights or another model file)",
                short(&saved.model_hash),
                short(&self.model_hash)
            ));
        }
        if saved.data_hash != self.data_hash {
            return Some(format!(
                "the data differ (samples hash {} recorded, {} now: another --data, --limit or data file)",
                short(&saved.data_hash),
                short(&self.data_hash)
            ));
        }
        if saved.kernel != self.kernel {
            return Some(format!(
                "the kernel path differs ({} recorded, {} now: results of different kernel paths differ in the \
                 last bits and are never mixed; rerun with ARMOURY_SIMD={} or start afresh)",
                if saved.kernel.is_empty() { "none" } else { &saved.kernel },
                self.kernel,
                if saved.kernel.is_empty() { "?" } else { &saved.kernel },
            ));
        }
        if saved.version != self.version {
            return Some(format!(
                "Armoury's version differs ({} recorded, {} now)",
                if saved.version.is_empty() { "unknown" } else { &saved.version },
                self.version
            ));
        }
        None
    }
}

/// The kernel path this process computes on: `avx512`, `avx2` or `portable` (capped by `ARMOURY_SIMD`), with
/// `-direct` when `ARMOURY_NO_WINOGRAD` keeps 3×3 convolutions off Winograd's transforms (another rounding).
pub fn kernel_path() -> &'static str {
    crate::ops::simd_level_name()
}

/// Lower-case hex of bytes (a digest).
pub(crate) fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 (hex) of a module's content: every named parameter and buffer (name, shape and the bits of its
/// values, in definition order), then `extra` (for an ONNX model, the file's bytes — its graph). Two modules
/// hash the same only if they compute the same function with the same numbers.
pub fn model_hash(module: &dyn Module, extra: &[u8]) -> String {
    let mut h = Sha256::new();
    for (name, p) in module.named_params() {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        let v = p.value();
        h.update((v.ndim() as u64).to_le_bytes());
        for &d in v.shape() {
            h.update((d as u64).to_le_bytes());
        }
        for &x in v.iter() {
            h.update(x.to_bits().to_le_bytes());
        }
    }
    h.update((extra.len() as u64).to_le_bytes());
    h.update(extra);
    hex(h.finalize())
}

/// SHA-256 (hex) of samples `0..n` of `data`: their shape, the bits of their values and their labels.
pub fn data_hash(data: &Dataset, n: usize) -> Result<String> {
    if n > data.len() {
        return Err(Error::invalid("data hash", format!("{n} samples asked of a data set of {}", data.len())));
    }
    let mut h = Sha256::new();
    h.update((n as u64).to_le_bytes());
    for &d in data.images().shape().iter().skip(1) {
        h.update((d as u64).to_le_bytes());
    }
    const STEP: usize = 256;
    let mut lo = 0;
    while lo < n {
        let hi = (lo + STEP).min(n);
        let (x, y) = data.batch(lo..hi)?;
        for &v in x.value().iter() {
            h.update(v.to_bits().to_le_bytes());
        }
        for &l in &y {
            h.update((l as u64).to_le_bytes());
        }
        lo = hi;
    }
    Ok(hex(h.finalize()))
}
