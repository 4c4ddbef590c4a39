//! Softmax, log-softmax and the losses: compositions of primitive ops (so their gradients come for free), except
//! the softmax along the last axis, one fused op with its own backward (each transformer block's attention runs
//! it on [batch, heads, tokens, tokens]; the composition took seven passes each way, 10% of ViT-B/16's time).

use std::mem::MaybeUninit;

use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;

use super::{record, vmath, Op, PAR_THRESHOLD};
use crate::tensor::{Array, Tensor};
use crate::{Error, Result};

/// Rows per parallel task of the fused softmax (each row is computed alone, so the split changes nothing).
const SOFTMAX_ROWS: usize = 64;

/// `f(first row, block of outputs)` over blocks of [`SOFTMAX_ROWS`] rows of `d` values, in parallel when large,
/// each block written whole by `f`; the `len` outputs, with no zero-fill before (a pass over 7 MB a call for
/// ViT-B/16's attention).
fn softmax_blocks(len: usize, d: usize, f: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send) -> Vec<f32> {
    let block = SOFTMAX_ROWS * d;
    // SAFETY: `f` writes every block whole (its callers write each row of theirs).
    unsafe {
        super::written(len, |slots| {
            if len >= PAR_THRESHOLD {
                slots.par_chunks_mut(block).enumerate().for_each(|(i, o)| f(i * SOFTMAX_ROWS, o));
            } else {
                slots.chunks_mut(block).enumerate().for_each(|(i, o)| f(i * SOFTMAX_ROWS, o));
            }
        })
    }
}

/// The fused softmax along the last axis (see [`Tensor::softmax`]): per row the maximum `m`, `e = exp(x − m)` on
/// the vector loops, their sum `s` in sixteen lanes added in a fixed order ([`vmath::lane_sum`]: not one chain of
/// dependent additions per row), then `e / s`.
fn softmax_last(x: &Tensor) -> Tensor {
    let d = x.shape()[x.rank() - 1];
    let xs = super::shape::standard(x.value());
    let out = softmax_blocks(xs.len(), d, |row0, o| {
        for (i, or) in o.chunks_exact_mut(d).enumerate() {
            let xr = &xs[(row0 + i) * d..][..d];
            // NaN propagates as in the composition: it is never the maximum, but x − m is NaN for it.
            let m = vmath::lane_max(xr);
            vmath::map_into(xr, or, &|v| vmath::exp(v - m));
            // SAFETY: `map_into` wrote every element of the row.
            let or = unsafe { &mut *(or as *mut [MaybeUninit<f32>] as *mut [f32]) };
            let s = vmath::lane_sum(or, or, |e, _| e);
            or.iter_mut().for_each(|v| *v /= s);
        }
    });
    let value = ArrayD::from_shape_vec(IxDyn(x.shape()), out).expect("one value per input");
    record(value, Op::Softmax(x.clone()))
}

/// The softmax's input gradient from its output `y` and the output's gradient `g`: `y·(g − Σ g·y)` per row.
pub(crate) fn softmax_backward(y: &Array, g: &ArrayD<f32>) -> ArrayD<f32> {
    let d = y.shape()[y.ndim() - 1];
    let (ys, gs) = (super::shape::standard(y), super::shape::standard(g));
    let out = softmax_blocks(ys.len(), d, |row0, o| {
        for (i, or) in o.chunks_exact_mut(d).enumerate() {
            let (yr, gr) = (&ys[(row0 + i) * d..][..d], &gs[(row0 + i) * d..][..d]);
            let dot = vmath::lane_sum(yr, gr, |y, g| y * g);
            for ((o, &y), &g) in or.iter_mut().zip(yr).zip(gr) {
                o.write(y * (g - dot));
            }
        }
    });
    ArrayD::from_shape_vec(IxDyn(y.shape()), out).expect("one gradient per output")
}

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

    /// softmax along `axis`: `exp(x − m) / Σ exp(x − m)` with `m` the row's maximum, so it never overflows. Along
    /// the last axis (attention's scores) one fused op, a pass for the maximum and one for the exponentials and
    /// their sum per row, and its backward `y·(g − Σ g·y)` in one pass; along another axis the composition
    /// (exp of [`Tensor::log_softmax`]).
    pub fn softmax(&self, axis: usize) -> Result<Tensor> {
        if self.rank() > 0 && axis == self.rank() - 1 && self.shape()[axis] > 0 {
            return Ok(softmax_last(self));
        }
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

#[cfg(test)]
mod tests {
    use crate::Tensor;

    /// The fused softmax gives the composition's values and input gradients (to rounding), and the same NaN and
    /// −∞ behaviour: a row with a NaN is all NaN, a masked (−∞) score gets 0.
    #[test]
    fn fused_softmax_matches_the_composition() {
        let mut x = Tensor::uniform(&[5, 7, 33], -6.0, 6.0, 1).to_array();
        x[[0, 0, 3]] = f32::NAN;
        x[[1, 2, 5]] = f32::NEG_INFINITY;
        let x = Tensor::new(x).variable();
        let r = Tensor::uniform(&[5, 7, 33], -1.0, 1.0, 2);
        let fused = x.softmax(2).unwrap();
        let composed = x.log_softmax(2).unwrap().exp();
        for (i, (&a, &b)) in fused.to_vec().iter().zip(&composed.to_vec()).enumerate() {
            assert!(a.is_nan() == b.is_nan() && (a.is_nan() || (a - b).abs() <= 1e-6), "value {i}: {a} vs {b}");
        }
        assert!(fused.to_array()[[0, 0, 0]].is_nan() && fused.to_array()[[1, 2, 5]] == 0.0);
        let gf = fused.mul(&r).unwrap().sum_all().grad_wrt(&[&x]).unwrap();
        let gc = composed.mul(&r).unwrap().sum_all().grad_wrt(&[&x]).unwrap();
        for (i, (&a, &b)) in gf[0].to_vec().iter().zip(&gc[0].to_vec()).enumerate().skip(33) {
            assert!((a - b).abs() <= 1e-5, "gradient {i}: {a} vs {b}");
        }
    }
}
