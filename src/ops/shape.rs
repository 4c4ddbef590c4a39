//! Shape ops: reshape, permute, broadcast, narrow, split, pad, concat — views where possible, with their backwards.

use ndarray::{ArrayD, Axis, IxDyn, ShapeBuilder, Slice};

use super::{record, Op};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Sums a broadcast gradient back down to `shape` (leading axes, then axes of size 1).
pub(crate) fn sum_to_shape(mut g: ArrayD<f32>, shape: &[usize]) -> ArrayD<f32> {
    if g.shape() == shape {
        return g;
    }
    // Leading axes kept and trailing ones summed (a squeeze-and-excitation gate's gradient, `[N, C, H, W]` to
    // `[N, C, 1, 1]`): row sums of the standard-layout gradient.
    let keep = shape.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
    if g.ndim() == shape.len() && keep < shape.len() && g.shape()[..keep] == shape[..keep] {
        if let Some(s) = super::reduce::sum_trailing(g.view(), shape.len() - keep, true) {
            return s;
        }
    }
    while g.ndim() > shape.len() {
        g = g.sum_axis(Axis(0));
    }
    for (ax, &d) in shape.iter().enumerate() {
        if d == 1 && g.shape()[ax] != 1 {
            g = g.sum_axis(Axis(ax)).insert_axis(Axis(ax));
        }
    }
    g
}

/// The values of `a` in row-major order, as one vector: a copy of the slice when `a` is in standard layout, else a
/// blocked transpose between the output's last axis and the input's unit-stride axis, tile by tile (a permuted
/// view — the NHWC layout a transformer block's LayerNorm reads after `permute(0, 2, 3, 1)` — would otherwise be
/// gathered element by element through `IxDyn` index arithmetic, 20-odd ns each: most of ConvNeXt-T's LayerNorm
/// time). Any strides, negative and broadcast (zero) ones included.
pub(crate) fn contiguous_vec(a: &ndarray::ArrayViewD<f32>) -> Vec<f32> {
    if let Some(s) = a.as_slice() {
        return s.to_vec();
    }
    let (shape, strides) = (a.shape(), a.strides());
    let rank = shape.len();
    let n: usize = shape.iter().product();
    if n == 0 {
        return Vec::new();
    }
    let l = rank - 1;
    if strides[l] == 1 && rank >= 2 {
        return contiguous_rows(a);
    }
    // Trailing axes that are one run in the source too (positive strides, each the next one's span; no negative
    // stride before them) merge into one: ConvNeXt-T's `[4, 14, 14, 384]` read as NCHW copies as 4 transposes of
    // `196 × 384` instead of 56 of `14 × 384`, whose 14-float output rows each write a partial cache line.
    // Row-major order is unchanged.
    let mut m = l;
    while m > 0 && strides[m] > 0 && strides[m - 1] == strides[m] * shape[m] as isize {
        m -= 1;
    }
    if m < l && strides[..m].iter().all(|&s| s >= 0) {
        let merged: Vec<usize> = shape[..m].iter().copied().chain([shape[m..].iter().product()]).collect();
        let steps: Vec<usize> = strides[..m].iter().chain([&strides[l]]).map(|&s| s as usize).collect();
        // SAFETY: the merged view addresses exactly the elements of `a` (the merged axes are one arithmetic run
        // of positive stride in the source), in the same row-major order, and borrows `a`'s data for this call.
        let view = unsafe { ndarray::ArrayViewD::from_shape_ptr(IxDyn(&merged).strides(IxDyn(&steps)), a.as_ptr()) };
        return contiguous_vec(&view);
    }
    // The output's last axis `l` and the input's unit-stride axis `u` (if another): tiles of `u × l`.
    let u = (0..l).rev().find(|&ax| strides[ax].abs() == 1 && shape[ax] > 1 && strides[l].abs() != 1);
    let mut out_strides = vec![1usize; rank];
    for ax in (0..l).rev() {
        out_strides[ax] = out_strides[ax + 1] * shape[ax + 1];
    }
    // The axes other than `l` and `u`: each index over them owns a `u × l` block of the output (disjoint blocks,
    // together all of it), so the blocks run in parallel when the copy is large.
    let outer: Vec<usize> = (0..l).filter(|&ax| Some(ax) != u).collect();
    let (len_l, sl) = (shape[l], strides[l]);
    let (len_u, su, ou) = u.map_or((1, 0, 0), |u| (shape[u], strides[u], out_strides[u]));
    const TILE: usize = 16;
    // Without a unit-stride axis to transpose against, whole rows at a time.
    let tile_l = if u.is_some() { TILE } else { len_l };
    // With the vector kernels, a unit stride along `u` and a positive one along `l`, the block is a strided 2-D
    // transpose in 8×8 register blocks: the scalar tiles ran at 3 ns an element on ConvNeXt-T's first stage
    // (`[4, 56, 56, 96]` read as NCHW: its layer scale and LayerNorm copies, 8× a contiguous pass).
    #[cfg(target_arch = "x86_64")]
    let vector = super::simd::accelerated() && su == 1 && sl > 0;
    let block = |t: usize, out: &super::Slots| {
        let (mut rem, mut so, mut oo) = (t, 0isize, 0usize);
        for &ax in outer.iter().rev() {
            let i = rem % shape[ax];
            rem /= shape[ax];
            so += i as isize * strides[ax];
            oo += i * out_strides[ax];
        }
        #[cfg(target_arch = "x86_64")]
        if vector {
            // SAFETY: the CPU has AVX2 (`accelerated`); element (j, i) of the source block — `l` index j, `u`
            // index i — lies at `so + j·sl + i` inside the view, and its output position `oo + i·ou + j` belongs
            // to this block alone.
            unsafe {
                super::simd::transpose_strided(a.as_ptr().offset(so), sl as usize, out.ptr().add(oo), ou, len_l, len_u)
            };
            return;
        }
        for i0 in (0..len_u).step_by(TILE) {
            for j0 in (0..len_l).step_by(tile_l) {
                for i in i0..(i0 + TILE).min(len_u) {
                    let base = so + i as isize * su + j0 as isize * sl;
                    for j in 0..(len_l - j0).min(tile_l) {
                        // SAFETY: every index is within the view's shape, so the offset lies inside its data, and
                        // the output position within `n` belongs to this block alone.
                        unsafe { out.write(oo + i * ou + j0 + j, *a.as_ptr().offset(base + j as isize * sl)) };
                    }
                }
            }
        }
    };
    let blocks = n / (len_u * len_l);
    // SAFETY: the blocks cover the output, each position written once.
    unsafe {
        super::written(n, |out| {
            let slots = super::Slots::new(out);
            if n >= super::PAR_THRESHOLD && blocks > 1 {
                use rayon::prelude::*;
                let min = (super::PAR_THRESHOLD / (len_u * len_l)).max(1);
                (0..blocks).into_par_iter().with_min_len(min).for_each(|t| block(t, &slots));
            } else {
                (0..blocks).for_each(|t| block(t, &slots));
            }
        })
    }
}

/// [`contiguous_vec`] of a view whose rows (last axis) are contiguous — a permutation or slice of the leading axes,
/// as attention's heads after a transpose: whole rows copied, a block of rows per index of the other leading axes,
/// the blocks in parallel when large. An odometer step per row cost more than the row's copy.
fn contiguous_rows(a: &ndarray::ArrayViewD<f32>) -> Vec<f32> {
    let (shape, strides) = (a.shape(), a.strides());
    let r = shape.len() - 2;
    let (len_r, len_l, sr) = (shape[r], shape[r + 1], strides[r]);
    let n = a.len();
    let fill = |(b, dst): (usize, &mut [std::mem::MaybeUninit<f32>])| {
        // Block `b`'s offset: its index over the leading axes, row-major.
        let (mut rem, mut so) = (b, 0isize);
        for ax in (0..r).rev() {
            so += (rem % shape[ax]) as isize * strides[ax];
            rem /= shape[ax];
        }
        for (i, row) in dst.chunks_exact_mut(len_l).enumerate() {
            // SAFETY: row `i` of block `b` is an index within the view's shape, its `len_l` values one after another.
            let src = unsafe { std::slice::from_raw_parts(a.as_ptr().offset(so + i as isize * sr), len_l) };
            row.iter_mut().zip(src).for_each(|(d, &v)| _ = d.write(v));
        }
    };
    // SAFETY: the blocks cover the output and every row of each is written.
    unsafe {
        super::written(n, |out| {
            if n >= super::PAR_THRESHOLD {
                use rayon::prelude::*;
                out.par_chunks_mut(len_r * len_l).enumerate().for_each(fill);
            } else {
                out.chunks_mut(len_r * len_l).enumerate().for_each(fill);
            }
        })
    }
}

/// The values as a flat row-major slice, copied only when they are not in standard layout.
pub(crate) fn standard<S: ndarray::Data<Elem = f32>>(a: &ndarray::ArrayBase<S, IxDyn>) -> std::borrow::Cow<'_, [f32]> {
    match a.as_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(contiguous_vec(&a.view())),
    }
}

pub(crate) fn reshape_backward(shape: &[usize], g: ArrayD<f32>) -> ArrayD<f32> {
    let g = if g.is_standard_layout() {
        g
    } else {
        ArrayD::from_shape_vec(g.raw_dim(), contiguous_vec(&g.view())).expect("same number of elements")
    };
    g.into_shape_with_order(IxDyn(shape)).expect("same number of elements")
}

pub(crate) fn permute_backward(perm: &[usize], g: ArrayD<f32>) -> ArrayD<f32> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    g.permuted_axes(IxDyn(&inv))
}

pub(crate) fn narrow_backward(shape: &[usize], axis: usize, start: usize, g: &ArrayD<f32>) -> ArrayD<f32> {
    let mut out = ArrayD::zeros(IxDyn(shape));
    let len = g.shape()[axis];
    out.slice_axis_mut(Axis(axis), Slice::from(start..start + len)).assign(g);
    out
}

/// `acc[start..start + len along axis] += g`: a narrow's gradient added into the input's gradient already held
/// (the backward's sum over the input's readers, without an input-sized gradient of the narrow's own).
pub(crate) fn narrow_add_into(acc: &mut ArrayD<f32>, axis: usize, start: usize, g: &ArrayD<f32>) {
    let len = g.shape()[axis];
    let mut part = acc.slice_axis_mut(Axis(axis), Slice::from(start..start + len));
    match (part.as_slice_mut(), g.as_slice()) {
        (Some(a), Some(b)) => super::elementwise::add_slices(a, b),
        _ => part += g,
    }
}

pub(crate) fn pad_backward(shape: &[usize], pads: &[(usize, usize)], g: &ArrayD<f32>) -> ArrayD<f32> {
    let mut v = g.view();
    for (ax, (&(before, _), &d)) in pads.iter().zip(shape).enumerate() {
        v.slice_axis_inplace(Axis(ax), Slice::from(before..before + d));
    }
    v.to_owned()
}

pub(crate) fn concat_backward(xs: &[Tensor], axis: usize, g: &ArrayD<f32>, need: &[bool]) -> Vec<Option<ArrayD<f32>>> {
    if let Some(gs) = g.as_slice() {
        // Each input's gradient is its columns of `g` seen as [outer, total·inner]: one copy per outer index.
        let (outer, inner) = outer_inner(g.shape(), axis);
        let row = g.shape()[axis] * inner;
        let lens: Vec<usize> = xs.iter().map(|x| x.shape()[axis] * inner).collect();
        let starts: Vec<usize> = lens.iter().scan(0, |s, &l| Some(std::mem::replace(s, *s + l))).collect();
        let mut pieces: Vec<Vec<f32>> =
            lens.iter().zip(need).map(|(&l, &n)| Vec::with_capacity(if n { outer * l } else { 0 })).collect();
        let mut blocks = Vec::new();
        for (i, v) in pieces.iter_mut().enumerate().filter(|&(i, _)| need[i]) {
            let (start, len) = (starts[i], lens[i]);
            let mut rest = &mut v.spare_capacity_mut()[..outer * len];
            for o in 0..outer {
                let (dst, tail) = rest.split_at_mut(len);
                blocks.push((dst, &gs[o * row + start..o * row + start + len]));
                rest = tail;
            }
        }
        copy_blocks(blocks);
        return xs
            .iter()
            .zip(pieces)
            .enumerate()
            .map(|(i, (x, mut v))| {
                need[i].then(|| {
                    // SAFETY: `copy_blocks` wrote every one of the input's `outer · len` floats.
                    unsafe { v.set_len(outer * lens[i]) };
                    ArrayD::from_shape_vec(x.shape(), v).expect("input-sized")
                })
            })
            .collect();
    }
    let mut start = 0;
    xs.iter()
        .zip(need)
        .map(|(x, &n)| {
            let len = x.shape()[axis];
            let piece = n.then(|| g.slice_axis(Axis(axis), Slice::from(start..start + len)).to_owned());
            start += len;
            piece
        })
        .collect()
}

/// The number of elements before `axis` (outer) and after it (inner) in a row-major array of `shape`.
fn outer_inner(shape: &[usize], axis: usize) -> (usize, usize) {
    (shape[..axis].iter().product(), shape[axis + 1..].iter().product())
}

/// [`Tensor::concat`] of standard-layout values: per outer index, each input's contiguous block copied in turn
/// (`None` when an input is not in standard layout).
fn concat_blocks(xs: &[Tensor], axis: usize) -> Option<ArrayD<f32>> {
    let slices: Vec<&[f32]> = xs.iter().map(|x| x.value().as_slice()).collect::<Option<_>>()?;
    let mut shape = xs[0].shape().to_vec();
    shape[axis] = xs.iter().map(|x| x.shape()[axis]).sum();
    let (outer, inner) = outer_inner(&shape, axis);
    let lens: Vec<usize> = xs.iter().map(|x| x.shape()[axis] * inner).collect();
    let total = shape.iter().product();
    // SAFETY: the blocks tile the output: per outer index, every input's block in turn.
    let out = unsafe {
        super::written(total, |slots| {
            let mut rest = slots;
            let mut blocks = Vec::with_capacity(outer * xs.len());
            for o in 0..outer {
                for (s, &len) in slices.iter().zip(&lens) {
                    let (dst, tail) = rest.split_at_mut(len);
                    blocks.push((dst, &s[o * len..(o + 1) * len]));
                    rest = tail;
                }
            }
            copy_blocks(blocks);
        })
    };
    Some(ArrayD::from_shape_vec(IxDyn(&shape), out).expect("output-sized"))
}

/// Floats a parallel job of [`copy_blocks`] takes at least: below this a copy is not worth a thread's wake-up.
const COPY_JOB: usize = 1 << 15;

/// Each `(dst, src)` pair copied, across the threads when the floats are many (a DenseNet-121 block's
/// concatenations copy its growing features on every layer: 18.8 ms of its 160 on one thread).
fn copy_blocks(blocks: Vec<(&mut [std::mem::MaybeUninit<f32>], &[f32])>) {
    let total: usize = blocks.iter().map(|(_, src)| src.len()).sum();
    use rayon::prelude::*;
    let copy = |(dst, src): (&mut [std::mem::MaybeUninit<f32>], &[f32])| {
        assert_eq!(dst.len(), src.len(), "copy_blocks: blocks of one length");
        // SAFETY: both hold `src.len()` floats (asserted) and do not overlap (`dst` is borrowed uniquely).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<f32>(), src.len()) };
    };
    if total < 2 * COPY_JOB || rayon::current_num_threads() == 1 {
        blocks.into_iter().for_each(copy);
    } else {
        let per_job = (COPY_JOB * blocks.len()).div_ceil(total).max(1);
        blocks.into_par_iter().with_min_len(per_job).for_each(copy);
    }
}

fn check_axis(op: &'static str, axis: usize, rank: usize) -> Result<()> {
    if axis >= rank {
        return Err(Error::invalid(op, format!("axis {axis} out of range for rank {rank}")));
    }
    Ok(())
}

/// `v` as `shape` when the two differ only in axes of size 1 (a squeeze or an unsqueeze): a view of the same data,
/// whatever its strides — a permuted value otherwise copies (ViT-B/16's attention squeezes its transposed
/// query-key-value projection, 1.8 M floats a block).
fn unit_axes_moved(v: &crate::tensor::Array, shape: &[usize]) -> Option<crate::tensor::Array> {
    let kept = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    if kept(v.shape()) != kept(shape) {
        return None;
    }
    let mut out = v.clone();
    while let Some(ax) = out.shape().iter().rposition(|&d| d == 1) {
        out = out.remove_axis(Axis(ax));
    }
    for (ax, _) in shape.iter().enumerate().filter(|(_, &d)| d == 1) {
        out.insert_axis_inplace(Axis(ax));
    }
    Some(out)
}

/// Shape manipulation.
impl Tensor {
    /// The same values in a new shape (row-major); a view when the value is contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        // Checked over every dimension: `[0, 2^40, 2^40]` has as many elements as `[0]` but is no valid array.
        if crate::limits::checked_numel("reshape", shape)? != self.numel() {
            return Err(Error::ShapeMismatch { op: "reshape", expected: shape.to_vec(), got: self.shape().to_vec() });
        }
        let v = self.value();
        let bad = |e: ndarray::ShapeError| Error::invalid("reshape", format!("to {shape:?}: {e}"));
        let value = if v.is_standard_layout() {
            v.clone().into_shape_with_order(IxDyn(shape)).map_err(bad)?
        } else if let Some(view) = unit_axes_moved(v, shape) {
            view
        } else {
            // A permuted or sliced view: copied in row-major order by tiles, not element by element.
            ArrayD::from_shape_vec(IxDyn(shape), contiguous_vec(&v.view())).map_err(bad)?.into_shared()
        };
        Ok(record(value, Op::Reshape(self.clone())))
    }

    /// Flattens every axis from `start` on into one (as `torch.flatten(x, start)`).
    pub fn flatten_from(&self, start: usize) -> Result<Tensor> {
        check_axis("flatten", start, self.rank().max(1))?;
        let mut shape = self.shape()[..start].to_vec();
        shape.push(self.shape()[start..].iter().product());
        self.reshape(&shape)
    }

    /// Inserts an axis of size 1 at `axis`.
    pub fn unsqueeze(&self, axis: usize) -> Result<Tensor> {
        check_axis("unsqueeze", axis, self.rank() + 1)?;
        let mut shape = self.shape().to_vec();
        shape.insert(axis, 1);
        self.reshape(&shape)
    }

    /// Removes an axis of size 1.
    pub fn squeeze(&self, axis: usize) -> Result<Tensor> {
        check_axis("squeeze", axis, self.rank())?;
        if self.shape()[axis] != 1 {
            return Err(Error::invalid("squeeze", format!("axis {axis} has size {}", self.shape()[axis])));
        }
        let mut shape = self.shape().to_vec();
        shape.remove(axis);
        self.reshape(&shape)
    }

    /// Reorders the axes (a view).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank() || perm.iter().any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true)) {
            return Err(Error::invalid("permute", format!("{perm:?} is not a permutation of {} axes", self.rank())));
        }
        let value = self.value().clone().permuted_axes(IxDyn(perm));
        Ok(record(value, Op::Permute(self.clone(), perm.to_vec())))
    }

    /// Swaps two axes (a view).
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        check_axis("transpose", a.max(b), self.rank())?;
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// The transpose of a matrix.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(self.rank_error("t", 2));
        }
        self.transpose(0, 1)
    }

    /// Broadcasts to `shape` (NumPy rules).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let view = self.value().broadcast(IxDyn(shape)).ok_or_else(|| Error::Broadcast {
            op: "broadcast_to",
            lhs: self.shape().to_vec(),
            rhs: shape.to_vec(),
        })?;
        Ok(record(view.to_owned(), Op::BroadcastTo(self.clone())))
    }

    /// `len` entries along `axis` starting at `start` (a view).
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Tensor> {
        check_axis("narrow", axis, self.rank())?;
        if start.checked_add(len).is_none_or(|end| end > self.shape()[axis]) {
            return Err(Error::invalid(
                "narrow",
                format!("range {start} + {len} exceeds axis {axis} of size {}", self.shape()[axis]),
            ));
        }
        let mut value = self.value().clone();
        value.slice_axis_inplace(Axis(axis), Slice::from(start..start + len));
        Ok(record(value, Op::Narrow { x: self.clone(), axis, start }))
    }

    /// Pads every axis with `(before, after)` copies of `value` (constant padding).
    pub fn pad(&self, pads: &[(usize, usize)], value: f32) -> Result<Tensor> {
        if pads.len() != self.rank() {
            return Err(Error::invalid("pad", format!("{} pad pairs for rank {}", pads.len(), self.rank())));
        }
        let shape: Vec<usize> = self.shape().iter().zip(pads).map(|(&d, &(a, b))| d + a + b).collect();
        let mut out = ArrayD::from_elem(IxDyn(&shape), value);
        {
            let mut v = out.view_mut();
            for (ax, (&(before, _), &d)) in pads.iter().zip(self.shape()).enumerate() {
                v.slice_axis_inplace(Axis(ax), Slice::from(before..before + d));
            }
            v.assign(self.value());
        }
        Ok(record(out, Op::Pad { x: self.clone(), pads: pads.to_vec() }))
    }

    /// Cuts the tensor along `axis` into consecutive pieces of the given sizes, which must add up to the axis's
    /// length (as `torch.split(x, sizes, axis)` and ONNX's Split). Each piece is a view; its gradient is
    /// scattered back into place.
    pub fn split(&self, axis: usize, sizes: &[usize]) -> Result<Vec<Tensor>> {
        check_axis("split", axis, self.rank())?;
        let d = self.shape()[axis];
        if sizes.iter().try_fold(0usize, |acc, &s| acc.checked_add(s)) != Some(d) {
            return Err(Error::invalid(
                "split",
                format!("sizes {sizes:?} do not add up to the length {d} of axis {axis} (shape {:?})", self.shape()),
            ));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let piece = self.narrow(axis, start, len);
                start += len;
                piece
            })
            .collect()
    }

    /// Joins tensors along an existing axis.
    pub fn concat(xs: &[Tensor], axis: usize) -> Result<Tensor> {
        let first = xs.first().ok_or_else(|| Error::invalid("concat", "no tensors given"))?;
        check_axis("concat", axis, first.rank())?;
        for x in xs {
            let same = x.rank() == first.rank()
                && x.shape().iter().zip(first.shape()).enumerate().all(|(i, (a, b))| i == axis || a == b);
            if !same {
                return Err(Error::ShapeMismatch {
                    op: "concat",
                    expected: first.shape().to_vec(),
                    got: x.shape().to_vec(),
                });
            }
        }
        let value = concat_blocks(xs, axis).unwrap_or_else(|| {
            let views: Vec<_> = xs.iter().map(|x| x.value().view()).collect();
            ndarray::concatenate(Axis(axis), &views).expect("shapes checked above")
        });
        Ok(record(value, Op::Concat { xs: xs.to_vec(), axis }))
    }

    /// Joins tensors of equal shape along a new axis.
    pub fn stack(xs: &[Tensor], axis: usize) -> Result<Tensor> {
        let parts = xs.iter().map(|x| x.unsqueeze(axis)).collect::<Result<Vec<_>>>()?;
        Tensor::concat(&parts, axis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked copy gives ndarray's row-major order for permuted, sliced (negative and step strides),
    /// broadcast and contiguous views, tiles with remainders and rank 1.
    #[test]
    fn contiguous_vec_is_row_major_order() {
        let x = Tensor::uniform(&[3, 37, 5, 18], -1.0, 1.0, 1).to_array();
        let want = |v: &ndarray::ArrayViewD<f32>| v.iter().copied().collect::<Vec<f32>>();
        let views = [
            x.view(),
            x.view().permuted_axes(IxDyn(&[0, 2, 3, 1])),
            x.view().permuted_axes(IxDyn(&[1, 0, 2, 3])),
            x.view().permuted_axes(IxDyn(&[3, 1, 0, 2])),
            x.slice(ndarray::s![.., ..;-2, 1.., ..;3]).into_dyn(),
            x.slice(ndarray::s![.., 3, .., ..]).into_dyn().permuted_axes(IxDyn(&[2, 1, 0])),
            x.slice(ndarray::s![1, 2, .., 4]).into_dyn(),
            // Channels-last to channels-first: the trailing axes merge into one run (not behind a reversed axis).
            x.view().permuted_axes(IxDyn(&[0, 3, 1, 2])),
            x.slice(ndarray::s![..;-1, .., .., ..]).into_dyn().permuted_axes(IxDyn(&[0, 3, 1, 2])),
            x.slice(ndarray::s![.., 1..36, .., ..;2]).into_dyn().permuted_axes(IxDyn(&[0, 3, 1, 2])),
        ];
        for (i, v) in views.iter().enumerate() {
            assert_eq!(contiguous_vec(v), want(v), "view {i}");
        }
        // Contiguous rows (copied whole): a reversed and stepped leading slice, a rank-2 slice, and attention's
        // heads after a transpose, large enough for the parallel blocks.
        let heads = Tensor::uniform(&[4, 197, 12, 64], -1.0, 1.0, 2).to_array();
        let rows = [
            x.slice(ndarray::s![..;-1, 1..30;2, .., ..]).into_dyn(),
            x.slice(ndarray::s![2, 3..9, 1, ..]).into_dyn(),
            heads.view().permuted_axes(IxDyn(&[0, 2, 1, 3])),
        ];
        for (i, v) in rows.iter().enumerate() {
            assert_eq!(contiguous_vec(v), want(v), "rows {i}");
        }
        // Tiles in parallel blocks: channels-last views both ways (the unit-stride axis next to the last, and far
        // from it), and a broadcast one.
        let maps = Tensor::uniform(&[2, 24, 30, 40], -1.0, 1.0, 3).to_array();
        let col = ndarray::Array1::from_iter((0..40_000).map(|v| v as f32)).into_dyn();
        let large = [
            maps.view().permuted_axes(IxDyn(&[0, 2, 3, 1])),
            maps.view().permuted_axes(IxDyn(&[0, 3, 1, 2])),
            maps.view().permuted_axes(IxDyn(&[3, 2, 1, 0])),
            col.broadcast(IxDyn(&[3, 40_000])).unwrap().permuted_axes(IxDyn(&[1, 0])),
        ];
        for (i, v) in large.iter().enumerate() {
            assert_eq!(contiguous_vec(v), want(v), "large {i}");
        }
        let row = ndarray::Array1::from_iter((0..20).map(|v| v as f32)).into_dyn();
        let b = row.broadcast(IxDyn(&[3, 20])).unwrap().permuted_axes(IxDyn(&[1, 0]));
        assert_eq!(contiguous_vec(&b), want(&b));
        assert!(contiguous_vec(&ArrayD::<f32>::zeros(IxDyn(&[2, 0, 3])).view()).is_empty());
    }

    /// A squeeze or unsqueeze of a permuted value is a view of the same data (no copy), with the values and the
    /// gradient of the copying reshape; other reshapes of it still copy.
    #[test]
    fn unit_axes_of_a_permuted_value_move_without_a_copy() {
        let x = Tensor::uniform(&[3, 5, 1, 4], -1.0, 1.0, 7).variable();
        let p = x.permute(&[2, 1, 0, 3]).unwrap(); // [1, 5, 3, 4], not contiguous
        let want = |shape: &[usize]| {
            let v = contiguous_vec(&p.value().view());
            ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
        };
        for shape in [&[5, 3, 4][..], &[5, 1, 3, 4, 1], &[1, 1, 5, 3, 1, 4]] {
            let r = p.reshape(shape).unwrap();
            assert_eq!(r.shape(), shape);
            assert_eq!(r.value().as_ptr(), p.value().as_ptr(), "{shape:?}: a view");
            assert_eq!(r.to_array(), want(shape), "{shape:?}");
            let g = r.mul_scalar(2.0).sum_all().grad_wrt(&[&x]).unwrap();
            assert_eq!(g[0].to_vec(), vec![2.0; 60], "{shape:?}: gradient");
        }
        let split = p.reshape(&[5, 12]).unwrap();
        assert_eq!(split.to_array(), want(&[5, 12]));
        assert!(split.value().is_standard_layout());
    }

    /// The block copies give `ndarray::concatenate`'s values along every axis, and the backward hands each input
    /// its own block of the gradient.
    #[test]
    fn concat_blocks_match_ndarray() {
        let xs = [
            Tensor::uniform(&[2, 3, 4, 5], -1.0, 1.0, 1),
            Tensor::uniform(&[2, 3, 4, 5], -1.0, 1.0, 2),
            Tensor::uniform(&[2, 3, 4, 5], -1.0, 1.0, 3),
        ];
        for axis in 0..4 {
            let parts = [xs[0].clone(), xs[1].narrow(axis, 1, 1).unwrap().to_array().into(), xs[2].clone()];
            let parts: Vec<Tensor> = parts.iter().map(|t| Tensor::new(t.to_array())).collect();
            let got = concat_blocks(&parts, axis).unwrap();
            let views: Vec<_> = parts.iter().map(|x| x.value().view()).collect();
            assert_eq!(got, ndarray::concatenate(Axis(axis), &views).unwrap(), "axis {axis}");
            let back = concat_backward(&parts, axis, &got, &[true, true, true]);
            for (b, x) in back.iter().zip(&parts) {
                assert_eq!(b.as_ref().unwrap(), &x.to_array(), "axis {axis}: gradient block");
            }
        }
        // Large enough to be copied across the threads (a DenseNet block's features), with inputs of other
        // lengths and a gradient left out.
        let parts: Vec<Tensor> = [40, 7, 50]
            .iter()
            .enumerate()
            .map(|(i, &c)| Tensor::uniform(&[3, c, 30, 30], -1.0, 1.0, i as u64))
            .collect();
        for axis in [0, 1] {
            let parts: Vec<Tensor> = if axis == 0 {
                parts
                    .iter()
                    .map(|t| {
                        Tensor::new(t.to_array().permuted_axes(vec![1, 0, 2, 3]).as_standard_layout().into_owned())
                    })
                    .collect()
            } else {
                parts.clone()
            };
            let got = concat_blocks(&parts, axis).unwrap();
            assert!(got.len() > 2 * COPY_JOB);
            let views: Vec<_> = parts.iter().map(|x| x.value().view()).collect();
            assert_eq!(got, ndarray::concatenate(Axis(axis), &views).unwrap(), "axis {axis}");
            let back = concat_backward(&parts, axis, &got, &[true, false, true]);
            assert!(back[1].is_none());
            for i in [0, 2] {
                assert_eq!(back[i].as_ref().unwrap(), &parts[i].to_array(), "axis {axis}: gradient block {i}");
            }
        }
    }
}
