//! Reductions: sum, mean, max/min along an axis, argmax/argmin and top-k.

use ndarray::{Array2, ArrayD, Axis, IxDyn};
use rayon::prelude::*;

use super::{record, Op};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// The sums of the consecutive runs of `len` values in `v` (the rows of a row-major array whose trailing axes are
/// summed), rows in parallel, each in sixteen interleaved partial sums: a fixed order, so the same bits whatever
/// the thread count, and vector adds instead of one dependent chain. `len` must not be 0.
pub(crate) fn row_sums(v: &[f32], len: usize) -> Vec<f32> {
    row_sums_of(v, v, len, |x, _| x)
}

/// The sums of `f(a[i], b[i])` over each run of `len` values: [`row_sums`] of the values `f` forms, in the same
/// order, without writing them out (a product's row dots, `f = |x, y| x * y`: the same bits as summing the formed
/// product). `len` must not be 0.
pub(crate) fn row_sums_of(a: &[f32], b: &[f32], len: usize, f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    let sum = |(a, b): (&[f32], &[f32])| {
        let mut acc = [0.0f32; 16];
        let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
        let rest: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(&x, &y)| f(x, y)).sum();
        for (ca, cb) in ca.zip(cb) {
            for ((s, &x), &y) in acc.iter_mut().zip(ca).zip(cb) {
                *s += f(x, y);
            }
        }
        acc.iter().sum::<f32>() + rest
    };
    let mut out = vec![0.0f32; a.len() / len];
    out.par_iter_mut()
        .zip(a.par_chunks_exact(len).zip(b.par_chunks_exact(len)))
        .with_min_len((1 << 14) / len + 1)
        .for_each(|(o, rows)| *o = sum(rows));
    out
}

/// `a` summed over its last `k` axes (kept as size 1 when `keepdim`) by [`row_sums`], when `a` is in standard
/// layout and those axes are not empty; `None` otherwise.
pub(crate) fn sum_trailing(a: ndarray::ArrayViewD<f32>, k: usize, keepdim: bool) -> Option<ArrayD<f32>> {
    let r = a.ndim();
    let len: usize = a.shape()[r - k..].iter().product();
    let s = a.as_slice().filter(|_| len > 0 && k > 0)?;
    let mut shape = a.shape()[..r - k].to_vec();
    if keepdim {
        shape.resize(r, 1);
    }
    Some(ArrayD::from_shape_vec(IxDyn(&shape), row_sums(s, len)).expect("one sum per row"))
}

pub(crate) fn sum_backward(shape: &[usize], axes: &[usize], keepdim: bool, g: &ArrayD<f32>) -> ArrayD<f32> {
    let mut g = g.view();
    if !keepdim {
        let mut sorted = axes.to_vec();
        sorted.sort_unstable();
        for &ax in &sorted {
            g.insert_axis_inplace(Axis(ax));
        }
    }
    if g.len() == 1 {
        return ArrayD::from_elem(IxDyn(shape), g.iter().next().copied().unwrap_or(0.0));
    }
    // Trailing axes summed (a global average pooling's): each row of the result is one value of `g`, filled.
    let lead = shape.len().saturating_sub(axes.len());
    let trailing = axes.iter().all(|&a| a >= lead);
    let len: usize = shape[lead..].iter().product();
    if let (true, Some(gs), true) = (trailing, g.as_slice(), len > 0) {
        // SAFETY: the rows cover the output and each is filled whole.
        let out = unsafe {
            super::written(gs.len() * len, |out| {
                let rows = out.par_chunks_mut(len).zip(gs.par_iter()).with_min_len((1 << 14) / len + 1);
                rows.for_each(|(row, &v)| row.iter_mut().for_each(|d| _ = d.write(v)));
            })
        };
        return ArrayD::from_shape_vec(IxDyn(shape), out).expect("one row per value");
    }
    let b = g.broadcast(IxDyn(shape)).expect("reduced shape broadcasts back");
    // `to_owned` of a broadcast view walks it element by element on one thread; a parallel Zip is far faster.
    ndarray::Zip::from(&b).par_map_collect(|&v| v)
}

pub(crate) fn max_backward(
    shape: &[usize],
    axis: usize,
    keepdim: bool,
    index: &[usize],
    g: &ArrayD<f32>,
) -> ArrayD<f32> {
    let mut out = ArrayD::zeros(IxDyn(shape));
    let g = if keepdim { g.view().index_axis_move(Axis(axis), 0) } else { g.view() };
    for ((mut lane, &i), &gv) in out.lanes_mut(Axis(axis)).into_iter().zip(index).zip(g.iter()) {
        lane[i] += gv;
    }
    out
}

fn axis_index(x: &Tensor, axis: usize, op: &'static str, better: impl Fn(f32, f32) -> bool) -> Result<Vec<usize>> {
    if axis >= x.rank() {
        return Err(Error::invalid(op, format!("axis {axis} out of range for rank {}", x.rank())));
    }
    if x.shape()[axis] == 0 {
        return Err(Error::invalid(op, format!("axis {axis} is empty")));
    }
    Ok(x.value()
        .lanes(Axis(axis))
        .into_iter()
        .map(|lane| {
            let mut best = 0;
            for (i, &v) in lane.iter().enumerate() {
                if better(v, lane[best]) {
                    best = i;
                }
            }
            best
        })
        .collect())
}

/// Reductions over axes.
impl Tensor {
    /// Sum over `axes` (all of them if empty), keeping reduced axes as size 1 when `keepdim`.
    pub fn sum(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        let axes: Vec<usize> = if axes.is_empty() { (0..self.rank()).collect() } else { axes.to_vec() };
        let mut sorted = axes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != axes.len() || sorted.last().is_some_and(|&a| a >= self.rank()) {
            return Err(Error::invalid("sum", format!("bad axes {axes:?} for rank {}", self.rank())));
        }
        // The trailing axes of a standard-layout array (a global average pooling, a loss's sum) as row sums.
        let trailing = sorted.iter().enumerate().all(|(i, &a)| a == self.rank() - sorted.len() + i);
        let fast = if trailing { sum_trailing(self.value().view(), sorted.len(), keepdim) } else { None };
        let v = fast.unwrap_or_else(|| {
            let mut v = self.value().to_owned();
            for &ax in sorted.iter().rev() {
                v = v.sum_axis(Axis(ax));
                if keepdim {
                    v.insert_axis_inplace(Axis(ax));
                }
            }
            v
        });
        Ok(record(v, Op::Sum { x: self.clone(), axes: sorted, keepdim }))
    }

    /// Sum of every element (a scalar).
    pub fn sum_all(&self) -> Tensor {
        self.sum(&[], false).expect("all axes are valid")
    }

    /// Mean over `axes` (all if empty).
    pub fn mean(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        let n: usize = if axes.is_empty() {
            self.numel()
        } else {
            axes.iter().map(|&a| self.shape().get(a).copied().unwrap_or(1)).product()
        };
        if n == 0 {
            return Err(Error::invalid("mean", "mean over an empty axis"));
        }
        Ok(self.sum(axes, keepdim)?.mul_scalar(1.0 / n as f32))
    }

    /// Mean of every element (a scalar).
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// Maximum along `axis`; the gradient goes to the first maximal entry.
    pub fn max(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        let index = axis_index(self, axis, "max", |a, b| a > b)?;
        let mut out_shape = self.shape().to_vec();
        out_shape.remove(axis);
        let vals: Vec<f32> = self.value().lanes(Axis(axis)).into_iter().zip(&index).map(|(l, &i)| l[i]).collect();
        let mut v = ArrayD::from_shape_vec(IxDyn(&out_shape), vals).expect("one value per lane");
        if keepdim {
            v.insert_axis_inplace(Axis(axis));
        }
        Ok(record(v, Op::MaxAlong { x: self.clone(), axis, keepdim, index }))
    }

    /// Minimum along `axis` (−max(−x)).
    pub fn min(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        Ok(self.neg().max(axis, keepdim)?.neg())
    }

    /// Index of the (first) maximum along `axis`, one per lane in row-major order.
    pub fn argmax(&self, axis: usize) -> Result<Vec<usize>> {
        axis_index(self, axis, "argmax", |a, b| a > b)
    }

    /// Index of the (first) minimum along `axis`.
    pub fn argmin(&self, axis: usize) -> Result<Vec<usize>> {
        axis_index(self, axis, "argmin", |a, b| a < b)
    }

    /// The `k` largest entries of each row of a matrix, in descending order, with their column indices.
    /// The values are differentiable (a gather).
    pub fn topk(&self, k: usize) -> Result<(Tensor, Array2<usize>)> {
        let (n, c) = self.dims2("topk")?;
        if k == 0 || k > c {
            return Err(Error::invalid("topk", format!("k = {k} for {c} columns")));
        }
        let v = self.value();
        let mut idx = Array2::zeros((n, k));
        for (i, row) in v.outer_iter().enumerate() {
            let mut order: Vec<usize> = (0..c).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            for (j, &o) in order[..k].iter().enumerate() {
                idx[[i, j]] = o;
            }
        }
        Ok((self.gather(&idx)?, idx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sums over trailing axes (a global average pooling's, a broadcast gradient's) by row sums: within f32
    /// rounding of f64 sums, the shape kept or not, the same bits on one thread as on several, and the broadcast
    /// gradient's reduction to `[N, C, 1, 1]` equal to the axis-by-axis one within rounding.
    #[test]
    fn trailing_sums_are_row_sums() {
        let x = Tensor::uniform(&[3, 5, 7, 9], -1.0, 1.0, 1);
        let want: Vec<f64> = x.to_vec().chunks(63).map(|r| r.iter().map(|&v| v as f64).sum()).collect();
        for keepdim in [false, true] {
            let s = x.sum(&[2, 3], keepdim).unwrap();
            assert_eq!(s.shape(), if keepdim { &[3, 5, 1, 1][..] } else { &[3, 5][..] });
            for (a, b) in s.to_vec().iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let big = Tensor::uniform(&[64, 3, 40, 40], -1.0, 1.0, 2);
        let serial = one.install(|| big.sum(&[2, 3], true).unwrap().to_vec());
        assert_eq!(serial, big.sum(&[2, 3], true).unwrap().to_vec());
        let full = crate::ops::shape::sum_to_shape(big.value().to_owned(), &[64, 3, 1, 1]);
        let mut generic = big.value().to_owned();
        for ax in [3, 2] {
            generic = generic.sum_axis(Axis(ax)).insert_axis(Axis(ax));
        }
        assert_eq!(full.shape(), generic.shape());
        for (a, b) in full.iter().zip(generic.iter()) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        // Not trailing, or not standard layout: the axis-by-axis path, the same values.
        let t = Tensor::new(x.value().clone().permuted_axes(IxDyn(&[0, 1, 3, 2])));
        let (a, b) = (t.sum(&[2, 3], false).unwrap().to_vec(), x.sum(&[2, 3], false).unwrap().to_vec());
        assert!(a.iter().zip(&b).all(|(a, b)| (a - b).abs() < 1e-5));
        assert_eq!(x.sum(&[1], false).unwrap().shape(), &[3, 7, 9]);
        // The backward of a trailing sum: each row filled with its value, as the broadcast it replaces.
        let g = Tensor::uniform(&[3, 5], -1.0, 1.0, 3).value().to_owned();
        for keepdim in [false, true] {
            let gk = if keepdim { g.clone().into_shape_with_order(IxDyn(&[3, 5, 1, 1])).unwrap() } else { g.clone() };
            let back = sum_backward(&[3, 5, 7, 9], &[2, 3], keepdim, &gk);
            let want = g.clone().into_shape_with_order(IxDyn(&[3, 5, 1, 1])).unwrap();
            assert_eq!(back, want.broadcast(IxDyn(&[3, 5, 7, 9])).unwrap().to_owned());
        }
        let mid = sum_backward(&[3, 5, 7], &[1], false, &Tensor::uniform(&[3, 7], -1.0, 1.0, 4).value().to_owned());
        assert_eq!(mid.shape(), &[3, 5, 7]);
    }
}
