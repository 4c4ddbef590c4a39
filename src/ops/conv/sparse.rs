//! The backward of the fused convolution, ReLU and 2×2 max pooling through the windows' arg-max alone.
//!
//! Of the convolution's output gradient only one entry per pooling window is nonzero: the window's arg-max, where
//! the pooled output is positive. The dense backward spends three quarters of its multiply-adds on zeros; here
//! both gradients are sums over the nonzero entries only. In channels-last layout (`[H, W, C]`) one kernel row over
//! all input channels is a contiguous run of `kw·C` values, in the image and in the weights reordered to
//! `[O, kh, kw, C]`, so each sum is of whole runs ([`simd::RowSums`]). For an entry `g` of channel `o` at
//! output position `(oh, ow)`:
//! - ∂L/∂x: each output position sums `g · W[o, kh]` over its entries, per kernel row `kh`, and adds the run into
//!   the image gradient's row `oh + kh` from column `ow`;
//! - ∂L/∂W: each output channel sums `g · x[oh + kh, ow..]` over its entries, per kernel row, for a chunk of images
//!   at a time (the chunks fixed, as in the dense backward, so the result does not depend on the thread count).
//!
//! The values are the dense backward's up to rounding, as the additions run in another order. One difference is by
//! design: the entries the ReLU or the pooling zeroes are never multiplied, so a NaN in the input (which the
//! forward's ReLU maps to 0) does not reach the weight gradient as `0 · NaN`. That is the ReLU's own backward
//! rule, which passes nothing where its output is not positive, whatever the incoming gradient.

use rayon::prelude::*;

use super::{sum_in_order, Geom, WGRAD_CHUNK};
use crate::ops::simd::{self, Term};

/// Whether the sparse backward takes this geometry: one group, unit stride and dilation (so that a kernel row over
/// all channels is one run in channels-last layout), runs of at least one AVX2 vector (shorter ones leave lanes
/// idle, where the dense kernels do better: the cnn's conv1, runs of 5, took a fast-AT step from 8.1 to 10.3 ms
/// when sparse), and offsets that fit the terms' `u32`.
pub(super) fn applies(g: &Geom) -> bool {
    let plane = (g.h + 2 * g.p.padding.0) * (g.w + 2 * g.p.padding.1) * g.c;
    let fits = WGRAD_CHUNK.saturating_mul(plane) < u32::MAX as usize && g.o * g.kh * g.kw * g.c < u32::MAX as usize;
    let unit = g.p.groups == 1 && g.p.stride == (1, 1) && g.p.dilation == (1, 1);
    unit && g.kw * g.c >= 8 && g.ho >= 2 && g.wo >= 2 && fits
}

/// The pooled gradient, the pooled output and each window's arg-max (numbered as the forward's pooling planes),
/// all `[N, O, Ho/2, Wo/2]`.
pub(super) struct Pooled<'a> {
    pub g: &'a [f32],
    pub out: &'a [f32],
    pub argmax: &'a [u32],
}

/// Flat gradients, in the tensors' own layouts, for those asked for.
pub(super) struct Grads {
    pub dx: Option<Vec<f32>>,
    pub dw: Option<Vec<f32>>,
    pub db: Option<Vec<f32>>,
}

/// Shapes and offsets shared by the images of one backward.
struct Layout {
    /// Channels, rows and columns of the zero-padded channels-last image.
    c: usize,
    hp: usize,
    wp: usize,
    /// Length of one kernel row over all channels: `kw·C`.
    run: usize,
    /// Offset of each output position's window corner in the channels-last image.
    corner: Vec<u32>,
    /// The kernel adding rows of `run` values.
    sums: simd::RowSums,
}

impl Layout {
    fn new(g: &Geom) -> Layout {
        let (hp, wp) = (g.h + 2 * g.p.padding.0, g.w + 2 * g.p.padding.1);
        let corner = (0..g.ho).flat_map(|oh| (0..g.wo).map(move |ow| ((oh * wp + ow) * g.c) as u32)).collect();
        Layout { c: g.c, hp, wp, run: g.kw * g.c, corner, sums: simd::RowSums::new(g.kw * g.c) }
    }

    fn plane(&self) -> usize {
        self.hp * self.wp * self.c
    }
}

/// Calls `f(o, pos, g, live)` for each window of image `i`, channel by channel, each channel's in window order:
/// `pos` is the window's arg-max, `live` whether its entry is nonzero (the pooled output positive). Dead entries
/// are passed too, so that callers can store every entry and count only the live ones, without a branch.
fn for_each_window(geo: &Geom, src: &Pooled, i: usize, mut f: impl FnMut(usize, usize, f32, bool)) {
    let (hw, pp) = (geo.hw_out(), (geo.ho / 2) * (geo.wo / 2));
    // The arg-max is flat in the forward's pooling plane: the whole image when `Ho` is even, else one channel.
    let tall = geo.ho.is_multiple_of(2);
    let at = i * geo.o * pp;
    for o in 0..geo.o {
        let base = if tall { o * hw } else { 0 };
        let r = at + o * pp..at + (o + 1) * pp;
        for ((&g, &y), &j) in src.g[r.clone()].iter().zip(&src.out[r.clone()]).zip(&src.argmax[r]) {
            f(o, j as usize - base, g, y > 0.0);
        }
    }
}

/// `img[C, H, W]` into `dst`, channels-last and zero-padded.
fn to_channels_last(img: &[f32], geo: &Geom, lay: &Layout, dst: &mut [f32]) {
    let (ph, pw) = geo.p.padding;
    if (ph, pw) == (0, 0) && simd::transpose(img, None, geo.c, geo.h * geo.w, dst) {
        return;
    }
    dst.fill(0.0);
    for (ch, plane) in img.chunks_exact(geo.h * geo.w).enumerate() {
        for (h, row) in plane.chunks_exact(geo.w).enumerate() {
            let at = ((h + ph) * lay.wp + pw) * lay.c + ch;
            for (w, &v) in row.iter().enumerate() {
                dst[at + w * lay.c] = v;
            }
        }
    }
}

/// The interior of the channels-last, padded `src` into `img[C, H, W]`.
fn from_channels_last(src: &[f32], geo: &Geom, lay: &Layout, img: &mut [f32]) {
    let (ph, pw) = geo.p.padding;
    if (ph, pw) == (0, 0) && simd::transpose(src, None, geo.h * geo.w, geo.c, img) {
        return;
    }
    for (ch, plane) in img.chunks_exact_mut(geo.h * geo.w).enumerate() {
        for (h, row) in plane.chunks_exact_mut(geo.w).enumerate() {
            let at = ((h + ph) * lay.wp + pw) * lay.c + ch;
            for (w, v) in row.iter_mut().enumerate() {
                *v = src[at + w * lay.c];
            }
        }
    }
}

/// Scratch reused across the images a thread takes: terms in buckets of fixed capacity, and their counts.
#[derive(Default)]
struct Scratch {
    terms: Vec<Term>,
    count: Vec<usize>,
    image: Vec<f32>,
}

impl Scratch {
    /// `buckets` empty buckets of `cap` terms each.
    fn buckets(&mut self, buckets: usize, cap: usize) {
        self.count.clear();
        self.count.resize(buckets, 0);
        self.terms.resize(buckets * cap, Term { scale: 0.0, off: 0 });
    }

    /// Stores `t` as the next term of bucket `b`, kept (counted) only when `live`.
    #[inline]
    fn push(&mut self, b: usize, cap: usize, t: Term, live: bool) {
        let c = self.count[b];
        debug_assert!(c < cap, "a bucket holds at most {cap} terms");
        self.terms[b * cap + c] = t;
        self.count[b] = c + usize::from(live);
    }

    fn bucket(&self, b: usize, cap: usize) -> &[Term] {
        &self.terms[b * cap..b * cap + self.count[b]]
    }
}

/// `dimg[C, H, W]` (every element written) for image `i` from the weights `wr` in `[O, kh, kw, C]` order.
fn input_grad(geo: &Geom, lay: &Layout, src: &Pooled, i: usize, wr: &[f32], s: &mut Scratch, dimg: &mut [f32]) {
    // The entries by output position, each position's in channel order (a channel has at most one per position:
    // its windows do not overlap).
    let (hw, cap, kernel) = (geo.hw_out(), geo.o, geo.kh * lay.run);
    s.buckets(hw, cap);
    for_each_window(geo, src, i, |o, pos, g, live| s.push(pos, cap, Term { scale: g, off: (o * kernel) as u32 }, live));
    let mut image = std::mem::take(&mut s.image);
    image.clear();
    image.resize(lay.plane(), 0.0);
    for (pos, &corner) in lay.corner.iter().enumerate() {
        let row = lay.wp * lay.c;
        // SAFETY: a term's rows are kernel rows of one output channel, inside `wr`.
        unsafe { lay.sums.add(wr, s.bucket(pos, cap), lay.run, &mut image[corner as usize..], row, geo.kh) };
    }
    from_channels_last(&image, geo, lay, dimg);
    s.image = image;
}

/// Adds the weight gradient (`acc`, `[O, kh, kw, C]` order) and the bias gradient (`bacc`) of images `images`
/// (`imgs` their inputs), each output channel's entries summed image after image.
#[allow(clippy::too_many_arguments)]
fn param_grads(
    geo: &Geom,
    lay: &Layout,
    src: &Pooled,
    images: std::ops::Range<usize>,
    imgs: &[f32],
    s: &mut Scratch,
    acc: Option<&mut [f32]>,
    bacc: Option<&mut [f32]>,
) {
    let plane = lay.plane();
    let cap = images.len() * (geo.ho / 2) * (geo.wo / 2);
    s.buckets(geo.o, cap);
    for (k, i) in images.clone().enumerate() {
        for_each_window(geo, src, i, |o, pos, g, live| {
            s.push(o, cap, Term { scale: g, off: (k * plane) as u32 + lay.corner[pos] }, live)
        });
    }
    if let Some(acc) = acc {
        let mut image = std::mem::take(&mut s.image);
        image.resize(images.len() * plane, 0.0);
        let in_len = geo.c * geo.h * geo.w;
        for (img, dst) in imgs.chunks_exact(in_len).zip(image.chunks_exact_mut(plane)) {
            to_channels_last(img, geo, lay, dst);
        }
        let (kernel, row) = (geo.kh * lay.run, lay.wp * lay.c);
        for (o, dst) in acc.chunks_exact_mut(kernel).enumerate() {
            // SAFETY: a term's rows are kernel rows at an output position of one image, inside `image`.
            unsafe { lay.sums.add(&image, s.bucket(o, cap), row, dst, lay.run, geo.kh) };
        }
        s.image = image;
    }
    if let Some(bacc) = bacc {
        for (o, b) in bacc.iter_mut().enumerate() {
            *b += s.bucket(o, cap).iter().map(|t| t.scale).sum::<f32>();
        }
    }
}

/// The gradients asked for (`need`: input, weight, bias) of the fused op over `n` images with inputs `xs` and
/// weights `ws`, from the pooled gradient.
pub(super) fn backward(
    xs: &[f32],
    ws: &[f32],
    geo: &Geom,
    n: usize,
    src: &Pooled,
    (need_x, need_w, need_b): (bool, bool, bool),
) -> Grads {
    let lay = Layout::new(geo);
    let (in_len, w_len, kernel) = (geo.c * geo.h * geo.w, geo.o * geo.k(), geo.kh * lay.run);
    // The weights as `[O, kh, kw, C]`: each kernel row over all channels contiguous.
    let mut wr = vec![0.0f32; if need_x { w_len } else { 0 }];
    for (o, dst) in wr.chunks_exact_mut(kernel).enumerate() {
        for (ch, taps) in ws[o * geo.k()..(o + 1) * geo.k()].chunks_exact(geo.kh * geo.kw).enumerate() {
            for (t, &v) in taps.iter().enumerate() {
                dst[t * geo.c + ch] = v;
            }
        }
    }
    let chunk = if need_w || need_b { WGRAD_CHUNK } else { 1 };
    let run = |s: &mut Scratch, ci: usize, dx: Option<&mut [f32]>| -> (Vec<f32>, Vec<f32>) {
        // One guard for the chunk's row sums, a kernel call per output position (see `FlushSubnormals`).
        let _flush = simd::FlushSubnormals::on();
        let images = ci * chunk..((ci + 1) * chunk).min(n);
        if let Some(dx) = dx {
            for (i, dimg) in images.clone().zip(dx.chunks_exact_mut(in_len)) {
                input_grad(geo, &lay, src, i, &wr, s, dimg);
            }
        }
        let mut acc = vec![0.0f32; if need_w { w_len } else { 0 }];
        let mut bacc = vec![0.0f32; if need_b { geo.o } else { 0 }];
        if need_w || need_b {
            let imgs = &xs[images.start * in_len..images.end * in_len];
            let (a, b) = (need_w.then_some(&mut acc[..]), need_b.then_some(&mut bacc[..]));
            param_grads(geo, &lay, src, images, imgs, s, a, b);
        }
        (acc, bacc)
    };
    let mut dx = if need_x { vec![0.0f32; n * in_len] } else { Vec::new() };
    let parts: Vec<(Vec<f32>, Vec<f32>)> = if need_x {
        dx.par_chunks_mut(chunk * in_len)
            .enumerate()
            .map_init(Scratch::default, |s, (ci, d)| run(s, ci, Some(d)))
            .collect()
    } else {
        (0..n.div_ceil(chunk)).into_par_iter().map_init(Scratch::default, |s, ci| run(s, ci, None)).collect()
    };
    let (dws, dbs): (Vec<Vec<f32>>, Vec<Vec<f32>>) = parts.into_iter().unzip();
    let dw = need_w.then(|| {
        // Back from `[O, kh, kw, C]` to `[O, C, kh, kw]`.
        let total = sum_in_order(&dws, w_len);
        let mut dw = vec![0.0f32; w_len];
        for (o, src) in total.chunks_exact(kernel).enumerate() {
            let dst = &mut dw[o * geo.k()..(o + 1) * geo.k()];
            for (t, taps) in src.chunks_exact(geo.c).enumerate() {
                for (ch, &v) in taps.iter().enumerate() {
                    dst[ch * geo.kh * geo.kw + t] = v;
                }
            }
        }
        dw
    });
    let db = need_b.then(|| sum_in_order(&dbs, geo.o));
    Grads { dx: need_x.then_some(dx), dw, db }
}

#[cfg(test)]
mod tests {
    use crate::ops::conv::Conv2dParams;
    use crate::Tensor;

    /// The sparse backward gives the same bits on one thread as on several, and for an image alone as within a
    /// batch (its input gradient), over more images than one chunk.
    #[test]
    fn gradients_do_not_depend_on_threads_or_batch() {
        let p = Conv2dParams { padding: (1, 0), ..Default::default() };
        let x = Tensor::uniform(&[19, 16, 12, 10], -1.0, 1.0, 1).variable();
        let w = Tensor::uniform(&[32, 16, 5, 5], -0.3, 0.3, 2).variable();
        let b = Tensor::uniform(&[32], -0.5, 0.5, 3).variable();
        let grads = |x: &Tensor| {
            let y = x.conv2d_relu_max_pool2(&w, Some(&b), p).unwrap();
            let r = Tensor::uniform(y.shape(), -1.0, 1.0, 4 + x.shape()[0] as u64);
            let g = y.mul(&r).unwrap().sum_all().grad_wrt(&[x, &w, &b]).unwrap();
            g.iter().map(|t| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>()
        };
        assert!(super::applies(&super::super::geometry(x.shape(), w.shape(), None, p).unwrap()));
        let many = grads(&x);
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| grads(&x));
        assert_eq!(many, one);
        assert!(many[1].iter().any(|&v| v != 0), "a weight gradient");
        let xi = Tensor::new(x.value().slice(ndarray::s![5..6, .., .., ..]).to_owned().into_dyn()).variable();
        let yi = xi.conv2d_relu_max_pool2(&w, Some(&b), p).unwrap();
        let r = Tensor::uniform(&[19, 32, 5, 3], -1.0, 1.0, 4 + 19);
        let ri = Tensor::new(r.value().slice(ndarray::s![5..6, .., .., ..]).to_owned().into_dyn());
        let gi = yi.mul(&ri).unwrap().sum_all().grad_wrt(&[&xi]).unwrap();
        let len = 16 * 12 * 10;
        let bits: Vec<u32> = gi[0].to_vec().iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, many[0][5 * len..6 * len]);
        // An empty batch: no input gradient, zero weight and bias gradients.
        let x0 = Tensor::zeros(&[0, 16, 12, 10]).variable();
        let y0 = x0.conv2d_relu_max_pool2(&w, Some(&b), p).unwrap();
        let g0 = y0.sum_all().grad_wrt(&[&x0, &w, &b]).unwrap();
        assert_eq!(g0[0].shape(), &[0, 16, 12, 10]);
        assert!(g0[1].to_vec().iter().chain(&g0[2].to_vec()).all(|&v| v == 0.0));
    }
}
