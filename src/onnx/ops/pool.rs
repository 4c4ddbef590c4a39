//! MaxPool, AveragePool (`count_include_pad`), GlobalAveragePool and GlobalMaxPool.

use std::sync::Arc;

use super::window::{has_extra, rank4, Pads, Window};
use super::{input, tensor, Op};
use crate::nn::plan::{Kind, Layer};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::ops::Pool2dParams;
use crate::tensor::Tensor;
use crate::Result;

/// MaxPool (explicit padding is −∞).
#[derive(Clone, Debug)]
pub(crate) struct MaxPool(pub(crate) Window);

/// AveragePool. With asymmetric padding that must not be counted, the window sums are divided by the number of
/// real entries in each window (the same pooling applied to a mask of ones).
#[derive(Clone, Debug)]
struct AvgPool {
    window: Window,
    count_include_pad: bool,
}

/// GlobalAveragePool / GlobalMaxPool over every axis after the channels.
#[derive(Clone, Debug)]
struct GlobalPool {
    max: bool,
}

pub(super) fn max_pool(a: &Attrs) -> Result<Arc<dyn Op>> {
    a.ignore("storage_order");
    if a.node.output.get(1).is_some_and(|o| !o.is_empty()) {
        return Err(a.info.unsupported("the Indices output of MaxPool"));
    }
    Ok(Arc::new(MaxPool(super::window::parse(a, true)?)))
}

pub(super) fn avg_pool(a: &Attrs) -> Result<Arc<dyn Op>> {
    let count_include_pad = a.int("count_include_pad", 0)? != 0;
    Ok(Arc::new(AvgPool { window: super::window::parse(a, true)?, count_include_pad }))
}

pub(super) fn global_avg_pool(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(GlobalPool { max: false }))
}

pub(super) fn global_max_pool(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(GlobalPool { max: true }))
}

/// The padding of a pooling window on an input of `h × w`: symmetric and at most half the kernel goes to the
/// pooling op, anything else is padded explicitly.
fn pool_pads(info: &NodeInfo, h: usize, w: usize, win: &Window) -> Result<((usize, usize), Pads)> {
    let k = win.kernel.ok_or_else(|| info.malformed("kernel_shape is required"))?;
    let p = win.padding([h, w], k);
    if p[0] == p[2] && p[1] == p[3] && 2 * p[0] <= k[0] && 2 * p[1] <= k[1] {
        return Ok(((p[0], p[1]), [(0, 0); 4]));
    }
    Ok(((0, 0), [(0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])]))
}

fn pool_params(
    info: &NodeInfo,
    win: &Window,
    padding: (usize, usize),
    count_include_pad: bool,
) -> Result<Pool2dParams> {
    let kernel = win.kernel.ok_or_else(|| info.malformed("kernel_shape is required"))?;
    Ok(Pool2dParams {
        kernel: (kernel[0], kernel[1]),
        stride: (win.strides[0], win.strides[1]),
        padding,
        ceil_mode: win.ceil_mode,
        count_include_pad,
    })
}

/// The output of a pooling window, with the explicit padding copy (and the averaging counts) as scratch.
fn pool_cost(info: &NodeInfo, x: &[usize], win: &Window, avg: bool) -> Result<Cost> {
    let [n, c, h, w] = rank4(info, x)?;
    let (sym, extra) = pool_pads(info, h, w, win)?;
    let (hp, wp) = (h + extra[2].0 + extra[2].1, w + extra[3].0 + extra[3].1);
    let k = win.kernel.ok_or_else(|| info.malformed("kernel_shape is required"))?;
    let ho = Pool2dParams::out_len(hp, k[0], win.strides[0], sym.0, win.ceil_mode);
    let wo = Pool2dParams::out_len(wp, k[1], win.strides[1], sym.1, win.ceil_mode);
    let (Some(ho), Some(wo)) = (ho, wo) else {
        return Err(info.malformed(format!("window {k:?} does not fit input {h}x{w}")));
    };
    let padded = if has_extra(&extra) { (n * c * hp * wp) as u128 * 4 } else { 0 };
    let counts = if avg && padded > 0 { (hp * wp + ho * wo) as u128 * 4 } else { 0 };
    Ok(Cost { outputs: vec![Meta::float(vec![n, c, ho, wo])], scratch: padded + counts })
}

impl Op for MaxPool {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        pool_cost(info, input(info, ins, 0)?.shape(), &self.0, false)
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor(info, ins, 0)?;
        let [_, _, h, w] = rank4(info, x.shape())?;
        let (sym, extra) = pool_pads(info, h, w, &self.0)?;
        let x = if has_extra(&extra) { x.pad(&extra, f32::NEG_INFINITY)? } else { x };
        Ok(vec![Value::F(x.max_pool2d(pool_params(info, &self.0, sym, true)?)?)])
    }

    /// The 2×2 pooling of stride 2 the fused convolution kernel pools; any other window is its own op.
    fn kind(&self) -> Kind {
        if self.0.is_max_pool2() {
            Kind::MaxPool(Pool2dParams::square(2))
        } else {
            Kind::Opaque
        }
    }

    fn describe(&self, info: &NodeInfo, _: &[Option<&Value>]) -> Result<Layer> {
        match self.kind() {
            Kind::MaxPool(p) => Ok(Layer::MaxPool(p)),
            _ => Err(info.malformed("planned as a fused 2×2 max pooling")),
        }
    }
}

impl Op for AvgPool {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        pool_cost(info, input(info, ins, 0)?.shape(), &self.window, true)
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (x, win) = (tensor(info, ins, 0)?, &self.window);
        let [_, _, h, w] = rank4(info, x.shape())?;
        let (sym, extra) = pool_pads(info, h, w, win)?;
        if !has_extra(&extra) {
            return Ok(vec![Value::F(x.avg_pool2d(pool_params(info, win, sym, self.count_include_pad)?)?)]);
        }
        let p = pool_params(info, win, (0, 0), true)?;
        let sums = x.pad(&extra, 0.0)?.avg_pool2d(p)?;
        if self.count_include_pad {
            return Ok(vec![Value::F(sums)]);
        }
        let counts = Tensor::ones(&[1, 1, h, w]).pad(&extra, 0.0)?.avg_pool2d(p)?;
        Ok(vec![Value::F(sums.div(&counts)?)])
    }
}

impl Op for GlobalPool {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let mut s = input(info, ins, 0)?.shape().to_vec();
        if s.len() < 3 {
            return Err(info.malformed(format!("input of rank {}", s.len())));
        }
        s[2..].fill(1);
        Cost::one(Meta::float(s))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor(info, ins, 0)?;
        if x.rank() < 3 {
            return Err(info.malformed(format!("input of rank {}", x.rank())));
        }
        let axes: Vec<usize> = (2..x.rank()).collect();
        if !self.max {
            return Ok(vec![Value::F(x.mean(&axes, true)?)]);
        }
        let (n, c) = (x.shape()[0], x.shape()[1]);
        let m = x.reshape(&[n, c, x.numel() / (n * c).max(1)])?.max(2, true)?;
        let mut shape = vec![n, c];
        shape.resize(x.rank(), 1);
        Ok(vec![Value::F(m.reshape(&shape)?)])
    }
}
