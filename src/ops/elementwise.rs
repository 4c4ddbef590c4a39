//! Elementwise ops with NumPy broadcasting, and the unary functions, each beside its derivative.

use std::mem::MaybeUninit;

use ndarray::{ArrayBase, ArrayD, Data, IxDyn, Zip};
use rayon::prelude::*;

use super::shape::sum_to_shape;
use super::{record, vmath, Op, PAR_THRESHOLD};
use crate::tensor::{Array, Tensor};
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
}

impl BinaryKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BinaryKind::Add => "add",
            BinaryKind::Sub => "sub",
            BinaryKind::Mul => "mul",
            BinaryKind::Div => "div",
            BinaryKind::Maximum => "maximum",
            BinaryKind::Minimum => "minimum",
        }
    }
}

/// Elements per task of the flat elementwise loops: each task is a plain slice loop that LLVM vectorises (a
/// rayon `map(..).collect()` pushes one element at a time and does not).
pub(super) const FLAT_CHUNK: usize = 1 << 14;

/// `out[i] = f(a[i])` over equal-length slices, in parallel when long.
fn flat1(a: &[f32], f: impl Fn(f32) -> f32 + Sync + Send) -> Vec<f32> {
    let body = |(o, a): (&mut [MaybeUninit<f32>], &[f32])| vmath::map_into(a, o, &f);
    // SAFETY: `map_into` writes every element of each chunk, and the chunks cover the output.
    unsafe {
        super::written(a.len(), |out| {
            if a.len() >= PAR_THRESHOLD {
                out.par_chunks_mut(FLAT_CHUNK).zip(a.par_chunks(FLAT_CHUNK)).for_each(body);
            } else {
                body((out, a));
            }
        })
    }
}

/// `acc += x` (equal shapes), split across threads when long and both are contiguous: the backward's sum of an
/// input's gradients (a residual block's two branches), a pass over memory that ran on one thread.
pub(crate) fn add_into(acc: &mut ArrayD<f32>, x: &ArrayD<f32>) {
    debug_assert_eq!(acc.shape(), x.shape());
    match (acc.as_slice_mut(), x.as_slice()) {
        (Some(a), Some(b)) if a.len() == b.len() => add_slices(a, b),
        _ => *acc += x,
    }
}

/// `a += b` (equal lengths), split across threads when long.
pub(crate) fn add_slices(a: &mut [f32], b: &[f32]) {
    debug_assert_eq!(a.len(), b.len());
    if a.len() >= PAR_THRESHOLD {
        a.par_chunks_mut(FLAT_CHUNK).zip(b.par_chunks(FLAT_CHUNK)).for_each(|(a, b)| {
            a.iter_mut().zip(b).for_each(|(a, &b)| *a += b);
        });
    } else {
        a.iter_mut().zip(b).for_each(|(a, &b)| *a += b);
    }
}

/// `f` applied to every element, split across threads when the array is large (elementwise, so deterministic).
pub(crate) fn map(x: &Array, f: impl Fn(f32) -> f32 + Sync + Send) -> ArrayD<f32> {
    if let Some(s) = x.as_slice() {
        return ArrayD::from_shape_vec(x.raw_dim(), flat1(s, f)).expect("same length");
    }
    if x.len() >= PAR_THRESHOLD {
        Zip::from(x).par_map_collect(|&v| f(v))
    } else {
        x.map(|&v| f(v))
    }
}

/// The broadcast shape of two shapes (NumPy rules), or `None`.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// `$f(args…, op)` with `op` the closure of `kind`, monomorphised per kind (a `match` inside the closure keeps
/// the slice loops from vectorising).
macro_rules! by_kind {
    ($kind:expr, $f:ident($($arg:expr),*)) => {
        match $kind {
            BinaryKind::Add => $f($($arg,)* |x: f32, y: f32| x + y),
            BinaryKind::Sub => $f($($arg,)* |x: f32, y: f32| x - y),
            BinaryKind::Mul => $f($($arg,)* |x: f32, y: f32| x * y),
            BinaryKind::Div => $f($($arg,)* |x: f32, y: f32| x / y),
            BinaryKind::Maximum => $f($($arg,)* |x: f32, y: f32| x.max(y)),
            BinaryKind::Minimum => $f($($arg,)* |x: f32, y: f32| x.min(y)),
        }
    };
}

fn binary(kind: BinaryKind, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let value = binary_values(kind, a.value(), b.value()).ok_or_else(|| Error::Broadcast {
        op: kind.name(),
        lhs: a.shape().to_vec(),
        rhs: b.shape().to_vec(),
    })?;
    Ok(record(value, Op::Binary(kind, a.clone(), b.clone())))
}

/// `kind` applied to `a` and `b` broadcast together (`None`: the shapes do not broadcast). Equal shapes are one
/// flat loop; one operand constant along all axes but one run of them (a per-channel scale or shift, a
/// squeeze-and-excitation gate) a slice loop per run of the other; anything else an `ndarray` `Zip`.
pub(crate) fn binary_values<A, B>(
    kind: BinaryKind,
    a: &ArrayBase<A, IxDyn>,
    b: &ArrayBase<B, IxDyn>,
) -> Option<ArrayD<f32>>
where
    A: Data<Elem = f32>,
    B: Data<Elem = f32>,
{
    let shape = broadcast_shape(a.shape(), b.shape())?;
    // An operand of the output's shape in another layout (the channels-last view a transpose leaves, ConvNeXt's
    // layer scale and residual): made contiguous by the blocked copy first, so the flat and per-run loops apply —
    // a `Zip` over it would stride through memory. Elementwise, so the same values.
    if let Some(a) = contiguous_full(a, &shape) {
        return binary_values(kind, &a, b);
    }
    if let Some(b) = contiguous_full(b, &shape) {
        return binary_values(kind, a, &b);
    }
    if a.shape() == b.shape() {
        return Some(by_kind!(kind, zip2(a, b)));
    }
    if let (Some(sa), Some(sb)) = (a.as_slice(), b.as_slice()) {
        let flat = if a.shape() == shape.as_slice() {
            run_split(&shape, b.shape()).map(|split| by_kind!(kind, along_runs(sa, sb, split)))
        } else if b.shape() == shape.as_slice() {
            run_split(&shape, a.shape()).map(|split| by_kind!(kind, along_runs_flipped(sb, sa, split)))
        } else {
            None
        };
        if let Some(v) = flat {
            return Some(ArrayD::from_shape_vec(IxDyn(&shape), v).expect("output-sized"));
        }
    }
    let av = a.broadcast(IxDyn(&shape)).expect("broadcast shape computed above");
    let bv = b.broadcast(IxDyn(&shape)).expect("broadcast shape computed above");
    Some(if shape.iter().product::<usize>() >= PAR_THRESHOLD {
        by_kind!(kind, zip_views_par(&av, &bv))
    } else {
        by_kind!(kind, zip_views(&av, &bv))
    })
}

/// `a` in standard layout when it has the full `shape` but is not contiguous; `None` otherwise.
fn contiguous_full<A: Data<Elem = f32>>(a: &ArrayBase<A, IxDyn>, shape: &[usize]) -> Option<ArrayD<f32>> {
    (a.shape() == shape && a.as_slice().is_none())
        .then(|| ArrayD::from_shape_vec(a.raw_dim(), super::shape::contiguous_vec(&a.view())).expect("same length"))
}

/// `f` over two arrays of one shape: one flat loop over slices (in parallel when long), else a `Zip`.
fn zip2<A, B>(
    a: &ArrayBase<A, IxDyn>,
    b: &ArrayBase<B, IxDyn>,
    f: impl Fn(f32, f32) -> f32 + Sync + Send,
) -> ArrayD<f32>
where
    A: Data<Elem = f32>,
    B: Data<Elem = f32>,
{
    if let (Some(sa), Some(sb)) = (a.as_slice(), b.as_slice()) {
        type Chunks<'a> = ((&'a mut [MaybeUninit<f32>], &'a [f32]), &'a [f32]);
        let body = |((o, a), b): Chunks| {
            o.iter_mut().zip(a).zip(b).for_each(|((o, &a), &b)| {
                o.write(f(a, b));
            });
        };
        // SAFETY: the chunks cover the output, and `body` writes every element of its chunk (the operands have
        // the output's length).
        let out = unsafe {
            super::written(sa.len(), |out| {
                if sa.len() >= PAR_THRESHOLD {
                    let chunks = out.par_chunks_mut(FLAT_CHUNK).zip(sa.par_chunks(FLAT_CHUNK));
                    chunks.zip(sb.par_chunks(FLAT_CHUNK)).for_each(body);
                } else {
                    body(((out, sa), sb));
                }
            })
        };
        return ArrayD::from_shape_vec(a.raw_dim(), out).expect("same length");
    }
    if a.len() >= PAR_THRESHOLD {
        Zip::from(a).and(b).par_map_collect(|&x, &y| f(x, y))
    } else {
        Zip::from(a).and(b).map_collect(|&x, &y| f(x, y))
    }
}

fn zip_views_par(
    a: &ndarray::ArrayViewD<f32>,
    b: &ndarray::ArrayViewD<f32>,
    f: impl Fn(f32, f32) -> f32 + Sync + Send,
) -> ArrayD<f32> {
    Zip::from(a).and(b).par_map_collect(|&x, &y| f(x, y))
}

fn zip_views(a: &ndarray::ArrayViewD<f32>, b: &ndarray::ArrayViewD<f32>, f: impl Fn(f32, f32) -> f32) -> ArrayD<f32> {
    Zip::from(a).and(b).map_collect(|&x, &y| f(x, y))
}

/// Runs below this length go to the `Zip` (a slice loop per run costs more than it saves).
const MIN_RUN: usize = 16;

/// How an operand of shape `small` broadcasts against `shape` when it varies along one run of axes only: the
/// output as runs of `inner` contiguous elements, run `k` taking the operand's value `k % mid` (`None` when it
/// varies otherwise, or the runs are shorter than [`MIN_RUN`]).
fn run_split(shape: &[usize], small: &[usize]) -> Option<(usize, usize)> {
    let pad = shape.len().checked_sub(small.len())?;
    let dim = |i: usize| if i < pad { 1 } else { small[i - pad] };
    let varying: Vec<usize> = (0..shape.len()).filter(|&i| dim(i) != 1).collect();
    let (mid, inner) = match (varying.first(), varying.last()) {
        (Some(&lo), Some(&hi)) => {
            if (lo..=hi).any(|i| dim(i) != shape[i]) {
                return None;
            }
            (shape[lo..=hi].iter().product(), shape[hi + 1..].iter().product())
        }
        // A single value: any split into runs will do.
        _ => (1, shape.iter().product::<usize>().min(FLAT_CHUNK)),
    };
    (inner >= MIN_RUN).then_some((mid, inner))
}

/// `out = f(full, small)` with `small[m]` repeated over each run of `inner` elements (run `k` takes `small[k % mid]`).
fn along_runs(
    full: &[f32],
    small: &[f32],
    (mid, inner): (usize, usize),
    f: impl Fn(f32, f32) -> f32 + Sync + Send,
) -> Vec<f32> {
    let run = |(k, (o, a)): (usize, (&mut [MaybeUninit<f32>], &[f32]))| {
        let s = small[k % mid];
        o.iter_mut().zip(a).for_each(|(o, &a)| {
            o.write(f(a, s));
        });
    };
    // SAFETY: the runs cover the output and `run` writes every element of its run.
    unsafe {
        super::written(full.len(), |out| {
            if full.len() >= PAR_THRESHOLD {
                out.par_chunks_mut(inner)
                    .zip(full.par_chunks(inner))
                    .enumerate()
                    .with_min_len(FLAT_CHUNK / inner + 1)
                    .for_each(run);
            } else {
                out.chunks_mut(inner).zip(full.chunks(inner)).enumerate().for_each(run);
            }
        })
    }
}

/// [`along_runs`] with the operands of `f` the other way round: `out = f(small, full)`.
fn along_runs_flipped(
    full: &[f32],
    small: &[f32],
    split: (usize, usize),
    f: impl Fn(f32, f32) -> f32 + Sync + Send,
) -> Vec<f32> {
    along_runs(full, small, split, move |x, s| f(s, x))
}

/// `f(g, a, b)` over the output gradient's shape, with `a` and `b` broadcast to it.
fn zip_grad(g: &ArrayD<f32>, a: &Array, b: &Array, f: impl Fn(f32, f32, f32) -> f32 + Sync + Send) -> ArrayD<f32> {
    let av = a.broadcast(g.raw_dim()).expect("inputs broadcast to the output");
    let bv = b.broadcast(g.raw_dim()).expect("inputs broadcast to the output");
    if g.len() >= PAR_THRESHOLD {
        Zip::from(g).and(&av).and(&bv).par_map_collect(|&g, &x, &y| f(g, x, y))
    } else {
        Zip::from(g).and(&av).and(&bv).map_collect(|&g, &x, &y| f(g, x, y))
    }
}

pub(crate) fn binary_backward(
    kind: BinaryKind,
    a: &Tensor,
    b: &Tensor,
    g: &ArrayD<f32>,
    need: &[bool],
) -> Vec<Option<ArrayD<f32>>> {
    let (av, bv) = (a.value(), b.value());
    let ga = need[0].then(|| {
        if let Some(d) = (kind == BinaryKind::Mul).then(|| trailing_dots(g, bv, a.shape())).flatten() {
            return d;
        }
        let full = match kind {
            BinaryKind::Add => g.clone(),
            BinaryKind::Sub => g.clone(),
            // g·b and g/b: the forward's broadcast loops.
            BinaryKind::Mul => binary_values(BinaryKind::Mul, g, bv).expect("broadcasts as in the forward"),
            BinaryKind::Div => binary_values(BinaryKind::Div, g, bv).expect("broadcasts as in the forward"),
            BinaryKind::Maximum => zip_grad(g, av, bv, tie_share),
            BinaryKind::Minimum => zip_grad(g, av, bv, |g, x, y| tie_share(g, y, x)),
        };
        sum_to_shape(full, a.shape())
    });
    let gb = need[1].then(|| {
        if let Some(d) = (kind == BinaryKind::Mul).then(|| trailing_dots(g, av, b.shape())).flatten() {
            return d;
        }
        let full = match kind {
            BinaryKind::Add => g.clone(),
            BinaryKind::Sub => g.mapv(|v| -v),
            BinaryKind::Mul => binary_values(BinaryKind::Mul, g, av).expect("broadcasts as in the forward"),
            BinaryKind::Div => zip_grad(g, av, bv, |g, x, y| -g * x / (y * y)),
            BinaryKind::Maximum => zip_grad(g, av, bv, |g, x, y| tie_share(g, y, x)),
            BinaryKind::Minimum => zip_grad(g, av, bv, tie_share),
        };
        sum_to_shape(full, b.shape())
    });
    vec![ga, gb]
}

/// [`binary_backward`] of a sum, given the output's gradient to keep: it goes on to an operand as it is, copied
/// only when both operands take it (a residual connection) — a transformer's bias adds and a ConvNeXt block's
/// took a copy of the whole activation gradient each.
pub(crate) fn add_backward(a: &Tensor, b: &Tensor, g: ArrayD<f32>, need: &[bool]) -> Vec<Option<ArrayD<f32>>> {
    match (need[0], need[1]) {
        (true, true) => vec![Some(sum_to_shape(g.clone(), a.shape())), Some(sum_to_shape(g, b.shape()))],
        (true, false) => vec![Some(sum_to_shape(g, a.shape())), None],
        (false, true) => vec![None, Some(sum_to_shape(g, b.shape()))],
        (false, false) => vec![None, None],
    }
}

/// `Σ g·v` over the trailing axes that `small` broadcasts (it is `g`'s shape with its trailing axes of size 1 —
/// a squeeze-excitation gate `[N, C, 1, 1]` scaling `v` `[N, C, H, W]`): the gradient of the broadcast factor of a
/// product, row by row, without forming `g·v` ([`super::reduce::row_sums_of`]: the bits of summing the formed
/// product). `None` when the shapes or layouts do not fit.
fn trailing_dots(g: &ArrayD<f32>, v: &Array, small: &[usize]) -> Option<ArrayD<f32>> {
    let keep = small.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
    let fits = g.shape() == v.shape() && g.ndim() == small.len() && keep < small.len();
    let (gs, vs) = (g.as_slice().filter(|_| fits)?, v.as_slice()?);
    if g.shape()[..keep] != small[..keep] {
        return None;
    }
    let len: usize = g.shape()[keep..].iter().product();
    if len == 0 {
        return None;
    }
    let out = super::reduce::row_sums_of(gs, vs, len, |x, y| x * y);
    Some(ArrayD::from_shape_vec(IxDyn(small), out).expect("one value per row"))
}

/// The gradient of [`Tensor::add_relu`] for both operands: `g` where the output is positive (the ReLU's backward,
/// which masks by the sum being positive: the same lanes).
///
/// Given the output's gradient to keep: masked in place when both are in standard layout (a residual block's
/// gradient, ResNet-50's largest, was masked into a fresh array and that copied again), copied only when both
/// operands take it.
pub(crate) fn add_relu_backward(out: &Array, mut g: ArrayD<f32>, need: &[bool]) -> Vec<Option<ArrayD<f32>>> {
    let mask = |gs: &mut [f32], ys: &[f32]| gs.iter_mut().zip(ys).for_each(|(g, &y)| *g *= f32::from(y > 0.0));
    let masked = match (g.as_slice_mut(), out.as_slice()) {
        (Some(gs), Some(ys)) if gs.len() == ys.len() => {
            if gs.len() >= PAR_THRESHOLD {
                gs.par_chunks_mut(FLAT_CHUNK).zip(ys.par_chunks(FLAT_CHUNK)).for_each(|(g, y)| mask(g, y));
            } else {
                mask(gs, ys);
            }
            g
        }
        _ => zip2(&g, out, |g, y| g * f32::from(y > 0.0)),
    };
    match (need[0], need[1]) {
        (true, true) => vec![Some(masked.clone()), Some(masked)],
        (true, false) => vec![Some(masked), None],
        (false, true) => vec![None, Some(masked)],
        (false, false) => vec![None, None],
    }
}

/// The share of `g` that goes to the winner `x` of a max against `y`: all of it, none, or half on a tie (PyTorch).
#[inline]
fn tie_share(g: f32, x: f32, y: f32) -> f32 {
    if x > y {
        g
    } else if x == y {
        0.5 * g
    } else {
        0.0
    }
}

/// Elementwise arithmetic and functions on tensors.
impl Tensor {
    /// a + b with broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Add, self, other)
    }
    /// max(a + b, 0) as one op (a residual connection and its ReLU): one pass over the data each way instead of
    /// two, the same values and gradients as [`Tensor::add`] then [`Tensor::relu`] bit for bit. Operands of
    /// different shapes run as the two ops.
    pub fn add_relu(&self, other: &Tensor) -> Result<Tensor> {
        if self.shape() != other.shape() {
            return Ok(self.add(other)?.relu());
        }
        let value = zip2(self.value(), other.value(), |x, y| (x + y).max(0.0));
        Ok(record(value, Op::AddRelu(self.clone(), other.clone())))
    }
    /// a − b with broadcasting.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Sub, self, other)
    }
    /// a · b (elementwise) with broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Mul, self, other)
    }
    /// a / b with broadcasting; ∂/∂b = −a/b².
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Div, self, other)
    }
    /// Elementwise maximum; on ties the gradient is split evenly (as PyTorch).
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Maximum, self, other)
    }
    /// Elementwise minimum; on ties the gradient is split evenly (as PyTorch).
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        binary(BinaryKind::Minimum, self, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gradient of a product's broadcast factor (an SE gate `[N, C, 1, 1]`, either side) by row dots: the bits
    /// of the formed product summed down to its shape, and the finite-difference-checked generic path's values
    /// for shapes it does not take (a broadcast in the middle).
    #[test]
    fn broadcast_factor_gradient_is_row_dots() {
        let x = Tensor::uniform(&[3, 5, 7, 9], -1.0, 1.0, 1).variable();
        let gate = Tensor::uniform(&[3, 5, 1, 1], -1.0, 1.0, 2).variable();
        let w = Tensor::uniform(&[3, 5, 7, 9], -1.0, 1.0, 3);
        let formed = sum_to_shape(w.value().to_owned() * x.value(), &[3, 5, 1, 1]);
        assert!(trailing_dots(&w.value().to_owned(), x.value(), &[3, 5, 1, 1]).is_some());
        for y in [x.mul(&gate).unwrap(), gate.mul(&x).unwrap()] {
            let g = y.mul(&w).unwrap().sum_all().grad_wrt(&[&gate, &x]).unwrap();
            assert_eq!(g[0].value().mapv(f32::to_bits), formed.mapv(f32::to_bits));
            assert_eq!(
                g[1].to_vec(),
                (w.value() * &gate.value().broadcast(IxDyn(&[3, 5, 7, 9])).unwrap()).into_raw_vec_and_offset().0
            );
        }
        let mid = Tensor::uniform(&[3, 1, 7, 9], -1.0, 1.0, 4);
        assert!(trailing_dots(&w.value().to_owned(), x.value(), mid.shape()).is_none());
    }

    /// The fused residual add and ReLU: the bits of the two ops, values and both gradients, with ties at zero, a
    /// NaN and runs long enough to split across threads.
    #[test]
    fn add_relu_is_add_then_relu_bit_for_bit() {
        let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for len in [7, PAR_THRESHOLD + 5] {
            let mut av = Tensor::uniform(&[len], -1.0, 1.0, 1).to_vec();
            let mut bv = Tensor::uniform(&[len], -1.0, 1.0, 2).to_vec();
            (av[0], bv[0], av[1]) = (0.5, -0.5, f32::NAN);
            let a = Tensor::from_vec(av, &[len]).unwrap().variable();
            let b = Tensor::from_vec(bv, &[len]).unwrap().variable();
            let r = Tensor::uniform(&[len], -1.0, 1.0, 3);
            let fused = a.add_relu(&b).unwrap();
            let plain = a.add(&b).unwrap().relu();
            assert_eq!(bits(&fused), bits(&plain));
            let gf = fused.mul(&r).unwrap().sum_all().grad_wrt(&[&a, &b]).unwrap();
            let gp = plain.mul(&r).unwrap().sum_all().grad_wrt(&[&a, &b]).unwrap();
            for (f, p) in gf.iter().zip(&gp) {
                assert_eq!(bits(f), bits(p));
            }
            // One operand's gradient alone (the masked gradient handed on, not copied), and a gradient that
            // arrives transposed (masked by the `Zip`).
            let one = fused.mul(&r).unwrap().sum_all().grad_wrt(&[&b]).unwrap();
            assert_eq!(bits(&one[0]), bits(&gp[1]));
        }
        let (a, b) = (Tensor::uniform(&[6, 9], -1.0, 1.0, 4).variable(), Tensor::uniform(&[6, 9], -1.0, 1.0, 5));
        let r = Tensor::uniform(&[9, 6], -1.0, 1.0, 6);
        let loss = |y: Tensor| y.t().unwrap().mul(&r).unwrap().sum_all().grad_wrt(&[&a]).unwrap().remove(0);
        assert_eq!(bits(&loss(a.add_relu(&b).unwrap())), bits(&loss(a.add(&b).unwrap().relu())));
    }

    /// The per-run slice loops give the bits of the `Zip` over broadcast views, for every kind, both operand
    /// orders, and runs long enough to split across threads.
    #[test]
    fn run_loops_match_the_zip() {
        let kinds = [BinaryKind::Add, BinaryKind::Sub, BinaryKind::Mul, BinaryKind::Div, BinaryKind::Maximum];
        let cases: [(&[usize], &[usize]); 5] = [
            (&[2, 3, 4, 5], &[1, 3, 1, 1]),
            (&[2, 3, 4, 5], &[3, 1, 1]),
            (&[2, 3, 4, 5], &[2, 3, 1, 1]),
            (&[2, 3, 4, 5], &[1]),
            (&[2, 64, 32, 32], &[64, 1, 1]),
        ];
        for (i, (full, small)) in cases.iter().enumerate() {
            let a = Tensor::uniform(full, -2.0, 2.0, i as u64).to_array();
            let b = Tensor::uniform(small, 0.5, 2.0, 10 + i as u64).to_array();
            assert!(run_split(full, small).is_some(), "{full:?} by {small:?} takes the run loops");
            for kind in kinds {
                for flipped in [false, true] {
                    let (x, y) = if flipped { (&b, &a) } else { (&a, &b) };
                    let got = binary_values(kind, x, y).unwrap();
                    let xv = x.broadcast(IxDyn(full)).unwrap();
                    let yv = y.broadcast(IxDyn(full)).unwrap();
                    let want = by_kind!(kind, zip_views(&xv, &yv));
                    let bits = |v: &ArrayD<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{kind:?} {full:?} {small:?} flipped {flipped}");
                }
            }
        }
        // Operands that vary along two separate runs, or runs too short, take the `Zip`.
        assert_eq!(run_split(&[2, 3, 4, 5], &[1, 3, 1, 5]), None);
        assert_eq!(run_split(&[2, 3, 2, 2], &[1, 3, 1, 1]), None);
    }

    /// A channels-last view (a permuted operand of the output's shape) gives the `Zip`'s bits through its
    /// contiguous copy: against a per-channel scale (ConvNeXt's layer scale), an operand of its own shape, and
    /// both permuted; large enough to split across threads.
    #[test]
    fn permuted_operands_match_the_zip() {
        let nhwc = Tensor::uniform(&[2, 20, 24, 64], -2.0, 2.0, 1).to_array();
        let x = nhwc.view().permuted_axes(IxDyn(&[0, 3, 1, 2]));
        let scale = Tensor::uniform(&[64, 1, 1], 0.5, 2.0, 2).to_array();
        let same = Tensor::uniform(&[2, 64, 20, 24], -2.0, 2.0, 3).to_array();
        let shape = IxDyn(&[2, 64, 20, 24]);
        for kind in [BinaryKind::Add, BinaryKind::Mul, BinaryKind::Div, BinaryKind::Maximum] {
            for (other, name) in [(scale.view(), "scale"), (same.view(), "same shape"), (x.view(), "permuted")] {
                for flipped in [false, true] {
                    let (p, q) = if flipped { (other.view(), x.view()) } else { (x.view(), other.view()) };
                    let got = binary_values(kind, &p, &q).unwrap();
                    let want = by_kind!(
                        kind,
                        zip_views(&p.broadcast(shape.clone()).unwrap(), &q.broadcast(shape.clone()).unwrap())
                    );
                    assert!(got.is_standard_layout());
                    let bits = |v: &ArrayD<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{kind:?} {name} flipped {flipped}");
                }
            }
        }
    }

    /// The parallel sum of gradients gives the serial sum's values element by element: long and short, and a
    /// transposed operand (which takes the serial path); each element checked against its own sum.
    #[test]
    fn add_into_sums_every_element() {
        for (len, seed) in [(3 * super::PAR_THRESHOLD + 5, 20), (100, 22)] {
            let a = Tensor::uniform(&[len], -2.0, 2.0, seed).to_array();
            let b = Tensor::uniform(&[len], -2.0, 2.0, seed + 1).to_array();
            let mut acc = a.clone();
            super::add_into(&mut acc, &b);
            assert!(acc.iter().zip(&a).zip(&b).all(|((s, x), y)| s.to_bits() == (x + y).to_bits()), "{len}");
        }
        let a = Tensor::uniform(&[300, 200], -2.0, 2.0, 24).to_array();
        let t = Tensor::uniform(&[200, 300], -2.0, 2.0, 25).to_array().reversed_axes();
        let mut acc = a.clone();
        super::add_into(&mut acc, &t);
        assert!(acc.iter().zip(&a).zip(&t).all(|((s, x), y)| s.to_bits() == (x + y).to_bits()));
    }
}
