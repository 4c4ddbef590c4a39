//! The classifier contract every attack, defense, detector and evaluator programs against, and the
//! black-box views that expose only scores or only labels while counting queries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ndarray::Array2;

use crate::nn::Module;
use crate::ops::Reduction;
use crate::tensor::{no_grad, Tensor};
use crate::{Error, Result};

/// Forward and backward passes a classifier has run, in calls and in samples.
#[derive(Debug, Default)]
pub struct Counters {
    forward_calls: AtomicU64,
    forward_samples: AtomicU64,
    backward_calls: AtomicU64,
    backward_samples: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountSnapshot {
    /// Forward calls.
    pub forward_calls: u64,
    /// Samples passed forward.
    pub forward_samples: u64,
    /// Backward (gradient) calls.
    pub backward_calls: u64,
    /// Samples whose input gradient was computed.
    pub backward_samples: u64,
}

impl Counters {
    /// Records a forward pass over `n` samples.
    pub fn add_forward(&self, n: usize) {
        self.forward_calls.fetch_add(1, Ordering::Relaxed);
        self.forward_samples.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a backward pass over `n` samples.
    pub fn add_backward(&self, n: usize) {
        self.backward_calls.fetch_add(1, Ordering::Relaxed);
        self.backward_samples.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The current counts.
    pub fn snapshot(&self) -> CountSnapshot {
        CountSnapshot {
            forward_calls: self.forward_calls.load(Ordering::Relaxed),
            forward_samples: self.forward_samples.load(Ordering::Relaxed),
            backward_calls: self.backward_calls.load(Ordering::Relaxed),
            backward_samples: self.backward_samples.load(Ordering::Relaxed),
        }
    }

    /// Sets every count to zero.
    pub fn reset(&self) {
        for c in [&self.forward_calls, &self.forward_samples, &self.backward_calls, &self.backward_samples] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// An image classifier with known input bounds, input shape and class count.
///
/// Implementors provide [`Classifier::forward`] (differentiable logits, evaluation mode) and the metadata; the
/// rest — validated prediction, probabilities, loss gradients, gradients of any function of the logits and
/// pass counting — is provided.
pub trait Classifier: Send + Sync {
    /// Shape of one input, e.g. `[1, 28, 28]` (C, H, W).
    fn input_shape(&self) -> &[usize];

    /// Number of classes.
    fn num_classes(&self) -> usize;

    /// Valid input range `(min, max)`; ε is always in these units.
    fn bounds(&self) -> (f32, f32);

    /// Differentiable logits [N, classes] of a batch [N, C, H, W], in evaluation mode. Does not validate or
    /// count; use the provided methods.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Pass counters.
    fn counters(&self) -> &Counters;

    /// Checks that `x` is a non-empty, finite batch of the right shape.
    fn check_input(&self, x: &Tensor) -> Result<usize> {
        let shape = self.input_shape();
        if x.rank() != shape.len() + 1 {
            return Err(Error::RankMismatch {
                op: "classifier",
                expected: shape.len() + 1,
                got: x.rank(),
                shape: x.shape().to_vec(),
            });
        }
        if &x.shape()[1..] != shape {
            let mut expected = vec![x.shape()[0]];
            expected.extend_from_slice(shape);
            return Err(Error::ShapeMismatch { op: "classifier", expected, got: x.shape().to_vec() });
        }
        if x.shape()[0] == 0 {
            return Err(Error::invalid("classifier", "empty batch"));
        }
        if !x.all_finite() {
            return Err(Error::NonFinite { op: "classifier" });
        }
        Ok(x.shape()[0])
    }

    /// Logits [N, classes] with no graph recorded.
    fn logits(&self, x: &Tensor) -> Result<Array2<f32>> {
        let n = self.check_input(x)?;
        self.counters().add_forward(n);
        let z = no_grad(|| self.forward(&x.detach()))?;
        to_matrix(&z, n, self.num_classes())
    }

    /// Softmax probabilities [N, classes].
    fn probabilities(&self, x: &Tensor) -> Result<Array2<f32>> {
        Ok(softmax_rows(&self.logits(x)?))
    }

    /// Predicted class of each sample (first maximum).
    fn predict(&self, x: &Tensor) -> Result<Vec<usize>> {
        Ok(argmax_rows(&self.logits(x)?))
    }

    /// Per-sample cross-entropy and its gradient with respect to the input, in one forward and one backward.
    /// The gradient is of the summed loss, so each sample's gradient is that of its own loss.
    fn loss_gradient(&self, x: &Tensor, labels: &[usize]) -> Result<(Vec<f32>, Tensor)> {
        let (loss, grad, _) = self.gradient(x, &|z: &Tensor| z.cross_entropy(labels, Reduction::None))?;
        Ok((loss, grad))
    }

    /// The value of `f(logits)` (one value per sample, or a scalar) and the gradient of its sum with respect
    /// to the input; also returns the logits. One forward and one backward pass.
    fn gradient(&self, x: &Tensor, f: &dyn Fn(&Tensor) -> Result<Tensor>) -> Result<(Vec<f32>, Tensor, Array2<f32>)> {
        let n = self.check_input(x)?;
        let xv = x.detach().variable();
        let z = self.forward(&xv)?;
        let logits = to_matrix(&z, n, self.num_classes())?;
        let value = f(&z)?;
        self.counters().add_forward(n);
        self.counters().add_backward(n);
        let grad = value.grad_wrt(&[&xv])?.pop().expect("one target, one gradient");
        Ok((value.to_vec(), grad, logits))
    }
}

fn to_matrix(z: &Tensor, n: usize, classes: usize) -> Result<Array2<f32>> {
    if z.shape() != [n, classes] {
        return Err(Error::ShapeMismatch {
            op: "classifier output",
            expected: vec![n, classes],
            got: z.shape().to_vec(),
        });
    }
    Ok(z.value().to_owned().into_shape_with_order((n, classes)).expect("shape checked"))
}

/// Row-wise softmax of a logit matrix (stable).
pub fn softmax_rows(z: &Array2<f32>) -> Array2<f32> {
    let mut p = z.clone();
    for mut row in p.rows_mut() {
        let m = row.fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        row.mapv_inplace(|v| (v - m).exp());
        let s = row.sum();
        row.mapv_inplace(|v| v / s);
    }
    p
}

/// Index of the first maximum of each row.
pub fn argmax_rows(z: &Array2<f32>) -> Vec<usize> {
    z.rows()
        .into_iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) })
                .0
        })
        .collect()
}

/// Any [`Module`] as a [`Classifier`]: runs it in evaluation mode (or training mode if asked).
pub struct ModuleClassifier {
    module: Arc<dyn Module>,
    input_shape: Vec<usize>,
    num_classes: usize,
    bounds: (f32, f32),
    train_mode: bool,
    counters: Counters,
}

impl ModuleClassifier {
    /// Wraps `module` with its input shape (C, H, W), class count and input bounds.
    pub fn new(
        module: impl Module + 'static,
        input_shape: &[usize],
        num_classes: usize,
        bounds: (f32, f32),
    ) -> Result<Self> {
        if !bounds.0.is_finite() || !bounds.1.is_finite() || bounds.0 >= bounds.1 {
            return Err(Error::invalid(
                "ModuleClassifier::new",
                format!("bounds {bounds:?} must be finite with min < max"),
            ));
        }
        if num_classes < 2 || input_shape.is_empty() || input_shape.contains(&0) {
            return Err(Error::invalid(
                "ModuleClassifier::new",
                format!("{num_classes} classes, input shape {input_shape:?}"),
            ));
        }
        Ok(ModuleClassifier {
            module: Arc::new(module),
            input_shape: input_shape.to_vec(),
            num_classes,
            bounds,
            train_mode: false,
            counters: Counters::default(),
        })
    }

    /// Runs the module in training mode (dropout on, batch statistics) — only when the caller asks for it.
    pub fn with_train_mode(mut self, train: bool) -> Self {
        self.train_mode = train;
        self
    }

    /// The wrapped module.
    pub fn module(&self) -> &Arc<dyn Module> {
        &self.module
    }
}

impl Classifier for ModuleClassifier {
    fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }
    fn num_classes(&self) -> usize {
        self.num_classes
    }
    fn bounds(&self) -> (f32, f32) {
        self.bounds
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.module.forward_t(x, self.train_mode)
    }
    fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// A score-only view of a classifier: probabilities, no gradients; every sample queried is counted.
pub struct ScoreOracle<'a> {
    inner: &'a dyn Classifier,
    queries: AtomicU64,
}

impl<'a> ScoreOracle<'a> {
    /// Wraps a classifier.
    pub fn new(inner: &'a dyn Classifier) -> Self {
        ScoreOracle { inner, queries: AtomicU64::new(0) }
    }
    /// Probabilities [N, classes]; counts N queries.
    pub fn probabilities(&self, x: &Tensor) -> Result<Array2<f32>> {
        let p = self.inner.probabilities(x)?;
        self.queries.fetch_add(p.nrows() as u64, Ordering::Relaxed);
        Ok(p)
    }
    /// Queries so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
    /// Input shape, class count and bounds (public knowledge about the model).
    pub fn meta(&self) -> (&[usize], usize, (f32, f32)) {
        (self.inner.input_shape(), self.inner.num_classes(), self.inner.bounds())
    }
}

/// A label-only view of a classifier: top-1 labels only; every sample queried is counted.
pub struct LabelOracle<'a> {
    inner: &'a dyn Classifier,
    queries: AtomicU64,
}

impl<'a> LabelOracle<'a> {
    /// Wraps a classifier.
    pub fn new(inner: &'a dyn Classifier) -> Self {
        LabelOracle { inner, queries: AtomicU64::new(0) }
    }
    /// Top-1 labels; counts N queries.
    pub fn labels(&self, x: &Tensor) -> Result<Vec<usize>> {
        let l = self.inner.predict(x)?;
        self.queries.fetch_add(l.len() as u64, Ordering::Relaxed);
        Ok(l)
    }
    /// Queries so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
    /// Input shape, class count and bounds.
    pub fn meta(&self) -> (&[usize], usize, (f32, f32)) {
        (self.inner.input_shape(), self.inner.num_classes(), self.inner.bounds())
    }
}
