//! Pad: constant, reflect and edge modes; pads and value as attributes before opset 11, as inputs after (axes
//! from opset 18); negative pads crop.

use std::sync::Arc;

use super::{axes, data_then_constants, input, ints, opt_ints, opt_scalar, tensor, InputRole, Op};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::Result;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PadMode {
    Constant,
    Reflect,
    Edge,
}

#[derive(Clone, Debug)]
struct Pad {
    mode: PadMode,
    /// The attribute form (opset < 11): pads and value.
    attrs: Option<(Vec<i64>, f32)>,
}

pub(super) fn pad(a: &Attrs) -> Result<Arc<dyn Op>> {
    let mode = match a.string("mode", "constant")?.as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        other => return Err(a.info.unsupported(format!("mode = {other}"))),
    };
    let pads = a.ints("pads")?.or(a.ints("paddings")?);
    let attrs = pads.map(|p| -> Result<_> { Ok((p, a.float("value", 0.0)?)) }).transpose()?;
    Ok(Arc::new(Pad { mode, attrs }))
}

/// (begin, end) padding of every axis (negative crops) and the output shape.
type Plan = (Vec<(i64, i64)>, Vec<usize>);

impl Pad {
    /// The padding and output shape for these inputs.
    fn plan<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Plan> {
        let pads = match &self.attrs {
            Some((p, _)) => p.clone(),
            None => ints(info, ins, 1)?,
        };
        let s = input(info, ins, 0)?.shape();
        let axes: Vec<usize> = match opt_ints(info, ins, 3)? {
            Some(a) => axes(info, &a, s.len())?,
            None => (0..s.len()).collect(),
        };
        if pads.len() != 2 * axes.len() || pads.iter().any(|p| p.unsigned_abs() > 1 << 16) {
            return Err(info.malformed(format!("pads {pads:?} for {} axes", axes.len())));
        }
        let mut pp = vec![(0i64, 0i64); s.len()];
        let mut shape = s.to_vec();
        for (i, &a) in axes.iter().enumerate() {
            pp[a] = (pads[i], pads[i + axes.len()]);
            let d = shape[a] as i128 + i128::from(pads[i]) + i128::from(pads[i + axes.len()]);
            if d < 0 {
                return Err(info.malformed(format!("pads {pads:?} crop more than axis {a} holds")));
            }
            shape[a] = usize::try_from(d).map_err(|_| info.malformed("padded size overflows"))?;
        }
        Ok((pp, shape))
    }
}

impl Op for Pad {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let shape = self.plan(info, ins)?.1;
        // Reflect and edge padding gather along each axis in turn: one intermediate per axis at most.
        let scratch = if self.mode == PadMode::Constant { 0 } else { Meta::float(shape.clone()).bytes() };
        Ok(Cost { outputs: vec![Meta::float(shape)], scratch })
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (pp, _) = self.plan(info, ins)?;
        let value = match &self.attrs {
            Some((_, v)) => *v,
            None => opt_scalar(info, ins, 2)?.unwrap_or(0.0),
        };
        // Crop first (negative pads), then pad.
        let mut t = tensor(info, ins, 0)?;
        for (a, &(b, e)) in pp.iter().enumerate() {
            let (cb, ce) = ((-b).max(0) as usize, (-e).max(0) as usize);
            if cb + ce > 0 {
                let d = t.shape()[a];
                if cb + ce > d {
                    return Err(info.malformed(format!("pads {pp:?} crop more than axis {a} holds")));
                }
                t = t.narrow(a, cb, d - cb - ce)?;
            }
        }
        let pos: Vec<(usize, usize)> = pp.iter().map(|&(b, e)| (b.max(0) as usize, e.max(0) as usize)).collect();
        if self.mode == PadMode::Constant {
            let y = if pos.iter().all(|&(b, e)| b + e == 0) { t } else { t.pad(&pos, value)? };
            return Ok(vec![Value::F(y)]);
        }
        for (a, &(b, e)) in pos.iter().enumerate() {
            if b + e == 0 {
                continue;
            }
            let d = t.shape()[a] as i64;
            if d == 0 || (self.mode == PadMode::Reflect && (b as i64 >= d || e as i64 >= d)) {
                return Err(info.malformed(format!("reflect padding {b},{e} needs more than {d} entries")));
            }
            let idx: Vec<usize> = (-(b as i64)..d + e as i64)
                .map(|j| match self.mode {
                    PadMode::Edge => j.clamp(0, d - 1) as usize,
                    _ if j < 0 => (-j) as usize,
                    _ if j >= d => (2 * (d - 1) - j) as usize,
                    _ => j as usize,
                })
                .collect();
            t = t.index_select(a, &idx)?;
        }
        Ok(vec![Value::F(t)])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }
}
