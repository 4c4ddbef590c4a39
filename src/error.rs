//! The one error type of the core crate.

use std::path::PathBuf;

/// Everything that can go wrong in Armoury's core.
///
/// Variants carry the operation and the shapes involved, so that a message is enough to find the bug.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two shapes that had to agree did not.
    #[error("{op}: shape mismatch, expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// The operation that checked.
        op: &'static str,
        /// What it needed.
        expected: Vec<usize>,
        /// What it was given.
        got: Vec<usize>,
    },
    /// A tensor had the wrong number of dimensions.
    #[error("{op}: expected rank {expected}, got rank {got} (shape {shape:?})")]
    RankMismatch {
        /// The operation that checked.
        op: &'static str,
        /// The rank it needed.
        expected: usize,
        /// The rank it was given.
        got: usize,
        /// The offending shape.
        shape: Vec<usize>,
    },
    /// Shapes that cannot be broadcast together.
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not broadcast")]
    Broadcast {
        /// The operation.
        op: &'static str,
        /// Left shape.
        lhs: Vec<usize>,
        /// Right shape.
        rhs: Vec<usize>,
    },
    /// An argument outside its domain (negative ε, empty batch, axis out of range, …).
    #[error("{op}: invalid argument: {msg}")]
    InvalidArgument {
        /// Who rejected it.
        op: &'static str,
        /// Why.
        msg: String,
    },
    /// An input holds NaN or infinite values.
    #[error("{op}: input contains non-finite values (NaN or Inf)")]
    NonFinite {
        /// Who found them.
        op: &'static str,
    },
    /// A class label outside `0..num_classes`.
    #[error("{op}: label {label} out of range for {num_classes} classes")]
    LabelOutOfRange {
        /// Who found it.
        op: &'static str,
        /// The label.
        label: usize,
        /// How many classes there are.
        num_classes: usize,
    },
    /// A file that is malformed or truncated.
    #[error("{path}: bad file: {msg}")]
    BadFile {
        /// The file (or a description of the byte source).
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Parameters in a file do not match the model: every difference is listed.
    #[error("parameters do not match the model:\n  {}", .0.join("\n  "))]
    ParameterMismatch(Vec<String>),
    /// A data set could not be found in any of the places searched.
    #[error("data set not found; looked in: {}", .0.join(", "))]
    DataNotFound(Vec<String>),
    /// An ONNX model uses something Armoury does not implement.
    #[error("unsupported ONNX {what} in node '{node}' (op {op}, opset {opset})")]
    UnsupportedOnnx {
        /// What is unsupported (the operator, or an attribute of it).
        what: String,
        /// The node's name.
        node: String,
        /// The operator type.
        op: String,
        /// The model's default-domain opset.
        opset: i64,
    },
    /// A gradient was asked for a tensor the loss does not depend on through tracked operations.
    #[error("{op}: {msg}")]
    Autograd {
        /// Where.
        op: &'static str,
        /// What happened.
        msg: String,
    },
    /// An I/O error, with the path it concerned.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file or a computation would need more memory (or more of something) than the limit allows
    /// ([`crate::limits`]): refused before anything is allocated.
    #[error("{what}: needs {needed} {unit}, the limit is {limit} (see armoury::limits)")]
    ResourceLimit {
        /// What would have been allocated (an ONNX node, a decompressed file, a class count, …).
        what: String,
        /// How much it needs.
        needed: u128,
        /// The limit it exceeds.
        limit: u128,
        /// The unit of both numbers ("bytes", "elements", "classes").
        unit: &'static str,
    },
    /// Shards of a sharded evaluation that have not finished (no ledger, an unreadable one, or steps left):
    /// every one is named, so that exactly those can be run again before the merge.
    #[error(
        "{}: {} of {n} shards unfinished: {} ({}); rerun them with the same flags and `--shard i/{n}` (each \
         continues from its ledger), then merge again",
        .dir.display(), .unfinished.len(), join(.unfinished, ","), .why.join("; ")
    )]
    UnfinishedShards {
        /// The directory of the shard ledgers.
        dir: PathBuf,
        /// How many shards the evaluation has.
        n: usize,
        /// The indices of the unfinished ones, ascending.
        unfinished: Vec<usize>,
        /// Per unfinished shard, what is wrong with it.
        why: Vec<String>,
    },
    /// An image could not be decoded or encoded.
    #[error("{path}: image error: {source}")]
    Image {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: image::ImageError,
    },
}

/// `1,3,5`: a list as Slurm's `--array` and people read it.
fn join(items: &[usize], sep: &str) -> String {
    items.iter().map(usize::to_string).collect::<Vec<_>>().join(sep)
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument { op, msg: msg.into() }
    }

    /// Shorthand for [`Error::BadFile`].
    pub fn bad_file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::BadFile { path: path.into(), msg: msg.into() }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}
