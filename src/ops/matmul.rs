//! Matrix products, 2-D and batched, with their backward: `Linear`'s forward on the packed vector kernel
//! (`simd::gemm_packed`), the rest on the unpacked one or the `gemm` crate.

use ndarray::{s, Array2, Array3, ArrayD, ArrayView2, ArrayView3, ArrayViewMut2, Axis, Ix2, Ix3};

use super::simd::RowsAfter;
use super::{record, Op};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Products with at least this many multiply-adds let the GEMM use every thread.
const PAR_GEMM_WORK: usize = 1 << 20;

/// A fresh array of `shape` that `product` writes whole, with nothing zero-filled first ([`crate::ops::written`]):
/// a matrix, or a batch of them. With the activations of a recorded pass held for its backward, each output is
/// memory last touched a pass before, out of every cache, and the zeroing cost about what the product's own stores
/// did: ConvNeXt-T's `784 × 384 → 1536` MatMuls took 4.0–4.1 ms each in the model, 3.3–3.4 without it.
///
/// # Safety
///
/// `product` writes every element of the view it is given before reading it (products on the vector kernels, not
/// accumulating: each chain starts at zero or at a bias, never at `c`).
pub(super) unsafe fn product_array<D: ndarray::Dimension>(
    shape: D,
    product: impl FnOnce(ndarray::ArrayViewMut<f32, D>),
) -> ndarray::Array<f32, D> {
    let len = shape.size();
    // SAFETY: `written` hands over `len` slots, the view's size; the view is of raw memory (no reference to a
    // float is made), and `product` writes each element before reading it (the caller's promise).
    let v = unsafe {
        crate::ops::written(len, |slots| {
            product(ndarray::ArrayViewMut::from_shape_ptr(shape.clone(), slots.as_mut_ptr().cast::<f32>()))
        })
    };
    ndarray::Array::from_shape_vec(shape, v).expect("the shape's size")
}

/// `c = a·b` (or `c += a·b` when `accumulate`), any strides.
///
/// The `gemm` crate splits the output across threads but keeps each element's reduction over k in one fixed
/// order, so the result does not depend on the thread count (tested in `tests/determinism.rs`).
pub(crate) fn gemm(
    a: ArrayView2<f32>,
    b: ArrayView2<f32>,
    mut c: ArrayViewMut2<f32>,
    accumulate: bool,
    parallel: bool,
) {
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    assert!(k == k2 && c.dim() == (m, n), "gemm: callers check shapes");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    // Never nest a parallel GEMM inside a rayon task (a classifier's chunk, a per-image conv): while a worker
    // waits inside the crate's parallel loop it may steal another GEMM that reuses the same thread-local packing
    // buffer, which showed up as rare, load-dependent differences in results. Chunks already use every thread.
    let nested = rayon::current_thread_index().is_some();
    let par = if parallel && !nested && m * n * k >= PAR_GEMM_WORK {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    let (sa, sb, sc) = (a.strides(), b.strides(), c.strides());
    let (cs, rs) = (sc[1], sc[0]);
    // SAFETY: the three views are valid for their dims and strides, `c` is uniquely borrowed, and a view's
    // strides never alias its own elements; `a` and `b` may alias each other since they are only read.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            cs,
            rs,
            accumulate,
            a.as_ptr(),
            sa[1],
            sa[0],
            b.as_ptr(),
            sb[1],
            sb[0],
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `c = a·b` (or `c += a·b`) on the packed vector kernel, or on the `gemm` crate where that kernel is off: one
/// item of a batched product (attention's `q·kᵀ` and `p·v` and their gradients, 48 items of 197 × 64 × 197 in
/// ViT-B/16), where the crate ran at about half the packed kernel's rate. Each element is one fixed chain of
/// multiply-adds either way, so the result does not depend on the thread count.
fn item_product(a: ArrayView2<f32>, b: ArrayView2<f32>, mut c: ArrayViewMut2<f32>, accumulate: bool, parallel: bool) {
    if !super::simd::gemm_packed(a, b, c.view_mut(), accumulate, parallel) {
        gemm(a, b, c, accumulate, parallel);
    }
}

/// Keys of a weight's packed forms kept with it ([`Tensor::memo`]): as the `b` of `x·w`, and transposed, as the `b`
/// of the input gradient `g·wᵀ`.
pub(super) const KEY_PACKED: u64 = 1 << 60;
pub(super) const KEY_PACKED_T: u64 = 1 << 60 | 1;

/// A right-hand operand of at least this many floats, a leaf, keeps its packed form ([`kept_packed`]); a smaller
/// one is packed per call (it is cheap, and a small leaf is as likely a value of the moment as a weight).
const KEEP_PACKED_MIN: usize = 1 << 16;

/// `b` — the value of the leaf `w`, or its transpose — packed and kept with `w` under `key`, so the product's
/// next call (an attack's next pass) does not pack it again: ViT-B/16 packs 85 M floats of weights per forward
/// pass and as many per input gradient. `None` (pack per call) for a computed `w` or one only this call holds
/// ([`Tensor::is_kept_leaf`]), a small `b`, or on the portable level.
pub(super) fn kept_packed(w: &Tensor, b: ArrayView2<f32>, key: u64) -> Option<std::sync::Arc<super::simd::PackedB>> {
    if !w.is_kept_leaf() || b.len() < KEEP_PACKED_MIN || !super::simd::accelerated() {
        return None;
    }
    w.memo(key, |_| super::simd::pack(b).ok_or(())).ok()
}

/// `a·b` into a fresh matrix, `b` being the value of the tensor `w` (or its transpose, `key` saying which): on
/// `w`'s kept packed form where it has one ([`kept_packed`]) — the same bits as [`matmul2`], each element the same
/// chain of multiply-adds — else [`matmul2`].
fn matmul2_kept(a: ArrayView2<f32>, w: &Tensor, b: ArrayView2<f32>, key: u64) -> Array2<f32> {
    match kept_packed(w, b, key) {
        // SAFETY: the product, not accumulating, writes every element of `c` before reading any.
        Some(packed) => unsafe {
            product_array(Ix2(a.nrows(), b.ncols()), |c| super::simd::gemm_prepacked(a, &packed, c, false, None, true))
        },
        None => matmul2(a, b),
    }
}

/// The number of rows `a·b` is computed with so that the `gemm` crate takes its blocked micro-kernel path with a
/// k-blocking that depends on `k` alone (gemm 0.18, `gemm_basic_generic`): fewer rows are zero-padded up to it.
///
/// Below it the crate switches to other kernels whose rounding differs: a GEMV when a side is a single row or
/// column, horizontal dot products when `m·n ≤ 256`, and for `k > 512` with both sides ≤ 64 a k-block of 512 instead
/// of the `kernel_params` one. (`k ≤ 2` also uses another kernel, for every `m`, so it needs nothing.) Above it,
/// each output element is its own fused multiply-add chain over k in blocks of a fixed size, whatever `m`.
fn invariant_rows(m: usize, k: usize, n: usize) -> usize {
    let mut rows = m.max(2).max(256 / n.max(1) + 1);
    if k > 512 && n <= 64 {
        rows = rows.max(65);
    }
    rows
}

/// `a·b` into a fresh matrix, *batch invariant*: row `i` of the output is bit-identical whatever the other rows of
/// `a` are and however many there are, so a classifier's output for a sample does not depend on the batch it came
/// in (tested below and in `classifier::tests`). Small `m` is zero-padded to [`invariant_rows`].
pub(crate) fn matmul2(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Array2<f32> {
    let ((m, k), n) = (a.dim(), b.ncols());
    if m == 0 || n == 0 {
        return Array2::zeros((m, n));
    }
    // The packed vector kernel is batch invariant as it is (each element one multiply-add chain over k, the
    // same as `gemm_nn`'s): no padding.
    if super::simd::accelerated() {
        // SAFETY: on the vector kernels the product runs, and, not accumulating, writes every element of `c`
        // before reading any.
        return unsafe {
            product_array(Ix2(m, n), |c| assert!(super::simd::gemm_packed(a, b, c, false, true), "the kernels are on"))
        };
    }
    let rows = invariant_rows(m, k, n);
    let padded = (rows != m).then(|| {
        let mut p = Array2::zeros((rows, k));
        p.slice_mut(s![..m, ..]).assign(&a);
        p
    });
    let lhs = match &padded {
        Some(p) => p.view(),
        None => a.view(),
    };
    if rows < COL_MAJOR_ROWS {
        let mut c = Array2::zeros((rows, n));
        gemm(lhs, b, c.view_mut(), false, true);
        return if rows == m { c } else { c.slice_move(s![..m, ..]) };
    }
    // A column-major product: the GEMM then packs the (small) batch of rows of `a`, not all of `b` — for a
    // `Linear` layer `b` is the transposed weight, which a row-major product would repack on every call. The
    // orientation does not change the rounding: either way each element is the same fused multiply-add chain.
    let mut ct = Array2::zeros((n, rows));
    gemm(lhs, b, ct.view_mut().reversed_axes(), false, true);
    ct.slice(s![.., ..m]).t().as_standard_layout().into_owned()
}

/// From this many rows on, [`matmul2`] computes a column-major product (the rows of `a` along the GEMM's SIMD
/// lanes, 16 wide); fewer rows would leave most lanes empty, so the product stays row-major.
const COL_MAJOR_ROWS: usize = 16;

/// `f(i, out_i)` for every item `i` of a batch of products of `work` multiply-adds in all: across threads over the
/// items when there are several and enough work (each item's GEMM then runs on one thread), else in order with
/// each GEMM free to use every thread (`f`'s flag). The same bits either way: each element is one fixed chain of
/// multiply-adds over k, whichever thread computes it.
fn for_items(mut out: ndarray::ArrayViewMut3<f32>, work: usize, f: impl Fn(usize, ArrayViewMut2<f32>, bool) + Sync) {
    use rayon::prelude::*;
    let nested = rayon::current_thread_index().is_some();
    if out.shape()[0] > 1 && !nested && work >= PAR_GEMM_WORK {
        out.axis_iter_mut(Axis(0)).into_par_iter().enumerate().for_each(|(i, o)| f(i, o, false));
    } else {
        out.outer_iter_mut().enumerate().for_each(|(i, o)| f(i, o, true));
    }
}

/// `[B,m,k]·[B,k,n]`, any strides.
fn batched(a: ArrayView3<f32>, b: ArrayView3<f32>) -> Array3<f32> {
    let (bn, m, k) = a.dim();
    let n = b.shape()[2];
    let work = bn * m * k * n;
    let each = |i: usize, ci: ArrayViewMut2<f32>, par: bool| {
        item_product(a.index_axis(Axis(0), i), b.index_axis(Axis(0), i), ci, false, par)
    };
    if !super::simd::accelerated() {
        let mut c = Array3::zeros((bn, m, n));
        for_items(c.view_mut(), work, each);
        return c;
    }
    // SAFETY: on the vector kernels each item's product runs and, not accumulating, writes every element of its
    // matrix before reading any.
    unsafe { product_array(Ix3(bn, m, n), |c| for_items(c, work, each)) }
}

/// `x` as a `rows × cols` matrix: a view when it is in standard layout, else a copy.
pub(super) fn rows(x: ndarray::ArrayViewD<'_, f32>, rows: usize, cols: usize) -> ndarray::CowArray<'_, f32, Ix2> {
    if x.is_standard_layout() {
        return ndarray::CowArray::from(x.into_shape_with_order((rows, cols)).expect("rows · cols values"));
    }
    let v = super::shape::contiguous_vec(&x);
    ndarray::CowArray::from(Array2::from_shape_vec((rows, cols), v).expect("rows · cols values"))
}

/// ∂L/∂A = G·Bᵀ and ∂L/∂B = Aᵀ·G of a 2-D product with `b2` the value of `b`, each when `need` asks for it.
/// `g·bᵀ`, the input gradient of a product with `b` (whose value is `b2`), then `after` on every row: in the
/// product's blocks as each completes, in cache, on `b`'s kept packing (an attack's case), else in a pass after.
/// The output is made only for the product that fills it: a zeroed matrix made first and then dropped for the kept
/// packing was a pass over cold memory per call (ConvNeXt-T's `784 × 384 → 1536` input gradients, whose weights
/// are row-major).
pub(super) fn input_grad(
    g2: ArrayView2<f32>,
    (b, b2): (&Tensor, ArrayView2<f32>),
    after: Option<RowsAfter>,
) -> Array2<f32> {
    let (m, n) = (g2.nrows(), b2.nrows());
    let mut c = if super::simd::accelerated() && (n <= 1 || b2.strides()[0] == 1) {
        // SAFETY: the vector kernel runs (accelerated, `b2ᵀ` with contiguous rows, a fresh `c`) and, not
        // accumulating, writes every element of `c` before reading any.
        unsafe { product_array(Ix2(m, n), |c| assert!(super::simd::gemm_nn(g2, b2.t(), c, false, true), "it applies")) }
    } else if let Some(packed) = kept_packed(b, b2.t(), KEY_PACKED_T) {
        // SAFETY: the product, not accumulating, writes every element of `c` before reading any.
        return unsafe {
            product_array(Ix2(m, n), |c| super::simd::gemm_prepacked_then(g2, &packed, c, false, None, true, after))
        };
    } else {
        matmul2(g2, b2.t())
    };
    if let Some(f) = after {
        use rayon::prelude::*;
        c.axis_iter_mut(Axis(0))
            .into_par_iter()
            .enumerate()
            .for_each(|(i, mut row)| f(i, 0, row.as_slice_mut().expect("a fresh matrix's rows")));
    }
    c
}

pub(super) fn backward2(
    a2: ArrayView2<f32>,
    (b, b2): (&Tensor, ArrayView2<f32>),
    g2: ArrayView2<f32>,
    need: &[bool],
) -> (Option<Array2<f32>>, Option<ArrayD<f32>>) {
    // ∂L/∂A = G·Bᵀ, ∂L/∂B = Aᵀ·G. On the vector kernel when the right operand has contiguous rows (a
    // `Linear` layer's weight is [out, in], so G·W qualifies): each row of its product is one fixed chain
    // of multiply-adds, so G·Bᵀ stays batch invariant without padding. A row-major weight's transpose is
    // packed once and kept with it.
    let ga = need[0].then(|| input_grad(g2, (b, b2), None));
    let gb = need[1].then(|| {
        // A reduction over the rows: batch invariance does not apply, one GEMM over everything.
        if b2.ncols() > 1 && b2.t().is_standard_layout() {
            // B is a transposed matrix (a `Linear` layer's weight seen as Wᵀ): compute (∂L/∂B)ᵀ = Gᵀ·A in
            // the matrix's own layout, so that the transpose's backward hands the weight a standard-layout
            // gradient without a copy (and the optimiser reads it contiguously).
            let mut ct = Array2::zeros((g2.ncols(), a2.ncols()));
            if !super::simd::gemm_nn(g2.t(), a2, ct.view_mut(), false, true) {
                gemm(g2.t(), a2, ct.view_mut(), false, true);
            }
            return ct.reversed_axes().into_dyn();
        }
        let mut c = Array2::zeros((a2.ncols(), g2.ncols()));
        if !super::simd::gemm_nn(a2.t(), g2, c.view_mut(), false, true) {
            gemm(a2.t(), g2, c.view_mut(), false, true);
        }
        c.into_dyn()
    });
    (ga, gb)
}

pub(crate) fn matmul_backward(
    a: &Tensor,
    b: &Tensor,
    g: &ArrayD<f32>,
    need: &[bool],
) -> Result<Vec<Option<ArrayD<f32>>>> {
    let (av, bv) = (a.value(), b.value());
    if a.rank() == 2 && b.rank() == 2 {
        let g2 = g.view().into_dimensionality::<Ix2>().expect("output is a matrix");
        let a2 = av.view().into_dimensionality::<Ix2>().expect("rank checked");
        let b2 = bv.view().into_dimensionality::<Ix2>().expect("rank checked");
        let (ga, gb) = backward2(a2, (b, b2), g2, need);
        return Ok(vec![ga.map(|c| c.into_dyn()), gb]);
    }
    if a.rank() >= 3 && b.rank() == 2 {
        // [B,m,k]·[k,n] was one product over the flattened rows (and `[…, m, k]` with a bias, `matmul_bias`), and so
        // is its backward: per item, ∂L/∂A would stream all of B once per item (a transformer's sequence-first QKV
        // projection: 197 items of 4 rows reading a 768×2304 weight, 63 ms a call against 11 ms forward), and
        // ∂L/∂B would be B products.
        let (k, n) = (b.shape()[0], b.shape()[1]);
        let rows_n = a.numel() / k.max(1);
        // The rows of A only when ∂L/∂B is asked for (an attack's weights are not tracked).
        let a2 = if need[1] { rows(av.view(), rows_n, k) } else { ndarray::CowArray::from(Array2::zeros((0, k))) };
        let g2 = rows(g.view(), rows_n, n);
        let b2 = bv.view().into_dimensionality::<Ix2>().expect("rank checked");
        let (ga, gb) = backward2(a2.view(), (b, b2), g2.view(), need);
        let ga = ga.map(|c| c.into_shape_with_order(a.shape()).expect("same size").into_dyn());
        return Ok(vec![ga, gb]);
    }
    let g3 = g.view().into_dimensionality::<Ix3>().expect("output is batched");
    let a3 = av.view().into_dimensionality::<Ix3>().expect("rank checked");
    let work = g3.len() * a3.shape()[2];
    let ga = need[0].then(|| {
        let mut out = Array3::zeros(a3.raw_dim());
        for_items(out.view_mut(), work, |i, o, par| {
            let bi = if b.rank() == 3 { bv.index_axis(Axis(0), i) } else { bv.view() };
            let bi = bi.into_dimensionality::<Ix2>().expect("matrix");
            item_product(g3.index_axis(Axis(0), i), bi.t(), o, false, par);
        });
        out.into_dyn()
    });
    let gb = need[1].then(|| {
        if b.rank() == 3 {
            let mut out = Array3::zeros((bv.shape()[0], bv.shape()[1], bv.shape()[2]));
            for_items(out.view_mut(), work, |i, o, par| {
                item_product(a3.index_axis(Axis(0), i).t(), g3.index_axis(Axis(0), i), o, false, par)
            });
            out.into_dyn()
        } else {
            let mut out = Array2::zeros((bv.shape()[0], bv.shape()[1]));
            for i in 0..a3.shape()[0] {
                gemm(a3.index_axis(Axis(0), i).t(), g3.index_axis(Axis(0), i), out.view_mut(), true, true);
            }
            out.into_dyn()
        }
    });
    Ok(vec![ga, gb])
}

/// The machine's attainable f32 rate in GFLOP/s: a tight loop of independent vector fused multiply-adds on the
/// instruction set the kernels use, run on every thread of the rayon pool at once for about `seconds`. `None`
/// when the hand-written kernels are off (`ARMOURY_SIMD=portable` or a CPU without AVX2 and FMA). The
/// benchmarks report their rates as a share of it; on a loaded machine it measures what the load leaves.
pub fn measured_peak_gflops(seconds: f64) -> Option<f64> {
    let threads = rayon::current_num_threads();
    let probe = 1 << 16;
    let t = std::time::Instant::now();
    super::simd::fma_peak(probe)?;
    let per_iter = t.elapsed().as_secs_f64().max(1e-9) / probe as f64;
    let iters = ((seconds / per_iter) as usize).clamp(probe, 1 << 34);
    let t = std::time::Instant::now();
    let runs = rayon::broadcast(|_| super::simd::fma_peak(iters));
    let elapsed = t.elapsed().as_secs_f64();
    let flops: f64 = runs.iter().flatten().map(|(f, _)| f).sum();
    // Every run's value is read, so no thread's loop can be dropped.
    let sink: f32 = runs.iter().flatten().map(|(_, v)| v).sum();
    std::hint::black_box(sink);
    debug_assert_eq!(runs.len(), threads);
    Some(flops / elapsed / 1e9)
}

/// The shape of NumPy's `matmul` of shapes `a` and `b`: vectors promoted to matrices (and their axis dropped from
/// the result), leading axes broadcast. The shape rule of [`Tensor::matmul`] (and of ONNX's MatMul).
pub(crate) fn matmul_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let mismatch = || Error::ShapeMismatch { op: "matmul", expected: a.to_vec(), got: b.to_vec() };
    let (ra, rb) = (a.len(), b.len());
    if ra == 0 || rb == 0 {
        return Err(mismatch());
    }
    // The inner sizes, and the leading axes of each side (none for a vector).
    let (ka, kb) = (a[ra - 1], if rb == 1 { b[0] } else { b[rb - 2] });
    if ka != kb {
        return Err(mismatch());
    }
    let (la, lb) = (&a[..ra.saturating_sub(2)], &b[..rb.saturating_sub(2)]);
    let mut shape = super::elementwise::broadcast_shape(la, lb).ok_or_else(|| Error::Broadcast {
        op: "matmul",
        lhs: a.to_vec(),
        rhs: b.to_vec(),
    })?;
    if ra > 1 {
        shape.push(a[ra - 2]);
    }
    if rb > 1 {
        shape.push(b[rb - 1]);
    }
    Ok(shape)
}

/// NumPy's `matmul` on shapes that are not one of [`Tensor::matmul`]'s direct forms: vectors promoted to matrices
/// (and their axis dropped from the result), leading axes broadcast, then one 2-D or batched product.
fn matmul_broadcast(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let out = matmul_shape(a.shape(), b.shape())?;
    let a2 = if a.rank() == 1 { a.unsqueeze(0)? } else { a.clone() };
    let b2 = if b.rank() == 1 { b.unsqueeze(1)? } else { b.clone() };
    let (ra, rb) = (a2.rank(), b2.rank());
    let (m, k, n) = (a2.shape()[ra - 2], a2.shape()[ra - 1], b2.shape()[rb - 1]);
    let lead = super::elementwise::broadcast_shape(&a2.shape()[..ra - 2], &b2.shape()[..rb - 2])
        .expect("checked by matmul_shape");
    let p: usize = lead.iter().product();
    // Each operand broadcast to the leading axes (a copy only where they differ), as `[p, rows, cols]`.
    let full = |t: &Tensor, r: usize, c: usize| -> Result<Tensor> {
        let s = [&lead[..], &[r, c]].concat();
        let t = if t.shape() == s.as_slice() { t.clone() } else { t.broadcast_to(&s)? };
        t.reshape(&[p, r, c])
    };
    let y = if b2.shape()[..rb - 2].iter().product::<usize>() == 1 {
        // One right-hand matrix for every item: a single product over the flattened rows.
        let rows = full(&a2, m, k)?.reshape(&[p * m, k])?;
        rows.matmul(&b2.reshape(&[k, n])?)?
    } else {
        full(&a2, m, k)?.matmul(&full(&b2, k, n)?)?
    };
    y.reshape(&out)
}

/// Matrix products.
impl Tensor {
    /// `self · wᵀ` for matrices (ONNX's `Gemm` with `transB`, a `Linear` layer): [`Tensor::matmul`] of `w.t()`,
    /// the same values and gradients, but `wᵀ`'s packed form is kept with `w` itself — a transposed view made
    /// afresh on every call would keep it with the view, for that call only.
    pub(crate) fn matmul_transposed(&self, w: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 || w.rank() != 2 || self.shape()[1] != w.shape()[1] {
            return self.matmul(&w.t()?);
        }
        let a = self.value().view().into_dimensionality::<Ix2>().expect("rank checked");
        let b = w.value().view().into_dimensionality::<Ix2>().expect("rank checked");
        let value = matmul2_kept(a, w, b.t(), KEY_PACKED_T).into_dyn();
        // The view after the product: made before, it would hold `w` (`Tensor::is_kept_leaf`).
        Ok(record(value, Op::MatMul(self.clone(), w.t()?)))
    }

    /// Matrix product with NumPy's `matmul` semantics: `[m,k]·[k,n]`; batched `[…,m,k]·[…,k,n]` with the leading
    /// axes broadcast (`[B,m,k]·[k,n]` is one product over the flattened rows); a 1-D operand is a row (left) or
    /// column (right) vector whose axis the result drops. Derivatives: ∂/∂A = G·Bᵀ, ∂/∂B = Aᵀ·G (summed over
    /// broadcast axes).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let (sa, sb) = (self.shape(), other.shape());
        let direct = match (sa.len(), sb.len()) {
            (2, 2) => sa[1] == sb[0],
            (3, 3) => sa[0] == sb[0] && sa[2] == sb[1],
            (3, 2) => sa[2] == sb[0],
            _ => false,
        };
        if !direct {
            return matmul_broadcast(self, other);
        }
        let value = if sa.len() == 2 {
            let a = self.value().view().into_dimensionality::<Ix2>().expect("rank checked");
            let b = other.value().view().into_dimensionality::<Ix2>().expect("rank checked");
            matmul2_kept(a, other, b, KEY_PACKED).into_dyn()
        } else if sb.len() == 3 {
            let a = self.value().view().into_dimensionality::<Ix3>().expect("rank checked");
            let b = other.value().view().into_dimensionality::<Ix3>().expect("rank checked");
            batched(a, b).into_dyn()
        } else {
            // [B,m,k]·[k,n]: one GEMM over the flattened batch.
            let (bn, m, k) = (sa[0], sa[1], sa[2]);
            let a2 = rows(self.value().view(), bn * m, k);
            let b = other.value().view().into_dimensionality::<Ix2>().expect("rank checked");
            matmul2_kept(a2.view(), other, b, KEY_PACKED)
                .into_shape_with_order((bn, m, sb[1]))
                .expect("same size")
                .into_dyn()
        };
        Ok(record(value, Op::MatMul(self.clone(), other.clone())))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The bit patterns of values, in order.
    pub(in crate::ops) fn bits<'a>(a: impl IntoIterator<Item = &'a f32>) -> Vec<u32> {
        a.into_iter().map(|v| v.to_bits()).collect()
    }

    /// Each row of `matmul2` is bit-identical to that row computed alone or in any other batch, across the shapes
    /// where the `gemm` crate changes kernels (see [`invariant_rows`]).
    #[test]
    fn rows_are_batch_invariant() {
        for (k, n) in [(3, 5), (25, 16), (128, 10), (256, 1), (400, 32), (512, 128), (513, 10), (784, 256), (600, 70)] {
            let a = Tensor::uniform(&[300, k], -1.0, 1.0, k as u64).to_array().into_dimensionality::<Ix2>().unwrap();
            let b = Tensor::uniform(&[n, k], -1.0, 1.0, n as u64).to_array().into_dimensionality::<Ix2>().unwrap();
            // b as a transposed view, as `Linear` passes it, and in standard layout.
            let bt = b.t().to_owned();
            for bv in [b.t(), bt.view()] {
                let full = matmul2(a.view(), bv);
                for (start, len) in [(0, 1), (299, 1), (3, 2), (10, 7), (40, 26), (100, 64), (7, 65), (50, 200)] {
                    let part = matmul2(a.slice(s![start..start + len, ..]), bv);
                    assert!(part == full.slice(s![start..start + len, ..]), "k {k} n {n} rows {start}+{len}");
                }
            }
        }
    }

    /// `[B,m,k]·[k,n]` (contiguous and permuted left operands): the gradients of both sides against f64 sums,
    /// ∂L/∂A[i] = G[i]·Bᵀ and ∂L/∂B = Σᵢ A[i]ᵀ·G[i], computed as one product over the flattened rows.
    #[test]
    fn batched_by_matrix_gradients() {
        let base = Tensor::uniform(&[5, 3, 7], -1.0, 1.0, 1);
        let permuted = Tensor::uniform(&[3, 5, 7], -1.0, 1.0, 4).permute(&[1, 0, 2]).unwrap();
        for a in [base, permuted] {
            let a = Tensor::new(a.value().clone()).variable();
            let b = Tensor::uniform(&[7, 4], -1.0, 1.0, 2).variable();
            let r = Tensor::uniform(&[5, 3, 4], -1.0, 1.0, 3);
            let grads = a.matmul(&b).unwrap().mul(&r).unwrap().sum_all().grad_wrt(&[&a, &b]).unwrap();
            let (av, bv, rv) = (a.to_array(), b.to_array(), r.to_array());
            for i in 0..5 {
                for row in 0..3 {
                    for p in 0..7 {
                        let want: f64 = (0..4).map(|j| rv[[i, row, j]] as f64 * bv[[p, j]] as f64).sum();
                        assert!((grads[0].to_array()[[i, row, p]] as f64 - want).abs() < 1e-5);
                    }
                }
            }
            for p in 0..7 {
                for j in 0..4 {
                    let mut want = 0.0f64;
                    for i in 0..5 {
                        for row in 0..3 {
                            want += av[[i, row, p]] as f64 * rv[[i, row, j]] as f64;
                        }
                    }
                    assert!((grads[1].to_array()[[p, j]] as f64 - want).abs() < 1e-5);
                }
            }
        }
    }

    /// A leaf weight's packed forms (as `b` of `x·w`, and transposed for the input gradient and for `x·wᵀ`) are
    /// made once and kept with it, and the products on them have the bits of the products that pack per call —
    /// forward, `x·wᵀ`, and the input gradient `g·wᵀ` — on rank-2 and rank-3 inputs. A computed or small weight
    /// keeps nothing.
    #[test]
    fn a_leaf_weight_keeps_its_packing() {
        if !super::super::simd::accelerated() {
            return;
        }
        let w = Tensor::uniform(&[300, 260], -1.0, 1.0, 5);
        // A layer's parameter slot holds the weight too.
        let _slot = w.clone();
        let wv = w.value().view().into_dimensionality::<Ix2>().unwrap();
        for shape in [&[37, 300][..], &[3, 13, 300]] {
            let x = Tensor::uniform(shape, -1.0, 1.0, 6).variable();
            let n = shape.iter().product::<usize>() / 300;
            let rows = Array2::from_shape_vec((n, 300), x.to_vec()).unwrap();
            let y = x.matmul(&w).unwrap();
            let mut want = Array2::zeros((n, 260));
            assert!(super::super::simd::gemm_packed(rows.view(), wv, want.view_mut(), false, true));
            assert_eq!(bits(y.value()), bits(&want));
            // The input gradient of Σ y·r is r·wᵀ, on the kept transposed packing.
            let r = Tensor::uniform(y.shape(), -1.0, 1.0, 7);
            let gx = y.mul(&r).unwrap().sum_all().grad_wrt(&[&x]).unwrap().remove(0);
            let r2 = Array2::from_shape_vec((n, 260), r.to_vec()).unwrap();
            let mut want = Array2::zeros((n, 300));
            assert!(super::super::simd::gemm_packed(r2.view(), wv.t(), want.view_mut(), false, true));
            assert_eq!(bits(gx.value()), bits(&want));
        }
        let first = kept_packed(&w, wv, KEY_PACKED).expect("a large leaf keeps its packing");
        assert!(std::sync::Arc::ptr_eq(&first, &kept_packed(&w, wv, KEY_PACKED).unwrap()), "made once");
        assert!(kept_packed(&w, wv.t(), KEY_PACKED_T).is_some());
        // x·wᵀ on the transposed packing kept with `w` itself.
        let x = Tensor::uniform(&[20, 260], -1.0, 1.0, 8);
        let y = x.matmul_transposed(&w).unwrap();
        assert_eq!(bits(y.value()), bits(x.matmul(&w.t().unwrap()).unwrap().value()));
        // A computed weight, a transient view or a small weight keeps nothing.
        let view = w.t().unwrap();
        let vv = view.value().view().into_dimensionality::<Ix2>().unwrap();
        assert!(kept_packed(&view, vv, KEY_PACKED).is_none(), "a view made for one call");
        let computed = w.variable().mul_scalar(1.0);
        let cv = computed.value().view().into_dimensionality::<Ix2>().unwrap();
        assert!(kept_packed(&computed, cv, KEY_PACKED).is_none());
        let small = Tensor::uniform(&[30, 26], -1.0, 1.0, 9);
        let sv = small.value().view().into_dimensionality::<Ix2>().unwrap();
        assert!(kept_packed(&small, sv, KEY_PACKED).is_none());
    }

    /// The products whose outputs are not zero-filled first ([`product_array`]: [`matmul2`], a kept packing,
    /// `matmul_bias`, the input gradient on the unpacked kernel, [`batched`]) write every element: run on a heap
    /// dirtied with NaN blocks of the outputs' sizes ([`crate::ops::poisoned`]), they give the bits of the same
    /// products into zeroed matrices — the packed product (a right operand that keeps no packing), a kept packing,
    /// `x·w + b` on it, `g·W` for `x·Wᵀ`, and a batch of products.
    #[test]
    fn unfilled_outputs_are_written_whole() {
        use crate::ops::poisoned;
        use crate::ops::simd::{gemm_nn, gemm_packed, gemm_prepacked, pack};
        if !super::super::simd::accelerated() {
            return;
        }
        // How many elements differ from `want`'s bits (a NaN left by the poison counts), not the values.
        let same = |got: &[u32], want: &[u32], what: &str| {
            let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
            assert!(got.len() == want.len() && wrong == 0, "{what}: {wrong} of {} elements differ", want.len());
        };
        let matrix = |t: &Tensor| t.value().view().into_dimensionality::<Ix2>().unwrap().to_owned();
        let (a, b) =
            (matrix(&Tensor::uniform(&[40, 50], -1.0, 1.0, 1)), matrix(&Tensor::uniform(&[50, 70], -1.0, 1.0, 2)));
        let mut want = Array2::zeros((40, 70));
        assert!(gemm_packed(a.view(), b.view(), want.view_mut(), false, true));
        same(&bits(&poisoned(&[40 * 70], || matmul2(a.view(), b.view()))), &bits(&want), "packed");

        let w = Tensor::uniform(&[300, 260], -1.0, 1.0, 3);
        let _slot = w.clone();
        let (x, bias) = (Tensor::uniform(&[3, 13, 300], -1.0, 1.0, 4), Tensor::uniform(&[260], -1.0, 1.0, 5));
        let (xm, wm) = (Array2::from_shape_vec((39, 300), x.to_vec()).unwrap(), matrix(&w));
        let packed = pack(wm.view()).unwrap();
        let mut want = Array2::zeros((39, 260));
        gemm_prepacked(xm.view(), &packed, want.view_mut(), false, None, true);
        let got = poisoned(&[39 * 260], || x.matmul(&w).unwrap());
        assert!(kept_packed(&w, wm.view(), KEY_PACKED).is_some(), "on the kept packing");
        same(&bits(got.value()), &bits(&want), "kept packing");
        let mut want = Array2::zeros((39, 260));
        gemm_prepacked(xm.view(), &packed, want.view_mut(), false, Some(bias.to_vec().as_slice()), true);
        let got = poisoned(&[39 * 260], || x.matmul_bias(&w, &bias, false).unwrap());
        same(&bits(got.value()), &bits(&want), "x·w + b");

        // The input gradient `g·W` of `x·Wᵀ` (a `Linear` layer: `W` has contiguous rows, the unpacked kernel).
        let (x, w, r) = (
            Tensor::uniform(&[40, 50], -1.0, 1.0, 8).variable(),
            Tensor::uniform(&[70, 50], -1.0, 1.0, 9),
            Tensor::uniform(&[40, 70], -1.0, 1.0, 10),
        );
        let loss = x.matmul_transposed(&w).unwrap().mul(&r).unwrap().sum_all();
        let got = poisoned(&[40 * 50], || loss.grad_wrt(&[&x]).unwrap().remove(0));
        let mut want = Array2::zeros((40, 50));
        assert!(gemm_nn(matrix(&r).view(), matrix(&w).view(), want.view_mut(), false, true));
        same(&bits(got.value()), &bits(&want), "input gradient g·W");

        let (p, q) = (Tensor::uniform(&[3, 20, 30], -1.0, 1.0, 6), Tensor::uniform(&[3, 30, 40], -1.0, 1.0, 7));
        let got = poisoned(&[3 * 20 * 40], || p.matmul(&q).unwrap());
        for i in 0..3 {
            let (pi, qi) = (p.value().index_axis(Axis(0), i).to_owned(), q.value().index_axis(Axis(0), i).to_owned());
            let (pi, qi) = (pi.into_dimensionality::<Ix2>().unwrap(), qi.into_dimensionality::<Ix2>().unwrap());
            let mut want = Array2::zeros((20, 40));
            assert!(gemm_packed(pi.view(), qi.view(), want.view_mut(), false, true));
            same(&bits(got.value().index_axis(Axis(0), i)), &bits(&want), &format!("batched, item {i}"));
        }
    }

    /// x·Wᵀ as `Linear` computes it: W's gradient arrives in W's own (standard) layout, with the values of Gᵀ·X.
    #[test]
    fn transposed_weight_gets_a_standard_layout_gradient() {
        let x = Tensor::uniform(&[37, 24], -1.0, 1.0, 1);
        let w = Tensor::uniform(&[9, 24], -1.0, 1.0, 2).variable();
        let g = w.t().unwrap();
        let y = x.matmul(&g).unwrap().sum_all();
        let grads = y.backward_with(&[&w]).unwrap();
        let gw = grads.get(&w).unwrap();
        assert!(gw.is_standard_layout());
        assert_eq!(gw.shape(), &[9, 24]);
        // ∂Σ(x·Wᵀ)/∂W[o, i] = Σ_r x[r, i]
        let col: Vec<f32> = x.value().sum_axis(Axis(0)).iter().copied().collect();
        for o in 0..9 {
            for (i, c) in col.iter().enumerate() {
                assert!((gw[[o, i]] - c).abs() <= 1e-5 * (1.0 + c.abs()));
            }
        }
    }
}
