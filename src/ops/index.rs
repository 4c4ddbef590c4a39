//! Indexing: index_select, gather (pick each row's entries), where / masked_fill.

use ndarray::{Array2, ArrayD, Axis, IxDyn, Zip};

use super::shape::sum_to_shape;
use super::{record, Op};
use crate::tensor::Tensor;
use crate::{Error, Result};

pub(crate) fn index_select_backward(shape: &[usize], axis: usize, index: &[usize], g: &ArrayD<f32>) -> ArrayD<f32> {
    let mut out = ArrayD::zeros(IxDyn(shape));
    for (j, &i) in index.iter().enumerate() {
        let mut dst = out.index_axis_mut(Axis(axis), i);
        dst += &g.index_axis(Axis(axis), j);
    }
    out
}

pub(crate) fn gather_backward(shape: &[usize], index: &Array2<usize>, g: &ArrayD<f32>) -> ArrayD<f32> {
    let mut out = ArrayD::zeros(IxDyn(shape));
    for ((i, j), &c) in index.indexed_iter() {
        out[[i, c]] += g[[i, j]];
    }
    out
}

pub(crate) fn where_backward(
    mask: &ArrayD<bool>,
    a: &Tensor,
    b: &Tensor,
    g: &ArrayD<f32>,
    need: &[bool],
) -> Vec<Option<ArrayD<f32>>> {
    let ga =
        need[0].then(|| sum_to_shape(Zip::from(g).and(mask).map_collect(|&g, &m| if m { g } else { 0.0 }), a.shape()));
    let gb =
        need[1].then(|| sum_to_shape(Zip::from(g).and(mask).map_collect(|&g, &m| if m { 0.0 } else { g }), b.shape()));
    vec![ga, gb]
}

/// Indexing.
impl Tensor {
    /// The entries at `index` along `axis` (indices may repeat); gradients scatter-add back.
    pub fn index_select(&self, axis: usize, index: &[usize]) -> Result<Tensor> {
        if axis >= self.rank() {
            return Err(Error::invalid("index_select", format!("axis {axis} out of range for rank {}", self.rank())));
        }
        let d = self.shape()[axis];
        if let Some(&bad) = index.iter().find(|&&i| i >= d) {
            return Err(Error::invalid("index_select", format!("index {bad} out of range for size {d}")));
        }
        let mut out_shape = self.shape().to_vec();
        out_shape[axis] = index.len();
        crate::limits::checked_numel("index_select", &out_shape)?;
        let value = self.value().select(Axis(axis), index);
        Ok(record(value, Op::IndexSelect { x: self.clone(), axis, index: index.to_vec() }))
    }

    /// For a matrix `x` [N, C] and indices [N, K]: `out[i, j] = x[i, index[i, j]]` (torch.gather on dim 1).
    pub fn gather(&self, index: &Array2<usize>) -> Result<Tensor> {
        let (n, c) = self.dims2("gather")?;
        if index.nrows() != n {
            return Err(Error::ShapeMismatch {
                op: "gather",
                expected: vec![n, index.ncols()],
                got: index.shape().to_vec(),
            });
        }
        if let Some(&bad) = index.iter().find(|&&i| i >= c) {
            return Err(Error::invalid("gather", format!("index {bad} out of range for {c} columns")));
        }
        let v = self.value();
        let value = Array2::from_shape_fn(index.dim(), |(i, j)| v[[i, index[[i, j]]]]).into_dyn();
        Ok(record(value, Op::Gather { x: self.clone(), index: index.clone() }))
    }

    /// Each row's entry at `labels[i]`: `[N, C] → [N]` (a sample's logit of a class).
    pub fn pick(&self, labels: &[usize]) -> Result<Tensor> {
        let index = Array2::from_shape_vec((labels.len(), 1), labels.to_vec()).expect("one column");
        let n = labels.len();
        self.gather(&index)?.reshape(&[n])
    }

    /// `a` where `mask` is true, else `b`; `a` and `b` broadcast to the mask's shape.
    pub fn where_(mask: &ArrayD<bool>, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let shape = mask.shape();
        let av = a.value().broadcast(IxDyn(shape));
        let bv = b.value().broadcast(IxDyn(shape));
        let (Some(av), Some(bv)) = (av, bv) else {
            return Err(Error::Broadcast { op: "where", lhs: a.shape().to_vec(), rhs: shape.to_vec() });
        };
        let value = Zip::from(mask).and(&av).and(&bv).map_collect(|&m, &x, &y| if m { x } else { y });
        Ok(record(value, Op::Where { mask: mask.clone(), a: a.clone(), b: b.clone() }))
    }

    /// `value` where `mask` is true, else this tensor.
    pub fn masked_fill(&self, mask: &ArrayD<bool>, value: f32) -> Result<Tensor> {
        if mask.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: "masked_fill",
                expected: self.shape().to_vec(),
                got: mask.shape().to_vec(),
            });
        }
        Tensor::where_(mask, &Tensor::scalar(value), self)
    }
}
