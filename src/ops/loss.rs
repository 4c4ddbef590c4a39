//! Softmax, log-softmax and the losses, all compositions of primitive ops (so their gradients come for free).

use ndarray::{ArrayD, IxDyn};

use crate::tensor::Tensor;
use crate::{Error, Result};

/// How a per-sample loss is reduced over the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The batch mean (PyTorch's default).
    #[default]
    Mean,
    /// The batch sum.
    Sum,
    /// One value per sample.
    None,
}

impl Reduction {
    fn apply(self, per_sample: Tensor) -> Result<Tensor> {
        match self {
            Reduction::Mean => per_sample.mean_all(),
            Reduction::Sum => Ok(per_sample.sum_all()),
            Reduction::None => Ok(per_sample),
        }
    }
}

/// Checks that `logits` is [N, C] with N = labels.len() > 0 and every label < C.
pub(crate) fn check_labels(op: &'static str, logits: &Tensor, labels: &[usize]) -> Result<(usize, usize)> {
    let (n, c) = logits.dims2(op)?;
    if n != labels.len() {
        return Err(Error::ShapeMismatch { op, expected: vec![n], got: vec![labels.len()] });
    }
    if n == 0 {
        return Err(Error::invalid(op, "empty batch"));
    }
    if let Some(&label) = labels.iter().find(|&&l| l >= c) {
        return Err(Error::LabelOutOfRange { op, label, num_classes: c });
    }
    Ok((n, c))
}

/// Softmax, log-softmax and losses.
impl Tensor {
    /// log softmax along `axis`: `x − m − ln Σ exp(x − m)` with `m` the (detached) maximum, so it never overflows.
    pub fn log_softmax(&self, axis: usize) -> Result<Tensor> {
        let m = self.max(axis, true)?.detach();
        let shifted = self.sub(&m)?;
        let lse = shifted.exp().sum(&[axis], true)?.log();
        shifted.sub(&lse)
    }

    /// softmax along `axis` (exp of [`Tensor::log_softmax`]).
    pub fn softmax(&self, axis: usize) -> Result<Tensor> {
        Ok(self.log_softmax(axis)?.exp())
    }

    /// Cross-entropy of logits [N, C] against integer labels, computed through log-softmax (stable).
    pub fn cross_entropy(&self, labels: &[usize], reduction: Reduction) -> Result<Tensor> {
        check_labels("cross_entropy", self, labels)?;
        self.log_softmax(1)?.nll_loss(labels, reduction)
    }

    /// Negative log-likelihood of log-probabilities [N, C]: `−logp[i, yᵢ]`.
    pub fn nll_loss(&self, labels: &[usize], reduction: Reduction) -> Result<Tensor> {
        check_labels("nll_loss", self, labels)?;
        reduction.apply(self.pick(labels)?.neg())
    }

    /// Mean squared error against `target` (same shape); with `Reduction::None`, per element.
    pub fn mse_loss(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        if self.shape() != target.shape() {
            return Err(Error::ShapeMismatch {
                op: "mse_loss",
                expected: self.shape().to_vec(),
                got: target.shape().to_vec(),
            });
        }
        let sq = self.sub(target)?.powf(2.0);
        match reduction {
            Reduction::Mean => sq.mean_all(),
            Reduction::Sum => Ok(sq.sum_all()),
            Reduction::None => Ok(sq),
        }
    }

    /// KL divergence as PyTorch's `kl_div(input, target)`: `self` holds log q [N, C], `target` holds p;
    /// per sample Σⱼ pⱼ (ln pⱼ − ln qⱼ), with 0·ln 0 = 0. `Mean` is the batch mean ("batchmean").
    pub fn kl_div(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        let (n, c) = self.dims2("kl_div")?;
        if target.shape() != [n, c] {
            return Err(Error::ShapeMismatch { op: "kl_div", expected: vec![n, c], got: target.shape().to_vec() });
        }
        let p = target.value();
        let plogp = p.mapv(|v| if v > 0.0 { v * v.ln() } else { 0.0 });
        let per = Tensor::new(plogp).sub(&target.mul(self)?)?;
        // Gradient w.r.t. the target (if tracked): ln p + 1 − ln q, through the log-term only where p > 0.
        let per = if target.is_tracked() {
            let safe = target.value().mapv(|v| v.max(f32::MIN_POSITIVE));
            let mask: ArrayD<bool> = target.value().mapv(|v| v > 0.0);
            let zeros = Tensor::zeros(&[n, c]);
            let logp = Tensor::where_(&mask, &target.maximum(&Tensor::new(safe))?.log(), &zeros)?;
            target.mul(&logp)?.sub(&target.mul(self)?)?
        } else {
            per
        };
        reduction.apply(per.sum(&[1], false)?)
    }

    /// Carlini–Wagner margin of logits [N, C]: `max_{j≠y} z_j − z_y` per sample (negative when classified as y).
    pub fn cw_margin(&self, labels: &[usize]) -> Result<Tensor> {
        let (n, c) = check_labels("cw_margin", self, labels)?;
        if c < 2 {
            return Err(Error::invalid("cw_margin", "needs at least two classes"));
        }
        let mut mask = ArrayD::from_elem(IxDyn(&[n, c]), false);
        for (i, &l) in labels.iter().enumerate() {
            mask[[i, l]] = true;
        }
        let others = self.masked_fill(&mask, f32::NEG_INFINITY)?.max(1, false)?;
        others.sub(&self.pick(labels)?)
    }
}
