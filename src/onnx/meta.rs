//! What is known about a value before it is computed ([`Meta`]), what a node costs ([`Cost`]), and [`Arg`], the
//! view of an input that shape rules read: the same rule runs on [`Meta`]s at load (shape inference, memory
//! estimate, folding) and on [`Value`]s when the node executes.

use super::value::Value;

/// What is known about a value before it is computed.
#[derive(Clone, Debug)]
pub(crate) enum Meta {
    /// The value itself (a constant, shape arithmetic, or at run time any input).
    Known(Value),
    /// Only the shape: a float tensor (`int` false) or an integer one.
    Shape { shape: Vec<usize>, int: bool },
}

impl Meta {
    /// A float tensor of this shape.
    pub(crate) fn float(shape: Vec<usize>) -> Meta {
        Meta::Shape { shape, int: false }
    }

    /// The bytes the value occupies (f32 or i64 elements).
    pub(crate) fn bytes(&self) -> u128 {
        let n: u128 = self.shape().iter().map(|&d| d as u128).product();
        n * if self.is_int() { 8 } else { 4 }
    }
}

/// A node's outputs as shapes (with their kinds) and the scratch memory it needs beyond them, in bytes.
pub(crate) struct Cost {
    pub(crate) outputs: Vec<Meta>,
    pub(crate) scratch: u128,
}

impl Cost {
    /// One output and no scratch.
    pub(crate) fn one(m: Meta) -> crate::Result<Cost> {
        Ok(Cost { outputs: vec![m], scratch: 0 })
    }

    /// Outputs plus scratch.
    pub(crate) fn bytes(&self) -> u128 {
        self.outputs.iter().map(Meta::bytes).sum::<u128>() + self.scratch
    }
}

/// An input as a shape rule sees it: its shape, whether it holds integers, and its value when known.
pub(crate) trait Arg {
    fn shape(&self) -> &[usize];
    fn is_int(&self) -> bool;
    /// The value, when known (always for a [`Value`]; for a [`Meta`] when it is a constant or shape arithmetic).
    fn known(&self) -> Option<&Value>;
}

impl Arg for Meta {
    fn shape(&self) -> &[usize] {
        match self {
            Meta::Known(v) => v.shape(),
            Meta::Shape { shape, .. } => shape,
        }
    }

    fn is_int(&self) -> bool {
        match self {
            Meta::Known(v) => v.is_int(),
            Meta::Shape { int, .. } => *int,
        }
    }

    fn known(&self) -> Option<&Value> {
        match self {
            Meta::Known(v) => Some(v),
            Meta::Shape { .. } => None,
        }
    }
}

impl Arg for Value {
    fn shape(&self) -> &[usize] {
        Value::shape(self)
    }

    fn is_int(&self) -> bool {
        Value::is_int(self)
    }

    fn known(&self) -> Option<&Value> {
        Some(self)
    }
}
