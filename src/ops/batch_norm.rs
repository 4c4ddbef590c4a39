//! Batch normalisation over axis 1 (the channels of [N, C, …]), fused: one statistics pass and one
//! normalise-and-affine pass forward, one pass for the two per-channel sums and one for ∂x backward.
//!
//! A fused primitive rather than the composition mean, sub, pow, mean, add, pow, mul, mul, add: that takes nine
//! broadcasting passes over the activations forward and as many temporaries, and twice that backward, on every
//! BatchNorm of a network in training mode (issue 32: a ResNet training step at 0.25× PyTorch).
//!
//! Determinism and accuracy: a channel's values are cut into blocks of about [`BLOCK`] values by the shape alone
//! (a block is several whole planes, or a fixed run of one plane), each block is summed in f32 lanes in a fixed
//! order, and the blocks are combined in f64 in order. The variance is two-pass within a block (about the block's
//! own mean, the block still in L1) and the blocks' centred sums are recombined exactly about the channel's mean,
//! so it neither depends on the thread count nor cancels when the mean is large against the spread.

use std::ops::Range;

use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;

use super::shape::standard;
use super::{record, Op, PAR_THRESHOLD};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Values per block of a channel's statistics (whole planes are grouped up to it, longer planes are cut at it).
const BLOCK: usize = 2048;
/// Independent f32 accumulators of a block's sums.
const LANES: usize = 16;

/// What [`Op::BatchNorm`] keeps for its backward.
pub(crate) struct BatchNormSaved {
    pub(crate) x: Tensor,
    pub(crate) scale: Tensor,
    pub(crate) bias: Tensor,
    /// Per channel, the mean the forward subtracted and 1/√(var + ε) it multiplied by.
    pub(crate) mean: Vec<f32>,
    pub(crate) rstd: Vec<f32>,
    /// Batch statistics (training): the mean and variance depend on x, and ∂x has their two terms.
    pub(crate) batch_stats: bool,
    /// A ReLU fused after it (given statistics only): the output is `max(y, 0)` and the gradient passes where it is
    /// positive.
    pub(crate) relu: bool,
}

/// Which statistics normalise.
pub(crate) enum Stats<'a> {
    /// The batch's own mean and biased variance (training).
    Batch,
    /// Given per-channel mean and variance (evaluation: the running statistics).
    Given { mean: &'a [f32], var: &'a [f32] },
}

/// The shape as (N, C, S): samples, channels and values per channel per sample.
fn dims(op: &'static str, x: &Tensor) -> Result<(usize, usize, usize)> {
    if x.rank() < 2 {
        return Err(Error::invalid(op, format!("input of shape {:?} has no channel axis (rank < 2)", x.shape())));
    }
    let s = x.shape()[2..].iter().product();
    Ok((x.shape()[0], x.shape()[1], s))
}

/// The blocks of one channel's values: (samples, positions within the plane) of each, in order.
fn blocks(n: usize, s: usize) -> Vec<(Range<usize>, Range<usize>)> {
    if s >= BLOCK {
        (0..n).flat_map(|i| (0..s).step_by(BLOCK).map(move |p| (i..i + 1, p..(p + BLOCK).min(s)))).collect()
    } else {
        let per = (BLOCK / s.max(1)).max(1);
        (0..n).step_by(per).map(|i| (i..(i + per).min(n), 0..s)).collect()
    }
}

/// Adds `f(a[i], b[i])` into the lane accumulators, lane `i mod LANES`.
#[inline(always)]
fn accumulate(acc: &mut [f32; LANES], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (ca, cb) in ca.zip(cb) {
        for ((acc, &a), &b) in acc.iter_mut().zip(ca).zip(cb) {
            *acc += f(a, b);
        }
    }
    for ((acc, &a), &b) in acc.iter_mut().zip(ta).zip(tb) {
        *acc += f(a, b);
    }
}

/// The lanes summed by a fixed pairwise tree.
#[inline(always)]
fn fold(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0]
}

/// Channel `c`'s mean and biased variance (f64), from `x` laid out as [N, C, S].
#[inline(always)]
fn channel_stats(x: &[f32], (n, c, s): (usize, usize, usize), ch: usize) -> (f64, f64) {
    let plane = |i: usize, p: &Range<usize>| &x[(i * c + ch) * s..][p.clone()];
    // Per block: values, centre, Σ(v − centre), Σ(v − centre)².
    let mut parts = Vec::new();
    let mut total = 0.0f64;
    for (samples, pos) in blocks(n, s) {
        let mut acc = [0.0f32; LANES];
        for i in samples.clone() {
            let v = plane(i, &pos);
            accumulate(&mut acc, v, v, |v, _| v);
        }
        let sum = fold(acc);
        let count = samples.len() * pos.len();
        let centre = sum / count as f32;
        let (mut lin, mut sq) = ([0.0f32; LANES], [0.0f32; LANES]);
        for i in samples {
            let v = plane(i, &pos);
            accumulate(&mut lin, v, v, |v, _| v - centre);
            accumulate(&mut sq, v, v, |v, _| (v - centre) * (v - centre));
        }
        total += sum as f64;
        parts.push((count as f64, centre as f64, fold(lin) as f64, fold(sq) as f64));
    }
    let m = (n * s) as f64;
    let mean = total / m;
    // Σ(v − μ)² = Σ(v − centre)² − 2(μ − centre)·Σ(v − centre) + count·(μ − centre)², block by block.
    let m2: f64 =
        parts.iter().map(|&(k, centre, lin, sq)| sq - 2.0 * (mean - centre) * lin + k * (mean - centre).powi(2)).sum();
    (mean, (m2 / m).max(0.0))
}

/// Channel `c`'s Σg and Σg·(x − μ) (f64), from `g` and `x` laid out as [N, C, S].
#[inline(always)]
fn channel_grad_sums(g: &[f32], x: &[f32], (n, c, s): (usize, usize, usize), ch: usize, mu: f32) -> (f64, f64) {
    let (mut sg, mut sgx) = (0.0f64, 0.0f64);
    for (samples, pos) in blocks(n, s) {
        let (mut a, mut b) = ([0.0f32; LANES], [0.0f32; LANES]);
        for i in samples {
            let at = (i * c + ch) * s;
            let (gv, xv) = (&g[at..][pos.clone()], &x[at..][pos.clone()]);
            accumulate(&mut a, gv, xv, |g, _| g);
            accumulate(&mut b, gv, xv, |g, x| g * (x - mu));
        }
        sg += fold(a) as f64;
        sgx += fold(b) as f64;
    }
    (sg, sgx)
}

/// `f(channel)` for every channel, in parallel when the tensor has at least [`PAR_THRESHOLD`] values; each channel
/// is computed alone, so the results do not depend on the thread count.
fn per_channel<T: Send>(c: usize, len: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    if len >= PAR_THRESHOLD {
        (0..c).into_par_iter().map(f).collect()
    } else {
        (0..c).map(f).collect()
    }
}

/// `out[(i, ch, ·)] = f(ch, in-plane offset range)` plane by plane: `f(ch, first flat index, out plane)`, in
/// parallel over fixed runs of planes when there is enough work (each value is computed alone).
fn per_plane<T: Send>(out: &mut [T], c: usize, s: usize, f: impl Fn(usize, usize, &mut [T]) + Sync + Send) {
    let s = s.max(1);
    let planes_per_task = (8192 / s).max(1);
    let run = |(t, o): (usize, &mut [T])| {
        for (j, plane) in o.chunks_mut(s).enumerate() {
            let p = t * planes_per_task + j;
            f(p % c, p * s, plane);
        }
    };
    if out.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(planes_per_task * s).enumerate().for_each(run);
    } else {
        out.chunks_mut(planes_per_task * s).enumerate().for_each(run);
    }
}

/// Runs `f` in a function compiled for AVX2 where the CPU has it and the kernel level allows vector code (LLVM
/// inlines the `#[inline(always)]` loops `f` calls and vectorises them there); no FMA, so the bits are the same
/// on every path.
#[inline(always)]
fn vectorised<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(target_arch = "x86_64")]
    if super::vmath::wide() {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<T>(f: impl FnOnce() -> T) -> T {
            f()
        }
        // SAFETY: `wide` checked that the CPU has AVX2.
        return unsafe { avx2(f) };
    }
    f()
}

/// A per-channel vector of `t`'s values ([C]).
fn per_channel_param(op: &'static str, what: &str, t: &Tensor, c: usize) -> Result<Vec<f32>> {
    if t.shape() != [c] {
        return Err(Error::invalid(op, format!("{what} of shape {:?}, expected [{c}] (one per channel)", t.shape())));
    }
    Ok(t.value().iter().copied().collect())
}

/// Batch normalisation of `x` ([N, C, …]) over every axis but 1: `(x − mean)·scale/√(var + eps) + bias` per
/// channel, with the batch's statistics or the given ones. Returns the output and the mean and (biased) variance
/// it normalised with.
pub(crate) fn batch_norm(
    x: &Tensor,
    stats: Stats<'_>,
    scale: &Tensor,
    bias: &Tensor,
    eps: f32,
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    batch_norm_act(x, stats, scale, bias, eps, false)
}

/// Evaluation mode: [`batch_norm_act`] with the running statistics `mean` and `var` (`C` values each, no gradient
/// through them) — a layer's, a fused step's, an imported node's.
pub(crate) fn batch_norm_running(
    x: &Tensor,
    (scale, bias): (&Tensor, &Tensor),
    (mean, var): (&Tensor, &Tensor),
    eps: f32,
    relu: bool,
) -> Result<Tensor> {
    let (mean, var) = (mean.to_vec(), var.to_vec());
    Ok(batch_norm_act(x, Stats::Given { mean: &mean, var: &var }, scale, bias, eps, relu)?.0)
}

/// [`batch_norm`] with given statistics and the ReLU after it in the same pass (`relu`), each way: a
/// pre-activation network's BatchNorm + ReLU before every convolution (DenseNet-121, PreAct-ResNet-18), which
/// the convolution's fold cannot take, ran as three passes over the activations forward and three back. The same
/// values and gradients as [`batch_norm`] then [`Tensor::relu`], bit for bit.
pub(crate) fn batch_norm_act(
    x: &Tensor,
    stats: Stats<'_>,
    scale: &Tensor,
    bias: &Tensor,
    eps: f32,
    relu: bool,
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    const OP: &str = "batch_norm";
    if relu && matches!(stats, Stats::Batch) {
        return Err(Error::invalid(OP, "a fused ReLU needs given statistics (evaluation mode)"));
    }
    let (n, c, s) = dims(OP, x)?;
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(OP, format!("epsilon {eps} must be finite and non-negative")));
    }
    let gamma = per_channel_param(OP, "scale", scale, c)?;
    let beta = per_channel_param(OP, "bias", bias, c)?;
    let xs = standard(x.value());
    let (mean, var): (Vec<f64>, Vec<f64>) = match stats {
        Stats::Batch => {
            if n * s < 2 {
                return Err(Error::invalid(
                    OP,
                    format!("batch statistics need more than one value per channel (input {:?})", x.shape()),
                ));
            }
            per_channel(c, xs.len(), |ch| vectorised(|| channel_stats(&xs, (n, c, s), ch))).into_iter().unzip()
        }
        Stats::Given { mean, var } => {
            if mean.len() != c || var.len() != c {
                return Err(Error::invalid(
                    OP,
                    format!("{} means and {} variances for {c} channels", mean.len(), var.len()),
                ));
            }
            (mean.iter().map(|&v| v as f64).collect(), var.iter().map(|&v| v as f64).collect())
        }
    };
    let rstd: Vec<f32> = var.iter().map(|&v| (1.0 / (v + eps as f64).sqrt()) as f32).collect();
    let mean: Vec<f32> = mean.iter().map(|&m| m as f32).collect();
    // y = (x − μ)·a + β with a = γ·r.
    let a: Vec<f32> = gamma.iter().zip(&rstd).map(|(&g, &r)| (g as f64 * r as f64) as f32).collect();
    // SAFETY: the planes cover the output and each is written whole.
    let out = unsafe {
        super::written(xs.len(), |out| {
            per_plane(out, c, s, |ch, at, o| {
                let (mu, a, b) = (mean[ch], a[ch], beta[ch]);
                let xr = &xs[at..at + o.len()];
                if relu {
                    vectorised(|| {
                        o.iter_mut().zip(xr).for_each(|(o, &v)| {
                            o.write(((v - mu) * a + b).max(0.0));
                        })
                    });
                } else {
                    vectorised(|| {
                        o.iter_mut().zip(xr).for_each(|(o, &v)| {
                            o.write((v - mu) * a + b);
                        })
                    });
                }
            })
        })
    };
    let value = ArrayD::from_shape_vec(IxDyn(x.shape()), out).expect("one value per input");
    let var: Vec<f32> = var.iter().map(|&v| v as f32).collect();
    let saved = BatchNormSaved {
        x: x.clone(),
        scale: scale.clone(),
        bias: bias.clone(),
        mean: mean.clone(),
        rstd,
        batch_stats: matches!(stats, Stats::Batch),
        relu,
    };
    Ok((record(value, Op::BatchNorm(Box::new(saved))), mean, var))
}

/// With x̂ = (x − μ)·r (r = 1/√(var + ε)), y = x̂·γ + β and M values per channel: ∂L/∂β = Σ g, ∂L/∂γ = Σ g·x̂ and,
/// with batch statistics, ∂L/∂x = γ·r·(g − Σg/M − x̂·Σ(g·x̂)/M) (the mean's and the variance's terms), with given
/// statistics ∂L/∂x = γ·r·g. Sums over every axis but 1.
///
/// With a fused ReLU, `g` is first masked where the output `out` is not positive (the ReLU's backward: `g·[y > 0]`,
/// the same lanes as its input's sign) — inside the loop of ∂x when no sum is asked for.
pub(crate) fn batch_norm_backward(
    s: &BatchNormSaved,
    out: &crate::tensor::Array,
    g: &ArrayD<f32>,
    need: &[bool],
) -> Vec<Option<ArrayD<f32>>> {
    let (n, c, sp) = dims("batch_norm", &s.x).expect("checked in the forward");
    let xs = standard(s.x.value());
    let need_sums = need[1] || need[2] || (need[0] && s.batch_stats);
    let ys = s.relu.then(|| standard(out));
    let masked = ys.as_ref().filter(|_| need_sums).map(|ys| {
        let gs = standard(g);
        gs.iter().zip(ys.iter()).map(|(&g, &y)| g * f32::from(y > 0.0)).collect::<Vec<f32>>()
    });
    let gs = match &masked {
        Some(m) => std::borrow::Cow::Borrowed(m.as_slice()),
        None => standard(g),
    };
    // The mask left to ∂x's loop: a fused ReLU whose gradient was not masked above.
    let mask = if need_sums { None } else { ys.as_deref() };
    let gamma: Vec<f32> = s.scale.value().iter().copied().collect();
    let sums: Vec<(f64, f64)> = if need_sums {
        per_channel(c, xs.len(), |ch| vectorised(|| channel_grad_sums(&gs, &xs, (n, c, sp), ch, s.mean[ch])))
    } else {
        Vec::new()
    };
    let gx = need[0].then(|| {
        let m = (n * sp) as f64;
        // ∂x = k·g − k0 − k1·(x − μ) per channel.
        let coef: Vec<(f32, f32, f32)> = (0..c)
            .map(|ch| {
                let (r, k) = (s.rstd[ch] as f64, gamma[ch] as f64 * s.rstd[ch] as f64);
                match (s.batch_stats, sums.get(ch)) {
                    (true, Some(&(sg, sgx))) => (k as f32, (k * sg / m) as f32, (k * r * r * sgx / m) as f32),
                    _ => (k as f32, 0.0, 0.0),
                }
            })
            .collect();
        // SAFETY: the planes cover the gradient and each is written whole, on either branch.
        let out = unsafe {
            super::written(xs.len(), |out| {
                per_plane(out, c, sp, |ch, at, o| {
                    let ((k, k0, k1), mu) = (coef[ch], s.mean[ch]);
                    let (gr, xr) = (&gs[at..at + o.len()], &xs[at..at + o.len()]);
                    if s.batch_stats {
                        vectorised(|| {
                            o.iter_mut().zip(gr).zip(xr).for_each(|((o, &g), &v)| {
                                o.write(k * g - k0 - k1 * (v - mu));
                            });
                        });
                    } else if let Some(ys) = mask {
                        let yr = &ys[at..at + o.len()];
                        vectorised(|| {
                            o.iter_mut().zip(gr).zip(yr).for_each(|((o, &g), &y)| {
                                o.write(k * (g * f32::from(y > 0.0)));
                            })
                        });
                    } else {
                        vectorised(|| {
                            o.iter_mut().zip(gr).for_each(|(o, &g)| {
                                o.write(k * g);
                            })
                        });
                    }
                })
            })
        };
        ArrayD::from_shape_vec(IxDyn(s.x.shape()), out).expect("one gradient per input")
    });
    let channel_vector = |v: Vec<f32>| ArrayD::from_shape_vec(IxDyn(&[c]), v).expect("C values");
    let gscale = need[1]
        .then(|| channel_vector(sums.iter().zip(&s.rstd).map(|(&(_, sgx), &r)| (sgx * r as f64) as f32).collect()));
    let gbias = need[2].then(|| channel_vector(sums.iter().map(|&(sg, _)| sg as f32).collect()));
    vec![gx, gscale, gbias]
}

/// Normalisation.
impl Tensor {
    /// Batch normalisation with the batch's statistics (training mode): per channel (axis 1 of [N, C, …]), the
    /// values minus their mean over √(their biased variance + `eps`), then times `scale` and plus `bias` (each
    /// [C]) — PyTorch's `batch_norm(x, None, None, scale, bias, training=True, eps=eps)`. The layer
    /// [`crate::nn::BatchNorm`] also keeps the running statistics.
    ///
    /// Derivatives, with x̂ the normalised value, r = 1/√(var + ε), g the output's gradient and M the values per
    /// channel (sums over every axis but 1): ∂/∂bias = Σ g, ∂/∂scale = Σ g·x̂,
    /// ∂/∂x = scale·r·(g − Σg/M − x̂·Σ(g·x̂)/M).
    pub fn batch_norm(&self, scale: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
        Ok(batch_norm(self, Stats::Batch, scale, bias, eps)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean and biased variance of channel `ch` in f64, two-pass.
    fn stats64(x: &[f32], (n, c, s): (usize, usize, usize), ch: usize) -> (f64, f64) {
        let vals: Vec<f64> = (0..n).flat_map(|i| x[(i * c + ch) * s..][..s].iter().map(|&v| v as f64)).collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        (mean, vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64)
    }

    #[test]
    fn blocks_cover_every_value_once() {
        for (n, s) in [(1, 1), (7, 1), (3, 5), (5, 2048), (2, 5000), (300, 16), (4, 2047)] {
            let mut seen = vec![0u8; n * s];
            for (samples, pos) in blocks(n, s) {
                for i in samples {
                    for p in pos.clone() {
                        seen[i * s + p] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&k| k == 1), "n {n}, s {s}");
        }
    }

    /// Against f64 two-pass statistics, on shapes that take each block layout, with a mean far from zero (where
    /// E[x²] − E[x]² would cancel).
    #[test]
    fn statistics_match_f64() {
        for (n, c, s) in [(4, 3, 1), (32, 2, 64), (3, 2, 5000), (64, 3, 16), (2, 1, 3)] {
            let x: Vec<f32> = Tensor::uniform(&[n * c * s], 1000.0, 1001.0, 5).to_vec();
            for ch in 0..c {
                let (m, v) = vectorised(|| channel_stats(&x, (n, c, s), ch));
                let (m64, v64) = stats64(&x, (n, c, s), ch);
                assert!((m - m64).abs() <= 1e-6 * m64.abs(), "{n}x{c}x{s} mean {m} vs {m64}");
                assert!((v - v64).abs() <= 1e-4 * v64, "{n}x{c}x{s} var {v} vs {v64}");
            }
        }
    }

    /// The vector and portable loops give the same bits (no FMA, the same summation order).
    #[test]
    fn vectorised_and_plain_agree_bit_for_bit() {
        let dims = (8, 3, 200);
        let x = Tensor::uniform(&[8 * 3 * 200], -2.0, 3.0, 9).to_vec();
        let g = Tensor::uniform(&[8 * 3 * 200], -1.0, 1.0, 10).to_vec();
        for ch in 0..3 {
            assert_eq!(vectorised(|| channel_stats(&x, dims, ch)), channel_stats(&x, dims, ch));
            assert_eq!(
                vectorised(|| channel_grad_sums(&g, &x, dims, ch, 0.5)),
                channel_grad_sums(&g, &x, dims, ch, 0.5)
            );
        }
    }

    /// Forward and backward the same, bit for bit, on one thread and on four.
    #[test]
    fn independent_of_the_thread_count() {
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let x = Tensor::uniform(&[16, 8, 24, 24], -1.0, 2.0, 3).variable();
                let (gamma, beta) =
                    (Tensor::uniform(&[8], 0.5, 1.5, 4).variable(), Tensor::uniform(&[8], -1.0, 1.0, 5).variable());
                let y = x.batch_norm(&gamma, &beta, 1e-5).unwrap();
                let r = Tensor::uniform(y.shape(), -1.0, 1.0, 6);
                let grads = y.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &gamma, &beta]).unwrap();
                (y.to_vec(), grads.iter().map(Tensor::to_vec).collect::<Vec<_>>())
            })
        };
        assert_eq!(run(1), run(4));
    }

    #[test]
    fn misuse_is_an_error() {
        let (gamma, beta) = (Tensor::ones(&[3]), Tensor::zeros(&[3]));
        assert!(Tensor::zeros(&[3]).batch_norm(&gamma, &beta, 1e-5).is_err());
        assert!(Tensor::zeros(&[1, 3]).batch_norm(&gamma, &beta, 1e-5).is_err(), "one value per channel");
        assert!(Tensor::zeros(&[2, 4]).batch_norm(&gamma, &beta, 1e-5).is_err(), "channels");
        assert!(Tensor::zeros(&[2, 3]).batch_norm(&gamma, &beta, f32::NAN).is_err());
        assert!(Tensor::zeros(&[2, 3]).batch_norm(&Tensor::ones(&[3, 1]), &beta, 1e-5).is_err());
    }
}
