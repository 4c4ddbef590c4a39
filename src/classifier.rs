//! The classifier contract every attack, defense, detector and evaluator programs against, and the
//! black-box views that expose only scores or only labels while counting queries.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ndarray::{Array2, Axis, Slice};
use rayon::prelude::*;

use crate::nn::Module;
use crate::ops::Reduction;
use crate::tensor::{enable_grad, grad_enabled, no_grad, Tensor};
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

/// What [`Classifier::activations`] returns: the logits and the requested intermediate activations of one forward
/// pass.
#[derive(Clone, Debug)]
pub struct Activations {
    /// Logits [N, classes]: the same values as [`Classifier::logits`].
    pub logits: Tensor,
    /// The requested activations, in the order asked, each with its name; every one has the batch axis first.
    pub layers: Vec<(String, Tensor)>,
}

impl Activations {
    /// The activation named `name`, if it was asked for.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.layers.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

/// The four [`Classifier`] methods a wrapper around another classifier usually passes through: the input shape,
/// class count and bounds of the wrapped classifier in the field `$inner`, and the wrapper's own pass counters in
/// the field `$counters`. Used inside `impl Classifier for Wrapper { … }`:
///
/// ```ignore
/// impl Classifier for Wrapper {
///     armoury::delegate_classifier!(inner, counters);
///     fn forward(&self, x: &Tensor) -> Result<Tensor> { … }
/// }
/// ```
#[macro_export]
macro_rules! delegate_classifier {
    ($inner:ident, $counters:ident) => {
        fn input_shape(&self) -> &[usize] {
            self.$inner.input_shape()
        }
        fn num_classes(&self) -> usize {
            self.$inner.num_classes()
        }
        fn bounds(&self) -> (f32, f32) {
            self.$inner.bounds()
        }
        fn counters(&self) -> &$crate::Counters {
            &self.$counters
        }
    };
}

/// An image classifier with known input bounds, input shape and class count.
///
/// Implementors provide [`Classifier::forward`] (differentiable logits, evaluation mode) and the metadata; the
/// rest — validated prediction, probabilities, loss gradients, gradients of any function of the logits and
/// pass counting — is provided. Implementors that can expose intermediate activations (layer taps, for coverage
/// metrics and feature-space detectors such as LID, Ma et al. 2018, or Mahalanobis, Lee et al. 2018) also
/// provide [`Classifier::layer_names`] and [`Classifier::forward_activations`]; [`Classifier::activations`] is
/// then provided.
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

    /// The names [`Classifier::activations`] accepts, in the order the forward pass computes them (for a native
    /// model the [`crate::Sequential`] child names, e.g. `conv1_relu`; for an ONNX model the graph's value
    /// names). Empty (the default) for a classifier that cannot tap.
    fn layer_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// Logits and the named activations of a batch from one forward pass, like [`Classifier::forward`]: on the
    /// graph, not validated, not counted, names not checked against [`Classifier::layer_names`] (the provided
    /// [`Classifier::activations`] does all that). The default taps nothing: it runs `forward` when no layer is
    /// asked for and is an error otherwise.
    fn forward_activations(&self, x: &Tensor, layers: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        match layers.first() {
            None => Ok((self.forward(x)?, Vec::new())),
            Some(name) => Err(crate::nn::unknown_layer("Classifier::activations", name, &self.layer_names())),
        }
    }

    /// The class meaning "rejected" when this classifier has one (a detector in front of a classifier:
    /// [`crate::detector::Guarded`]): attacks never count reaching it as a success and never pick it as a
    /// target.
    fn rejection_class(&self) -> Option<usize> {
        None
    }

    /// Checks that `x` is a non-empty, finite batch of the right shape, and that the classifier's own
    /// [`Classifier::bounds`] are finite with min < max (a custom classifier may get them wrong; attacks clamp to
    /// them).
    fn check_input(&self, x: &Tensor) -> Result<usize> {
        let (lo, hi) = self.bounds();
        if !(lo.is_finite() && hi.is_finite() && lo < hi) {
            return Err(Error::invalid("classifier", format!("bounds {:?} must be finite with min < max", (lo, hi))));
        }
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

    /// Samples per piece when the provided methods split a batch: `None` runs the whole batch at once.
    ///
    /// Splitting is exact only when each sample's output depends on that sample alone (evaluation mode: no batch
    /// statistics), which holds for the layers here; implementors whose forward mixes samples return `None`.
    /// The default, [`CHUNK`], is a constant so results do not depend on the machine.
    fn chunk_size(&self) -> Option<usize> {
        Some(CHUNK)
    }

    /// Logits [N, classes] with no graph recorded. Large batches run as pieces of [`Classifier::chunk_size`]
    /// samples in parallel; counted as one pass over N samples.
    fn logits(&self, x: &Tensor) -> Result<Array2<f32>> {
        let n = self.check_input(x)?;
        let classes = self.num_classes();
        let parts = in_chunks(x, n, self.chunk_size(), |xc, r| {
            let z = no_grad(|| self.forward(&xc))?;
            to_matrix(&z, r.len(), classes)
        })?;
        self.counters().add_forward(n);
        // A NaN logit (NaN weights, an overflow inside the model) has no argmax: every prediction would be 0.
        if parts.iter().any(|p| p.iter().any(|v| v.is_nan())) {
            return Err(Error::NonFinite { op: "classifier logits" });
        }
        Ok(concat_rows(parts, n, classes))
    }

    /// The logits and the activations named in `layers` (each one of [`Classifier::layer_names`]; in the order
    /// asked) from one forward pass, counted as one pass over N samples like [`Classifier::logits`], validated by
    /// [`Classifier::check_input`] and split into pieces of [`Classifier::chunk_size`] samples the same way, so
    /// the logits are bit for bit those of `logits`.
    ///
    /// Under [`no_grad`], or for an input that is not tracked, nothing is recorded: the tensors are constants.
    /// For a tracked input (e.g. [`Tensor::variable`]) with gradients enabled, every returned tensor is on the
    /// graph and differentiable with respect to `x`: `act.grad_wrt(&[&x])` gives ∂(a function of an activation)/∂x.
    /// That backward pass is the caller's and is not counted.
    ///
    /// An unknown name is an [`Error::InvalidArgument`] listing the valid ones; a classifier that cannot tap
    /// says so. An activation without the batch axis first (e.g. an ONNX shape computation) is an error.
    fn activations(&self, x: &Tensor, layers: &[&str]) -> Result<Activations> {
        let n = self.check_input(x)?;
        let valid = self.layer_names();
        if let Some(bad) = layers.iter().find(|l| !valid.iter().any(|v| v == *l)) {
            return Err(crate::nn::unknown_layer("Classifier::activations", bad, &valid));
        }
        let classes = self.num_classes();
        let tracked = grad_enabled() && x.is_tracked();
        let run = |xc: &Tensor, len: usize| -> Result<(Tensor, Vec<Tensor>)> {
            let (z, acts) = self.forward_activations(xc, layers)?;
            if z.shape() != [len, classes] {
                return Err(Error::ShapeMismatch {
                    op: "classifier output",
                    expected: vec![len, classes],
                    got: z.shape().to_vec(),
                });
            }
            if acts.len() != layers.len() {
                return Err(Error::invalid(
                    "Classifier::activations",
                    format!("{} activations returned for {} names", acts.len(), layers.len()),
                ));
            }
            if let Some((name, a)) = layers.iter().zip(&acts).find(|(_, a)| a.shape().first() != Some(&len)) {
                return Err(Error::invalid(
                    "Classifier::activations",
                    format!("'{name}' has shape {:?}, not one row per sample of the {len}", a.shape()),
                ));
            }
            Ok((z, acts))
        };
        let parts = if tracked {
            // On the graph: each piece is a differentiable slice of `x`, and the pieces are joined on the graph.
            match self.chunk_size() {
                Some(c) if c > 0 && n > c => {
                    let ranges: Vec<Range<usize>> = (0..n).step_by(c).map(|s| s..(s + c).min(n)).collect();
                    ranges
                        .into_par_iter()
                        .map(|r| enable_grad(|| run(&x.narrow(0, r.start, r.len())?, r.len())))
                        .collect::<Result<Vec<_>>>()?
                }
                _ => vec![run(x, n)?],
            }
        } else {
            in_chunks(x, n, self.chunk_size(), |xc, r| no_grad(|| run(&xc, r.len())))?
        };
        self.counters().add_forward(n);
        let join = || -> Result<Activations> {
            if parts.len() == 1 {
                let (logits, acts) = parts.into_iter().next().expect("one part");
                let layers = layers.iter().map(|l| l.to_string()).zip(acts).collect();
                return Ok(Activations { logits, layers });
            }
            let (zs, acts): (Vec<Tensor>, Vec<Vec<Tensor>>) = parts.into_iter().unzip();
            let logits = Tensor::concat(&zs, 0)?;
            let mut out = Vec::with_capacity(layers.len());
            for (k, name) in layers.iter().enumerate() {
                let pieces: Vec<Tensor> = acts.iter().map(|a| a[k].clone()).collect();
                out.push((name.to_string(), Tensor::concat(&pieces, 0)?));
            }
            Ok(Activations { logits, layers: out })
        };
        if tracked {
            enable_grad(join)
        } else {
            no_grad(join)
        }
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
        if x.rank() > 0 && labels.len() != x.shape()[0] {
            return Err(Error::ShapeMismatch {
                op: "cross_entropy",
                expected: vec![x.shape()[0]],
                got: vec![labels.len()],
            });
        }
        let f = |z: &Tensor, r: Range<usize>| z.cross_entropy(&labels[r], Reduction::None);
        let (loss, grad, _) = self.gradient(x, &f)?;
        Ok((loss, grad))
    }

    /// The value of `f` (one value per sample) and the gradient of its sum with respect to the input; also
    /// returns the logits. One forward and one backward pass, counted as one over N samples.
    ///
    /// `f` receives the logits [len, classes] of the samples `range` of `x` and must return one value per sample
    /// of that range (shape `[len]`). Large batches run as pieces of [`Classifier::chunk_size`] samples in
    /// parallel, so `f` must be *separable*: sample `i`'s value may depend only on row `i` of the logits (and on
    /// per-sample data such as `labels[range]`) — a batch mean or any other coupling between samples would be
    /// computed per piece.
    fn gradient(
        &self,
        x: &Tensor,
        f: &(dyn Fn(&Tensor, Range<usize>) -> Result<Tensor> + Sync),
    ) -> Result<(Vec<f32>, Tensor, Array2<f32>)> {
        self.gradient_through(x, &|xv: &Tensor, _| Ok(xv.clone()), f)
    }

    /// [`Classifier::gradient`] through a differentiable transform of the input: the value of `f` on the logits
    /// of `transform(x)` and the gradient of its sum with respect to `x` (DI²'s random resize-and-pad, an
    /// expectation over transformations). Checked, chunked, recorded under `enable_grad` and counted exactly like
    /// [`Classifier::gradient`]; the returned logits are those of the transformed input.
    ///
    /// `transform` receives the samples `range` of `x` (a recorded variable) and must return a batch of the same
    /// length that the model accepts, each sample depending on its own input alone (as `f` must be separable).
    fn gradient_through(
        &self,
        x: &Tensor,
        transform: &(dyn Fn(&Tensor, Range<usize>) -> Result<Tensor> + Sync),
        f: &(dyn Fn(&Tensor, Range<usize>) -> Result<Tensor> + Sync),
    ) -> Result<(Vec<f32>, Tensor, Array2<f32>)> {
        let n = self.check_input(x)?;
        let classes = self.num_classes();
        // enable_grad: a chunk may be stolen by a worker that is waiting inside a no_grad scope.
        let parts = in_chunks(x, n, self.chunk_size(), |xc, r| {
            enable_grad(|| {
                let xv = xc.variable();
                let z = self.forward(&transform(&xv, r.clone())?)?;
                let logits = to_matrix(&z, r.len(), classes)?;
                let value = f(&z, r.clone())?;
                if value.numel() != r.len() {
                    return Err(Error::ShapeMismatch {
                        op: "Classifier::gradient",
                        expected: vec![r.len()],
                        got: value.shape().to_vec(),
                    });
                }
                let grad = value.grad_wrt(&[&xv])?.pop().expect("one target, one gradient");
                Ok((value.to_vec(), grad, logits))
            })
        })?;
        self.counters().add_forward(n);
        self.counters().add_backward(n);
        if parts.len() == 1 {
            let (value, grad, logits) = parts.into_iter().next().expect("one part");
            return Ok((value, grad, logits));
        }
        let mut values = Vec::with_capacity(n);
        let mut grad = Vec::with_capacity(x.numel());
        let mut logits = Vec::with_capacity(parts.len());
        for (v, g, l) in parts {
            values.extend_from_slice(&v);
            match g.value().as_slice() {
                Some(s) => grad.extend_from_slice(s),
                None => grad.extend(g.value().iter().copied()),
            }
            logits.push(l);
        }
        Ok((values, Tensor::from_vec(grad, x.shape())?, concat_rows(logits, n, classes)))
    }
}

/// Samples per piece of the provided [`Classifier`] methods by default: small enough that a piece's activations
/// stay in cache and its buffers are reused instead of freshly mapped and page-faulted (the cnn's first
/// activation is 1.2 MB at 32 samples; at 64 samples a forward + input gradient of 1000 images took ~5× the page
/// faults and ~30% more CPU time), large enough to feed the GEMMs. A constant, not a function of the thread count,
/// so results are the same on every machine.
pub const CHUNK: usize = 32;

/// `f` on the pieces of `chunk` samples of `x` (all of `x` if it fits or `chunk` is `None`), in parallel, in order.
/// The pieces share `x`'s storage.
fn in_chunks<T: Send>(
    x: &Tensor,
    n: usize,
    chunk: Option<usize>,
    f: impl Fn(Tensor, Range<usize>) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    match chunk {
        Some(c) if c > 0 && n > c => {
            let ranges: Vec<Range<usize>> = (0..n).step_by(c).map(|s| s..(s + c).min(n)).collect();
            ranges
                .into_par_iter()
                .map(|r| {
                    let mut v = x.value().clone();
                    v.slice_axis_inplace(Axis(0), Slice::from(r.clone()));
                    f(Tensor::new(v), r)
                })
                .collect()
        }
        _ => Ok(vec![f(x.detach(), 0..n)?]),
    }
}

/// Stacks row blocks into one [n, classes] matrix.
fn concat_rows(parts: Vec<Array2<f32>>, n: usize, classes: usize) -> Array2<f32> {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let mut all = Vec::with_capacity(n * classes);
    for p in &parts {
        all.extend(p.iter().copied());
    }
    Array2::from_shape_vec((n, classes), all).expect("pieces cover the batch")
}

fn to_matrix(z: &Tensor, n: usize, classes: usize) -> Result<Array2<f32>> {
    if z.shape() != [n, classes] {
        return Err(Error::ShapeMismatch {
            op: "classifier output",
            expected: vec![n, classes],
            got: z.shape().to_vec(),
        });
    }
    // Row-major whatever the layout the forward pass produced (a concatenation along the class axis is not).
    Ok(z.value().as_standard_layout().into_owned().into_shape_with_order((n, classes)).expect("shape checked"))
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
        crate::limits::check_classes("ModuleClassifier::new", num_classes)?;
        crate::limits::checked_numel("ModuleClassifier::new: the input shape", input_shape)?;
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
    /// The module's [`Module::tap_names`].
    fn layer_names(&self) -> Vec<String> {
        self.module.tap_names()
    }
    /// The module's [`Module::forward_taps`], in the classifier's mode.
    fn forward_activations(&self, x: &Tensor, layers: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        self.module.forward_taps(x, self.train_mode, layers)
    }
    fn chunk_size(&self) -> Option<usize> {
        // Training mode may use batch statistics, which couple the samples: run the batch whole.
        (!self.train_mode).then_some(CHUNK)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{cnn, mlp};

    fn classifiers() -> Vec<(&'static str, ModuleClassifier)> {
        vec![
            ("cnn", ModuleClassifier::new(cnn(0), &[1, 28, 28], 10, (0.0, 1.0)).unwrap()),
            ("mlp", ModuleClassifier::new(mlp(0), &[1, 28, 28], 10, (0.0, 1.0)).unwrap()),
        ]
    }

    fn rows(t: &Tensor, r: Range<usize>) -> Vec<f32> {
        let per = t.numel() / t.shape()[0];
        t.to_vec()[r.start * per..r.end * per].to_vec()
    }

    fn batch(x: &Tensor, r: Range<usize>) -> Tensor {
        Tensor::from_vec(rows(x, r.clone()), &[r.len(), 1, 28, 28]).unwrap()
    }

    #[test]
    fn results_are_bit_identical_whatever_the_batch_size() {
        let n = 1000;
        let x = Tensor::uniform(&[n, 1, 28, 28], 0.0, 1.0, 7);
        let labels: Vec<usize> = (0..n).map(|i| (i * 7) % 10).collect();
        for (name, clf) in classifiers() {
            let logits = clf.logits(&x).unwrap();
            let (loss, grad) = clf.loss_gradient(&x, &labels).unwrap();
            // Windows that start mid-piece and straddle piece boundaries of the full batch.
            for r in [999..1000, 0..1, 61..68, 300..307, 500..628, 0..1000] {
                let xb = batch(&x, r.clone());
                let lb = clf.logits(&xb).unwrap();
                assert_eq!(lb, logits.slice(ndarray::s![r.clone(), ..]), "{name} logits {r:?}");
                let (lossb, gradb) = clf.loss_gradient(&xb, &labels[r.clone()]).unwrap();
                assert_eq!(lossb, loss[r.clone()], "{name} loss {r:?}");
                assert!(rows(&grad, r.clone()) == gradb.to_vec(), "{name} gradient {r:?}");
            }
        }
    }

    #[test]
    fn results_are_bit_identical_whatever_the_thread_count() {
        let x = Tensor::uniform(&[300, 1, 28, 28], 0.0, 1.0, 8);
        let labels: Vec<usize> = (0..300).map(|i| (i * 3) % 10).collect();
        let pool = |t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap();
        for (name, clf) in classifiers() {
            for r in [0..300, 5..6] {
                let xb = batch(&x, r.clone());
                let run = |t| {
                    pool(t).install(|| {
                        let (loss, grad) = clf.loss_gradient(&xb, &labels[r.clone()]).unwrap();
                        (clf.logits(&xb).unwrap(), loss, grad.to_vec())
                    })
                };
                assert!(run(1) == run(2), "{name} {r:?}: 1 vs 2 threads");
                assert!(run(1) == run(3), "{name} {r:?}: 1 vs 3 threads");
            }
        }
    }

    #[test]
    fn pieces_count_as_one_call_and_train_mode_runs_whole() {
        let (_, clf) = classifiers().remove(0);
        let x = Tensor::uniform(&[150, 1, 28, 28], 0.0, 1.0, 9);
        let labels = vec![1; 150];
        clf.logits(&x).unwrap();
        clf.loss_gradient(&x, &labels).unwrap();
        let c = clf.counters().snapshot();
        assert_eq!((c.forward_calls, c.forward_samples, c.backward_calls, c.backward_samples), (2, 300, 1, 150));
        assert!(clf.loss_gradient(&x, &labels[..149]).is_err());
        assert_eq!(clf.chunk_size(), Some(CHUNK));
        let clf = ModuleClassifier::new(cnn(0), &[1, 28, 28], 10, (0.0, 1.0)).unwrap().with_train_mode(true);
        assert_eq!(clf.chunk_size(), None);
        // f must give one value per sample.
        let scalar = |z: &Tensor, _: Range<usize>| Ok(z.sum_all());
        assert!(clf.gradient(&x, &scalar).is_err());
    }
}
