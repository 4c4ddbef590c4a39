//! Conv (2-D: strides, pads, `auto_pad`, dilations, group); with explicit symmetric padding the fuser sees it as a
//! [`Layer::Conv`] (a BatchNorm, a Relu and a 2×2 max pooling after it may run in its kernel).

use std::sync::Arc;

use super::window::{has_extra, rank4, split_pads, AutoPad, Pads, Window};
use super::{input, opt_tensor, tensor, Op};
use crate::nn::plan::{Kind, Layer};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::ops::Conv2dParams;
use crate::Result;

/// Conv: the symmetric part of the padding goes to the kernel, any asymmetric remainder is padded first; the
/// bias is fused into the convolution.
#[derive(Clone, Debug)]
pub(crate) struct Conv {
    pub(crate) window: Window,
    pub(crate) group: usize,
}

pub(super) fn conv(a: &Attrs) -> Result<Arc<dyn Op>> {
    let group = a.int("group", 1)?;
    if group < 1 {
        return Err(a.info.malformed(format!("group = {group}")));
    }
    Ok(Arc::new(Conv { window: super::window::parse(a, false)?, group: group as usize }))
}

/// The geometry of a convolution of `x` by `w`: input and weight dimensions checked, the padding split into the
/// kernel's symmetric part and the explicit rest.
struct Geometry {
    x: [usize; 4],
    w: [usize; 4],
    sym: (usize, usize),
    extra: Pads,
}

impl Conv {
    fn geometry(&self, info: &NodeInfo, x: &[usize], w: &[usize]) -> Result<Geometry> {
        let [_, c, h, wd] = rank4(info, x)?;
        if w.len() != 4 {
            return Err(info.unsupported(format!("weight of rank {} (only 2-D convolution)", w.len())));
        }
        let [o, cg, kh, kw] = rank4(info, w)?;
        if kh == 0 || kw == 0 || cg.checked_mul(self.group) != Some(c) || o % self.group != 0 {
            return Err(info.malformed(format!("Conv of input {x:?} with weight {w:?} and group {}", self.group)));
        }
        if self.window.kernel.is_some_and(|k| k != [kh, kw]) {
            return Err(info.malformed(format!("kernel_shape {:?} disagrees with weight {w:?}", self.window.kernel)));
        }
        let (sym, extra) = split_pads(self.window.padding([h, wd], [kh, kw]));
        Ok(Geometry { x: rank4(info, x)?, w: rank4(info, w)?, sym, extra })
    }

    fn params(&self, sym: (usize, usize)) -> Conv2dParams {
        let win = &self.window;
        Conv2dParams {
            stride: (win.strides[0], win.strides[1]),
            padding: sym,
            dilation: (win.dilations[0], win.dilations[1]),
            groups: self.group,
        }
    }
}

impl Op for Conv {
    /// Output `[n, o, ho, wo]`, with the asymmetric padding copy and one sample's
    /// unfolded columns per thread as scratch.
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let g = self.geometry(info, input(info, ins, 0)?.shape(), input(info, ins, 1)?.shape())?;
        let ([n, c, h, wd], [o, cg, kh, kw], win) = (g.x, g.w, &self.window);
        let (hp, wp) = (h + g.extra[2].0 + g.extra[2].1, wd + g.extra[3].0 + g.extra[3].1);
        let out = |len, k, s, p, d| crate::ops::conv::out_size(len, k, s, p, d);
        let ho = out(hp, kh, win.strides[0], g.sym.0, win.dilations[0]);
        let wo = out(wp, kw, win.strides[1], g.sym.1, win.dilations[1]);
        let (Some(ho), Some(wo)) = (ho, wo) else {
            return Err(info.malformed(format!("kernel {kh}x{kw} does not fit input {h}x{wd}")));
        };
        let padded = if has_extra(&g.extra) { (n * c * hp * wp) as u128 * 4 } else { 0 };
        let columns = (cg * kh * kw) as u128 * (ho * wo) as u128 * 4 * rayon::current_num_threads() as u128;
        let scratch = padded + columns;
        Ok(Cost { outputs: vec![Meta::float(vec![n, o, ho, wo])], scratch })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (x, w, b) = (tensor(info, ins, 0)?, tensor(info, ins, 1)?, opt_tensor(ins, 2)?);
        let g = self.geometry(info, x.shape(), w.shape())?;
        let x = if has_extra(&g.extra) { x.pad(&g.extra, 0.0)? } else { x };
        let y = x.conv2d(&w, b.as_ref(), self.params(g.sym))?;
        Ok(vec![Value::F(y)])
    }

    /// A [`Layer::Conv`] when the padding is explicit and symmetric (the kernel's own); anything else pads first
    /// and runs on its own.
    fn kind(&self) -> Kind {
        let win = &self.window;
        let symmetric = win.pads[0] == win.pads[2] && win.pads[1] == win.pads[3];
        if symmetric && matches!(win.auto_pad, AutoPad::NotSet | AutoPad::Valid) {
            Kind::Conv
        } else {
            Kind::Opaque
        }
    }

    fn describe(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Layer> {
        let w = tensor(info, ins, 1)?;
        let [_, _, kh, kw] = rank4(info, w.shape())?;
        // Explicit pads (or none): the input's size does not enter.
        let (sym, extra) = split_pads(self.window.padding([0, 0], [kh, kw]));
        if has_extra(&extra) {
            return Err(info.malformed("a Conv with asymmetric padding planned as a fused layer"));
        }
        Ok(Layer::Conv { weight: w, bias: opt_tensor(ins, 2)?, params: self.params(sym) })
    }
}
