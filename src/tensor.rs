//! The tensor: a cheap, immutable handle on an f32 n-d array and the operation that made it.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ndarray::{ArcArray, ArrayD, IxDyn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::ops::Op;
use crate::{Error, Result};

/// The storage of every tensor: a shared, reference-counted f32 array of any rank.
pub type Array = ArcArray<f32, IxDyn>;

/// A unique identity for a tensor node; gradient stores are keyed by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

impl TensorId {
    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TensorId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// How a tensor takes part in differentiation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A constant: no gradient flows into it and no op is recorded for it.
    Constant,
    /// A leaf whose gradient may be asked for with `grad_wrt` (an attack's input).
    Variable,
    /// A trainable parameter: `backward` returns its gradient.
    Parameter,
    /// The result of an op with at least one tracked input.
    Computed,
}

pub(crate) struct Node {
    pub(crate) id: TensorId,
    pub(crate) value: Array,
    pub(crate) role: Role,
    pub(crate) op: Option<Op>,
}

/// An immutable f32 tensor: a shared value plus, when tracked, the op that computed it.
///
/// Clones are reference counts. Every op returns a new tensor; nothing is mutated in place, so a caller's data
/// can never be changed by an attack or a defense.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Node>);

thread_local! {
    static NO_GRAD_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f` with gradient recording switched off on this thread: every op returns a constant.
///
/// Evaluation, prediction and detectors run in this scope so that they build no graph.
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            NO_GRAD_DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
    let _guard = Guard;
    f()
}

/// Runs `f` with gradient recording switched on on this thread, whatever scope the thread is in.
///
/// Work that builds a graph inside a rayon task must use it: a worker waiting inside a [`no_grad`] scope may steal
/// the task and would otherwise run it with recording off.
pub fn enable_grad<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_GRAD_DEPTH.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(NO_GRAD_DEPTH.with(|d| d.replace(0)));
    f()
}

/// Whether ops on this thread currently record a graph.
pub fn grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

impl Tensor {
    pub(crate) fn from_node(value: Array, role: Role, op: Option<Op>) -> Tensor {
        Tensor(Arc::new(Node { id: TensorId::fresh(), value, role, op }))
    }

    /// A constant tensor wrapping an array (shared, not copied).
    pub fn new(value: impl Into<Array>) -> Tensor {
        Tensor::from_node(value.into(), Role::Constant, None)
    }

    /// A constant tensor from a flat slice and a shape.
    pub fn from_slice(data: &[f32], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// A constant tensor from a flat vector (row-major) and a shape.
    pub fn from_vec(data: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(Error::ShapeMismatch { op: "from_vec", expected: shape.to_vec(), got: vec![data.len()] });
        }
        let a = ArrayD::from_shape_vec(IxDyn(shape), data).expect("length checked above");
        Ok(Tensor::new(a))
    }

    /// A scalar (rank-0) constant.
    pub fn scalar(v: f32) -> Tensor {
        Tensor::new(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor::full(shape, 0.0)
    }

    /// A tensor of ones.
    pub fn ones(shape: &[usize]) -> Tensor {
        Tensor::full(shape, 1.0)
    }

    /// A tensor filled with `v`.
    pub fn full(shape: &[usize], v: f32) -> Tensor {
        Tensor::new(ArrayD::from_elem(IxDyn(shape), v))
    }

    /// Uniform samples in `[lo, hi)` from a ChaCha8 generator seeded with `seed`.
    pub fn uniform(shape: &[usize], lo: f32, hi: f32, seed: u64) -> Tensor {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        Tensor::new(ArrayD::from_shape_simple_fn(IxDyn(shape), || lo + (hi - lo) * rng.random::<f32>()))
    }

    /// Normal samples N(mean, std²) from a ChaCha8 generator seeded with `seed` (Box–Muller).
    pub fn normal(shape: &[usize], mean: f32, std: f32, seed: u64) -> Tensor {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v = normal_vec(&mut rng, n);
        let a = ArrayD::from_shape_vec(IxDyn(shape), v.into_iter().map(|z| mean + std * z).collect())
            .expect("length equals the product of the shape");
        Tensor::new(a)
    }

    /// The same value as a leaf whose gradient can be asked for with [`Tensor::grad_wrt`].
    pub fn variable(&self) -> Tensor {
        Tensor::from_node(self.0.value.clone(), Role::Variable, None)
    }

    /// The same value as a trainable-parameter leaf: [`Tensor::backward`] reports its gradient.
    pub(crate) fn parameter(value: Array) -> Tensor {
        Tensor::from_node(value, Role::Parameter, None)
    }

    /// The same value, cut from the graph (a constant).
    pub fn detach(&self) -> Tensor {
        if self.0.role == Role::Constant {
            return self.clone();
        }
        Tensor::new(self.0.value.clone())
    }

    /// This node's identity.
    pub fn id(&self) -> TensorId {
        self.0.id
    }

    /// Whether gradients can flow through this tensor.
    pub fn is_tracked(&self) -> bool {
        self.0.role != Role::Constant
    }

    /// The value (a shared array: cloning it is a reference count).
    pub fn value(&self) -> &Array {
        &self.0.value
    }

    /// The value as an owned standard-layout array (copies).
    pub fn to_array(&self) -> ArrayD<f32> {
        self.0.value.to_owned()
    }

    /// The value as an owned array, without a copy when this tensor is the last holder of its storage (an
    /// attack's iterate handed to the classifier and taken back, a fresh gradient).
    pub fn into_array(self) -> ArrayD<f32> {
        match Arc::try_unwrap(self.0) {
            Ok(node) => node.value.into_owned(),
            Err(shared) => shared.value.to_owned(),
        }
    }

    /// The values in row-major order.
    pub fn to_vec(&self) -> Vec<f32> {
        self.0.value.iter().copied().collect()
    }

    /// The only value of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(Error::ShapeMismatch { op: "item", expected: vec![1], got: self.shape().to_vec() });
        }
        Ok(*self.0.value.iter().next().expect("one element"))
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.0.value.shape()
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.value.ndim()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.0.value.len()
    }

    /// The two dimensions of a rank-2 tensor.
    pub fn dims2(&self, op: &'static str) -> Result<(usize, usize)> {
        match *self.shape() {
            [a, b] => Ok((a, b)),
            _ => Err(self.rank_error(op, 2)),
        }
    }

    /// The four dimensions of a rank-4 (N, C, H, W) tensor.
    pub fn dims4(&self, op: &'static str) -> Result<(usize, usize, usize, usize)> {
        match *self.shape() {
            [a, b, c, d] => Ok((a, b, c, d)),
            _ => Err(self.rank_error(op, 4)),
        }
    }

    pub(crate) fn rank_error(&self, op: &'static str, expected: usize) -> Error {
        Error::RankMismatch { op, expected, got: self.rank(), shape: self.shape().to_vec() }
    }

    /// Whether every value is finite.
    pub fn all_finite(&self) -> bool {
        match self.0.value.as_slice_memory_order() {
            // A branch-free fold over blocks vectorises; `all` stops per element and does not.
            Some(s) => s.chunks(1024).all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite())),
            None => self.0.value.iter().all(|v| v.is_finite()),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.0.op.as_ref().map(|o| o.name()).unwrap_or("leaf");
        write!(f, "Tensor(id={:?}, shape={:?}, role={:?}, op={op})", self.0.id, self.shape(), self.0.role)
    }
}

impl From<ArrayD<f32>> for Tensor {
    fn from(a: ArrayD<f32>) -> Tensor {
        Tensor::new(a)
    }
}

/// `n` standard-normal samples (Marsaglia's polar method in f64, both outputs used) from `rng`. Exact like
/// Box–Muller, without its sine and cosine: a logarithm and a square root per pair, for 4/π draws of a point.
pub fn normal_vec(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u = 2.0 * rng.random::<f64>() - 1.0;
        let v = 2.0 * rng.random::<f64>() - 1.0;
        let s = u * u + v * v;
        if s >= 1.0 || s == 0.0 {
            continue;
        }
        let f = (-2.0 * s.ln() / s).sqrt();
        out.push((u * f) as f32);
        out.push((v * f) as f32);
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The normal samples have the standard normal's moments and quantiles: mean 0, variance 1, no skew, kurtosis
    /// 3, and the mass within 1, 2 and 3 σ (68.27%, 95.45%, 99.73%), on 400k draws (several standard errors
    /// each); odd lengths are cut from whole pairs.
    #[test]
    fn normal_vec_is_standard_normal() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        assert_eq!(normal_vec(&mut rng, 5).len(), 5);
        let z: Vec<f64> = normal_vec(&mut rng, 400_001).into_iter().map(f64::from).collect();
        let n = z.len() as f64;
        let moment = |k: i32| z.iter().map(|v| v.powi(k)).sum::<f64>() / n;
        assert!(moment(1).abs() < 0.01, "mean {}", moment(1));
        assert!((moment(2) - 1.0).abs() < 0.01, "variance {}", moment(2));
        assert!(moment(3).abs() < 0.03, "skew {}", moment(3));
        assert!((moment(4) - 3.0).abs() < 0.08, "kurtosis {}", moment(4));
        for (k, mass) in [(1.0, 0.682_689), (2.0, 0.954_500), (3.0, 0.997_300)] {
            let within = z.iter().filter(|v| v.abs() < k).count() as f64 / n;
            assert!((within - mass).abs() < 0.003, "within {k} σ: {within}");
        }
    }
}
