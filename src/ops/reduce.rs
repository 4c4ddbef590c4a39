//! Reductions: sum, mean, max/min along an axis, argmax/argmin and top-k.

use ndarray::{Array2, ArrayD, Axis, IxDyn};

use super::{record, Op};
use crate::tensor::Tensor;
use crate::{Error, Result};

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
        let mut v = self.value().to_owned();
        for &ax in sorted.iter().rev() {
            v = v.sum_axis(Axis(ax));
            if keepdim {
                v.insert_axis_inplace(Axis(ax));
            }
        }
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
