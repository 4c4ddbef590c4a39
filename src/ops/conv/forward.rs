//! The forward of a convolution, optionally fused with the ReLU after it, or with the ReLU and a 2×2 max pooling:
//! per image and group, `out[Og, HoWo] = W[Og, K] · col[K, HoWo]` with `K = Cg·kh·kw`, where `col` is the unfolded
//! image — read in place by the direct kernels, else written by im2col. Batch-parallel over images; one image
//! splits its work across threads instead.
//!
//! Dispatch: a pointwise convolution over a small map runs transposed ([`super::pointwise`]); a depthwise one runs
//! its own kernel ([`depthwise`]); otherwise [`DirectConv`] plans the direct path (`None`: unfold), which also
//! pools in registers; otherwise each image's output goes to a buffer, in cache, and is pooled from there.

use std::mem::MaybeUninit;

use ndarray::{Array4, ArrayViewMut2};
use rayon::prelude::*;

use super::plan::DirectConv;
use super::unfold::{clamped_product, direct_unfold, im2col};
use super::{depthwise, winograd};
use super::{geometry, mat, mat_mut, After, Clamp, Conv2dParams, Geom};
use crate::ops::pool::{self, Pool2dParams};
use crate::ops::shape::standard;
use crate::ops::simd::Start;
use crate::ops::{record, Op};
use crate::tensor::{grad_enabled, Tensor};
use crate::Result;

/// The plan of the forward straight from the image ([`DirectConv`]), or `None` where it unfolds the image: a
/// column stride of 1, or of 2 read from the image's stride phases (a ResNet's stem and its stride-2 3×3s); never a
/// 1×1 without padding ([`Geom::is_one_tap`]), whatever its stride.
pub(super) fn direct_plan(g: &Geom) -> Option<DirectConv> {
    match g.p.stride.1 {
        _ if g.is_one_tap() => None,
        1 => DirectConv::plan(&direct_unfold(g)),
        2 => DirectConv::plan_phased(&direct_unfold(g)),
        _ => None,
    }
}

/// Direct forward for one image (see [`direct_plan`]) with the geometry's `plan`: `img` is zero-padded into `pad`
/// when the geometry has padding, and every element of `out[O, Ho·Wo]` is written, with the bias and the fused
/// clamp, if any.
#[allow(clippy::too_many_arguments)]
fn forward_image_direct(
    img: &[f32],
    wt: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    plan: &DirectConv,
    pad: &mut Vec<f32>,
    out: &mut [MaybeUninit<f32>],
    act: Option<Clamp>,
    par: bool,
) {
    let (og, k, hw) = (g.og(), g.k(), g.hw_out());
    let src = plan.image(img, g, pad);
    for grp in 0..g.p.groups {
        let b = bias.map(|b| &b[grp * og..(grp + 1) * og]);
        let (wg, dst) = (&wt[grp * og * k..(grp + 1) * og * k], &mut out[grp * og * hw..(grp + 1) * og * hw]);
        plan.run(&src[grp * g.cg() * plan.plane_len()..], wg, og, b, act, dst, par);
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
    let src = plan.image(img, g, pad);
    let tall = g.ho.is_multiple_of(2);
    for grp in 0..g.p.groups {
        let b = bias.map(|b| &b[grp * og..(grp + 1) * og]);
        let wg = &wt[grp * og * k..(grp + 1) * og * k];
        let dst = &mut out[grp * og * pp..(grp + 1) * og * pp];
        let ids = if idx.is_empty() { &mut [][..] } else { &mut idx[grp * og * pp..(grp + 1) * og * pp] };
        let offset = if tall { (grp * og * hw) as u32 } else { 0 };
        plan.run_pooled(&src[grp * g.cg() * plan.plane_len()..], wg, og, b, dst, ids, (tall, offset), par);
    }
}

/// Forward for one image by unfolding: `out[O, Ho·Wo]` from `img[C, H, W]`, every element written (`out` need
/// not be initialised), the image's residual `res` (`[O, Ho·Wo]`) added and the sum clamped as each product stores
/// it when given.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_image(
    img: &[f32],
    wt: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    col: &mut Vec<f32>,
    out: &mut [MaybeUninit<f32>],
    (act, res): (Option<Clamp>, Option<&[f32]>),
    par: bool,
) {
    let (og, k, hw) = (g.og(), g.k(), g.hw_out());
    assert!(out.len() >= g.o * hw, "forward_image: sizes");
    for grp in 0..g.p.groups {
        let wg = mat(&wt[grp * og * k..(grp + 1) * og * k], og, k);
        // SAFETY: the group's `og × hw` block lies inside `out` (asserted), is borrowed uniquely here, and the
        // product writes every element of it before reading any (its chains start at zero or at the bias, never
        // at `c`; the `gemm` crate's fallback writes the bias or zero first) — uninitialised memory is never read.
        let dst = unsafe { ArrayViewMut2::from_shape_ptr((og, hw), out[grp * og * hw..].as_mut_ptr().cast::<f32>()) };
        // The chains start at the bias (`b + Σ w·x`): no pass over the output writes it first.
        let start = bias.map_or(Start::Zero, |b| Start::Rows(&b[grp * og..(grp + 1) * og]));
        let res = res.map(|r| mat(&r[grp * og * hw..(grp + 1) * og * hw], og, hw));
        if g.is_pointwise() {
            let src = &img[grp * g.cg() * hw..(grp + 1) * g.cg() * hw];
            clamped_product(wg, mat(src, k, hw), dst, start, par, act, res);
        } else {
            col.resize(k * hw, 0.0);
            im2col(img, g, grp * g.cg(), col);
            clamped_product(wg, mat(col, k, hw), dst, start, par, act, res);
        }
    }
}

/// The values of a convolution's input, weight and bias, contiguous (copied only when not in standard layout).
struct Operands<'a> {
    x: std::borrow::Cow<'a, [f32]>,
    w: std::borrow::Cow<'a, [f32]>,
    b: Option<std::borrow::Cow<'a, [f32]>>,
}

impl<'a> Operands<'a> {
    fn new(x: &'a Tensor, w: &'a Tensor, b: Option<&'a Tensor>) -> Self {
        let std = |t: &'a Tensor| standard(t.value());
        Operands { x: std(x), w: std(w), b: b.map(std) }
    }

    fn slices(&self) -> (&[f32], &[f32], Option<&[f32]>) {
        (&self.x, &self.w, self.b.as_deref())
    }
}

/// The convolution of `x` with `w` and the bias, plus `res` when given (a residual connection: a tensor of the
/// output's shape, else the broadcasting sum after the convolution), clamped to `act` when given — as one op.
pub(super) fn conv2d(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    p: Conv2dParams,
    act: Option<Clamp>,
    res: Option<&Tensor>,
) -> Result<Tensor> {
    let g = geometry(x.shape(), w.shape(), b.map(|b| b.shape()), p)?;
    let n = x.shape()[0];
    if let Some(r) = res.filter(|r| r.shape() != [n, g.o, g.ho, g.wo]) {
        // Not the output's shape: the convolution, then the sum with its broadcasting (and its error), then the clamp.
        let sum = conv2d(x, w, b, p, None, None)?.add(r)?;
        return Ok(match act {
            Some(Clamp::RELU) => sum.relu(),
            Some(c) => sum.clamp(c.lo, c.hi),
            None => sum,
        });
    }
    let value = forward_value((x, w, b), &g, (act, res, None));
    let op = Op::Conv2d { x: x.clone(), w: w.clone(), b: b.cloned(), p, act, pool: None, res: res.cloned() };
    Ok(record(value, op))
}

/// The forward's value `[N, O, Ho, Wo]` of `x`, `w` and the bias on the geometry `g`, with the residual (of the
/// output's shape), clamp and `after` ([`computed`] on their contiguous values).
fn forward_value(
    (x, w, b): (&Tensor, &Tensor, Option<&Tensor>),
    g: &Geom,
    (act, res, after): (Option<Clamp>, Option<&Tensor>, After),
) -> ndarray::ArrayD<f32> {
    let n = x.shape()[0];
    let ops = Operands::new(x, w, b);
    let rs = res.map(|r| standard(r.value()));
    let out = computed(w, ops.slices(), g, n, (act, rs.as_deref(), after));
    Array4::from_shape_vec((n, g.o, g.ho, g.wo), out).expect("sized by the geometry").into_dyn()
}

/// The forward's values of the weight tensor `w` (its kept layouts) over the contiguous input, weight and bias, with
/// the residual, clamp and `after`: one product over the batch for a 1×1 map, the transposed product for other small
/// pointwise maps, else [`values_adding`] (Winograd where its transform is kept).
fn computed(
    w: &Tensor,
    (xs, ws, bias): (&[f32], &[f32], Option<&[f32]>),
    g: &Geom,
    n: usize,
    epilogue: (Option<Clamp>, Option<&[f32]>, After),
) -> Vec<f32> {
    match super::pointwise::kept(w, super::pointwise::KEY, ws, g) {
        Some(wt) => super::pointwise::forward(xs, &wt, bias, g, n, epilogue),
        None => {
            let wino = winograd::kept(w, winograd::KEY, ws, g);
            values_adding(xs, ws, bias, g, n, epilogue, wino.as_deref())
        }
    }
}

/// [`Tensor::conv2d_silu`]: untracked, the SiLU applied by [`values_adding`]'s `after` to each stretch of output
/// just written; tracked, the two ops (the SiLU's backward reads the convolution's output, which the fused op
/// never keeps).
pub(super) fn conv2d_silu(x: &Tensor, w: &Tensor, b: Option<&Tensor>, p: Conv2dParams) -> Result<Tensor> {
    let tracked = grad_enabled() && (x.is_tracked() || w.is_tracked() || b.is_some_and(Tensor::is_tracked));
    if tracked {
        return Ok(conv2d(x, w, b, p, None, None)?.silu());
    }
    let g = geometry(x.shape(), w.shape(), b.map(|b| b.shape()), p)?;
    let value = forward_value((x, w, b), &g, (None, None, Some(crate::ops::vmath::silu_in_place)));
    // Nothing tracked: a constant, whatever the op says.
    let op = Op::Conv2d { x: x.clone(), w: w.clone(), b: b.cloned(), p, act: None, pool: None, res: None };
    Ok(record(value, op))
}

/// `after` over a whole batch's output, across threads, where no kernel applied it image by image.
fn after_par(out: &mut [f32], after: After) {
    const CHUNK: usize = 1 << 14;
    if let Some(f) = after {
        out.par_chunks_mut(CHUNK).for_each(f);
    }
}

/// `after` over one image's output just written: on this thread, or across threads when the image alone had them
/// (`par`, a batch of one).
pub(super) fn after_image(out: &mut [f32], after: After, par: bool) {
    match after {
        Some(_) if par => after_par(out, after),
        Some(f) => f(out),
        None => {}
    }
}

/// `out = act(out + res)` element by element: a residual connection's sum (and the clamp after it) where the kernel
/// did not add it in its store — the bits of the sum computed after the convolution, with subnormals flushed on the
/// vector kernels' level as the product's store flushes them (docs/conventions.md), so every path and batch size
/// gives the same bits.
pub(super) fn add_residual(out: &mut [f32], res: &[f32], act: Option<Clamp>) {
    let _flush = crate::ops::simd::accelerated().then(crate::ops::simd::FlushSubnormals::on);
    match act {
        Some(a) => out.iter_mut().zip(res).for_each(|(v, &r)| *v = a.apply(*v + r)),
        None => out.iter_mut().zip(res).for_each(|(v, &r)| *v += r),
    }
}

/// [`add_residual`] over a whole batch's output, across threads.
fn add_residual_par(out: &mut [f32], res: &[f32], act: Option<Clamp>) {
    const CHUNK: usize = 1 << 14;
    out.par_chunks_mut(CHUNK).zip(res.par_chunks(CHUNK)).for_each(|(o, r)| add_residual(o, r, act));
}

/// The forward's values `[N, O, Ho, Wo]` from the contiguous input `xs` (`n` images), weight and bias: the
/// depthwise kernel, the direct kernels or unfolding, as the geometry allows. The input gradient of a stride-1
/// convolution runs here too, as the convolution of the output gradient with the flipped weight. Given the
/// weight's Winograd transform (`wino`, from [`winograd::kept`]: only where Winograd runs), it runs Winograd.
pub(super) fn values(
    xs: &[f32],
    ws: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    n: usize,
    act: Option<Clamp>,
    wino: Option<&winograd::Transform>,
) -> Vec<f32> {
    values_adding(xs, ws, bias, g, n, (act, None, None), wino)
}

/// [`values`] with the residual `res` (`[N, O, Ho, Wo]`, contiguous) added before the clamp, if given: in the
/// unfolded product's store, else to each image's output just written by the direct kernels or Winograd (in
/// cache), else over the batch (depthwise, small maps). `after` (with no clamp or residual) is applied to each
/// image's output, or each plane, just written, else over the batch (Winograd, small maps).
pub(super) fn values_adding(
    xs: &[f32],
    ws: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    n: usize,
    (act, res, after): (Option<Clamp>, Option<&[f32]>, After),
    wino: Option<&winograd::Transform>,
) -> Vec<f32> {
    let g = *g;
    let (in_len, out_len) = (g.c * g.h * g.w, g.o * g.hw_out());
    debug_assert!(after.is_none() || act.is_none() && res.is_none(), "values_adding: `after` alone");
    // The clamp the kernels apply: after the sum, so not in a kernel that does not add it.
    let inner = if res.is_some() { None } else { act };
    let finish = |mut out: Vec<f32>| {
        if let Some(r) = res {
            add_residual_par(&mut out, r, act);
        }
        out
    };
    if let Some(u) = wino {
        let mut out = winograd::forward(xs, u, bias, &g, n, (act, res));
        after_par(&mut out, after);
        out
    } else if depthwise::applies(&g) {
        finish(depthwise::forward(xs, ws, bias, &g, n, inner, after))
    } else if let Some(plan) = direct_plan(&g) {
        // Straight from the image, bias and ReLU applied in registers; nothing is zero-filled first. A residual is
        // added to each image's output right after it, while it is in cache, and so is `after` applied.
        let mut out = Vec::with_capacity(n * out_len);
        let slots = &mut out.spare_capacity_mut()[..n * out_len];
        let run = |pad: &mut Vec<f32>, o: &mut [MaybeUninit<f32>], img: &[f32], r: Option<&[f32]>, par: bool| {
            forward_image_direct(img, ws, bias, &g, &plan, pad, o, inner, par);
            // SAFETY: `forward_image_direct` wrote every element of `o`.
            let o = unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) };
            if let Some(r) = r {
                add_residual(o, r, act);
            }
            after_image(o, after, par);
        };
        if n == 1 {
            run(&mut Vec::new(), slots, xs, res, true);
        } else {
            let images = slots.par_chunks_mut(out_len).zip(xs.par_chunks(in_len)).enumerate();
            images.for_each_init(Vec::new, |pad, (i, (o, img))| {
                run(pad, o, img, res.map(|r| &r[i * out_len..(i + 1) * out_len]), false)
            });
        }
        // SAFETY: `forward_image_direct` wrote every element of every image's output.
        unsafe { out.set_len(n * out_len) };
        out
    } else if let Some(per) = images_per_product(&g, n) {
        let mut out = finish(small_maps(xs, ws, bias, &g, n, inner, per));
        after_par(&mut out, after);
        out
    } else {
        // The residual and the fused clamp are applied in the product's store, `after` to each image's output right
        // after it; nothing is zero-filled first.
        let mut out = Vec::with_capacity(n * out_len);
        let slots = &mut out.spare_capacity_mut()[..n * out_len];
        let run = |col: &mut Vec<f32>, o: &mut [MaybeUninit<f32>], img: &[f32], r: Option<&[f32]>, par: bool| {
            forward_image(img, ws, bias, &g, col, o, (act, r), par);
            // SAFETY: `forward_image` wrote every element of `o`.
            after_image(unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) }, after, par);
        };
        if n == 1 {
            run(&mut Vec::new(), slots, xs, res, true);
        } else {
            let images = slots.par_chunks_mut(out_len).zip(xs.par_chunks(in_len)).enumerate();
            images.for_each_init(Vec::new, |col, (i, (o, img))| {
                run(col, o, img, res.map(|r| &r[i * out_len..(i + 1) * out_len]), false)
            });
        }
        // SAFETY: `forward_image` wrote every element of every image's output.
        unsafe { out.set_len(n * out_len) };
        out
    }
}

/// How many images [`small_maps`] unfolds side by side: enough for a 64-column block of the product when an
/// image's output map is smaller than two vectors (a CIFAR ResNet's 4×4 stage: 16 columns, one vector of a register
/// tile's four), on the vector kernels, ungrouped and not pointwise; `None` otherwise.
fn images_per_product(g: &Geom, n: usize) -> Option<usize> {
    let hw = g.hw_out();
    let fits = crate::ops::simd::accelerated() && g.p.groups == 1 && !g.is_pointwise() && hw > 0 && hw < 32;
    (fits && n > 1).then(|| (64 / hw).clamp(1, n))
}

/// The unfolded forward with `per` images' columns side by side in one product, `out[O, per·Ho·Wo] = W · [col₁ …
/// col_per]`, then scattered to each image's `[O, Ho, Wo]`: a small map fills a register tile's vectors, where one
/// image's 16 columns left three of the four empty. Each element is the same multiply-add chain (from the bias) as
/// the per-image product, so the bits do not change and an image's output does not depend on its neighbours.
#[allow(clippy::too_many_arguments)]
fn small_maps(
    xs: &[f32],
    ws: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    n: usize,
    act: Option<Clamp>,
    per: usize,
) -> Vec<f32> {
    let (o, k, hw) = (g.o, g.k(), g.hw_out());
    let (in_len, out_len) = (g.c * g.h * g.w, o * hw);
    let mut out = vec![0.0f32; n * out_len];
    out.par_chunks_mut(per * out_len).zip(xs.par_chunks(per * in_len)).for_each_init(
        || (Vec::new(), Vec::new(), Vec::new()),
        |(col, wide, prod), (dst, imgs)| {
            let cols = imgs.len() / in_len * hw;
            col.resize(k * hw, 0.0);
            wide.resize(k * cols, 0.0);
            for (b, img) in imgs.chunks_exact(in_len).enumerate() {
                im2col(img, g, 0, col);
                for (row, src) in wide.chunks_exact_mut(cols).zip(col.chunks_exact(hw)) {
                    row[b * hw..(b + 1) * hw].copy_from_slice(src);
                }
            }
            prod.resize(o * cols, 0.0);
            let start = bias.map_or(Start::Zero, Start::Rows);
            clamped_product(mat(ws, o, k), mat(wide, k, cols), mat_mut(prod, o, cols), start, false, act, None);
            for (b, image) in dst.chunks_exact_mut(out_len).enumerate() {
                for (plane, row) in image.chunks_exact_mut(hw).zip(prod.chunks_exact(cols)) {
                    plane.copy_from_slice(&row[b * hw..(b + 1) * hw]);
                }
            }
        },
    );
    out
}

/// `max_pool2d(relu(conv2d(x)), 2×2, stride 2)` as one op: on the direct kernels each register tile is pooled as
/// it is stored, elsewhere each image's convolution output stays in a per-thread buffer, in cache; only the pooled
/// output is written — with each window's arg-max when the op is recorded, for the backward. The same values and
/// gradients as the three ops.
pub(super) fn conv2d_relu_max_pool2(x: &Tensor, w: &Tensor, b: Option<&Tensor>, p: Conv2dParams) -> Result<Tensor> {
    let g = geometry(x.shape(), w.shape(), b.map(|b| b.shape()), p)?;
    let window = Pool2dParams::square(2);
    if g.ho < 2 || g.wo < 2 {
        // No whole window: the separate ops report the pooling's error.
        return conv2d(x, w, b, p, Some(Clamp::RELU), None)?.max_pool2d(window);
    }
    let n = x.shape()[0];
    let ops = Operands::new(x, w, b);
    let (xs, ws, bias) = ops.slices();
    let (in_len, out_len) = (g.c * g.h * g.w, g.o * g.hw_out());
    let (ph, pw) = (g.ho / 2, g.wo / 2);
    let pooled_len = g.o * ph * pw;
    let tracked = grad_enabled() && (x.is_tracked() || w.is_tracked() || b.is_some_and(Tensor::is_tracked));
    if let Some(u) = winograd::kept(w, winograd::KEY, ws, &g) {
        // Winograd's convolution of the whole batch, with the ReLU, pooled image by image from there.
        let mut conv = winograd::forward(xs, &u, bias, &g, n, (Some(Clamp::RELU), None));
        let mut out = vec![0.0f32; n * pooled_len];
        let mut argmax = vec![0u32; if tracked { n * pooled_len } else { 0 }];
        let pool = |conv: &mut [f32], o: &mut [f32], idx: &mut [u32]| pool_image(&g, conv, o, idx);
        let images = conv.par_chunks_mut(out_len).zip(out.par_chunks_mut(pooled_len));
        if tracked {
            images.zip(argmax.par_chunks_mut(pooled_len)).for_each(|((c, o), idx)| pool(c, o, idx));
        } else {
            images.for_each(|(c, o)| pool(c, o, &mut []));
        }
        return Ok(pooled_op(x, w, b, p, (n, g.o, ph, pw), out, argmax));
    }
    // Pooled in registers on stride-1 plans only.
    let plan = direct_plan(&g).filter(|_| g.p.stride.1 == 1);
    let one = |(conv, scratch): &mut (Vec<f32>, Vec<f32>), img: &[f32], o: &mut [f32], idx: &mut [u32], par: bool| {
        if let Some(plan) = &plan {
            // Pooled in registers as the tiles are stored: the convolution's output is never written.
            pooled_image_direct(img, ws, bias, &g, plan, scratch, (o, idx), par);
            return;
        }
        // Otherwise the image's convolution goes to a buffer, in cache, and is pooled from there.
        conv.resize(out_len, 0.0);
        // SAFETY: `f32` and `MaybeUninit<f32>` share their layout, and `forward_image` writes only initialised
        // values, so `conv` stays initialised.
        let slots = unsafe { &mut *(conv.as_mut_slice() as *mut [f32] as *mut [MaybeUninit<f32>]) };
        forward_image(img, ws, bias, &g, scratch, slots, (Some(Clamp::RELU), None), par);
        pool_image(&g, conv, o, idx);
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
    Ok(pooled_op(x, w, b, p, (n, g.o, ph, pw), out, argmax))
}

/// 2×2 max pooling (stride 2) of one image's convolution output `conv` into `out`, with the windows' arg-max
/// unless `idx` is empty.
fn pool_image(g: &Geom, conv: &mut [f32], out: &mut [f32], idx: &mut [u32]) {
    let (window, pw) = (Pool2dParams::square(2), g.wo / 2);
    for_each_pooling_plane(g, conv, |h, plane, range| {
        let idx = if idx.is_empty() { &mut [][..] } else { &mut idx[range.clone()] };
        pool::max_pool_plane(plane, &mut out[range], idx, h, g.wo, pw, &window);
    });
}

/// The fused op's tensor from its pooled output and the windows' arg-max (empty when not recorded).
fn pooled_op(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    p: Conv2dParams,
    shape: (usize, usize, usize, usize),
    out: Vec<f32>,
    argmax: Vec<u32>,
) -> Tensor {
    let value = Array4::from_shape_vec(shape, out).expect("sized by the caller").into_dyn();
    let act = Some(Clamp::RELU);
    let op = Op::Conv2d { x: x.clone(), w: w.clone(), b: b.cloned(), p, act, pool: Some(argmax), res: None };
    record(value, op)
}

/// Calls `f(h, plane, range)` for the planes of one image's convolution output `[O, Ho, Wo]` that 2×2 pooling
/// treats as one (`h` rows of `Wo`; `range`: their pooled outputs within the image's): the whole image as one
/// tall plane when `Ho` is even (no window straddles two channels), else each channel. The fused op's arg-max is
/// flat within these planes.
pub(super) fn for_each_pooling_plane<T>(
    geo: &Geom,
    img: &mut [T],
    mut f: impl FnMut(usize, &mut [T], std::ops::Range<usize>),
) {
    let (hw, pp) = (geo.hw_out(), (geo.ho / 2) * (geo.wo / 2));
    if geo.ho.is_multiple_of(2) {
        f(geo.o * geo.ho, &mut img[..geo.o * hw], 0..geo.o * pp);
    } else {
        for (c, plane) in img[..geo.o * hw].chunks_exact_mut(hw).enumerate() {
            f(geo.ho, plane, c * pp..(c + 1) * pp);
        }
    }
}
