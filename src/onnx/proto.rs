//! The subset of the ONNX protobuf messages (`onnx/onnx.proto`, IR version ≤ 10) that inference needs,
//! written by hand with `prost` so that no `protoc` is needed at build time.
//!
//! Field numbers follow onnx.proto exactly; fields Armoury does not read (doc strings, training info,
//! functions, sparse tensors, metadata) are left out and skipped by the decoder. Scalars are declared
//! proto3-style (a default value when absent), which decodes proto2 files identically.

/// A whole model file: the IR version, the imported operator sets and the graph.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// IR version.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// Operator sets, one per domain.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// Producing tool.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// Producing tool's version.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// The model's domain.
    #[prost(string, tag = "4")]
    pub domain: String,
    /// The model's version.
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    /// The graph.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

/// An operator set: a domain and its version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// `""` or `"ai.onnx"` for the standard operators.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The opset version.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// A computation graph: nodes in topological order, initialisers, inputs and outputs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// The nodes, sorted topologically.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// The graph's name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Named constant tensors (weights).
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// Graph inputs (may also list initialisers, in old IR versions).
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// Graph outputs.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    /// Optional type information for intermediate values.
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// One operator application.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// Input value names (`""` for an omitted optional input).
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Output value names.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// The node's name (may be empty).
    #[prost(string, tag = "3")]
    pub name: String,
    /// The operator.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// The operator's domain (`""` for standard operators).
    #[prost(string, tag = "7")]
    pub domain: String,
    /// Attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto.AttributeType`.
pub mod attribute_type {
    /// Unset (IR version 1 files): infer from the field in use.
    pub const UNDEFINED: i32 = 0;
    /// `f`.
    pub const FLOAT: i32 = 1;
    /// `i`.
    pub const INT: i32 = 2;
    /// `s`.
    pub const STRING: i32 = 3;
    /// `t`.
    pub const TENSOR: i32 = 4;
    /// `g`.
    pub const GRAPH: i32 = 5;
    /// `floats`.
    pub const FLOATS: i32 = 6;
    /// `ints`.
    pub const INTS: i32 = 7;
    /// `strings`.
    pub const STRINGS: i32 = 8;
}

/// A named attribute of a node.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// The attribute's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Set inside functions only (a reference to the caller's attribute).
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
    /// Which field holds the value (see [`attribute_type`]).
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    /// A float.
    #[prost(float, tag = "2")]
    pub f: f32,
    /// An integer.
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// A UTF-8 string.
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    /// A tensor.
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// A graph (subgraphs are not supported).
    #[prost(message, optional, tag = "6")]
    pub g: Option<GraphProto>,
    /// Floats.
    #[prost(float, repeated, tag = "7")]
    pub floats: Vec<f32>,
    /// Integers.
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
    /// Strings.
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    /// Tensors.
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
}

/// `TensorProto.DataType` codes Armoury reads.
pub mod data_type {
    /// f32.
    pub const FLOAT: i32 = 1;
    /// u8.
    pub const UINT8: i32 = 2;
    /// i8.
    pub const INT8: i32 = 3;
    /// u16.
    pub const UINT16: i32 = 4;
    /// i16.
    pub const INT16: i32 = 5;
    /// i32.
    pub const INT32: i32 = 6;
    /// i64.
    pub const INT64: i32 = 7;
    /// bool (one byte per element).
    pub const BOOL: i32 = 9;
    /// IEEE half precision.
    pub const FLOAT16: i32 = 10;
    /// f64.
    pub const DOUBLE: i32 = 11;
    /// u32.
    pub const UINT32: i32 = 12;
    /// u64.
    pub const UINT64: i32 = 13;
    /// bfloat16.
    pub const BFLOAT16: i32 = 16;
}

/// A serialised tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// The shape.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// The element type (see [`data_type`]).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// Float (and complex64) data.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// int32, int16, int8, uint16, uint8, bool and float16 (as bits) data.
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    /// String data.
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    /// int64 data.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// The tensor's name (an initialiser's name).
    #[prost(string, tag = "8")]
    pub name: String,
    /// Fixed-width little-endian data of any type.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    /// Double data.
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// uint32 and uint64 data.
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    /// Where external data lives (unsupported).
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// 0 = inside the file, 1 = external (unsupported).
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// A key–value pair.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A value's name and type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// The value's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// A type; only tensor types are read (the other members of the `oneof` are skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// A tensor type.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TypeProtoTensor>,
}

/// `TypeProto.Tensor`: element type and shape.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProtoTensor {
    /// The element type (see [`data_type`]).
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// The shape, if known.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// A shape whose dimensions may be symbolic.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// The dimensions.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`: a number or a name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// The dimension.
    #[prost(oneof = "DimensionValue", tags = "1, 2")]
    pub value: Option<DimensionValue>,
}

/// The value of a [`Dimension`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum DimensionValue {
    /// A fixed size.
    #[prost(int64, tag = "1")]
    DimValue(i64),
    /// A symbolic size (e.g. the batch).
    #[prost(string, tag = "2")]
    DimParam(String),
}
