//! 2-D convolution (cross-correlation, as PyTorch), batch-parallel, with its backward; optionally fused with the
//! ReLU after it, or with the ReLU and a 2×2 max pooling.
//!
//! Forward, per image and group: `out[Og, HoWo] = W[Og, K] · col[K, HoWo]` with `K = Cg·kh·kw`, where `col` is the
//! unfolded image — read in place by the direct kernels when the column stride is 1, else written by im2col.
//! Backward: `dcol = Wᵀ · dout` scattered back into the image for ∂L/∂x (tile by tile on the direct kernels, else
//! by col2im), and `dW = Σₙ dout · colᵀ` for ∂L/∂W — only the gradients whose inputs are tracked are computed.
//! Through the fused ReLU and 2×2 max pooling, the backward reads only the windows' arg-max entries where it can
//! ([`sparse`]). Weight and bias gradients are summed per fixed chunk of images and the chunks added in order, so
//! results do not depend on the thread count.

use std::mem::MaybeUninit;

use ndarray::{Array1, Array4, ArrayD, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use super::matmul::gemm;
use super::pool::{self, Pool2dParams};
use super::simd;
use super::{record, Op};
use crate::tensor::{grad_enabled, Tensor};
use crate::{Error, Result};

#[cfg(target_arch = "x86_64")]
mod plan;
#[cfg(not(target_arch = "x86_64"))]
#[path = "no_plan.rs"]
mod plan;
mod sparse;

use plan::{DirectConv, InputGrad, WeightGrad};

/// Stride, zero padding, dilation and groups of a convolution (PyTorch's meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Step between output positions (rows, columns).
    pub stride: (usize, usize),
    /// Zeros added on each side (rows, columns).
    pub padding: (usize, usize),
    /// Spacing between kernel taps (rows, columns).
    pub dilation: (usize, usize),
    /// Channel groups: input and output channels split into this many independent convolutions.
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams { stride: (1, 1), padding: (0, 0), dilation: (1, 1), groups: 1 }
    }
}

/// Geometry shared by the forward and backward kernels.
#[derive(Clone, Copy)]
struct Geom {
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    ho: usize,
    wo: usize,
    p: Conv2dParams,
}

impl Geom {
    fn cg(&self) -> usize {
        self.c / self.p.groups
    }
    fn og(&self) -> usize {
        self.o / self.p.groups
    }
    fn k(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    fn hw_out(&self) -> usize {
        self.ho * self.wo
    }
    fn unfold(&self) -> simd::Unfold {
        let p = &self.p;
        simd::Unfold {
            cg: self.cg(),
            h: self.h,
            w: self.w,
            kh: self.kh,
            kw: self.kw,
            ho: self.ho,
            wo: self.wo,
            sh: p.stride.0,
            ph: p.padding.0,
            pw: p.padding.1,
            dh: p.dilation.0,
            dw: p.dilation.1,
        }
    }
    fn is_pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.p.stride == (1, 1) && self.p.padding == (0, 0)
    }
}

/// Images per chunk for weight-gradient partial sums: fixed, so the summation order is too.
const WGRAD_CHUNK: usize = 8;

/// Output size of a convolution or pooling window along one axis, or `None` if the window does not fit.
pub(crate) fn out_size(len: usize, k: usize, stride: usize, pad: usize, dil: usize) -> Option<usize> {
    let span = dil * (k - 1) + 1;
    (len + 2 * pad).checked_sub(span).map(|r| r / stride + 1)
}

fn geometry(x: &[usize], w: &[usize], b: Option<&[usize]>, p: Conv2dParams) -> Result<Geom> {
    let op = "conv2d";
    let [_, c, h, wd] = *x else {
        return Err(Error::RankMismatch { op, expected: 4, got: x.len(), shape: x.to_vec() });
    };
    let [o, cg, kh, kw] = *w else {
        return Err(Error::RankMismatch { op, expected: 4, got: w.len(), shape: w.to_vec() });
    };
    if p.groups == 0
        || p.stride.0 == 0
        || p.stride.1 == 0
        || p.dilation.0 == 0
        || p.dilation.1 == 0
        || kh == 0
        || kw == 0
    {
        return Err(Error::invalid(op, format!("stride, dilation, kernel and groups must be positive: {p:?}")));
    }
    if c == 0 || o == 0 {
        return Err(Error::invalid(op, format!("{c} input and {o} output channels: both must be positive")));
    }
    if c % p.groups != 0 || o % p.groups != 0 || cg * p.groups != c {
        return Err(Error::ShapeMismatch { op, expected: vec![o, c / p.groups.max(1), kh, kw], got: w.to_vec() });
    }
    if let Some(b) = b {
        if b != [o] {
            return Err(Error::ShapeMismatch { op, expected: vec![o], got: b.to_vec() });
        }
    }
    let ho = out_size(h, kh, p.stride.0, p.padding.0, p.dilation.0);
    let wo = out_size(wd, kw, p.stride.1, p.padding.1, p.dilation.1);
    let (Some(ho), Some(wo)) = (ho, wo) else {
        return Err(Error::invalid(op, format!("kernel {kh}x{kw} does not fit input {h}x{wd} with {p:?}")));
    };
    Ok(Geom { c, h, w: wd, o, kh, kw, ho, wo, p })
}

/// The output columns `lo..hi` of one kernel tap whose input column `ow·stride + off` lies inside `0..w`.
#[inline]
fn valid_cols(off: isize, stride: usize, w: usize, wo: usize) -> (usize, usize) {
    let s = stride as isize;
    let lo = if off >= 0 { 0 } else { ((-off + s - 1) / s) as usize };
    let hi = if (w as isize) <= off { 0 } else { ((w as isize - off + s - 1) / s) as usize };
    let hi = hi.min(wo);
    (lo.min(hi), hi)
}

/// Unfolds the channels `c0..c0+Cg` of one image `[C, H, W]` into `col[K, Ho·Wo]`.
///
/// Each (tap, output row) is a contiguous copy (a strided gather when the stride is not 1) between zero-filled
/// margins, so the hot loop has no per-element bounds test.
fn im2col(img: &[f32], g: &Geom, c0: usize, col: &mut [f32]) {
    let (hw_out, (sh, sw), (ph, pw), (dh, dw)) = (g.hw_out(), g.p.stride, g.p.padding, g.p.dilation);
    if sw == 1 && simd::im2col(&img[c0 * g.h * g.w..], &g.unfold(), col) {
        return;
    }
    if (sh, sw, ph, pw, dh, dw) == (1, 1, 0, 0, 1, 1) {
        // The common unpadded, unit-stride case: every row is a plain window copy, nothing to test or zero.
        let planes = img[c0 * g.h * g.w..(c0 + g.cg()) * g.h * g.w].chunks_exact(g.h * g.w);
        let taps = col.chunks_exact_mut(g.kh * g.kw * hw_out);
        for (plane, dst) in planes.zip(taps) {
            for (t, tap) in dst.chunks_exact_mut(hw_out).enumerate() {
                let (ki, kj) = (t / g.kw, t % g.kw);
                for (oh, out_row) in tap.chunks_exact_mut(g.wo).enumerate() {
                    let src = &plane[(oh + ki) * g.w + kj..][..g.wo];
                    for (d, &v) in out_row.iter_mut().zip(src) {
                        *d = v;
                    }
                }
            }
        }
        return;
    }
    let mut row = 0;
    for c in c0..c0 + g.cg() {
        let plane = &img[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let dst = &mut col[row * hw_out..(row + 1) * hw_out];
                row += 1;
                let off = (kj * dw) as isize - pw as isize;
                let (lo, hi) = valid_cols(off, sw, g.w, g.wo);
                for (oh, out_row) in dst.chunks_exact_mut(g.wo).enumerate() {
                    let ih = (oh * sh + ki * dh) as isize - ph as isize;
                    if ih < 0 || ih >= g.h as isize {
                        out_row.fill(0.0);
                        continue;
                    }
                    let src = &plane[ih as usize * g.w..(ih as usize + 1) * g.w];
                    out_row[..lo].fill(0.0);
                    out_row[hi..].fill(0.0);
                    let start = (lo * sw) as isize + off;
                    if sw == 1 {
                        // An inline loop, not `copy_from_slice`: rows are a few floats and a memcpy call per row
                        // costs more than the copy.
                        for (d, &v) in out_row[lo..hi].iter_mut().zip(&src[start as usize..]) {
                            *d = v;
                        }
                    } else {
                        for (d, &v) in out_row[lo..hi].iter_mut().zip(src[start as usize..].iter().step_by(sw)) {
                            *d = v;
                        }
                    }
                }
            }
        }
    }
}

/// Adds `col[K, Ho·Wo]` back into the channels `c0..c0+Cg` of one image gradient (the adjoint of [`im2col`]).
fn col2im(col: &[f32], g: &Geom, c0: usize, img: &mut [f32]) {
    let (hw_out, (sh, sw), (ph, pw), (dh, dw)) = (g.hw_out(), g.p.stride, g.p.padding, g.p.dilation);
    if sw == 1 && simd::col2im(col, &g.unfold(), &mut img[c0 * g.h * g.w..]) {
        return;
    }
    let mut row = 0;
    for c in c0..c0 + g.cg() {
        let plane = &mut img[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let src = &col[row * hw_out..(row + 1) * hw_out];
                row += 1;
                let off = (kj * dw) as isize - pw as isize;
                let (lo, hi) = valid_cols(off, sw, g.w, g.wo);
                if lo == hi {
                    continue;
                }
                let start = ((lo * sw) as isize + off) as usize;
                for (oh, src_row) in src.chunks_exact(g.wo).enumerate() {
                    let ih = (oh * sh + ki * dh) as isize - ph as isize;
                    if ih < 0 || ih >= g.h as isize {
                        continue;
                    }
                    let dst = &mut plane[ih as usize * g.w..(ih as usize + 1) * g.w];
                    if sw == 1 {
                        for (d, &v) in dst[start..start + (hi - lo)].iter_mut().zip(&src_row[lo..hi]) {
                            *d += v;
                        }
                    } else {
                        for (d, &v) in dst[start..].iter_mut().step_by(sw).zip(&src_row[lo..hi]) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// `c (+)= a·b` on the vector kernel when the CPU has one, else on the `gemm` crate.
fn product(a: ArrayView2<f32>, b: ArrayView2<f32>, mut c: ArrayViewMut2<f32>, accumulate: bool, par: bool) {
    if !simd::gemm_nn(a, b, c.view_mut(), accumulate, par) {
        gemm(a, b, c, accumulate, par);
    }
}

/// `dst[c, r] = src[r, c]` for a row-major `rows × cols` source, masked by the fused ReLU's output `y` (same
/// layout as `src`) when given: 8×8 blocks in vector registers where the kernels allow, else each output row
/// gathers one source column.
fn transpose(src: &[f32], y: Option<&[f32]>, rows: usize, cols: usize, dst: &mut [f32]) {
    if simd::transpose(src, y, rows, cols, dst) {
        return;
    }
    for (c, out) in dst[..rows * cols].chunks_exact_mut(rows).enumerate() {
        for (r, d) in out.iter_mut().enumerate() {
            let at = r * cols + c;
            let pass = y.is_none_or(|y| y[at] > 0.0);
            *d = if pass { src[at] } else { 0.0 };
        }
    }
}

/// `g` where the fused ReLU's output `y` is positive and 0 elsewhere, written into `buf` (or `g` itself when
/// there is no ReLU).
fn relu_masked<'a>(g: &'a [f32], y: Option<&[f32]>, buf: &'a mut Vec<f32>) -> &'a [f32] {
    let Some(y) = y else { return g };
    buf.clear();
    buf.extend(g.iter().zip(y).map(|(&g, &y)| if y > 0.0 { g } else { 0.0 }));
    buf
}

/// The sum of `v` (where the fused ReLU's output `y`, if given, is positive) in sixteen interleaved partial sums
/// (a fixed order, so deterministic, and not bound by the latency of one dependent chain of additions).
fn lane_sum(v: &[f32], y: Option<&[f32]>) -> f32 {
    let pass = |v: f32, y: f32| if y > 0.0 { v } else { 0.0 };
    let mut acc = [0.0f32; 16];
    let chunks = v.chunks_exact(16);
    let rest: f32 = match y {
        Some(y) => chunks.remainder().iter().zip(&y[v.len() / 16 * 16..]).map(|(&v, &y)| pass(v, y)).sum(),
        None => chunks.remainder().iter().sum(),
    };
    match y {
        Some(y) => {
            for (c, m) in chunks.zip(y.chunks_exact(16)) {
                for ((a, &x), &m) in acc.iter_mut().zip(c).zip(m) {
                    *a += pass(x, m);
                }
            }
        }
        None => {
            for c in chunks {
                for (a, x) in acc.iter_mut().zip(c) {
                    *a += x;
                }
            }
        }
    }
    acc.iter().sum::<f32>() + rest
}

fn mat(s: &[f32], r: usize, c: usize) -> ArrayView2<'_, f32> {
    ArrayView2::from_shape((r, c), s).expect("slice length is r·c")
}

fn mat_mut(s: &mut [f32], r: usize, c: usize) -> ArrayViewMut2<'_, f32> {
    ArrayViewMut2::from_shape((r, c), s).expect("slice length is r·c")
}

/// The unpadded geometry the direct kernel sees: the image zero-padded by `padding` on each side.
fn direct_unfold(g: &Geom) -> simd::Unfold {
    let (ph, pw) = g.p.padding;
    simd::Unfold { h: g.h + 2 * ph, w: g.w + 2 * pw, ph: 0, pw: 0, ..g.unfold() }
}

/// The plan of the forward straight from the image ([`DirectConv`]), or `None` where it unfolds the image.
fn direct_plan(g: &Geom) -> Option<DirectConv> {
    if g.p.stride.1 == 1 && !g.is_pointwise() {
        DirectConv::plan(&direct_unfold(g))
    } else {
        None
    }
}

/// The plan of the input gradient added straight into the image gradient ([`InputGrad`], where the forward runs
/// direct), or `None` where it takes col2im.
fn input_grad_plan(g: &Geom, ws: &[f32]) -> Option<InputGrad> {
    if g.p.stride.1 == 1 && !g.is_pointwise() {
        InputGrad::plan(&direct_unfold(g), g.og(), ws)
    } else {
        None
    }
}

/// The plan of the weight gradient with the unfolded image read in place ([`WeightGrad`], on the vector kernels'
/// transposed product), or `None` where it unfolds the image.
fn weight_grad_plan(g: &Geom) -> Option<WeightGrad> {
    if simd::accelerated() && g.p.stride.1 == 1 && !g.is_pointwise() {
        WeightGrad::plan(&direct_unfold(g))
    } else {
        None
    }
}

/// `img` zero-padded by the geometry's padding into `pad` (or `img` itself when there is none): the image the
/// direct kernels read, of the size [`direct_unfold`] gives.
fn padded<'a>(img: &'a [f32], g: &Geom, pad: &'a mut Vec<f32>) -> &'a [f32] {
    let (ph, pw) = g.p.padding;
    if (ph, pw) == (0, 0) {
        return img;
    }
    let (hp, wp) = (g.h + 2 * ph, g.w + 2 * pw);
    pad.clear();
    pad.resize(g.c * hp * wp, 0.0);
    for (dst, plane) in pad.chunks_exact_mut(hp * wp).zip(img.chunks_exact(g.h * g.w)) {
        for (drow, srow) in dst[ph * wp..].chunks_exact_mut(wp).zip(plane.chunks_exact(g.w)) {
            drow[pw..pw + g.w].copy_from_slice(srow);
        }
    }
    pad
}

/// Direct forward for one image (see [`direct_plan`]) with the geometry's `plan`: `img` is zero-padded into `pad`
/// when the geometry has padding, and every element of `out[O, Ho·Wo]` is written, with the bias and, when
/// `relu`, the ReLU.
#[allow(clippy::too_many_arguments)]
fn forward_image_direct(
    img: &[f32],
    wt: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    plan: &DirectConv,
    pad: &mut Vec<f32>,
    out: &mut [MaybeUninit<f32>],
    relu: bool,
    par: bool,
) {
    let (og, k, hw) = (g.og(), g.k(), g.hw_out());
    let u = direct_unfold(g);
    let src = padded(img, g, pad);
    for grp in 0..g.p.groups {
        let b = bias.map(|b| &b[grp * og..(grp + 1) * og]);
        let (wg, dst) = (&wt[grp * og * k..(grp + 1) * og * k], &mut out[grp * og * hw..(grp + 1) * og * hw]);
        plan.run(&src[grp * g.cg() * u.h * u.w..], wg, og, b, relu, dst, par);
    }
}

/// Input gradient of one image on the direct kernels (see [`input_grad_plan`]): `dimg[C, H, W]` (zeroed) from the
/// masked output gradient `gimg[O, Ho·Wo]`, group by group, through a zero-padded scratch image `pad` when the
/// geometry has padding.
fn input_grad_image_direct(gimg: &[f32], plan: &InputGrad, g: &Geom, pad: &mut Vec<f32>, dimg: &mut [f32], par: bool) {
    let (og, hw) = (g.og(), g.hw_out());
    let u = direct_unfold(g);
    let (ph, pw) = g.p.padding;
    let padded = (ph, pw) != (0, 0);
    if padded {
        pad.clear();
        pad.resize(g.c * u.h * u.w, 0.0);
    }
    let target: &mut [f32] = if padded { pad } else { dimg };
    for grp in 0..g.p.groups {
        let planes = &mut target[grp * g.cg() * u.h * u.w..(grp + 1) * g.cg() * u.h * u.w];
        plan.run(grp, &gimg[grp * og * hw..(grp + 1) * og * hw], planes, par);
    }
    if padded {
        for (plane, src) in dimg.chunks_exact_mut(g.h * g.w).zip(pad.chunks_exact(u.h * u.w)) {
            for (drow, srow) in plane.chunks_exact_mut(g.w).zip(src[ph * u.w..].chunks_exact(u.w)) {
                drow.copy_from_slice(&srow[pw..pw + g.w]);
            }
        }
    }
}

/// [`Tensor::conv2d_relu_max_pool2`] of one image on the direct kernels, pooled in registers: `out[O, Ho/2, Wo/2]`
/// and, unless `idx` is empty, the windows' arg-max as [`for_each_pooling_plane`] numbers them.
#[allow(clippy::too_many_arguments)]
fn pooled_image_direct(
    img: &[f32],
    wt: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    plan: &DirectConv,
    pad: &mut Vec<f32>,
    (out, idx): (&mut [f32], &mut [u32]),
    par: bool,
) {
    let (og, k, hw, pp) = (g.og(), g.k(), g.hw_out(), (g.ho / 2) * (g.wo / 2));
    let u = direct_unfold(g);
    let src = padded(img, g, pad);
    let tall = g.ho.is_multiple_of(2);
    for grp in 0..g.p.groups {
        let b = bias.map(|b| &b[grp * og..(grp + 1) * og]);
        let wg = &wt[grp * og * k..(grp + 1) * og * k];
        let dst = &mut out[grp * og * pp..(grp + 1) * og * pp];
        let ids = if idx.is_empty() { &mut [][..] } else { &mut idx[grp * og * pp..(grp + 1) * og * pp] };
        let offset = if tall { (grp * og * hw) as u32 } else { 0 };
        plan.run_pooled(&src[grp * g.cg() * u.h * u.w..], wg, og, b, dst, ids, (tall, offset), par);
    }
}

/// Forward for one image by unfolding: `out[O, Ho·Wo]` from `img[C, H, W]` (`out` zeroed).
fn forward_image(
    img: &[f32],
    wt: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    col: &mut Vec<f32>,
    out: &mut [f32],
    par: bool,
) {
    let (og, k, hw) = (g.og(), g.k(), g.hw_out());
    // The bias is written first and the GEMM accumulates onto it (`b + Σ w·x`), saving a pass over the output.
    if let Some(b) = bias {
        for (plane, &bv) in out.chunks_mut(hw).zip(b) {
            plane.fill(bv);
        }
    }
    for grp in 0..g.p.groups {
        let wg = mat(&wt[grp * og * k..(grp + 1) * og * k], og, k);
        let dst = mat_mut(&mut out[grp * og * hw..(grp + 1) * og * hw], og, hw);
        if g.is_pointwise() {
            let src = &img[grp * g.cg() * hw..(grp + 1) * g.cg() * hw];
            product(wg, mat(src, k, hw), dst, bias.is_some(), par);
        } else {
            col.resize(k * hw, 0.0);
            im2col(img, g, grp * g.cg(), col);
            product(wg, mat(col, k, hw), dst, bias.is_some(), par);
        }
    }
}

/// The values of a convolution's input, weight and bias, contiguous (copied only when not in standard layout).
struct Operands<'a> {
    x: ndarray::CowArray<'a, f32, ndarray::IxDyn>,
    w: ndarray::CowArray<'a, f32, ndarray::IxDyn>,
    b: Option<ndarray::CowArray<'a, f32, ndarray::IxDyn>>,
}

impl<'a> Operands<'a> {
    fn new(x: &'a Tensor, w: &'a Tensor, b: Option<&'a Tensor>) -> Self {
        let std = |t: &'a Tensor| t.value().as_standard_layout();
        Operands { x: std(x), w: std(w), b: b.map(std) }
    }

    fn slices(&self) -> (&[f32], &[f32], Option<&[f32]>) {
        let flat = "standard layout";
        (
            self.x.as_slice().expect(flat),
            self.w.as_slice().expect(flat),
            self.b.as_ref().map(|b| b.as_slice().expect(flat)),
        )
    }
}

fn conv2d(x: &Tensor, w: &Tensor, b: Option<&Tensor>, p: Conv2dParams, relu: bool) -> Result<Tensor> {
    let g = geometry(x.shape(), w.shape(), b.map(|b| b.shape()), p)?;
    let n = x.shape()[0];
    let ops = Operands::new(x, w, b);
    let (xs, ws, bias) = ops.slices();
    let (in_len, out_len) = (g.c * g.h * g.w, g.o * g.hw_out());
    let out = if let Some(plan) = direct_plan(&g) {
        // Straight from the image, bias and ReLU applied in registers; nothing is zero-filled first.
        let mut out = Vec::with_capacity(n * out_len);
        let slots = &mut out.spare_capacity_mut()[..n * out_len];
        let run = |pad: &mut Vec<f32>, o: &mut [MaybeUninit<f32>], img: &[f32], par: bool| {
            forward_image_direct(img, ws, bias, &g, &plan, pad, o, relu, par)
        };
        if n == 1 {
            run(&mut Vec::new(), slots, xs, true);
        } else {
            slots
                .par_chunks_mut(out_len)
                .zip(xs.par_chunks(in_len))
                .for_each_init(Vec::new, |pad, (o, img)| run(pad, o, img, false));
        }
        // SAFETY: `forward_image_direct` wrote every element of every image's output.
        unsafe { out.set_len(n * out_len) };
        out
    } else {
        let mut out = vec![0.0f32; n * out_len];
        // The fused ReLU runs on each image's output while it is still in cache.
        let run = |col: &mut Vec<f32>, o: &mut [f32], img: &[f32], par: bool| {
            forward_image(img, ws, bias, &g, col, o, par);
            if relu {
                o.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        };
        if n == 1 {
            run(&mut Vec::new(), &mut out, xs, true);
        } else {
            out.par_chunks_mut(out_len)
                .zip(xs.par_chunks(in_len))
                .for_each_init(Vec::new, |col, (o, img)| run(col, o, img, false));
        }
        out
    };
    let value = Array4::from_shape_vec((n, g.o, g.ho, g.wo), out).expect("sized above").into_dyn();
    Ok(record(value, Op::Conv2d { x: x.clone(), w: w.clone(), b: b.cloned(), p, relu, pool: None }))
}

/// `max_pool2d(relu(conv2d(x)), 2×2, stride 2)` as one op: on the direct kernels each register tile is pooled as
/// it is stored, elsewhere each image's convolution output stays in a per-thread buffer, in cache; only the pooled
/// output is written — with each window's arg-max when the op is recorded, for the backward. The same values and
/// gradients as the three ops.
fn conv2d_relu_max_pool2(x: &Tensor, w: &Tensor, b: Option<&Tensor>, p: Conv2dParams) -> Result<Tensor> {
    let g = geometry(x.shape(), w.shape(), b.map(|b| b.shape()), p)?;
    let window = Pool2dParams::square(2);
    if g.ho < 2 || g.wo < 2 {
        // No whole window: the separate ops report the pooling's error.
        return conv2d(x, w, b, p, true)?.max_pool2d(window);
    }
    let n = x.shape()[0];
    let ops = Operands::new(x, w, b);
    let (xs, ws, bias) = ops.slices();
    let (in_len, out_len) = (g.c * g.h * g.w, g.o * g.hw_out());
    let (ph, pw) = (g.ho / 2, g.wo / 2);
    let pooled_len = g.o * ph * pw;
    let tracked = grad_enabled() && (x.is_tracked() || w.is_tracked() || b.is_some_and(Tensor::is_tracked));
    let plan = direct_plan(&g);
    let one = |(conv, scratch): &mut (Vec<f32>, Vec<f32>), img: &[f32], o: &mut [f32], idx: &mut [u32], par: bool| {
        if let Some(plan) = &plan {
            // Pooled in registers as the tiles are stored: the convolution's output is never written.
            pooled_image_direct(img, ws, bias, &g, plan, scratch, (o, idx), par);
            return;
        }
        // Otherwise the image's convolution goes to a buffer, in cache, and is pooled from there.
        conv.resize(out_len, 0.0);
        forward_image(img, ws, bias, &g, scratch, conv, par);
        conv.iter_mut().for_each(|v| *v = v.max(0.0));
        for_each_pooling_plane(&g, conv, |h, plane, range| {
            let idx = if idx.is_empty() { &mut [][..] } else { &mut idx[range.clone()] };
            pool::max_pool_plane(plane, &mut o[range], idx, h, g.wo, pw, &window);
        });
    };
    let mut out = vec![0.0f32; n * pooled_len];
    let mut argmax = vec![0u32; if tracked { n * pooled_len } else { 0 }];
    if n == 1 {
        one(&mut Default::default(), xs, &mut out, &mut argmax, true);
    } else if tracked {
        out.par_chunks_mut(pooled_len)
            .zip(argmax.par_chunks_mut(pooled_len))
            .zip(xs.par_chunks(in_len))
            .for_each_init(Default::default, |bufs, ((o, idx), img)| one(bufs, img, o, idx, false));
    } else {
        out.par_chunks_mut(pooled_len)
            .zip(xs.par_chunks(in_len))
            .for_each_init(Default::default, |bufs, (o, img)| one(bufs, img, o, &mut [], false));
    }
    let value = Array4::from_shape_vec((n, g.o, ph, pw), out).expect("sized above").into_dyn();
    let op = Op::Conv2d { x: x.clone(), w: w.clone(), b: b.cloned(), p, relu: true, pool: Some(argmax) };
    Ok(record(value, op))
}

/// The output gradient a convolution's backward consumes, one image at a time, before the fused ReLU (and
/// pooling) is undone.
enum OutGrad<'a> {
    /// `[N, O, Ho, Wo]`, masked where the fused ReLU's output `relu` (same layout), if any, is not positive.
    Dense { g: &'a [f32], relu: Option<&'a [f32]> },
    /// Through a fused ReLU and 2×2 max pooling: the pooled gradient and output `[N, O, Ho/2, Wo/2]` and each
    /// window's flat arg-max in its `Ho × Wo` plane. The gradient goes to the arg-max where the pooled output is
    /// positive — what the pooling's backward followed by the ReLU's gives.
    Pooled(sparse::Pooled<'a>),
}

impl OutGrad<'_> {
    /// Image `i`'s gradient `[O, Ho·Wo]` and the ReLU mask still to apply to it (`None`: none, or applied),
    /// expanded into `buf` when pooled.
    fn image<'s>(&'s self, geo: &Geom, i: usize, buf: &'s mut Vec<f32>) -> (&'s [f32], Option<&'s [f32]>) {
        let len = geo.o * geo.hw_out();
        match *self {
            OutGrad::Dense { g, relu } => (&g[i * len..(i + 1) * len], relu.map(|y| &y[i * len..(i + 1) * len])),
            OutGrad::Pooled(sparse::Pooled { g, out, argmax }) => {
                let pooled = geo.o * (geo.ho / 2) * (geo.wo / 2);
                let at = i * pooled;
                let (g, out, argmax) = (&g[at..at + pooled], &out[at..at + pooled], &argmax[at..at + pooled]);
                buf.resize(len, 0.0);
                for_each_pooling_plane(geo, buf, |h, plane, range| {
                    let (g, out, argmax) = (&g[range.clone()], &out[range.clone()], &argmax[range]);
                    if !simd::relu_max_pool_2x2_expand(h, geo.wo, out, g, argmax, plane) {
                        plane.fill(0.0);
                        for ((&gv, &y), &j) in g.iter().zip(out).zip(argmax) {
                            if y > 0.0 {
                                plane[j as usize] = gv;
                            }
                        }
                    }
                });
                (buf, None)
            }
        }
    }
}

/// Calls `f(h, plane, range)` for the planes of one image's convolution output `[O, Ho, Wo]` that 2×2 pooling
/// treats as one (`h` rows of `Wo`; `range`: their pooled outputs within the image's): the whole image as one
/// tall plane when `Ho` is even (no window straddles two channels), else each channel. The fused op's arg-max is
/// flat within these planes.
fn for_each_pooling_plane<T>(geo: &Geom, img: &mut [T], mut f: impl FnMut(usize, &mut [T], std::ops::Range<usize>)) {
    let (hw, pp) = (geo.hw_out(), (geo.ho / 2) * (geo.wo / 2));
    if geo.ho.is_multiple_of(2) {
        f(geo.o * geo.ho, &mut img[..geo.o * hw], 0..geo.o * pp);
    } else {
        for (c, plane) in img[..geo.o * hw].chunks_exact_mut(hw).enumerate() {
            f(geo.ho, plane, c * pp..(c + 1) * pp);
        }
    }
}

/// The backward of a convolution (with the fused ReLU when `relu_out` is its output).
pub(crate) fn conv2d_backward(
    x: &Tensor,
    w: &Tensor,
    has_bias: bool,
    p: &Conv2dParams,
    gout: &ArrayD<f32>,
    relu_out: Option<&crate::tensor::Array>,
    need: &[bool],
) -> Result<Vec<Option<ArrayD<f32>>>> {
    // A fused ReLU: the gradient passes only where the output is positive (the ReLU's own backward), applied to
    // each image's output gradient as it is used, in cache.
    let ys = relu_out.map(|y| y.as_standard_layout());
    let gs = gout.as_standard_layout();
    let relu = ys.as_ref().map(|y| y.as_slice().expect("std"));
    backward(x, w, has_bias, p, &OutGrad::Dense { g: gs.as_slice().expect("std"), relu }, need)
}

/// The backward of [`Tensor::conv2d_relu_max_pool2`], from the pooled output `out`, its gradient and the
/// windows' arg-max.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv2d_pool_backward(
    x: &Tensor,
    w: &Tensor,
    has_bias: bool,
    p: &Conv2dParams,
    gout: &ArrayD<f32>,
    out: &crate::tensor::Array,
    argmax: &[u32],
    need: &[bool],
) -> Result<Vec<Option<ArrayD<f32>>>> {
    let (gs, os) = (gout.as_standard_layout(), out.as_standard_layout());
    let (g, out) = (gs.as_slice().expect("std"), os.as_slice().expect("std"));
    backward(x, w, has_bias, p, &OutGrad::Pooled(sparse::Pooled { g, out, argmax }), need)
}

fn backward(
    x: &Tensor,
    w: &Tensor,
    has_bias: bool,
    p: &Conv2dParams,
    src: &OutGrad,
    need: &[bool],
) -> Result<Vec<Option<ArrayD<f32>>>> {
    let g = geometry(x.shape(), w.shape(), None, *p)?;
    let n = x.shape()[0];
    let (need_x, need_w) = (need[0], need[1]);
    let need_b = has_bias && need.get(2).copied().unwrap_or(false);
    let xs = x.value().as_standard_layout();
    let ws = w.value().as_standard_layout();
    let (xs, ws) = (xs.as_slice().expect("std"), ws.as_slice().expect("std"));
    if let OutGrad::Pooled(pooled) = src {
        if sparse::applies(&g) {
            let r = sparse::backward(xs, ws, &g, n, pooled, (need_x, need_w, need_b));
            let dx = r.dx.map(|v| ArrayD::from_shape_vec(x.shape(), v).expect("input-sized"));
            let dw = r.dw.map(|v| ArrayD::from_shape_vec(w.shape(), v).expect("weight-sized"));
            let mut out = vec![dx, dw];
            if has_bias {
                out.push(r.db.map(|v| Array1::from(v).into_dyn()));
            }
            return Ok(out);
        }
    }
    let (og, k, hw) = (g.og(), g.k(), g.hw_out());
    let (in_len, w_len) = (g.c * g.h * g.w, g.o * k);
    let col_len = k * hw;
    let par_inside = n == 1;
    let u = direct_unfold(&g);

    // Input gradient: where the forward runs direct, so does this — each register tile of Wᵀ·dout is added
    // straight into the (padded) image gradient, with no unfolded gradient matrix and no col2im pass.
    let dx_plan = if need_x { input_grad_plan(&g, ws) } else { None };
    // Weight gradient: with the vector kernels each group's is accumulated transposed, dWᵀ[K, Og] += col · doutᵀ,
    // so the product runs on the register-tiled kernel (doutᵀ has contiguous rows); otherwise dW += dout · colᵀ on
    // `gemm`. And with a column stride of 1 the unfolded image is read straight from the image.
    let transposed = simd::accelerated();
    let dw_plan = if need_w { weight_grad_plan(&g) } else { None };

    // Images go in fixed chunks (when weight or bias gradients are summed, so their partial sums, added chunk
    // after chunk, do not depend on the thread count), and each image's output gradient is masked (or expanded
    // from the pooling) once, in cache, for all three gradients.
    let chunk = if need_w || need_b { WGRAD_CHUNK } else { 1 };
    let run = |ci: usize, mut dx: Option<&mut [f32]>| -> (Vec<f32>, Vec<f32>) {
        let mut acc = vec![0.0f32; if need_w { w_len } else { 0 }];
        let mut bacc = vec![0.0f32; if need_b { g.o } else { 0 }];
        let mut col =
            vec![0.0f32; if need_x && dx_plan.is_none() || need_w && dw_plan.is_none() { col_len } else { 0 }];
        let mut gt = vec![0.0f32; if need_w && transposed { og * hw } else { 0 }];
        let (mut gm, mut pad, mut eb) = (Vec::new(), Vec::new(), Vec::new());
        for i in ci * chunk..((ci + 1) * chunk).min(n) {
            let (graw, yimg) = src.image(&g, i, &mut eb);
            if let Some(dx) = dx.as_deref_mut() {
                let dimg = &mut dx[(i - ci * chunk) * in_len..][..in_len];
                let gimg = relu_masked(graw, yimg, &mut gm);
                if let Some(plan) = &dx_plan {
                    input_grad_image_direct(gimg, plan, &g, &mut pad, dimg, par_inside);
                } else {
                    for grp in 0..g.p.groups {
                        let wg = mat(&ws[grp * og * k..(grp + 1) * og * k], og, k);
                        let gg = mat(&gimg[grp * og * hw..(grp + 1) * og * hw], og, hw);
                        if g.is_pointwise() {
                            let dst = &mut dimg[grp * g.cg() * hw..(grp + 1) * g.cg() * hw];
                            product(wg.t(), gg, mat_mut(dst, k, hw), false, par_inside);
                        } else {
                            product(wg.t(), gg, mat_mut(&mut col, k, hw), false, par_inside);
                            col2im(&col, &g, grp * g.cg(), dimg);
                        }
                    }
                }
            }
            if need_w {
                let img = &xs[i * in_len..(i + 1) * in_len];
                // The transposed path masks while it transposes; the `gemm` path needs the masked copy.
                let gimg = if transposed { graw } else { relu_masked(graw, yimg, &mut gm) };
                let src_img = if dw_plan.is_some() { padded(img, &g, &mut pad) } else { img };
                for grp in 0..g.p.groups {
                    let dst = &mut acc[grp * og * k..(grp + 1) * og * k];
                    if transposed {
                        let (lo, hi) = (grp * og * hw, (grp + 1) * og * hw);
                        transpose(&gimg[lo..hi], yimg.map(|y| &y[lo..hi]), og, hw, &mut gt);
                    }
                    if let Some(plan) = &dw_plan {
                        // The unfolded image is read in place, never written out.
                        plan.run(&src_img[grp * g.cg() * u.h * u.w..], &gt, og, dst);
                        continue;
                    }
                    let src = if g.is_pointwise() {
                        &img[grp * g.cg() * hw..(grp + 1) * g.cg() * hw]
                    } else {
                        im2col(img, &g, grp * g.cg(), &mut col);
                        &col[..]
                    };
                    if transposed {
                        product(mat(src, k, hw), mat(&gt, hw, og), mat_mut(dst, k, og), true, par_inside);
                    } else {
                        let gg = mat(&gimg[grp * og * hw..(grp + 1) * og * hw], og, hw);
                        gemm(gg, mat(src, k, hw).t(), mat_mut(dst, og, k), true, par_inside);
                    }
                }
            }
            if need_b {
                // Per output channel, the sum of its plane (masked), image after image.
                for (o, b) in bacc.iter_mut().enumerate() {
                    *b += lane_sum(&graw[o * hw..(o + 1) * hw], yimg.map(|y| &y[o * hw..(o + 1) * hw]));
                }
            }
        }
        (acc, bacc)
    };
    let mut dx = if need_x { vec![0.0f32; n * in_len] } else { Vec::new() };
    let parts: Vec<(Vec<f32>, Vec<f32>)> = if n == 1 {
        // Outside rayon's pool, so the kernels may split the one image across threads.
        vec![run(0, need_x.then_some(&mut dx[..]))]
    } else if need_x {
        dx.par_chunks_mut(chunk * in_len).enumerate().map(|(ci, d)| run(ci, Some(d))).collect()
    } else {
        (0..n.div_ceil(chunk)).into_par_iter().map(|ci| run(ci, None)).collect()
    };
    let (dws, dbs): (Vec<Vec<f32>>, Vec<Vec<f32>>) = parts.into_iter().unzip();
    let dw = need_w.then(|| {
        let mut total = sum_in_order(&dws, w_len);
        if transposed {
            // The chunks accumulated each group's dWᵀ [K, Og]: transposed once, after the sum.
            for grp in total.chunks_mut(og * k) {
                let t = mat(grp, k, og).t().as_standard_layout().into_owned();
                grp.copy_from_slice(t.as_slice().expect("standard layout"));
            }
        }
        ArrayD::from_shape_vec(w.shape(), total).expect("weight-sized")
    });
    let db = need_b.then(|| Array1::from(sum_in_order(&dbs, g.o)).into_dyn());
    let dx = need_x.then(|| ArrayD::from_shape_vec(x.shape(), dx).expect("input-sized"));
    let mut out = vec![dx, dw];
    if has_bias {
        out.push(db);
    }
    Ok(out)
}

/// The chunks' partial sums (`len` values each) added chunk after chunk: a fixed order, whatever the threads.
fn sum_in_order(parts: &[Vec<f32>], len: usize) -> Vec<f32> {
    let mut total = vec![0.0f32; len];
    for part in parts {
        total.iter_mut().zip(part).for_each(|(t, v)| *t += v);
    }
    total
}

/// Convolution.
impl Tensor {
    /// 2-D cross-correlation of `self` [N, C, H, W] with `weight` [O, C/groups, kh, kw] plus an optional
    /// `bias` [O]; output [N, O, Ho, Wo] with Ho = ⌊(H + 2p − d(kh−1) − 1)/s⌋ + 1.
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Tensor> {
        conv2d(self, weight, bias, params, false)
    }

    /// `relu(conv2d(…))` as one op: the same values and gradients, one pass over the output fewer each way.
    pub fn conv2d_relu(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Tensor> {
        conv2d(self, weight, bias, params, true)
    }

    /// `max_pool2d(relu(conv2d(…)), 2×2 windows, stride 2)` as one op: the same values and gradients, with the
    /// convolution's output kept in cache instead of written out and read back each way.
    pub fn conv2d_relu_max_pool2(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
    ) -> Result<Tensor> {
        conv2d_relu_max_pool2(self, weight, bias, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Ix4;

    /// The direct seven-loop convolution: the oracle for the im2col kernel.
    fn naive(x: &Array4<f32>, w: &Array4<f32>, b: &[f32], p: Conv2dParams) -> Array4<f32> {
        let (n, c, h, wd) = x.dim();
        let (o, cg, kh, kw) = w.dim();
        let ho = out_size(h, kh, p.stride.0, p.padding.0, p.dilation.0).unwrap();
        let wo = out_size(wd, kw, p.stride.1, p.padding.1, p.dilation.1).unwrap();
        let og = o / p.groups;
        let mut out = Array4::zeros((n, o, ho, wo));
        for ni in 0..n {
            for oc in 0..o {
                let grp = oc / og;
                for i in 0..ho {
                    for j in 0..wo {
                        let mut s = b[oc] as f64;
                        for ci in 0..cg {
                            for a in 0..kh {
                                for bb in 0..kw {
                                    let ih = (i * p.stride.0 + a * p.dilation.0) as isize - p.padding.0 as isize;
                                    let iw = (j * p.stride.1 + bb * p.dilation.1) as isize - p.padding.1 as isize;
                                    if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < wd {
                                        s += (x[[ni, grp * cg + ci, ih as usize, iw as usize]] * w[[oc, ci, a, bb]])
                                            as f64;
                                    }
                                }
                            }
                        }
                        out[[ni, oc, i, j]] = s as f32;
                    }
                }
            }
        }
        let _ = c;
        out
    }

    #[test]
    fn im2col_gemm_matches_direct_convolution() {
        let cases = [
            (2, 4, 9, 8, 6, 3, 3, Conv2dParams::default()),
            (3, 4, 9, 8, 6, 3, 2, Conv2dParams { stride: (2, 1), padding: (1, 2), dilation: (1, 2), groups: 2 }),
            (1, 6, 5, 5, 6, 1, 1, Conv2dParams { groups: 3, ..Default::default() }),
            (2, 3, 7, 7, 4, 1, 1, Conv2dParams::default()),
            (2, 2, 9, 37, 3, 3, 5, Conv2dParams { padding: (2, 1), ..Default::default() }),
            (1, 4, 11, 20, 4, 3, 3, Conv2dParams { stride: (2, 1), padding: (1, 3), dilation: (2, 2), groups: 2 }),
            (3, 16, 12, 12, 32, 5, 5, Conv2dParams::default()),
        ];
        for (seed, &(n, c, h, w, o, kh, kw, p)) in cases.iter().enumerate() {
            let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed as u64);
            let wt = Tensor::uniform(&[o, c / p.groups, kh, kw], -1.0, 1.0, 100 + seed as u64);
            let b = Tensor::uniform(&[o], -1.0, 1.0, 200 + seed as u64);
            let got = x.conv2d(&wt, Some(&b), p).unwrap();
            let x4 = x.to_array().into_dimensionality::<Ix4>().unwrap();
            let w4 = wt.to_array().into_dimensionality::<Ix4>().unwrap();
            let want = naive(&x4, &w4, &b.to_vec(), p);
            assert_eq!(got.shape(), want.shape());
            for (a, b) in got.value().iter().zip(want.iter()) {
                assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "case {seed}: {a} vs {b}");
            }
        }
    }

    /// The direct (implicit-GEMM) forward gives the same bits as unfolding the image and running the product
    /// onto the bias, with and without the fused ReLU: each output is the same multiply-add chain. Geometries
    /// with full and partial vectors, padding, row stride, dilation and groups.
    #[test]
    fn direct_forward_equals_unfolded_product() {
        let cases = [
            (2, 1, 28, 28, 16, 5, 5, Conv2dParams::default()),
            (2, 16, 12, 12, 32, 5, 5, Conv2dParams::default()),
            (2, 3, 13, 30, 7, 3, 3, Conv2dParams { padding: (1, 1), ..Default::default() }),
            (1, 4, 11, 21, 4, 3, 3, Conv2dParams { stride: (2, 1), padding: (1, 3), dilation: (2, 2), groups: 2 }),
            (1, 2, 6, 45, 13, 2, 4, Conv2dParams::default()),
        ];
        for (seed, &(n, c, h, w, o, kh, kw, p)) in cases.iter().enumerate() {
            let seed = seed as u64;
            let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed);
            let wt = Tensor::uniform(&[o, c / p.groups, kh, kw], -1.0, 1.0, 10 + seed);
            let b = Tensor::uniform(&[o], -1.0, 1.0, 20 + seed);
            let g = geometry(x.shape(), wt.shape(), None, p).unwrap();
            let (og, k, hw) = (g.og(), g.k(), g.hw_out());
            let (xs, ws, bs) = (x.to_vec(), wt.to_vec(), b.to_vec());
            let mut want = vec![0.0f32; n * o * hw];
            let mut col = vec![0.0f32; k * hw];
            for (img, out) in xs.chunks(c * h * w).zip(want.chunks_mut(o * hw)) {
                for (plane, &bv) in out.chunks_mut(hw).zip(&bs) {
                    plane.fill(bv);
                }
                for grp in 0..p.groups {
                    im2col(img, &g, grp * g.cg(), &mut col);
                    let wg = mat(&ws[grp * og * k..(grp + 1) * og * k], og, k);
                    product(
                        wg,
                        mat(&col, k, hw),
                        mat_mut(&mut out[grp * og * hw..(grp + 1) * og * hw], og, hw),
                        true,
                        false,
                    );
                }
            }
            let got = x.conv2d(&wt, Some(&b), p).unwrap().to_vec();
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "case {seed}");
            let fused = x.conv2d_relu(&wt, Some(&b), p).unwrap().to_vec();
            assert!(fused.iter().zip(&want).all(|(a, b)| a.to_bits() == b.max(0.0).to_bits()), "case {seed} relu");
        }
    }

    /// The weight gradient read straight from the image gives the same bits as unfolding it and running the
    /// product (`dWᵀ += col · doutᵀ`), on the geometries of the forward test. (Without the vector kernels there
    /// is no implicit path: the adjoint test covers the `gemm` one.)
    #[test]
    fn implicit_weight_gradient_equals_unfolded_product() {
        if !simd::accelerated() {
            return;
        }
        let cases = [
            (3, 1, 28, 28, 16, 5, 5, Conv2dParams::default()),
            (3, 16, 12, 12, 32, 5, 5, Conv2dParams::default()),
            (2, 3, 13, 30, 7, 3, 3, Conv2dParams { padding: (1, 1), ..Default::default() }),
            (1, 4, 11, 21, 4, 3, 3, Conv2dParams { stride: (2, 1), padding: (1, 3), dilation: (2, 2), groups: 2 }),
        ];
        for (seed, &(n, c, h, w, o, kh, kw, p)) in cases.iter().enumerate() {
            let seed = seed as u64;
            let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed);
            let wt = Tensor::uniform(&[o, c / p.groups, kh, kw], -1.0, 1.0, 10 + seed);
            let g = geometry(x.shape(), wt.shape(), None, p).unwrap();
            let (og, k, hw) = (g.og(), g.k(), g.hw_out());
            let gout = Tensor::uniform(&[n, o, g.ho, g.wo], -1.0, 1.0, 20 + seed).to_array();
            let got = conv2d_backward(&x, &wt, false, &p, &gout, None, &[false, true]).unwrap()[1].clone().unwrap();
            let (xs, gs) = (x.to_vec(), gout.iter().copied().collect::<Vec<f32>>());
            let mut acc = vec![0.0f32; o * k];
            let (mut col, mut gt) = (vec![0.0f32; k * hw], vec![0.0f32; og * hw]);
            for (img, gimg) in xs.chunks(c * h * w).zip(gs.chunks(o * hw)) {
                for grp in 0..p.groups {
                    im2col(img, &g, grp * g.cg(), &mut col);
                    transpose(&gimg[grp * og * hw..(grp + 1) * og * hw], None, og, hw, &mut gt);
                    let dst = mat_mut(&mut acc[grp * og * k..(grp + 1) * og * k], k, og);
                    product(mat(&col, k, hw), mat(&gt, hw, og), dst, true, false);
                }
            }
            let mut want: Vec<f32> = Vec::with_capacity(o * k);
            for grp in acc.chunks(og * k) {
                want.extend(mat(grp, k, og).t().iter());
            }
            let got: Vec<f32> = got.iter().copied().collect();
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "case {seed}");
        }
    }

    /// The backward (input, weight and bias gradients) against the direct adjoint sums in f64, over the
    /// geometries the vectorised im2col/col2im distinguish: padding, row stride, dilation, groups, rows wider
    /// than one 16-lane vector, and a column stride that takes the scalar path.
    #[test]
    fn backward_matches_direct_adjoint() {
        let cases = [
            (2, 3, 10, 9, 4, 3, 3, Conv2dParams::default()),
            (2, 2, 9, 37, 3, 3, 5, Conv2dParams { padding: (2, 1), ..Default::default() }),
            (1, 4, 11, 20, 4, 3, 3, Conv2dParams { stride: (2, 1), padding: (1, 3), dilation: (2, 2), groups: 2 }),
            (2, 2, 8, 8, 2, 3, 2, Conv2dParams { stride: (1, 2), padding: (1, 1), ..Default::default() }),
            (3, 16, 12, 12, 32, 5, 5, Conv2dParams::default()),
        ];
        for (seed, &(n, c, h, w, o, kh, kw, p)) in cases.iter().enumerate() {
            let seed = seed as u64;
            let x = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed);
            let wt = Tensor::uniform(&[o, c / p.groups, kh, kw], -1.0, 1.0, 10 + seed);
            let g = geometry(x.shape(), wt.shape(), None, p).unwrap();
            let gout = Tensor::uniform(&[n, o, g.ho, g.wo], -1.0, 1.0, 20 + seed).to_array();
            let grads = conv2d_backward(&x, &wt, true, &p, &gout, None, &[true, true, true]).unwrap();
            let (dx, dw, db) = (grads[0].as_ref().unwrap(), grads[1].as_ref().unwrap(), grads[2].as_ref().unwrap());
            let (x4, w4) = (x.to_array(), wt.to_array());
            let mut want_dx = ndarray::ArrayD::<f64>::zeros(x4.shape());
            let mut want_dw = ndarray::ArrayD::<f64>::zeros(w4.shape());
            let mut want_db = vec![0.0f64; o];
            let (og, cg) = (o / p.groups, c / p.groups);
            for ni in 0..n {
                for oc in 0..o {
                    for i in 0..g.ho {
                        for j in 0..g.wo {
                            let gv = gout[[ni, oc, i, j]] as f64;
                            want_db[oc] += gv;
                            for ci in 0..cg {
                                for a in 0..kh {
                                    for b in 0..kw {
                                        let ih = (i * p.stride.0 + a * p.dilation.0) as isize - p.padding.0 as isize;
                                        let iw = (j * p.stride.1 + b * p.dilation.1) as isize - p.padding.1 as isize;
                                        if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= w {
                                            continue;
                                        }
                                        let xc = oc / og * cg + ci;
                                        let (ih, iw) = (ih as usize, iw as usize);
                                        want_dx[[ni, xc, ih, iw]] += gv * w4[[oc, ci, a, b]] as f64;
                                        want_dw[[oc, ci, a, b]] += gv * x4[[ni, xc, ih, iw]] as f64;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs());
            assert!(dx.iter().zip(&want_dx).all(|(&a, &b)| close(a, b)), "case {seed}: input gradient");
            assert!(dw.iter().zip(&want_dw).all(|(&a, &b)| close(a, b)), "case {seed}: weight gradient");
            assert!(db.iter().zip(&want_db).all(|(&a, &b)| close(a, b)), "case {seed}: bias gradient");
        }
    }

    /// The input gradient of an image is the same bits whether the image is alone (its pieces of input channels
    /// split across threads) or one of a batch (each image on one thread): the direct kernel's order of additions
    /// into the image gradient depends on the geometry only. Large enough for the split (two and three pieces,
    /// one padded), and the one-channel case.
    #[test]
    fn input_gradient_does_not_depend_on_the_batch_or_threads() {
        let padded = Conv2dParams { padding: (2, 1), ..Default::default() };
        for (c, hw, o, p) in
            [(16, 40, 32, Conv2dParams::default()), (1, 120, 16, Conv2dParams::default()), (30, 20, 8, padded)]
        {
            let x = Tensor::uniform(&[3, c, hw, hw], -1.0, 1.0, 1);
            let wt = Tensor::uniform(&[o, c, 5, 5], -1.0, 1.0, 2);
            let g = geometry(x.shape(), wt.shape(), None, p).unwrap();
            let gout = Tensor::uniform(&[3, o, g.ho, g.wo], -1.0, 1.0, 3).to_array();
            let batch = conv2d_backward(&x, &wt, false, &p, &gout, None, &[true, false]).unwrap()[0].clone().unwrap();
            for i in 0..3 {
                let xi = Tensor::new(x.value().slice(ndarray::s![i..i + 1, .., .., ..]).to_owned().into_dyn());
                let gi = gout.slice(ndarray::s![i..i + 1, .., .., ..]).to_owned().into_dyn();
                let one = conv2d_backward(&xi, &wt, false, &p, &gi, None, &[true, false]).unwrap()[0].clone().unwrap();
                let want = batch.slice(ndarray::s![i..i + 1, .., .., ..]);
                assert!(one.iter().zip(want.iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "c {c}, image {i}");
            }
        }
    }

    /// `conv2d_relu` is `relu(conv2d(…))` bit for bit: values, and the gradients of input, weight and bias.
    #[test]
    fn fused_relu_equals_conv_then_relu() {
        let padded = Conv2dParams { padding: (1, 1), ..Default::default() };
        for (n, p) in [(3, Conv2dParams::default()), (11, Conv2dParams::default()), (1, padded)] {
            let x = Tensor::uniform(&[n, 2, 9, 9], -1.0, 1.0, 1).variable();
            let w = Tensor::uniform(&[4, 2, 3, 3], -1.0, 1.0, 2).variable();
            let b = Tensor::uniform(&[4], -0.5, 0.5, 3).variable();
            let r = Tensor::uniform(&[n, 4, 9 - 2 + 2 * p.padding.0, 9 - 2 + 2 * p.padding.1], -1.0, 1.0, 4);
            let fused = x.conv2d_relu(&w, Some(&b), p).unwrap();
            let plain = x.conv2d(&w, Some(&b), p).unwrap().relu();
            assert_eq!(fused.to_array(), plain.to_array());
            let gf = fused.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &w, &b]).unwrap();
            let gp = plain.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &w, &b]).unwrap();
            for (a, b) in gf.iter().zip(&gp) {
                assert_eq!(a.to_array(), b.to_array());
            }
        }
    }

    /// `conv2d_relu_max_pool2` is `max_pool2d(relu(conv2d(…)), 2×2)`: values bit for bit (recorded or not), and
    /// the gradients of input, weight and bias — bit for bit on the dense backward, to rounding on the sparse one
    /// (which adds in another order). Odd output sizes (an unpooled last row and column), padding, groups, one
    /// image (the split inside the image) and many, the cnn's two layers, and a NaN input (the ReLU maps it to 0
    /// in both); on the direct kernels' pooled store (rows that fill the vectors) and on the buffered path.
    #[test]
    fn fused_pool_equals_conv_relu_then_pool() {
        let padded = Conv2dParams { padding: (1, 1), ..Default::default() };
        let grouped = Conv2dParams { padding: (1, 2), groups: 2, ..Default::default() };
        let cases = [
            (3, 2, 9, 9, 4, 3, Conv2dParams::default()),
            (1, 2, 9, 10, 4, 3, padded),
            (2, 4, 11, 9, 6, 3, grouped),
            (5, 1, 28, 28, 16, 5, Conv2dParams::default()),
            (5, 16, 12, 12, 32, 5, Conv2dParams::default()),
            (2, 4, 10, 14, 6, 3, Conv2dParams { padding: (1, 1), groups: 2, ..Default::default() }),
            (1, 16, 30, 30, 32, 5, Conv2dParams::default()),
            (2, 3, 11, 17, 5, 3, Conv2dParams::default()),
            // Sparse only: padded (runs of 24 values), and runs of 200 (more than one block of vectors).
            (2, 8, 10, 11, 6, 3, Conv2dParams { padding: (1, 2), ..Default::default() }),
            (9, 40, 8, 8, 3, 5, Conv2dParams::default()),
        ];
        let pool = Pool2dParams::square(2);
        for (seed, &(n, c, h, w, o, k, p)) in cases.iter().enumerate() {
            let seed = seed as u64;
            let mut xv = Tensor::uniform(&[n, c, h, w], -1.0, 1.0, seed).to_array();
            xv[[0, 0, 1, 1]] = f32::NAN;
            let x = Tensor::new(xv).variable();
            let wt = Tensor::uniform(&[o, c / p.groups, k, k], -1.0, 1.0, 10 + seed).variable();
            let b = Tensor::uniform(&[o], -0.5, 0.5, 20 + seed).variable();
            let fused = x.conv2d_relu_max_pool2(&wt, Some(&b), p).unwrap();
            let plain = x.conv2d(&wt, Some(&b), p).unwrap().relu().max_pool2d(pool).unwrap();
            let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused), bits(&plain), "case {seed}: values");
            let untracked = crate::no_grad(|| x.conv2d_relu_max_pool2(&wt, Some(&b), p).unwrap());
            assert_eq!(bits(&untracked), bits(&plain), "case {seed}: values, not recorded");
            let r = Tensor::uniform(plain.shape(), -1.0, 1.0, 30 + seed);
            let gf = fused.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &wt, &b]).unwrap();
            let gp = plain.mul(&r).unwrap().sum_all().grad_wrt(&[&x, &wt, &b]).unwrap();
            let sparse = sparse::applies(&geometry(&[n, c, h, w], wt.shape(), None, p).unwrap());
            for (i, (a, b)) in gf.iter().zip(&gp).enumerate() {
                if !sparse {
                    assert_eq!(bits(a), bits(b), "case {seed}: gradient {i}");
                    continue;
                }
                // The sparse backward adds in another order, and never forms the plain weight gradient's
                // `0 · NaN` where the ReLU passed nothing.
                for (j, (&f, &q)) in a.to_vec().iter().zip(&b.to_vec()).enumerate() {
                    let close = (f - q).abs() <= 1e-5 * (1.0 + q.abs());
                    assert!(
                        close || q.is_nan() && i == 1 && f.is_finite(),
                        "case {seed}: gradient {i}[{j}] {f} vs {q}"
                    );
                }
            }
            assert_eq!(sparse, seed >= 8 || [4, 6, 7].contains(&seed), "case {seed}: the backward it means to test");
        }
        // No whole window: the pooling's error, as from the separate ops.
        let x = Tensor::zeros(&[1, 1, 5, 5]);
        let w = Tensor::zeros(&[1, 1, 5, 5]);
        assert!(x.conv2d_relu_max_pool2(&w, None, Conv2dParams::default()).is_err());
    }

    /// No input or no output channels is an error, not a panic; an empty batch is an empty output.
    #[test]
    fn zero_channels_are_an_error_and_an_empty_batch_is_empty() {
        let p = Conv2dParams::default();
        let (x, w) = (Tensor::zeros(&[2, 0, 5, 5]), Tensor::zeros(&[3, 0, 3, 3]));
        assert!(matches!(x.conv2d(&w, None, p), Err(Error::InvalidArgument { .. })));
        let (x, w) = (Tensor::zeros(&[2, 1, 5, 5]), Tensor::zeros(&[0, 1, 3, 3]));
        assert!(matches!(x.conv2d_relu_max_pool2(&w, None, p), Err(Error::InvalidArgument { .. })));
        let x = Tensor::zeros(&[0, 1, 6, 6]).variable();
        let w = Tensor::uniform(&[2, 1, 3, 3], -1.0, 1.0, 1).variable();
        for y in [x.conv2d(&w, None, p).unwrap(), x.conv2d_relu_max_pool2(&w, None, p).unwrap()] {
            assert_eq!(y.shape()[0], 0);
            let g = y.sum_all().grad_wrt(&[&x, &w]).unwrap();
            assert_eq!(g[0].shape(), &[0, 1, 6, 6]);
            assert!(g[1].to_vec().iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn kernel_larger_than_input_is_an_error() {
        let x = Tensor::zeros(&[1, 1, 3, 3]);
        let w = Tensor::zeros(&[1, 1, 5, 5]);
        assert!(matches!(x.conv2d(&w, None, Conv2dParams::default()), Err(Error::InvalidArgument { .. })));
        let w = Tensor::zeros(&[2, 2, 1, 1]);
        assert!(matches!(x.conv2d(&w, None, Conv2dParams::default()), Err(Error::ShapeMismatch { .. })));
    }
}
