//! The values an ONNX graph computes with: differentiable f32 tensors, and i64 tensors for shape arithmetic.

use ndarray::{ArrayD, IxDyn};

use super::proto::{data_type as dt, TensorProto};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// A small integer tensor (shapes, indices, axes): never differentiated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ints {
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Vec<i64>,
}

impl Ints {
    pub(crate) fn vector(data: Vec<i64>) -> Ints {
        Ints { shape: vec![data.len()], data }
    }

    pub(crate) fn scalar(v: i64) -> Ints {
        Ints { shape: vec![], data: vec![v] }
    }
}

/// A value flowing along a graph edge.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// Floating point data (f32; doubles are narrowed), possibly tracked.
    F(Tensor),
    /// Integer (and boolean) data.
    I(Ints),
}

impl Value {
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            Value::F(t) => t.shape(),
            Value::I(i) => &i.shape,
        }
    }

    /// Whether this is integer (or boolean) data.
    pub(crate) fn is_int(&self) -> bool {
        matches!(self, Value::I(_))
    }

    /// The number of elements.
    pub(crate) fn numel(&self) -> usize {
        match self {
            Value::F(t) => t.numel(),
            Value::I(i) => i.data.len(),
        }
    }

    /// As a float tensor (integers become an untracked constant).
    pub(crate) fn to_tensor(&self) -> Result<Tensor> {
        match self {
            Value::F(t) => Ok(t.clone()),
            Value::I(i) => Tensor::from_vec(i.data.iter().map(|&v| v as f32).collect(), &i.shape),
        }
    }

    /// As integers (floats are truncated toward zero, as ONNX `Cast`).
    pub(crate) fn to_ints(&self) -> Ints {
        match self {
            Value::I(i) => i.clone(),
            Value::F(t) => Ints { shape: t.shape().to_vec(), data: t.value().iter().map(|&v| v as i64).collect() },
        }
    }

    /// The values as f32, row-major.
    pub(crate) fn floats(&self) -> Vec<f32> {
        match self {
            Value::F(t) => t.to_vec(),
            Value::I(i) => i.data.iter().map(|&v| v as f32).collect(),
        }
    }
}

fn chunks<const N: usize, T>(raw: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    raw.chunks_exact(N).map(|c| f(c.try_into().expect("chunks_exact yields N bytes"))).collect()
}

/// IEEE half → f32.
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f32::from(h & 0x3ff);
    match exp {
        0 => sign * frac * 2f32.powi(-24),
        31 => {
            if frac == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            }
        }
        _ => sign * (1.0 + frac / 1024.0) * 2f32.powi(exp - 15),
    }
}

/// Decodes a `TensorProto` into a [`Value`]; `what` names it in errors.
pub(crate) fn decode_tensor(t: &TensorProto, what: &str) -> Result<Value> {
    let bad = |msg: String| Error::bad_file(format!("<onnx tensor '{what}'>"), msg);
    if t.data_location == 1 || !t.external_data.is_empty() {
        return Err(Error::UnsupportedOnnx {
            what: format!("external tensor data for '{what}' (save the model with the weights inside the file)"),
            node: what.to_string(),
            op: "initializer".into(),
            opset: 0,
        });
    }
    if t.dims.iter().any(|&d| d < 0) {
        return Err(bad(format!("negative dimension in {:?}", t.dims)));
    }
    let shape: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    let n =
        crate::limits::checked_numel("onnx tensor", &shape).map_err(|_| bad(format!("shape {shape:?} overflows")))?;
    let raw = &t.raw_data;
    let width = match t.data_type {
        dt::FLOAT | dt::INT32 | dt::UINT32 => 4,
        dt::DOUBLE | dt::INT64 | dt::UINT64 => 8,
        dt::UINT8 | dt::INT8 | dt::BOOL => 1,
        dt::FLOAT16 | dt::BFLOAT16 | dt::INT16 | dt::UINT16 => 2,
        other => {
            return Err(Error::UnsupportedOnnx {
                what: format!("tensor data type {other} for '{what}'"),
                node: what.to_string(),
                op: "tensor".into(),
                opset: 0,
            })
        }
    };
    let use_raw = !raw.is_empty() || n == 0;
    if use_raw && Some(raw.len()) != n.checked_mul(width) {
        return Err(bad(format!("raw data has {} bytes, shape {shape:?} needs {n}×{width}", raw.len())));
    }
    let floats = |v: Vec<f32>| -> Result<Value> {
        if v.len() != n {
            return Err(bad(format!("{} values for shape {shape:?}", v.len())));
        }
        let a = ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| bad(format!("shape {shape:?}: {e}")))?;
        Ok(Value::F(Tensor::new(a)))
    };
    let ints = |v: Vec<i64>| -> Result<Value> {
        if v.len() != n {
            return Err(bad(format!("{} values for shape {shape:?}", v.len())));
        }
        Ok(Value::I(Ints { shape: shape.clone(), data: v }))
    };
    let i32_field = || t.int32_data.clone();
    match t.data_type {
        dt::FLOAT if use_raw => floats(chunks(raw, f32::from_le_bytes)),
        dt::FLOAT => floats(t.float_data.clone()),
        dt::DOUBLE if use_raw => floats(chunks(raw, |b| f64::from_le_bytes(b) as f32)),
        dt::DOUBLE => floats(t.double_data.iter().map(|&v| v as f32).collect()),
        dt::FLOAT16 if use_raw => floats(chunks(raw, |b| f16_to_f32(u16::from_le_bytes(b)))),
        dt::FLOAT16 => floats(i32_field().into_iter().map(|v| f16_to_f32(v as u16)).collect()),
        dt::BFLOAT16 if use_raw => floats(chunks(raw, |b| f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16))),
        dt::BFLOAT16 => floats(i32_field().into_iter().map(|v| f32::from_bits((v as u32 & 0xffff) << 16)).collect()),
        dt::INT64 if use_raw => ints(chunks(raw, i64::from_le_bytes)),
        dt::INT64 => ints(t.int64_data.clone()),
        dt::INT32 if use_raw => ints(chunks(raw, |b| i64::from(i32::from_le_bytes(b)))),
        dt::UINT32 if use_raw => ints(chunks(raw, |b| i64::from(u32::from_le_bytes(b)))),
        dt::UINT64 if use_raw => ints(chunks(raw, |b| u64::from_le_bytes(b) as i64)),
        dt::UINT32 | dt::UINT64 => ints(t.uint64_data.iter().map(|&v| v as i64).collect()),
        dt::INT16 if use_raw => ints(chunks(raw, |b| i64::from(i16::from_le_bytes(b)))),
        dt::UINT16 if use_raw => ints(chunks(raw, |b| i64::from(u16::from_le_bytes(b)))),
        dt::INT8 if use_raw => ints(chunks(raw, |b: [u8; 1]| i64::from(b[0] as i8))),
        dt::UINT8 | dt::BOOL if use_raw => ints(chunks(raw, |b: [u8; 1]| i64::from(b[0]))),
        _ => ints(i32_field().into_iter().map(i64::from).collect()),
    }
}

/// Encodes an f32 array as a `TensorProto` (raw little-endian data), e.g. to write a test graph.
pub fn float_tensor(name: &str, shape: &[usize], data: &[f32]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: shape.iter().map(|&d| d as i64).collect(),
        data_type: dt::FLOAT,
        raw_data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

/// Encodes an i64 array as a `TensorProto` (in `int64_data`).
pub fn int_tensor(name: &str, shape: &[usize], data: &[i64]) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: shape.iter().map(|&d| d as i64).collect(),
        data_type: dt::INT64,
        int64_data: data.to_vec(),
        ..Default::default()
    }
}
