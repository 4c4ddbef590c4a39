//! The operators that rearrange a tensor without computing: Flatten, Reshape (`allowzero`), Squeeze and
//! Unsqueeze (axes as an attribute before opset 13, as input 1 after) and Transpose. Each shape rule runs on
//! [`Meta`]s at load and on values when the node executes.

use std::sync::Arc;

use super::{
    axes, axis, checked_product, data_then_constants, input, ints, like, opt_ints, reshape_value, InputRole, Op,
};
use crate::onnx::attrs::{Attrs, NodeInfo};
use crate::onnx::ints as int_ops;
use crate::onnx::meta::{Arg, Cost, Meta};
use crate::onnx::value::Value;
use crate::{Error, Result};

/// An op whose output is its input's data in a new shape.
trait Rearrange {
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>>;
}

/// [`Op`] for a [`Rearrange`]: the same shape rule for inference and for the reshape it executes.
macro_rules! rearrange_op {
    ($t:ty) => {
        impl Op for $t {
            fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
                Cost::one(like(input(info, ins, 0)?, self.out_shape(info, ins)?))
            }

            fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
                Ok(vec![reshape_value(input(info, ins, 0)?, &self.out_shape(info, ins)?)?])
            }

            fn input_role(&self, i: usize) -> InputRole {
                data_then_constants(i)
            }
        }
    };
}

/// Flatten at `axis` into 2-D.
#[derive(Clone, Debug)]
struct Flatten {
    axis: i64,
}

pub(super) fn flatten(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Flatten { axis: a.int("axis", 1)? }))
}

impl Rearrange for Flatten {
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>> {
        let s = input(info, ins, 0)?.shape();
        let r = s.len() as i64;
        let a = if self.axis < 0 { self.axis + r } else { self.axis };
        if a < 0 || a > r {
            return Err(info.malformed(format!("Flatten axis {a} for rank {r}")));
        }
        let (lo, hi) = s.split_at(a as usize);
        Ok(vec![checked_product(info, lo)?, checked_product(info, hi)?])
    }
}
rearrange_op!(Flatten);

/// Reshape to input 1 (0 copies the input dimension unless `allowzero`; one −1 is inferred).
#[derive(Clone, Debug)]
struct Reshape {
    allowzero: bool,
}

pub(super) fn reshape(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Reshape { allowzero: a.int("allowzero", 0)? != 0 }))
}

impl Rearrange for Reshape {
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>> {
        let input = input(info, ins, 0)?.shape();
        let spec = ints(info, ins, 1)?;
        let total = crate::limits::checked_numel("onnx Reshape", input)?;
        let mut out = Vec::with_capacity(spec.len());
        let mut infer = None;
        for (i, &d) in spec.iter().enumerate() {
            match d {
                -1 if infer.is_none() => {
                    infer = Some(i);
                    out.push(1);
                }
                0 if !self.allowzero => out
                    .push(*input.get(i).ok_or_else(|| info.malformed(format!("Reshape 0 at {i} beyond input rank")))?),
                d if d >= 0 => out.push(d as usize),
                _ => return Err(info.malformed(format!("Reshape target {spec:?}"))),
            }
        }
        let Some(known) = out.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) else {
            return Err(info.malformed(format!("Reshape target {spec:?} overflows")));
        };
        let mismatch = || Error::ShapeMismatch { op: "onnx Reshape", expected: out.clone(), got: input.to_vec() };
        match infer {
            Some(i) if known != 0 && total.is_multiple_of(known) => out[i] = total / known,
            Some(_) => return Err(mismatch()),
            None if known != total => return Err(mismatch()),
            None => {}
        }
        Ok(out)
    }
}
rearrange_op!(Reshape);

/// Squeeze `axes` (an attribute, the second input, or every axis of size 1); each must have size 1.
#[derive(Clone, Debug)]
struct Squeeze {
    axes: Option<Vec<i64>>,
}

pub(super) fn squeeze(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Squeeze { axes: a.ints("axes")? }))
}

impl Rearrange for Squeeze {
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>> {
        let s = input(info, ins, 0)?.shape();
        let given = match &self.axes {
            Some(a) => Some(a.clone()),
            None => opt_ints(info, ins, 1)?,
        };
        let drop: Vec<usize> = match given {
            Some(a) => axes(info, &a, s.len())?,
            None => (0..s.len()).filter(|&i| s[i] == 1).collect(),
        };
        if let Some(&bad) = drop.iter().find(|&&a| s[a] != 1) {
            return Err(info.malformed(format!("cannot squeeze axis {bad} of size {}", s[bad])));
        }
        Ok((0..s.len()).filter(|i| !drop.contains(i)).map(|i| s[i]).collect())
    }
}
rearrange_op!(Squeeze);

/// Unsqueeze at `axes` (an attribute or the second input), counted in the output's rank.
#[derive(Clone, Debug)]
struct Unsqueeze {
    axes: Option<Vec<i64>>,
}

pub(super) fn unsqueeze(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Unsqueeze { axes: a.ints("axes")? }))
}

impl Rearrange for Unsqueeze {
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>> {
        let s = input(info, ins, 0)?.shape();
        let given = match &self.axes {
            Some(a) => a.clone(),
            None => ints(info, ins, 1)?,
        };
        let mut ax = axes(info, &given, s.len() + given.len())?;
        ax.sort_unstable();
        ax.dedup();
        let mut shape = s.to_vec();
        for &a in &ax {
            if a > shape.len() {
                return Err(info.malformed(format!("Unsqueeze axes {ax:?} for rank {}", s.len())));
            }
            shape.insert(a, 1);
        }
        Ok(shape)
    }
}
rearrange_op!(Unsqueeze);

/// Transpose by `perm` (reversed axes when absent), which must be a permutation of the input's axes.
#[derive(Clone, Debug)]
struct Transpose {
    perm: Option<Vec<i64>>,
}

pub(super) fn transpose(a: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Transpose { perm: a.ints("perm")? }))
}

impl Transpose {
    fn perm(&self, info: &NodeInfo, rank: usize) -> Result<Vec<usize>> {
        let perm = match &self.perm {
            Some(p) => p.iter().map(|&a| axis(info, a, rank)).collect::<Result<Vec<_>>>()?,
            None => (0..rank).rev().collect(),
        };
        let mut seen = vec![false; rank];
        if perm.len() != rank || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
            return Err(info.malformed(format!("perm {perm:?} for rank {rank}")));
        }
        Ok(perm)
    }
}

impl Op for Transpose {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        let x = input(info, ins, 0)?;
        let s = x.shape();
        Cost::one(like(x, self.perm(info, s.len())?.iter().map(|&p| s[p]).collect()))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let v = input(info, ins, 0)?;
        let perm = self.perm(info, v.shape().len())?;
        Ok(vec![match v {
            Value::F(t) => Value::F(t.permute(&perm)?),
            Value::I(i) => Value::I(int_ops::permute(i, &perm)?),
        }])
    }
}

/// Expand: the input broadcast with the shape in input 1 (NumPy rules both ways: a 1 in the target keeps the
/// input's dimension). On floats the core's `broadcast_to`, whose gradient sums over the broadcast axes.
#[derive(Clone, Debug)]
struct Expand;

pub(super) fn expand(_: &Attrs) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(Expand))
}

impl Expand {
    fn out_shape<A: Arg>(&self, info: &NodeInfo, ins: &[Option<&A>]) -> Result<Vec<usize>> {
        let s = input(info, ins, 0)?.shape();
        let target = ints(info, ins, 1)?;
        if target.iter().any(|&d| d < 0) {
            return Err(info.malformed(format!("Expand to {target:?}")));
        }
        let target: Vec<usize> = target.iter().map(|&d| d as usize).collect();
        crate::ops::elementwise::broadcast_shape(s, &target).ok_or_else(|| Error::Broadcast {
            op: "onnx Expand",
            lhs: s.to_vec(),
            rhs: target,
        })
    }
}

impl Op for Expand {
    fn infer(&self, info: &NodeInfo, ins: &[Option<&Meta>]) -> Result<Cost> {
        Cost::one(like(input(info, ins, 0)?, self.out_shape(info, ins)?))
    }

    fn run(&self, info: &NodeInfo, ins: &[Option<&Value>]) -> Result<Vec<Value>> {
        let shape = self.out_shape(info, ins)?;
        Ok(vec![match input(info, ins, 0)? {
            Value::F(t) if t.shape() == shape.as_slice() => Value::F(t.clone()),
            Value::F(t) => Value::F(t.broadcast_to(&shape)?),
            Value::I(i) => Value::I(int_ops::broadcast_to(i, &shape)?),
        }])
    }

    fn input_role(&self, i: usize) -> InputRole {
        data_then_constants(i)
    }
}
