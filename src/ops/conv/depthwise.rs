//! Depthwise convolution (`groups == channels > 1`, each output channel reading one input channel: MobileNet's and
//! EfficientNet's 3×3 and 5×5, ConvNeXt's 7×7) as its own kernel, plane by plane, where the grouped path would run
//! one single-row GEMM per channel. Forward (with the fused ReLU), input gradient (the transposed convolution, what
//! an attack needs at the forward's speed) and weight and bias gradients.
//!
//! Each plane is first copied into a scratch laid out for whole-vector loads (zero-padded, split into column
//! phases for a column stride of 2; the output gradient with zero margins) — see [`simd::depthwise`] — and the
//! vector kernels (or, on the portable level, scalar loops in the same order) run over it. The scratch's padding
//! is written once per thread and never again: every plane of a convolution fills the same positions.
//!
//! Every output is one fixed-order sum (bias, then the taps row-major; the input gradient over the channel's
//! outputs, then the taps; the weight and bias gradients image after image), so results depend neither on the
//! thread count nor on the batch. Planes go to threads independently.
//!
//! With a channel multiplier of 1, the forward and the input gradient run with the channels in the vector lanes
//! instead ([`super::depthwise_lanes`]) where the planes' rows are short or the kernel wide ([`lanes_layout`]): the
//! same sums in the same order, so the same bits.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::backward::lane_sum;
use super::{After, Clamp, Geom};
#[cfg(target_arch = "x86_64")]
use crate::ops::simd::depthwise as kernels;
use crate::ops::simd::{level, Level};

/// Widest kernel row the kernels take.
const MAX_KW: usize = 7;

/// Room past the last column a vector may read (the widest vector, and a second one for the input gradient's
/// two-unit blocks).
const SLACK: usize = 48;

/// Outputs per parallel job, at least: enough work to pay for the task.
const JOB_OUTPUTS: usize = 1 << 13;

/// Whether a convolution is depthwise in the sense of this kernel: `groups == channels > 1`, any channel multiplier,
/// no dilation, kernels up to 7 wide, column stride 1 or 2.
pub(super) fn applies(g: &Geom) -> bool {
    g.p.groups == g.c && g.c > 1 && g.p.dilation == (1, 1) && g.kw <= MAX_KW && g.p.stride.1 <= 2
}

/// Whether the forward (`grad` false) or the input gradient runs with the channels in the vector lanes
/// ([`super::depthwise_lanes`], the same bits): where the plane kernels' rows are short (under two 16-lane
/// vectors: one latency-bound chain per row), the kernel is 7 wide, (forward) the columns are strided, or (input
/// gradient) the lanes' row kernel takes each class of pixels (a class's taps up to 5 wide: stride 1, 32@112
/// 0.98–1.34 → 0.66–0.70 ms; stride 2, 3×3 96@112 1.47–1.72 → 0.92, 5×5 144@56 0.75–0.78 → 0.41–0.44). On long
/// rows of a 3×3 or 5×5 the plane kernels' forward is as fast (measured in docs/performance.md).
#[cfg(target_arch = "x86_64")]
fn lanes_layout(g: &Geom, grad: bool) -> bool {
    if !super::depthwise_lanes::applies(g) {
        return false;
    }
    #[cfg(test)]
    if let Some(lanes) = LAYOUT.with(std::cell::Cell::get) {
        return lanes;
    }
    let short = if grad { g.w } else { g.wo } < SHORT_ROW;
    let by_rows = grad && crate::ops::simd::depthwise_lanes::rows_apply(g.kw.div_ceil(g.p.stride.1), 1, true);
    short || g.kw >= 7 || !grad && g.p.stride.1 > 1 || by_rows
}

/// Rows shorter than this run with the channels in the lanes (see [`lanes_layout`]).
#[cfg(target_arch = "x86_64")]
const SHORT_ROW: usize = 32;

#[cfg(test)]
thread_local! {
    /// Set by a test on its thread: `Some(true)` runs the lanes layout wherever it applies, `Some(false)` the plane
    /// kernels.
    pub(super) static LAYOUT: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// The scratch an image plane is copied into: `sw` column phases, `ps` apart, of `h + 2·ph` rows `rs` apart; padded
/// column `x` of row `y` at `(x % sw)·ps + y·rs + x / sw`.
#[derive(Clone, Copy)]
struct ImageLayout {
    rs: usize,
    ps: usize,
}

impl ImageLayout {
    fn new(g: &Geom) -> Self {
        let (ph, pw) = g.p.padding;
        let sw = g.p.stride.1;
        let rs = (g.w + 2 * pw).div_ceil(sw).max(g.wo + (g.kw - 1) / sw) + SLACK;
        ImageLayout { rs, ps: (g.h + 2 * ph) * rs + SLACK }
    }

    fn len(&self, g: &Geom) -> usize {
        g.p.stride.1 * self.ps
    }

    /// Copies `plane[h, w]` into `buf`, which holds zeros outside the positions copied (it is sized and zeroed
    /// here on first use; later planes overwrite the same positions).
    fn fill(&self, g: &Geom, plane: &[f32], buf: &mut Vec<f32>) {
        if buf.len() != self.len(g) {
            buf.clear();
            buf.resize(self.len(g), 0.0);
        }
        let (ph, pw) = g.p.padding;
        let sw = g.p.stride.1;
        debug_assert!(sw == 1 || sw == 2, "`applies` admits column strides 1 and 2");
        for (y, src) in plane.chunks_exact(g.w).enumerate() {
            let at = (y + ph) * self.rs;
            // Whole rows, or pairs: a `step_by` per phase kept the copy scalar, and it cost more than the convolution
            // over it (a `perf` profile of a 3×3 on 56×56 planes: 20% here against 13% in the kernel).
            if sw == 1 {
                buf[at + pw..at + pw + g.w].copy_from_slice(src);
                continue;
            }
            // Column `x` goes to phase `(x + pw) % 2`, column `at + (x + pw) / 2` of it: the even and odd columns
            // de-interleaved pair by pair (vectorised as shuffles), an odd width's last column to the even ones.
            let (phase0, phase1) = buf.split_at_mut(self.ps);
            let (even, odd) = if pw % 2 == 0 { (phase0, phase1) } else { (phase1, phase0) };
            let n = g.w.div_ceil(2);
            let even = &mut even[at + pw / 2..][..n];
            let odd = &mut odd[at + pw.div_ceil(2)..][..g.w / 2];
            for ((pair, e), o) in src.chunks_exact(2).zip(even.iter_mut()).zip(odd.iter_mut()) {
                *e = pair[0];
                *o = pair[1];
            }
            if g.w % 2 == 1 {
                even[n - 1] = src[g.w - 1];
            }
        }
    }
}

/// The scratch an output-gradient plane is copied into: `ho` rows `grs` apart, output column `ox` at `ml + ox`,
/// zeros on both sides; `planes` of them `gps` apart (a channel multiplier's outputs).
#[derive(Clone, Copy)]
struct GradLayout {
    ml: usize,
    grs: usize,
    gps: usize,
}

impl GradLayout {
    fn new(g: &Geom) -> Self {
        let sw = g.p.stride.1;
        let ml = g.kw;
        let grs = ml + g.wo.max((g.w - 1) / sw + 1) + g.p.padding.1 / sw + 2 + SLACK;
        GradLayout { ml, grs, gps: g.ho * grs }
    }

    /// Copies the output-gradient planes `src` (`[planes, ho, wo]`), masked where the fused ReLU's output `y` is
    /// not positive, into `buf` (zeros elsewhere, as [`ImageLayout::fill`]).
    fn fill(&self, g: &Geom, src: &[f32], y: Option<&[f32]>, planes: usize, buf: &mut Vec<f32>) {
        let len = planes * self.gps;
        if buf.len() != len {
            buf.clear();
            buf.resize(len, 0.0);
        }
        for (r, row) in src.chunks_exact(g.wo).enumerate() {
            let dst = &mut buf[(r / g.ho) * self.gps + (r % g.ho) * self.grs + self.ml..][..g.wo];
            match y {
                Some(y) => {
                    let mask = &y[r * g.wo..(r + 1) * g.wo];
                    for ((d, &v), &m) in dst.iter_mut().zip(row).zip(mask) {
                        *d = if m > 0.0 { v } else { 0.0 };
                    }
                }
                None => dst.copy_from_slice(row),
            }
        }
    }
}

/// The forward `[N, O, Ho, Wo]` of a depthwise convolution (see [`applies`]), with the fused clamp, if any, and
/// `after` applied to each plane (or band of planes) just written.
pub(super) fn forward(
    xs: &[f32],
    ws: &[f32],
    bias: Option<&[f32]>,
    g: &Geom,
    n: usize,
    act: Option<Clamp>,
    after: After,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if lanes_layout(g, false) {
        return super::depthwise_lanes::forward(xs, ws, bias, g, n, act, after);
    }
    let (hw, in_plane, kk, mult) = (g.hw_out(), g.h * g.w, g.kh * g.kw, g.o / g.c);
    let lay = ImageLayout::new(g);
    let mut out = Vec::with_capacity(n * g.o * hw);
    out.spare_capacity_mut()[..n * g.o * hw]
        .par_chunks_mut(hw)
        .enumerate()
        .with_min_len(JOB_OUTPUTS.div_ceil(hw))
        .for_each_init(Vec::new, |buf, (p, dst)| {
            let (img, oc) = (p / g.o, p % g.o);
            let ic = img * g.c + oc / mult;
            lay.fill(g, &xs[ic * in_plane..(ic + 1) * in_plane], buf);
            let w = &ws[oc * kk..(oc + 1) * kk];
            plane_forward(g, &lay, buf, w, bias.map_or(0.0, |b| b[oc]), act, dst);
            if let Some(f) = after {
                // SAFETY: `plane_forward` wrote every element of the plane.
                f(unsafe { &mut *(dst as *mut [MaybeUninit<f32>] as *mut [f32]) });
            }
        });
    // SAFETY: `plane_forward` wrote every element of every plane.
    unsafe { out.set_len(n * g.o * hw) };
    out
}

/// One output plane `dst[Ho·Wo]` from the image plane laid out in `src`.
fn plane_forward(
    g: &Geom,
    lay: &ImageLayout,
    src: &[f32],
    w: &[f32],
    bias: f32,
    act: Option<Clamp>,
    dst: &mut [MaybeUninit<f32>],
) {
    let (sh, sw) = g.p.stride;
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Portable {
        let t = kernels::Forward {
            src: src.as_ptr(),
            rs: lay.rs,
            ps: lay.ps,
            sh,
            kh: g.kh,
            w: w.as_ptr(),
            bias,
            clamp: Clamp::bounds(act),
            out: dst.as_mut_ptr().cast(),
            ho: g.ho,
            wo: g.wo,
        };
        // SAFETY: the layout has room for a whole vector past every output's last tap (`SLACK`), `dst` holds
        // `ho·wo` elements and the level's instructions are available.
        unsafe { kernels::forward(level(), &t, g.kw, sw) };
        return;
    }
    for (oy, row) in dst.chunks_exact_mut(g.wo).enumerate() {
        for (ox, o) in row.iter_mut().enumerate() {
            let mut acc = bias;
            for i in 0..g.kh {
                for j in 0..g.kw {
                    acc += w[i * g.kw + j] * src[(j % sw) * lay.ps + (sh * oy + i) * lay.rs + ox + j / sw];
                }
            }
            o.write(act.map_or(acc, |c| c.apply(acc)));
        }
    }
}

/// The input, weight and bias gradients, flat, each `None` when not asked for.
type Grads = (Option<Vec<f32>>, Option<Vec<f32>>, Option<Vec<f32>>);

/// The gradients of a depthwise convolution from the output gradient `gout` (masked where the fused ReLU's output
/// `y`, if any, is not positive): input, weight and bias, each when `need` asks for it.
pub(super) fn backward(
    xs: &[f32],
    ws: &[f32],
    g: &Geom,
    n: usize,
    gout: &[f32],
    y: Option<&[f32]>,
    need: (bool, bool, bool),
) -> Grads {
    let (need_x, need_w, need_b) = need;
    let dx = need_x.then(|| input_grad(ws, g, n, gout, y));
    let (dw, db) = if need_w || need_b { weight_grad(xs, g, n, gout, y, need_w, need_b) } else { (None, None) };
    (dx, dw, db)
}

/// The input gradient `[N, C, H, W]` from a channels-last output gradient `[N, Ho, Wo, C]` (no fused clamp), where
/// the channels-in-lanes layout runs: it reads the gradient as it lies, pixel by pixel. `None` where the plane
/// kernels run (they read `[N, C, Ho, Wo]`).
pub(super) fn input_grad_channels_last(ws: &[f32], g: &Geom, n: usize, gout: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if lanes_layout(g, true) {
        return Some(super::depthwise_lanes::input_grad(ws, g, n, super::depthwise_lanes::OutGrad::ChannelsLast(gout)));
    }
    let _ = (ws, g, n, gout);
    None
}

/// The input gradient `[N, C, H, W]`, plane by plane: each the transposed convolution of its channel's outputs.
fn input_grad(ws: &[f32], g: &Geom, n: usize, gout: &[f32], y: Option<&[f32]>) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if lanes_layout(g, true) {
        return super::depthwise_lanes::input_grad(ws, g, n, super::depthwise_lanes::OutGrad::Planes(gout, y));
    }
    let (hw, in_plane, kk, mult) = (g.hw_out(), g.h * g.w, g.kh * g.kw, g.o / g.c);
    let lay = GradLayout::new(g);
    let mut dx = vec![0.0f32; n * g.c * in_plane];
    dx.par_chunks_mut(in_plane).enumerate().with_min_len(JOB_OUTPUTS.div_ceil(in_plane)).for_each_init(
        Vec::new,
        |buf, (p, dst)| {
            let (img, c) = (p / g.c, p % g.c);
            let first = (img * g.o + c * mult) * hw;
            let ys = y.map(|y| &y[first..first + mult * hw]);
            lay.fill(g, &gout[first..first + mult * hw], ys, mult, buf);
            plane_input_grad(g, &lay, buf, &ws[c * mult * kk..(c + 1) * mult * kk], mult, dst);
        },
    );
    dx
}

/// One image-gradient plane `dst[H·W]` (overwritten) from its `mult` output planes laid out in `src`.
fn plane_input_grad(g: &Geom, lay: &GradLayout, src: &[f32], w: &[f32], mult: usize, dst: &mut [f32]) {
    let (sh, sw) = g.p.stride;
    let (ph, pw) = g.p.padding;
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Portable {
        let t = kernels::InputGrad {
            g: src.as_ptr(),
            gps: lay.gps,
            grs: lay.grs,
            ml: lay.ml,
            mult,
            w: w.as_ptr(),
            kh: g.kh,
            sh,
            ph,
            pw,
            ho: g.ho,
            dx: dst.as_mut_ptr(),
            h: g.h,
            wd: g.w,
        };
        // SAFETY: the layout has `ml ≥ kw` zero columns before every row and room for two blocks of vectors
        // past the last image column (`SLACK`); `dst` holds `h·w` elements and the level's instructions are
        // available.
        unsafe { kernels::input_grad(level(), &t, g.kw, sw) };
        return;
    }
    for (yy, row) in dst.chunks_exact_mut(g.w).enumerate() {
        for (x, d) in row.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for r in 0..mult {
                for i in 0..g.kh {
                    let tr = (yy + ph) as isize - i as isize;
                    if tr < 0 || !(tr as usize).is_multiple_of(sh) || tr as usize / sh >= g.ho {
                        continue;
                    }
                    let at = r * lay.gps + tr as usize / sh * lay.grs + lay.ml;
                    for j in 0..g.kw {
                        let tc = (x + pw) as isize - j as isize;
                        if tc.rem_euclid(sw as isize) != 0 {
                            continue;
                        }
                        let col = at as isize + tc / sw as isize;
                        acc += w[(r * g.kh + i) * g.kw + j] * src[col as usize];
                    }
                }
            }
            *d = acc;
        }
    }
}

/// The weight gradient `[O, 1, kh, kw]` and bias gradient `[O]`, each output channel's summed image after image.
fn weight_grad(
    xs: &[f32],
    g: &Geom,
    n: usize,
    gout: &[f32],
    y: Option<&[f32]>,
    need_w: bool,
    need_b: bool,
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    let (hw, in_plane, kk, mult) = (g.hw_out(), g.h * g.w, g.kh * g.kw, g.o / g.c);
    let (ilay, glay) = (ImageLayout::new(g), GradLayout::new(g));
    let mut dw = vec![0.0f32; g.o * kk];
    let mut db = vec![0.0f32; g.o];
    dw.par_chunks_mut(kk).zip(db.par_iter_mut()).enumerate().for_each_init(
        || (Vec::new(), Vec::new()),
        |(ibuf, gbuf), (oc, (dwc, dbc))| {
            for img in 0..n {
                let at = (img * g.o + oc) * hw;
                let (gp, yp) = (&gout[at..at + hw], y.map(|y| &y[at..at + hw]));
                if need_b {
                    *dbc += lane_sum(gp, yp);
                }
                if need_w {
                    let ic = img * g.c + oc / mult;
                    ilay.fill(g, &xs[ic * in_plane..(ic + 1) * in_plane], ibuf);
                    glay.fill(g, gp, yp, 1, gbuf);
                    plane_weight_grad(g, &ilay, ibuf, &gbuf[glay.ml..], glay.grs, dwc);
                }
            }
        },
    );
    (need_w.then_some(dw), need_b.then_some(db))
}

/// Adds one image's weight gradient of one channel into `dw[kh·kw]`: the image plane laid out in `src`, the
/// (masked) output gradient `gp` with rows `grs` apart and zeros after each row's `wo` columns.
fn plane_weight_grad(g: &Geom, lay: &ImageLayout, src: &[f32], gp: &[f32], grs: usize, dw: &mut [f32]) {
    let (sh, sw) = g.p.stride;
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Portable {
        let t = kernels::WeightGrad {
            src: src.as_ptr(),
            rs: lay.rs,
            ps: lay.ps,
            sh,
            kh: g.kh,
            g: gp.as_ptr(),
            grs,
            ho: g.ho,
            wo: g.wo,
            dw: dw.as_mut_ptr(),
        };
        // SAFETY: both layouts have room for a whole vector past each row's last output (`SLACK`); `dw` holds
        // `kh·kw` elements and the level's instructions are available.
        unsafe { kernels::weight_grad(level(), &t, g.kw, sw) };
        return;
    }
    for i in 0..g.kh {
        for j in 0..g.kw {
            let mut acc = 0.0f32;
            for oy in 0..g.ho {
                let row = &src[(j % sw) * lay.ps + (sh * oy + i) * lay.rs + j / sw..];
                acc += gp[oy * grs..oy * grs + g.wo].iter().zip(row).map(|(&a, &b)| a * b).sum::<f32>();
            }
            dw[i * g.kw + j] += acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Conv2dParams;
    use crate::tensor::Tensor;

    /// Geometry classes of the networks the kernel is for: (channels, multiplier, size, kernel, stride, padding).
    const CASES: &[(usize, usize, usize, usize, usize, usize)] = &[
        (3, 1, 9, 3, 1, 1),
        (4, 1, 10, 3, 2, 1),
        (3, 1, 11, 3, 2, 1),
        (2, 1, 12, 5, 1, 2),
        (3, 1, 13, 5, 2, 2),
        (2, 1, 15, 7, 1, 3),
        (2, 2, 9, 3, 1, 0),
        (3, 1, 37, 3, 1, 1),
        (2, 1, 40, 5, 2, 2),
        (2, 3, 8, 4, 2, 1),
    ];

    fn params(s: usize, p: usize, c: usize) -> Conv2dParams {
        Conv2dParams { stride: (s, s), padding: (p, p), dilation: (1, 1), groups: c }
    }

    /// The grouped convolution spelled out channel by channel with `groups = 1` convolutions: an independent path.
    fn reference(x: &Tensor, w: &Tensor, b: &Tensor, p: Conv2dParams, mult: usize) -> Tensor {
        let c = x.shape()[1];
        let one = Conv2dParams { groups: 1, ..p };
        let parts: Vec<Tensor> = (0..c)
            .map(|ch| {
                let xc = x.narrow(1, ch, 1).unwrap();
                let wc = w.narrow(0, ch * mult, mult).unwrap();
                let bc = b.narrow(0, ch * mult, mult).unwrap();
                xc.conv2d(&wc, Some(&bc), one).unwrap()
            })
            .collect();
        Tensor::concat(&parts, 1).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        let (a, b) = (a.to_array(), b.to_array());
        assert_eq!(a.shape(), b.shape());
        a.iter().zip(b.iter()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn matches_per_channel_convolutions_forward_and_backward() {
        for (seed, &(c, mult, size, k, s, pad)) in CASES.iter().enumerate() {
            let seed = seed as u64 * 10;
            let x = Tensor::uniform(&[3, c, size, size + 1], -1.0, 1.0, seed).variable();
            let w = Tensor::uniform(&[c * mult, 1, k, k], -1.0, 1.0, seed + 1).variable();
            let b = Tensor::uniform(&[c * mult], -1.0, 1.0, seed + 2).variable();
            let p = params(s, pad, c);
            for relu in [false, true] {
                let y = if relu { x.conv2d_relu(&w, Some(&b), p) } else { x.conv2d(&w, Some(&b), p) }.unwrap();
                let r = reference(&x, &w, &b, p, mult);
                let r = if relu { r.relu() } else { r };
                assert!(max_diff(&y, &r) < 1e-5, "forward {c} {mult} {size} {k} {s} {pad} relu {relu}");
                // One image alone gives the same bits as within the batch, and so does its input gradient.
                let x1 = x.narrow(0, 1, 1).unwrap().detach().variable();
                let y1 = x1.conv2d(&w, Some(&b), p).unwrap();
                let y1 = if relu { y1.relu() } else { y1 };
                let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y1), bits(&y.narrow(0, 1, 1).unwrap()), "batch-invariant forward");
                let gy = Tensor::uniform(y.shape(), -1.0, 1.0, seed + 3);
                let got = y.mul(&gy).unwrap().sum_all().grad_wrt(&[&x, &w, &b]).unwrap();
                let want = r.mul(&gy).unwrap().sum_all().grad_wrt(&[&x, &w, &b]).unwrap();
                for (name, (a, e)) in ["x", "w", "b"].iter().zip(got.iter().zip(&want)) {
                    let d = max_diff(a, e);
                    assert!(d < 1e-4, "∂{name} {c} {mult} {size} {k} {s} {pad} relu {relu}: {d}");
                }
            }
        }
    }

    /// The channels-in-lanes layout gives the plane kernels' bits, forward (plain, with the fused ReLU and with
    /// ReLU6) and input gradient (masked by the fused ReLU), on blocks partly filled and several, maps from 3×3 to
    /// banded, strides 1 and 2, kernels 1 to 7 wide.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn channels_in_lanes_give_the_plane_kernels_bits() {
        use super::LAYOUT;
        if crate::ops::simd::level() == crate::ops::simd::Level::Portable {
            // No vector kernels, no lanes layout: both runs would be the planes (CI's portable run).
            return;
        }
        // (channels, height, width, kernel, stride, padding)
        const LANES_CASES: &[(usize, usize, usize, usize, usize, usize)] = &[
            (37, 7, 7, 5, 1, 2),
            (16, 14, 14, 3, 1, 1),
            (9, 3, 3, 3, 1, 1),
            (20, 15, 13, 3, 2, 1),
            (8, 29, 31, 5, 2, 2),
            (17, 70, 67, 3, 1, 1),
            (5, 12, 11, 7, 1, 3),
            (6, 10, 9, 4, 2, 1),
            (3, 9, 8, 1, 1, 0),
            (24, 11, 12, 3, 2, 0),
        ];
        let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for (seed, &(c, h, w, k, s, pad)) in LANES_CASES.iter().enumerate() {
            let seed = 500 + seed as u64 * 10;
            let x = Tensor::uniform(&[2, c, h, w], -1.0, 1.0, seed).variable();
            let wt = Tensor::uniform(&[c, 1, k, k], -1.0, 1.0, seed + 1);
            let b = Tensor::uniform(&[c], -1.0, 1.0, seed + 2);
            let p = params(s, pad, c);
            for act in 0..3 {
                let run = |lanes: bool| {
                    LAYOUT.with(|f| f.set(Some(lanes)));
                    let y = match act {
                        0 => x.conv2d(&wt, Some(&b), p),
                        1 => x.conv2d_relu(&wt, Some(&b), p),
                        _ => x.conv2d_clamp(&wt, Some(&b), p, 0.0, 0.5),
                    }
                    .unwrap();
                    let gy = Tensor::uniform(y.shape(), -1.0, 1.0, seed + 3);
                    let dx = y.mul(&gy).unwrap().sum_all().grad_wrt(&[&x]).unwrap().remove(0);
                    LAYOUT.with(|f| f.set(None));
                    (bits(&y), bits(&dx))
                };
                let (lanes, planes) = (run(true), run(false));
                assert!(lanes.0 == planes.0, "forward {c} {h}x{w} k{k} s{s} p{pad} act {act}");
                assert!(lanes.1 == planes.1, "input gradient {c} {h}x{w} k{k} s{s} p{pad} act {act}");
                if act == 0 {
                    // The same output gradient handed back through a permute to channels-last (ConvNeXt's
                    // block): a channels-last view, read as it lies by the lanes (or copied for the planes).
                    for lanes in [true, false] {
                        LAYOUT.with(|f| f.set(Some(lanes)));
                        let y = x.conv2d(&wt, Some(&b), p).unwrap().permute(&[0, 2, 3, 1]).unwrap();
                        let gy = Tensor::uniform(&[2, c, y.shape()[1], y.shape()[2]], -1.0, 1.0, seed + 3);
                        let gy = Tensor::new(
                            gy.permute(&[0, 2, 3, 1]).unwrap().to_array().as_standard_layout().into_owned(),
                        );
                        let dx = y.mul(&gy).unwrap().sum_all().grad_wrt(&[&x]).unwrap().remove(0);
                        LAYOUT.with(|f| f.set(None));
                        assert!(bits(&dx) == planes.1, "channels-last gradient {c} {h}x{w} k{k} s{s} lanes {lanes}");
                    }
                }
            }
        }
    }
}
