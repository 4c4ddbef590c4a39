//! The tensor: a cheap, immutable handle on an f32 n-d array and the operation that made it.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ndarray::{ArcArray, ArrayD, IxDyn};
use rand::Rng;

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

    /// The id as a number (ids count up from 1 and are never reused).
    pub(crate) fn as_u64(self) -> u64 {
        self.0
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
    /// What an op derived from `value` and keeps for its next call (see [`Tensor::memo`]); made on first use, or
    /// shared with the earlier nodes of the same value ([`Tensor::from_node_sharing`]).
    derived: std::sync::OnceLock<MemoSlot>,
}

/// A value kept by [`Tensor::memo`].
type Memo = Arc<dyn std::any::Any + Send + Sync>;

/// The slot of [`Tensor::memo`]: up to [`MEMO_KEYS`] keys and their values, the least recently made first.
pub(crate) type MemoSlot = Arc<std::sync::Mutex<Vec<(u64, Memo)>>>;

/// The values a tensor keeps at most: a convolution weight's flipped layout (the input gradient's) and its
/// Winograd transforms, forward and flipped, and a fold of it — more keys than that means its uses changed, and
/// the least recently made value goes.
const MEMO_KEYS: usize = 4;

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
        Tensor(Arc::new(Node { id: TensorId::fresh(), value, role, op, derived: Default::default() }))
    }

    /// [`Tensor::from_node`] with the memo slot `slot`, shared with other nodes of the same value: what one of them
    /// keeps ([`Tensor::derived`]) the others find. For a value kept across calls under nodes made afresh each
    /// call (a BatchNorm folded into a tracked weight: the flipped weight of the input gradient is then made once,
    /// not every pass). Nothing kept in the slot may hold a node that shares it (it would never be freed).
    pub(crate) fn from_node_sharing(value: Array, role: Role, op: Option<Op>, slot: MemoSlot) -> Tensor {
        let derived = std::sync::OnceLock::new();
        let _ = derived.set(slot);
        Tensor(Arc::new(Node { id: TensorId::fresh(), value, role, op, derived }))
    }

    /// `make(value)`, computed on the first call with this `key` and kept with the tensor for the next (a tensor's
    /// value never changes, so the copy stays valid for the tensor's life and is freed with it). Up to four keys
    /// are kept; a fifth replaces the least recently made. For layouts an op rearranges a weight into on every call — the flipped,
    /// transposed convolution weight of the input gradient, read by every backward pass of an attack.
    pub(crate) fn derived(&self, key: u64, make: impl FnOnce(&Array) -> Vec<f32>) -> Arc<Vec<f32>> {
        match self.memo(key, |v| Ok::<_, std::convert::Infallible>(make(v))) {
            Ok(v) => v,
        }
    }

    /// [`Tensor::derived`] for any value and a fallible `make` (an error is returned and nothing kept): the slot
    /// holds values of any type; a kept value of another type under the same key is made again.
    pub(crate) fn memo<T: std::any::Any + Send + Sync, E>(
        &self,
        key: u64,
        make: impl FnOnce(&Array) -> std::result::Result<T, E>,
    ) -> std::result::Result<Arc<T>, E> {
        let mut slot = self.0.derived.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, v)) = slot.iter().find(|(k, _)| *k == key) {
            if let Ok(v) = v.clone().downcast::<T>() {
                return Ok(v);
            }
        }
        let v = Arc::new(make(&self.0.value)?);
        slot.retain(|(k, _)| *k != key);
        if slot.len() == MEMO_KEYS {
            slot.remove(0);
        }
        slot.push((key, v.clone()));
        Ok(v)
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
        let expected = crate::limits::checked_numel("Tensor::from_vec", shape)?;
        if expected != data.len() {
            return Err(Error::ShapeMismatch { op: "from_vec", expected: shape.to_vec(), got: vec![data.len()] });
        }
        let a = ArrayD::from_shape_vec(IxDyn(shape), data)
            .map_err(|e| Error::invalid("Tensor::from_vec", e.to_string()))?;
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
        let mut rng = crate::seed::rng(seed);
        Tensor::new(ArrayD::from_shape_simple_fn(IxDyn(shape), || lo + (hi - lo) * rng.random::<f32>()))
    }

    /// Normal samples N(mean, std²) from a ChaCha8 generator seeded with `seed` ([`crate::seed::normal_vec`]).
    pub fn normal(shape: &[usize], mean: f32, std: f32, seed: u64) -> Tensor {
        let mut rng = crate::seed::rng(seed);
        let n: usize = shape.iter().product();
        let v = crate::seed::normal_vec(&mut rng, n);
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

    /// Whether no op made this tensor and another handle holds it too (a layer's parameter slot, an imported
    /// graph's constants): a weight, kept across calls, so a layout kept with it ([`Tensor::derived`]) is worth
    /// making for the next call — unlike a view made afresh for one call (`w.t()` with gradients off is a new
    /// leaf), whose kept layout would be made on every call and freed after it.
    pub(crate) fn is_kept_leaf(&self) -> bool {
        self.0.op.is_none() && Arc::strong_count(&self.0) > 1
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

#[cfg(test)]
mod tests {
    use super::Tensor;

    /// A derived layout is made once per key and shared; another key replaces it; a copy of the handle shares
    /// it, a new tensor with the same values does not.
    #[test]
    fn derived_is_made_once_per_key() {
        let t = Tensor::from_slice(&[1.0, 2.0, 3.0], &[3]).unwrap();
        let calls = std::cell::Cell::new(0);
        let make = |v: &super::Array| {
            calls.set(calls.get() + 1);
            let mut r: Vec<f32> = v.iter().copied().collect();
            r.reverse();
            r
        };
        let a = t.derived(1, make);
        let b = t.clone().derived(1, make);
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        assert_eq!((a.as_slice(), calls.get()), (&[3.0, 2.0, 1.0][..], 1));
        // Other keys are kept beside it, up to four in all; a fifth replaces the least recently made.
        t.derived(2, make);
        t.derived(1, make);
        assert_eq!(calls.get(), 2);
        t.derived(3, make);
        t.derived(4, make);
        t.derived(1, make);
        assert_eq!(calls.get(), 4);
        t.derived(5, make);
        t.derived(2, make);
        assert_eq!(calls.get(), 5, "the fifth key replaced the first made (key 1), not key 2");
        t.derived(1, make);
        assert_eq!(calls.get(), 6);
        Tensor::from_slice(&[1.0, 2.0, 3.0], &[3]).unwrap().derived(1, make);
        assert_eq!(calls.get(), 7);
    }
}
