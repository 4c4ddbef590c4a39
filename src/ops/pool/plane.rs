//! Pooling of one image plane for any window, stride, padding and ceil mode, as separable passes: for each output
//! row, the rows of its window are reduced into one padded row buffer (a contiguous, vectorisable loop over the
//! plane's width), and each output is then reduced from `kw` consecutive buffer entries. The buffer carries the
//! padding (−∞ for max, 0 for average), so neither inner loop has per-element bounds logic; windows are clipped
//! once per output row and column ([`Windows`]).
//!
//! The max pooling's backward finds each window's arg-max again from the input and the pooled output (the first
//! entry equal to the maximum in row-major order, or the last NaN — the choice of a row-major scan), so the
//! forward stores no index.

use super::Pool2dParams;

/// The clipped windows of one pooling geometry: per output row and per output column, the window's first and
/// last-plus-one input index inside the plane and its length counted over the padded input.
pub(crate) struct Windows {
    w: usize,
    wo: usize,
    p: Pool2dParams,
    rows: Vec<(usize, usize, usize)>,
    cols: Vec<(usize, usize, usize)>,
    /// The padded row buffer's length: the left padding, the row, and whatever the last window reaches beyond.
    span: usize,
}

/// The clipped window `[start, end)` along one axis for output position `o`, and its length over the padded input.
pub(super) fn window(o: usize, s: usize, p: usize, k: usize, len: usize) -> (usize, usize, usize) {
    let start = (o * s) as isize - p as isize;
    let end = start + k as isize;
    let padded_end = end.min((len + p) as isize);
    (start.max(0) as usize, (end.min(len as isize)) as usize, (padded_end - start) as usize)
}

impl Windows {
    /// The windows of `p` over `h × w` planes pooled to `ho × wo` (the sizes [`Pool2dParams`] checked).
    pub(crate) fn new(p: &Pool2dParams, h: usize, w: usize, ho: usize, wo: usize) -> Windows {
        let ((kh, kw), (sh, sw), (ph, pw)) = (p.kernel, p.stride, p.padding);
        let rows = (0..ho).map(|i| window(i, sh, ph, kh, h)).collect();
        let cols = (0..wo).map(|j| window(j, sw, pw, kw, w)).collect();
        let span = (pw + w).max((wo - 1) * sw + kw);
        Windows { w, wo, p: *p, rows, cols, span }
    }

    /// The divisor of output `(i, j)` of an average pooling.
    #[inline]
    fn count(&self, i: usize, j: usize) -> f32 {
        let ((r0, r1, rn), (c0, c1, cn)) = (self.rows[i], self.cols[j]);
        let count = if self.p.count_include_pad { rn * cn } else { (r1 - r0) * (c1 - c0) };
        count.max(1) as f32
    }

    /// A row buffer holding `fill` in its padding.
    pub(crate) fn buffer(&self, fill: f32) -> Vec<f32> {
        vec![fill; self.span]
    }

    /// Max pooling of `plane` into `out` (`ho × wo`); a NaN in a window makes its output NaN. `buf` is from
    /// [`Windows::buffer`]`(−∞)`.
    pub(crate) fn max(&self, plane: &[f32], out: &mut [f32], buf: &mut [f32]) {
        let (w, pw) = (self.w, self.p.padding.1);
        for (&(r0, r1, _), orow) in self.rows.iter().zip(out.chunks_exact_mut(self.wo)) {
            let mid = &mut buf[pw..pw + w];
            mid.copy_from_slice(&plane[r0 * w..r0 * w + w]);
            for r in r0 + 1..r1 {
                for (m, &v) in mid.iter_mut().zip(&plane[r * w..r * w + w]) {
                    *m = nan_max(*m, v);
                }
            }
            reduce_row(buf, orow, self.p.kernel.1, self.p.stride.1, nan_max);
        }
    }

    /// Average pooling of `plane` into `out`; `buf` is from [`Windows::buffer`]`(0)`.
    pub(crate) fn avg(&self, plane: &[f32], out: &mut [f32], buf: &mut [f32]) {
        let (w, pw) = (self.w, self.p.padding.1);
        for (i, (&(r0, r1, _), orow)) in self.rows.iter().zip(out.chunks_exact_mut(self.wo)).enumerate() {
            let mid = &mut buf[pw..pw + w];
            mid.copy_from_slice(&plane[r0 * w..r0 * w + w]);
            for r in r0 + 1..r1 {
                for (m, &v) in mid.iter_mut().zip(&plane[r * w..r * w + w]) {
                    *m += v;
                }
            }
            reduce_row(buf, orow, self.p.kernel.1, self.p.stride.1, |a, b| a + b);
            for (j, o) in orow.iter_mut().enumerate() {
                *o /= self.count(i, j);
            }
        }
    }

    /// The gradient of [`Windows::max`] for one plane, added into `dx` (`h × w`): each output's gradient `g` goes
    /// to its window's first entry equal to the pooled value `out` (row-major), or to the last NaN when that is NaN.
    pub(crate) fn max_backward(&self, plane: &[f32], out: &[f32], g: &[f32], dx: &mut [f32]) {
        let w = self.w;
        for (i, &(r0, r1, _)) in self.rows.iter().enumerate() {
            for (j, &(c0, c1, _)) in self.cols.iter().enumerate() {
                let (m, gv) = (out[i * self.wo + j], g[i * self.wo + j]);
                let at = if m.is_nan() {
                    last_nan(plane, w, (r0, r1), (c0, c1))
                } else {
                    first_equal(plane, w, (r0, r1), (c0, c1), m)
                };
                dx[at] += gv;
            }
        }
    }

    /// The gradient of [`Windows::avg`] for one plane, added into `dx`: each output's gradient over its count,
    /// spread over the window's row in `buf` (from [`Windows::buffer`]`(0)`), then the row added to the window's
    /// rows.
    pub(crate) fn avg_backward(&self, g: &[f32], dx: &mut [f32], buf: &mut [f32]) {
        let (w, pw, (kw, sw)) = (self.w, self.p.padding.1, (self.p.kernel.1, self.p.stride.1));
        for (i, (&(r0, r1, _), grow)) in self.rows.iter().zip(g.chunks_exact(self.wo)).enumerate() {
            buf.fill(0.0);
            for (j, &gv) in grow.iter().enumerate() {
                let v = gv / self.count(i, j);
                buf[j * sw..j * sw + kw].iter_mut().for_each(|b| *b += v);
            }
            for r in r0..r1 {
                for (d, &v) in dx[r * w..r * w + w].iter_mut().zip(&buf[pw..pw + w]) {
                    *d += v;
                }
            }
        }
    }
}

/// The larger of `a` and a later `b`, NaN when either is (the later value wins when larger or NaN, as a
/// row-major scan).
#[inline(always)]
fn nan_max(a: f32, b: f32) -> f32 {
    if b > a || b.is_nan() {
        b
    } else {
        a
    }
}

/// `out[j] = f`-reduction of `buf[j·s..j·s + k]`, left to right; specialised for the common windows and strides
/// so that the compiler unrolls the window and vectorises over `j`.
#[inline(always)]
fn reduce_row(buf: &[f32], out: &mut [f32], k: usize, s: usize, f: impl Fn(f32, f32) -> f32 + Copy) {
    #[inline(always)]
    fn fixed<const K: usize, const S: usize>(buf: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        let buf = &buf[..(out.len() - 1) * S + K];
        for (j, o) in out.iter_mut().enumerate() {
            let win = &buf[j * S..j * S + K];
            let mut acc = win[0];
            for &v in &win[1..] {
                acc = f(acc, v);
            }
            *o = acc;
        }
    }
    match (k, s) {
        (2, 1) => fixed::<2, 1>(buf, out, f),
        (2, 2) => fixed::<2, 2>(buf, out, f),
        (3, 1) => fixed::<3, 1>(buf, out, f),
        (3, 2) => fixed::<3, 2>(buf, out, f),
        (5, 1) => fixed::<5, 1>(buf, out, f),
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                let win = &buf[j * s..j * s + k];
                *o = win[1..].iter().fold(win[0], |a, &v| f(a, v));
            }
        }
    }
}

/// The flat index of the first entry equal to `m` in the window, row-major (the window's first entry if none is).
#[inline]
fn first_equal(plane: &[f32], w: usize, (r0, r1): (usize, usize), (c0, c1): (usize, usize), m: f32) -> usize {
    // Scanned backwards with a select, no early exit: the last match seen is the first in row-major order, and the
    // loop has no data-dependent branch to mispredict (a 3×3 window's search was most of the pooling's backward).
    let mut at = r0 * w + c0;
    for r in (r0..r1).rev() {
        let row = &plane[r * w..r * w + c1];
        for c in (c0..c1).rev() {
            at = if row[c] == m { r * w + c } else { at };
        }
    }
    at
}

/// The flat index of the last NaN in the window, row-major (the window's first entry if none is).
#[inline]
fn last_nan(plane: &[f32], w: usize, (r0, r1): (usize, usize), (c0, c1): (usize, usize)) -> usize {
    for r in (r0..r1).rev() {
        if let Some(c) = plane[r * w + c0..r * w + c1].iter().rposition(|v| v.is_nan()) {
            return r * w + c0 + c;
        }
    }
    r0 * w + c0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The window maximum, its row-major first arg-max (last NaN) and the window mean, by a plain scan.
    fn scan(plane: &[f32], win: &Windows, i: usize, j: usize) -> (f32, usize, f32) {
        let ((r0, r1, _), (c0, c1, _)) = (win.rows[i], win.cols[j]);
        let (mut best, mut at, mut sum) = (f32::NEG_INFINITY, r0 * win.w + c0, 0.0f64);
        for r in r0..r1 {
            for c in c0..c1 {
                let v = plane[r * win.w + c];
                if v > best || v.is_nan() {
                    (best, at) = (v, r * win.w + c);
                }
                sum += v as f64;
            }
        }
        (best, at, (sum / win.count(i, j) as f64) as f32)
    }

    /// Every window shape, stride, padding and ceil mode against the scan: values (NaN included), the arg-max the
    /// backward picks (ties broken row-major, as the scan), and the average.
    #[test]
    fn separable_passes_match_the_window_scan() {
        let mut seed = 1usize;
        for (kh, kw) in [(1, 1), (2, 2), (3, 3), (2, 3), (5, 5), (7, 4)] {
            for (sh, sw) in [(1, 1), (2, 2), (1, 3), (3, 2)] {
                for (ph, pw) in [(0, 0), (kh / 2, kw / 2), (0, kw / 2)] {
                    for ceil in [false, true] {
                        for (h, w) in [(7, 9), (12, 12), (5, 17)] {
                            let p = Pool2dParams {
                                kernel: (kh, kw),
                                stride: (sh, sw),
                                padding: (ph, pw),
                                ceil_mode: ceil,
                                count_include_pad: seed.is_multiple_of(2),
                            };
                            let (Some(ho), Some(wo)) = (
                                Pool2dParams::out_len(h, kh, sh, ph, ceil),
                                Pool2dParams::out_len(w, kw, sw, pw, ceil),
                            ) else {
                                continue;
                            };
                            seed += 1;
                            // Few distinct values, so windows hold ties; a NaN in some planes.
                            let mut plane: Vec<f32> =
                                (0..h * w).map(|i| ((i * 7919 + seed) % 5) as f32 - 2.0).collect();
                            if seed.is_multiple_of(3) {
                                plane[(seed * 13) % (h * w)] = f32::NAN;
                            }
                            let win = Windows::new(&p, h, w, ho, wo);
                            let (mut mx, mut av) = (vec![0.0; ho * wo], vec![0.0; ho * wo]);
                            win.max(&plane, &mut mx, &mut win.buffer(f32::NEG_INFINITY));
                            win.avg(&plane, &mut av, &mut win.buffer(0.0));
                            let g: Vec<f32> = (0..ho * wo).map(|k| k as f32 + 1.0).collect();
                            let mut dx = vec![0.0; h * w];
                            win.max_backward(&plane, &mx, &g, &mut dx);
                            let mut want_dx = vec![0.0; h * w];
                            for i in 0..ho {
                                for j in 0..wo {
                                    let (best, at, mean) = scan(&plane, &win, i, j);
                                    let k = i * wo + j;
                                    assert!(mx[k] == best || (mx[k].is_nan() && best.is_nan()), "{p:?} max at {i},{j}");
                                    if !mean.is_nan() {
                                        assert!((av[k] - mean).abs() <= 1e-6, "{p:?} avg at {i},{j}");
                                    }
                                    want_dx[at] += g[k];
                                }
                            }
                            assert_eq!(dx, want_dx, "{p:?} {h}x{w}: max backward");
                        }
                    }
                }
            }
        }
    }
}
