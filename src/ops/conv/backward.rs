//! The backward of a convolution: `dcol = Wᵀ · dout` scattered back into the image for ∂L/∂x (tile by tile on the
//! direct kernels, else by col2im), `dW = Σₙ dout · colᵀ` for ∂L/∂W (on the vector kernels transposed,
//! `dWᵀ += col · doutᵀ`, with the unfolded image read in place where it can) and the bias gradient as plane sums —
//! only the gradients whose inputs are tracked. Through the fused ReLU each image's output gradient is masked once,
//! in cache; through the fused 2×2 pooling it is expanded from the windows' arg-max, or the whole backward goes
//! sparse ([`super::sparse`]).
//!
//! Dispatch: a depthwise convolution runs its own kernels ([`depthwise`]); otherwise [`InputGrad`] and
//! [`WeightGrad`] plan the direct paths (`None`: unfold instead). Images go in fixed
//! chunks whose weight and bias partial sums are added chunk after chunk, so the results do not depend on the
//! thread count.

use std::mem::MaybeUninit;

use ndarray::{Array1, ArrayD};
use rayon::prelude::*;

use super::depthwise;
use super::forward::for_each_pooling_plane;
use super::plan::{InputGrad, WeightGrad};
use super::unfold::{col2im, direct_unfold, im2col, product, unphased, unquartered};
use super::{geometry, mat, mat_mut, sparse, sum_in_order, Clamp, Conv2dParams, Geom, WGRAD_CHUNK};
use crate::ops::matmul::gemm;
use crate::ops::shape::standard;
use crate::ops::simd;
use crate::tensor::Tensor;
use crate::Result;

mod wgrad;

/// Elements per parallel job of the clamp's mask.
const MASK_CHUNK: usize = 1 << 16;

/// The gradients a backward returns: input, weight and (with a bias) bias, each `None` when not asked for.
type Grads = Vec<Option<ArrayD<f32>>>;

/// The backward of a convolution, through its fused clamp when `fused` gives it with the op's output.
pub(crate) fn conv2d_backward(
    x: &Tensor,
    w: &Tensor,
    has_bias: bool,
    p: &Conv2dParams,
    gout: &ArrayD<f32>,
    fused: Option<(Clamp, &crate::tensor::Array)>,
    need: &[bool],
) -> Result<Vec<Option<ArrayD<f32>>>> {
    // The input gradient alone, of a depthwise convolution, from a channels-last gradient: read as it lies.
    let input_grad_alone = need.first() == Some(&true) && !need[1..].contains(&true);
    if fused.is_none() && input_grad_alone {
        if let Some(dx) = depthwise_channels_last(x, w, p, gout)? {
            return Ok(grads(Some(dx), None, None, has_bias));
        }
    }
    // A fused ReLU: the gradient passes only where the output is positive (the ReLU's own backward), applied to
    // each image's output gradient as it is used, in cache. Any other clamp (ReLU6) masks the whole gradient
    // first, in one pass (the work of a separate clamp's backward, which it replaces).
    let ys = fused.map(|(_, y)| standard(y));
    let gs = standard(gout);
    let (gs, ys) = (&gs[..], ys.as_deref());
    match (fused, ys) {
        (Some((c, _)), Some(y)) if c != Clamp::RELU => {
            // SAFETY: the chunks cover the buffer and each element is written.
            let masked = unsafe {
                crate::ops::written(gs.len(), |m| {
                    m.par_chunks_mut(MASK_CHUNK).zip(gs.par_chunks(MASK_CHUNK)).zip(y.par_chunks(MASK_CHUNK)).for_each(
                        |((d, g), y)| {
                            for ((d, &g), &y) in d.iter_mut().zip(g).zip(y) {
                                d.write(if c.passes(y) { g } else { 0.0 });
                            }
                        },
                    )
                })
            };
            backward(x, w, has_bias, p, &OutGrad::Dense { g: &masked, relu: None }, need)
        }
        (_, relu) => backward(x, w, has_bias, p, &OutGrad::Dense { g: gs, relu }, need),
    }
}

/// The input gradient alone of a depthwise convolution whose output gradient is a channels-last view (`[N, C, H,
/// W]` over `[N, H, W, C]` memory: ConvNeXt-T's block, whose output is permuted to channels-last for its LayerNorm
/// and linear layers, hands its gradient back that way), read as it lies by the channels-in-lanes kernel — a
/// copy to `[N, C, H, W]` first was a transposing pass over the gradient, the kernel's time again (96@56: 2.1 ms a
/// call in the model against 1.25 alone). `None` where that does not apply: a gradient in any other layout, or
/// the plane kernels running.
fn depthwise_channels_last(
    x: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
    gout: &ArrayD<f32>,
) -> Result<Option<ArrayD<f32>>> {
    if gout.ndim() != 4 || gout.is_standard_layout() {
        return Ok(None);
    }
    let nhwc = gout.view().permuted_axes(&[0, 2, 3, 1][..]);
    let (Some(gs), true) = (nhwc.as_slice(), x.rank() == 4) else { return Ok(None) };
    let g = geometry(x.shape(), w.shape(), None, *p)?;
    if !depthwise::applies(&g) {
        return Ok(None);
    }
    let ws = standard(w.value());
    let dx = depthwise::input_grad_channels_last(&ws, &g, x.shape()[0], gs);
    Ok(dx.map(|v| ArrayD::from_shape_vec(x.shape(), v).expect("input-sized")))
}

/// The backward of a convolution with a residual added (and clamped after the sum when `fused` gives the clamp with
/// the op's output): the output's gradient, masked in place where the clamp passes it, is the residual's gradient
/// (the last of `need`) and the convolution's output gradient — one mask pass and no copy, where the separate sum
/// copied the gradient for its second operand.
pub(crate) fn conv2d_add_backward(
    x: &Tensor,
    w: &Tensor,
    has_bias: bool,
    p: &Conv2dParams,
    mut gout: ArrayD<f32>,
    fused: Option<(Clamp, &crate::tensor::Array)>,
    need: &[bool],
) -> Result<Grads> {
    if let Some((c, y)) = fused {
        let ys = standard(y);
        let mask =
            |g: &mut [f32], y: &[f32]| g.iter_mut().zip(y).for_each(|(g, &y)| *g = if c.passes(y) { *g } else { 0.0 });
        match gout.as_slice_mut() {
            Some(gs) => gs.par_chunks_mut(MASK_CHUNK).zip(ys.par_chunks(MASK_CHUNK)).for_each(|(g, y)| mask(g, y)),
            None => gout.iter_mut().zip(ys.iter()).for_each(|(g, &y)| *g = if c.passes(y) { *g } else { 0.0 }),
        }
    }
    let convs = 2 + usize::from(has_bias);
    let mut grads = if need[..convs].iter().any(|&n| n) {
        let gs = standard(&gout);
        backward(x, w, has_bias, p, &OutGrad::Dense { g: &gs, relu: None }, &need[..convs])?
    } else {
        vec![None; convs]
    };
    grads.push(need[convs].then_some(gout));
    Ok(grads)
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
    let (gs, os) = (standard(gout), standard(out));
    let (g, out) = (&gs[..], &os[..]);
    backward(x, w, has_bias, p, &OutGrad::Pooled(sparse::Pooled { g, out, argmax }), need)
}

/// The backward of a convolution from the output gradient `src`, `need` naming the gradients to compute.
fn backward(x: &Tensor, w: &Tensor, has_bias: bool, p: &Conv2dParams, src: &OutGrad, need: &[bool]) -> Result<Grads> {
    let g = geometry(x.shape(), w.shape(), None, *p)?;
    let (need_x, need_w) = (need[0], need[1]);
    let need_b = has_bias && need.get(2).copied().unwrap_or(false);
    // Only the weight and bias gradients read the input: an input gradient alone (an attack's pass) does not copy
    // an input that is a view (ConvNeXt-T's downsampling convolutions read their LayerNorm's output permuted back
    // from channels-last: a transposing pass over it on every backward).
    let xs = if need_w || need_b { standard(x.value()) } else { std::borrow::Cow::Borrowed(&[][..]) };
    let ws = standard(w.value());
    let (xs, ws) = (&xs[..], &ws[..]);
    if let OutGrad::Pooled(pooled) = src {
        // An input gradient alone (an attack's pass) where Winograd runs: its dense product on the expanded
        // gradient is faster than the sparse sums (a quarter of the direct multiply-adds, at a lower rate).
        let dense_wino = need_x && !need_w && !need_b && winograd_input_grad(&g);
        if sparse::applies(&g) && !dense_wino {
            let r = sparse::backward(xs, ws, &g, x.shape()[0], pooled, (need_x, need_w, need_b));
            let dx = r.dx.map(|v| ArrayD::from_shape_vec(x.shape(), v).expect("input-sized"));
            let dw = r.dw.map(|v| ArrayD::from_shape_vec(w.shape(), v).expect("weight-sized"));
            let db = r.db.map(|v| Array1::from(v).into_dyn());
            return Ok(grads(dx, dw, db, has_bias));
        }
    }
    if let (OutGrad::Dense { g: gout, relu }, true) = (src, depthwise::applies(&g)) {
        let (dx, dw, db) = depthwise::backward(xs, ws, &g, x.shape()[0], gout, *relu, (need_x, need_w, need_b));
        let dx = dx.map(|v| ArrayD::from_shape_vec(x.shape(), v).expect("input-sized"));
        let dw = dw.map(|v| ArrayD::from_shape_vec(w.shape(), v).expect("weight-sized"));
        return Ok(grads(dx, dw, db.map(|v| Array1::from(v).into_dyn()), has_bias));
    }
    let n = x.shape()[0];
    let flipped = (need_x && transposed_fits(&g)).then(|| input_grad_flipped(w, &g, n, src));
    let dense = Dense::new(g, w, xs, ws, n, src, (need_x && flipped.is_none(), need_w, need_b));
    let chunks = dense.need_x || need_b || need_w && !dense.transposed;
    let (dx, dws, dbs) = if chunks { dense.run() } else { Default::default() };
    let dw = need_w.then(|| ArrayD::from_shape_vec(w.shape(), dense.weight_grad(&dws)).expect("weight-sized"));
    let db = need_b.then(|| Array1::from(sum_in_order(&dbs, g.o)).into_dyn());
    let dx = need_x.then(|| ArrayD::from_shape_vec(x.shape(), flipped.unwrap_or(dx)).expect("input-sized"));
    Ok(grads(dx, dw, db, has_bias))
}

/// Whether the input gradient runs as a forward convolution ([`input_grad_flipped`]): a row and column stride of 1,
/// padding within the dilated kernel's reach (so the flipped convolution's padding is not negative), and an output
/// about as large as the input (the "same" padding of ResNets' 3×3 and all 1×1 convolutions). The flipped
/// convolution computes every input position over all its taps, the zero padding included, so an unpadded 5×5 on
/// a 12×12 map would do 2.25× the multiply-adds (the Fashion-MNIST cnn's: 1.2 → 2.1 ms on the other path).
pub(super) fn transposed_fits(g: &Geom) -> bool {
    let (p, d) = (g.p.padding, g.p.dilation);
    g.h * g.w * 8 <= g.ho * g.wo * 9 && g.p.stride == (1, 1) && p.0 <= d.0 * (g.kh - 1) && p.1 <= d.1 * (g.kw - 1)
}

/// The input gradient of a stride-1 convolution as a forward convolution, on the forward's kernels (direct from
/// the image, or unfolded): `dx = conv(dout, W')`, where `W'[g·Cg + c, o, i, j] = W[g·Og + o, c, kh−1−i, kw−1−j]`
/// (per group, channels swapped and the taps flipped), padded by `dilation·(k − 1) − padding` on each side, with
/// the same dilation and groups. Each element of `dx` is one fused multiply-add chain over `(o, i, j)` in order,
/// so an image's gradient does not depend on the batch or the thread count. `W'` is kept with the weight tensor
/// ([`Tensor::derived`]): an attack's passes flip it once.
fn input_grad_flipped(w: &Tensor, g: &Geom, n: usize, src: &OutGrad) -> Vec<f32> {
    let (groups, og, cg, kh, kw) = (g.p.groups, g.og(), g.cg(), g.kh, g.kw);
    let taps = kh * kw;
    // The key names the layout: a weight used with other groups is flipped again.
    let flipped = w.derived(groups as u64, |ws| {
        let ws = ws.as_standard_layout();
        let ws = ws.as_slice().expect("standard layout");
        // Row by row of the result (`og` flipped kernels of one input channel), in parallel when large: a weight
        // being trained is flipped again after every update (a CIFAR ResNet-18's: 45 MB a training step).
        let row = |(r, to): (usize, &mut [MaybeUninit<f32>])| {
            let (grp, c) = (r / cg, r % cg);
            for (o, to) in to.chunks_exact_mut(taps).enumerate() {
                let from = &ws[((grp * og + o) * cg + c) * taps..][..taps];
                for (t, &v) in to.iter_mut().zip(from.iter().rev()) {
                    t.write(v);
                }
            }
        };
        // SAFETY: the rows cover the result, and each writes all of its `og · taps` values.
        unsafe {
            crate::ops::written(ws.len(), |out| {
                if ws.len() >= crate::ops::PAR_THRESHOLD {
                    out.par_chunks_mut((og * taps).max(1)).enumerate().for_each(row);
                } else {
                    out.chunks_mut((og * taps).max(1)).enumerate().for_each(row);
                }
            })
        }
    });
    // The output gradient with the fused ReLU's mask (or the pooling's expansion) applied, image by image.
    let len = g.o * g.hw_out();
    let masked: std::borrow::Cow<[f32]> = match src {
        OutGrad::Dense { g: gout, relu: None } => std::borrow::Cow::Borrowed(gout),
        _ => {
            // SAFETY: every image's slot is written whole, masked or copied.
            let all = unsafe {
                crate::ops::written(n * len, |all| {
                    all.par_chunks_mut(len).enumerate().for_each_init(Vec::new, |eb, (i, dst)| {
                        let (graw, yimg) = src.image(g, i, eb);
                        // The ReLU's mask written straight into the image's slot.
                        match yimg {
                            Some(y) => relu_mask_into(graw, y, dst),
                            None => dst.iter_mut().zip(graw).for_each(|(d, &v)| _ = d.write(v)),
                        }
                    })
                })
            };
            std::borrow::Cow::Owned(all)
        }
    };
    let gt = adjoint(g, n);
    // A pointwise convolution's over a small map, transposed on the packed product (`W` packed, kept with it); over
    // a 1×1 map one product over the batch, `dout[N, O] · W`.
    if let Some(packed) = super::pointwise::kept(w, super::pointwise::KEY_FLIPPED, &flipped, &gt) {
        return super::pointwise::forward(&masked, &packed, None, &gt, n, (None, None, None));
    }
    // Winograd's transform of the flipped weight, kept with the weight beside the flipped one.
    let wino = super::winograd::kept(w, super::winograd::KEY_FLIPPED, &flipped, &gt);
    super::forward::values(&masked, &flipped, None, &gt, n, None, wino.as_deref())
}

/// Whether the input gradient runs by Winograd: as the flipped convolution, on a geometry Winograd takes.
pub(super) fn winograd_input_grad(g: &Geom) -> bool {
    transposed_fits(g) && super::winograd::applies(&adjoint(g, 1))
}

/// The geometry of [`input_grad_flipped`]'s forward convolution (output gradient in, input gradient out) for a
/// geometry [`transposed_fits`] takes.
pub(super) fn adjoint(g: &Geom, n: usize) -> Geom {
    let (d, p, (kh, kw)) = (g.p.dilation, g.p.padding, (g.kh, g.kw));
    let params = Conv2dParams { stride: (1, 1), padding: (d.0 * (kh - 1) - p.0, d.1 * (kw - 1) - p.1), ..g.p };
    let gt =
        geometry(&[n, g.o, g.ho, g.wo], &[g.c, g.og(), kh, kw], None, params).expect("the adjoint geometry is valid");
    debug_assert!((gt.ho, gt.wo) == (g.h, g.w));
    gt
}

/// `[dx, dw]`, then `db` when the convolution has a bias.
fn grads(dx: Option<ArrayD<f32>>, dw: Option<ArrayD<f32>>, db: Option<ArrayD<f32>>, has_bias: bool) -> Grads {
    let mut out = vec![dx, dw];
    if has_bias {
        out.push(db);
    }
    out
}

/// One dense backward: the inputs, the gradients asked for and the paths they take, shared by the chunks of images.
struct Dense<'a> {
    g: Geom,
    xs: &'a [f32],
    ws: &'a [f32],
    n: usize,
    src: &'a OutGrad<'a>,
    need_x: bool,
    need_w: bool,
    need_b: bool,
    /// Images per chunk: fixed when weight or bias gradients are summed, so that their partial sums, added chunk
    /// after chunk, do not depend on the thread count.
    chunk: usize,
    /// One image: the kernels may split it across threads.
    par_inside: bool,
    /// The weight gradient accumulates transposed, `dWᵀ[K, Og] += col · doutᵀ`, so the product runs on the
    /// register-tiled kernel (`doutᵀ` has contiguous rows); otherwise `dW += dout · colᵀ` on `gemm`.
    transposed: bool,
    /// Where the forward runs direct, so does the input gradient: each register tile of `Wᵀ·dout` is added
    /// straight into the (padded) image gradient, with no unfolded gradient matrix and no col2im pass.
    dx_plan: Option<InputGrad>,
    /// With a column stride of 1, the weight gradient reads the unfolded image straight from the image.
    dw_plan: Option<WeightGrad>,
    /// Images per weight-gradient product on the transposed path ([`wgrad`]).
    per: usize,
    /// A strided 1×1's weight packed for its input gradient computed transposed ([`super::pointwise`]).
    one_tap: Option<std::sync::Arc<simd::PackedB>>,
}

/// A chunk's scratch: the unfolded matrix, the masked output gradient and the padded image.
struct Scratch {
    col: Vec<f32>,
    gm: Vec<f32>,
    pad: Vec<f32>,
}

impl<'a> Dense<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        g: Geom,
        w: &Tensor,
        xs: &'a [f32],
        ws: &'a [f32],
        n: usize,
        src: &'a OutGrad<'a>,
        need: (bool, bool, bool),
    ) -> Self {
        let (need_x, need_w, need_b) = need;
        let chunk = if need_w || need_b { WGRAD_CHUNK } else { 1 };
        let transposed = simd::accelerated();
        let per = if transposed { wgrad::images_per_product(&g, n) } else { 1 };
        Dense {
            g,
            xs,
            ws,
            n,
            src,
            need_x,
            need_w,
            need_b,
            chunk,
            par_inside: n == 1,
            transposed,
            dx_plan: if need_x { input_grad_plan(&g, ws) } else { None },
            dw_plan: if need_w { weight_grad_plan(&g, per) } else { None },
            per,
            one_tap: if need_x { super::pointwise::kept_strided(w, ws, &g) } else { None },
        }
    }

    /// The input gradient (empty unless asked for) and each chunk's bias partial sums and (off the transposed
    /// path, which [`wgrad`] runs apart) weight partial sums.
    fn run(&self) -> (Vec<f32>, Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let (n, in_len) = (self.n, self.g.c * self.g.h * self.g.w);
        let mut parts: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
        let mut run = |slots: Option<&mut [MaybeUninit<f32>]>| {
            parts = if n == 1 {
                // Outside rayon's pool, so the kernels may split the one image across threads.
                vec![self.chunk(0, slots)]
            } else if let Some(slots) = slots {
                slots.par_chunks_mut(self.chunk * in_len).enumerate().map(|(ci, d)| self.chunk(ci, Some(d))).collect()
            } else {
                (0..n.div_ceil(self.chunk)).into_par_iter().map(|ci| self.chunk(ci, None)).collect()
            };
        };
        let dx = if self.need_x {
            // Not zero-filled first: each image's gradient is written whole, or zeroed by its chunk, in cache, where
            // its path adds into it ([`Dense::input_grad`]).
            // SAFETY: every chunk writes each of its images' gradients whole.
            unsafe { crate::ops::written(n * in_len, |slots| run(Some(slots))) }
        } else {
            run(None);
            Vec::new()
        };
        let (dws, dbs) = parts.into_iter().unzip();
        (dx, dws, dbs)
    }

    /// Chunk `ci`: its images' input gradients into `dx` (when asked for), and its bias and (off the transposed
    /// path) weight partial sums. Each image's output gradient is masked (or expanded from the pooling) once, in
    /// cache, for all three.
    fn chunk(&self, ci: usize, mut dx: Option<&mut [MaybeUninit<f32>]>) -> (Vec<f32>, Vec<f32>) {
        let g = &self.g;
        let (k, hw, in_len) = (g.k(), g.hw_out(), g.c * g.h * g.w);
        let gemm_w = self.need_w && !self.transposed;
        let mut acc = vec![0.0f32; if gemm_w { g.o * k } else { 0 }];
        let mut bacc = vec![0.0f32; if self.need_b { g.o } else { 0 }];
        let unfolds = self.need_x && self.dx_plan.is_none() || gemm_w;
        let mut s = Scratch { col: vec![0.0f32; if unfolds { k * hw } else { 0 }], gm: Vec::new(), pad: Vec::new() };
        let mut eb = Vec::new();
        for i in ci * self.chunk..((ci + 1) * self.chunk).min(self.n) {
            let (graw, yimg) = self.src.image(g, i, &mut eb);
            if let Some(dx) = dx.as_deref_mut() {
                let dimg = &mut dx[(i - ci * self.chunk) * in_len..][..in_len];
                self.input_grad(graw, yimg, dimg, &mut s);
            }
            if gemm_w {
                self.add_weight_grad(i, graw, yimg, &mut s, &mut acc);
            }
            if self.need_b {
                // Per output channel, the sum of its plane (masked), image after image.
                for (o, b) in bacc.iter_mut().enumerate() {
                    *b += lane_sum(&graw[o * hw..(o + 1) * hw], yimg.map(|y| &y[o * hw..(o + 1) * hw]));
                }
            }
        }
        (acc, bacc)
    }

    /// One image's input gradient `dimg` (written whole) from its output gradient `graw` and the fused ReLU's
    /// output `yimg`, if any.
    fn input_grad(&self, graw: &[f32], yimg: Option<&[f32]>, dimg: &mut [MaybeUninit<f32>], s: &mut Scratch) {
        let g = &self.g;
        let (og, k, hw) = (g.og(), g.k(), g.hw_out());
        let gimg = relu_masked(graw, yimg, &mut s.gm);
        if let Some(plan) = &self.dx_plan {
            input_grad_image_direct(gimg, plan, g, &mut s.pad, dimg, self.par_inside);
            return;
        }
        // The paths below add into it.
        let dimg = zeroed(dimg);
        if let Some(wp) = &self.one_tap {
            super::pointwise::strided_input_grad(gimg, wp, g, &mut s.pad, &mut s.col, dimg, self.par_inside);
            return;
        }
        for grp in 0..g.p.groups {
            let wg = mat(&self.ws[grp * og * k..(grp + 1) * og * k], og, k);
            let gg = mat(&gimg[grp * og * hw..(grp + 1) * og * hw], og, hw);
            if g.is_pointwise() {
                let dst = &mut dimg[grp * g.cg() * hw..(grp + 1) * g.cg() * hw];
                product(wg.t(), gg, mat_mut(dst, k, hw), false, self.par_inside);
            } else {
                product(wg.t(), gg, mat_mut(&mut s.col, k, hw), false, self.par_inside);
                col2im(&s.col, g, grp * g.cg(), dimg);
            }
        }
    }

    /// Adds image `i`'s weight gradient into `acc` on the `gemm` crate (without the vector kernels), from its
    /// output gradient `graw` and the fused ReLU's output `yimg`, if any.
    fn add_weight_grad(&self, i: usize, graw: &[f32], yimg: Option<&[f32]>, s: &mut Scratch, acc: &mut [f32]) {
        let g = &self.g;
        let (og, k, hw, in_len) = (g.og(), g.k(), g.hw_out(), g.c * g.h * g.w);
        let img = &self.xs[i * in_len..(i + 1) * in_len];
        let gimg = relu_masked(graw, yimg, &mut s.gm);
        for grp in 0..g.p.groups {
            let dst = &mut acc[grp * og * k..(grp + 1) * og * k];
            let src = if g.is_pointwise() {
                &img[grp * g.cg() * hw..(grp + 1) * g.cg() * hw]
            } else {
                im2col(img, g, grp * g.cg(), &mut s.col);
                &s.col[..]
            };
            let gg = mat(&gimg[grp * og * hw..(grp + 1) * og * hw], og, hw);
            gemm(gg, mat(src, k, hw).t(), mat_mut(dst, og, k), true, self.par_inside);
        }
    }

    /// The weight gradient `[O, K]`: on the transposed path computed apart ([`wgrad`]), else from the chunks'
    /// partial sums `parts`, added in order.
    fn weight_grad(&self, parts: &[Vec<f32>]) -> Vec<f32> {
        if self.transposed {
            self.weight_grad_transposed()
        } else {
            sum_in_order(parts, self.g.o * self.g.k())
        }
    }
}

/// The plan of the input gradient added straight into the image gradient ([`InputGrad`], where the forward runs
/// direct), or `None` where it takes col2im.
pub(super) fn input_grad_plan(g: &Geom, ws: &[f32]) -> Option<InputGrad> {
    match g.p.stride.1 {
        _ if g.is_one_tap() => None,
        1 => InputGrad::plan(&direct_unfold(g), g.og(), ws),
        2 => InputGrad::plan_phased(&direct_unfold(g), g.og(), ws),
        _ => None,
    }
}

/// The plan of the weight gradient with the unfolded image read in place ([`WeightGrad`], on the vector kernels'
/// transposed product), or `None` where it unfolds the image.
fn weight_grad_plan(g: &Geom, images: usize) -> Option<WeightGrad> {
    if simd::accelerated() && g.p.stride.1 == 1 && !g.is_pointwise() {
        let u = direct_unfold(g);
        WeightGrad::plan(&u, images, g.c * u.h * u.w)
    } else {
        None
    }
}

/// Input gradient of one image on the direct kernels (see [`input_grad_plan`]): `dimg[C, H, W]` (written whole) from
/// the masked output gradient `gimg[O, Ho·Wo]`, group by group, through a zero-padded scratch image `pad` when the
/// geometry has padding or a column stride of 2 (then in stride phases, two or four: [`InputGrad::plan_phased`]).
fn input_grad_image_direct(
    gimg: &[f32],
    plan: &InputGrad,
    g: &Geom,
    pad: &mut Vec<f32>,
    dimg: &mut [MaybeUninit<f32>],
    par: bool,
) {
    let (og, hw) = (g.og(), g.hw_out());
    let u = direct_unfold(g);
    let (ph, pw) = g.p.padding;
    let padded = (ph, pw) != (0, 0) || plan.phased();
    let plane = plan.plane_len();
    if padded {
        pad.clear();
        pad.resize(g.c * plane, 0.0);
    }
    // Unpadded, the kernels add straight into the image gradient; padded, into `pad`, copied across after.
    let target: &mut [f32] = if padded { pad } else { zeroed(dimg) };
    for grp in 0..g.p.groups {
        let planes = &mut target[grp * g.cg() * plane..(grp + 1) * g.cg() * plane];
        plan.run(grp, &gimg[grp * og * hw..(grp + 1) * og * hw], planes, par);
    }
    if plan.on_grid() {
        unquartered(pad, g, dimg);
    } else if plan.phased() {
        unphased(pad, g, dimg);
    } else if padded {
        for (plane, src) in dimg.chunks_exact_mut(g.h * g.w).zip(pad.chunks_exact(u.h * u.w)) {
            for (drow, srow) in plane.chunks_exact_mut(g.w).zip(src[ph * u.w..].chunks_exact(u.w)) {
                for (d, &v) in drow.iter_mut().zip(&srow[pw..pw + g.w]) {
                    d.write(v);
                }
            }
        }
    }
}

/// `d` filled with zeros, as floats.
fn zeroed(d: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    d.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was just written, and `f32` and `MaybeUninit<f32>` share their layout.
    unsafe { &mut *(d as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// `g` where the fused ReLU's output `y` is positive and 0 elsewhere, written into `buf` (or `g` itself when
/// there is no ReLU).
fn relu_masked<'a>(g: &'a [f32], y: Option<&[f32]>, buf: &'a mut Vec<f32>) -> &'a [f32] {
    let Some(y) = y else { return g };
    buf.resize(g.len(), 0.0);
    // SAFETY: `f32` and `MaybeUninit<f32>` share their layout, and `relu_mask_into` writes only values.
    relu_mask_into(g, y, unsafe { &mut *(buf.as_mut_slice() as *mut [f32] as *mut [MaybeUninit<f32>]) });
    buf
}

/// `dst[i] = g[i]` where the fused ReLU's output `y[i]` is positive, else 0 (a NaN output passes nothing).
fn relu_mask_into(g: &[f32], y: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for ((d, &g), &y) in dst.iter_mut().zip(g).zip(y) {
        d.write(if y > 0.0 { g } else { 0.0 });
    }
}

/// The sum of `v` (where the fused ReLU's output `y`, if given, is positive) in sixteen interleaved partial sums
/// (a fixed order, so deterministic, and not bound by the latency of one dependent chain of additions).
pub(super) fn lane_sum(v: &[f32], y: Option<&[f32]>) -> f32 {
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
