//! The window of a 2-D convolution or pooling (kernel, strides, pads, dilations, `auto_pad`, `ceil_mode`), as
//! Conv, MaxPool and AveragePool share it, and the ONNX padding rules.

use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::Result;

/// How `auto_pad` places the padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AutoPad {
    /// Explicit `pads`.
    NotSet,
    /// Output size ⌈in/stride⌉, the extra padding at the end.
    SameUpper,
    /// Output size ⌈in/stride⌉, the extra padding at the start.
    SameLower,
    /// No padding.
    Valid,
}

/// The window of a 2-D convolution or pooling.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    /// The kernel size, when given as an attribute (pooling always; Conv optionally).
    pub(crate) kernel: Option<[usize; 2]>,
    pub(crate) strides: [usize; 2],
    /// top, left, bottom, right (ONNX order: begins then ends).
    pub(crate) pads: [usize; 4],
    pub(crate) dilations: [usize; 2],
    pub(crate) auto_pad: AutoPad,
    pub(crate) ceil_mode: bool,
}

/// (before, after) padding of the four axes of an NCHW tensor.
pub(crate) type Pads = [(usize, usize); 4];

impl Window {
    /// The padding (top, left, bottom, right) for an input of `size` and a kernel `k`.
    pub(crate) fn padding(&self, size: [usize; 2], k: [usize; 2]) -> [usize; 4] {
        let mut p = self.pads;
        if matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower) {
            for i in 0..2 {
                let out = size[i].div_ceil(self.strides[i]);
                let span = k[i].saturating_sub(1).saturating_mul(self.dilations[i]).saturating_add(1);
                let total =
                    (out.max(1) - 1).saturating_mul(self.strides[i]).saturating_add(span).saturating_sub(size[i]);
                let small = total / 2;
                let (begin, end) =
                    if self.auto_pad == AutoPad::SameUpper { (small, total - small) } else { (total - small, small) };
                p[i] = begin;
                p[i + 2] = end;
            }
        } else if self.auto_pad == AutoPad::Valid {
            p = [0; 4];
        }
        p
    }

    /// Whether this pooling window is exactly 2×2 with stride 2, no padding and floor rounding (what
    /// [`crate::Tensor::conv2d_relu_max_pool2`] pools).
    pub(crate) fn is_max_pool2(&self) -> bool {
        self.kernel == Some([2, 2])
            && self.strides == [2, 2]
            && self.pads == [0; 4]
            && self.dilations == [1, 1]
            && matches!(self.auto_pad, AutoPad::NotSet | AutoPad::Valid)
            && !self.ceil_mode
    }
}

/// Splits `[top, left, bottom, right]` into the symmetric part (rows, columns) and the rest as explicit padding.
pub(crate) fn split_pads(p: [usize; 4]) -> ((usize, usize), Pads) {
    let (ph, pw) = (p[0].min(p[2]), p[1].min(p[3]));
    ((ph, pw), [(0, 0), (0, 0), (p[0] - ph, p[2] - ph), (p[1] - pw, p[3] - pw)])
}

/// Whether any explicit padding is left.
pub(crate) fn has_extra(extra: &Pads) -> bool {
    extra.iter().any(|&(a, b)| a + b > 0)
}

/// The input's `[n, c, h, w]`: only 2-D images are supported.
pub(crate) fn rank4(info: &NodeInfo, s: &[usize]) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(s)
        .map_err(|_| info.unsupported(format!("input of rank {} (only 2-D images, rank 4, are supported)", s.len())))
}

/// Parses the window attributes; `pooling` requires `kernel_shape` and reads `ceil_mode`.
pub(crate) fn parse(a: &Attrs, pooling: bool) -> Result<Window> {
    let info = a.info;
    let two = |name: &str, v: Option<Vec<i64>>, default: usize, len: usize| -> Result<Vec<usize>> {
        match v {
            None => Ok(vec![default; len]),
            Some(v) if v.len() == len && v.iter().all(|&x| x >= 0) => Ok(v.iter().map(|&x| x as usize).collect()),
            Some(v) => Err(info.unsupported(format!("{name} = {v:?} (only 2-D windows are supported)"))),
        }
    };
    let kernel = match a.ints("kernel_shape")? {
        Some(k) => {
            let k = two("kernel_shape", Some(k), 1, 2)?;
            if k.contains(&0) {
                return Err(info.malformed("zero kernel size"));
            }
            Some([k[0], k[1]])
        }
        None if pooling => return Err(info.malformed("kernel_shape is required")),
        None => None,
    };
    let strides = two("strides", a.ints("strides")?, 1, 2)?;
    let pads = two("pads", a.ints("pads")?, 0, 4)?;
    let dilations = two("dilations", a.ints("dilations")?, 1, 2)?;
    if strides.contains(&0) || dilations.contains(&0) {
        return Err(info.malformed("zero stride or dilation"));
    }
    // Bounds that no real model comes near keep a corrupt file from asking for absurd allocations.
    const LIMIT: usize = 1 << 16;
    if strides.iter().chain(&pads).chain(&dilations).chain(kernel.iter().flatten()).any(|&v| v > LIMIT) {
        return Err(info.malformed(format!(
            "kernel {kernel:?}, strides {strides:?}, pads {pads:?} or dilations {dilations:?} out of range"
        )));
    }
    if let (true, Some(k)) = (pooling, kernel) {
        if pads[0] >= k[0] || pads[2] >= k[0] || pads[1] >= k[1] || pads[3] >= k[1] {
            return Err(info.malformed(format!("pads {pads:?} must be smaller than the kernel {k:?}")));
        }
    }
    if pooling && dilations != [1, 1] {
        return Err(info.unsupported(format!("dilations = {dilations:?} in pooling")));
    }
    let auto_pad = match a.string("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" | "" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => return Err(info.unsupported(format!("auto_pad = {other}"))),
    };
    let ceil_mode = if pooling { a.int("ceil_mode", 0)? != 0 } else { false };
    Ok(Window {
        kernel,
        strides: [strides[0], strides[1]],
        pads: [pads[0], pads[1], pads[2], pads[3]],
        dilations: [dilations[0], dilations[1]],
        auto_pad,
        ceil_mode,
    })
}
