//! Writing small ONNX graphs in code: one image input `x`, initialisers, nodes and one output.

use armoury::onnx::proto::{
    attribute_type as at, AttributeProto, Dimension, DimensionValue, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto,
};
use armoury::onnx::{float_tensor, int_tensor, OnnxModel};
use prost::Message;

/// A graph under construction.
pub struct Graph {
    opset: i64,
    input_dims: Vec<i64>,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    output: (String, Vec<i64>),
}

/// A value description; −1 is a symbolic dimension (`batch`).
pub fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            value: Some(if d < 0 { DimensionValue::DimParam("batch".into()) } else { DimensionValue::DimValue(d) }),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor { elem_type: 1, shape: Some(TensorShapeProto { dim }) }),
        }),
    }
}

impl Graph {
    /// An empty graph with input `x` of the given dimensions.
    pub fn new(opset: i64, input_dims: &[i64]) -> Graph {
        Graph { opset, input_dims: input_dims.to_vec(), nodes: vec![], inits: vec![], output: ("y".into(), vec![]) }
    }

    /// Appends a node.
    pub fn node(mut self, n: NodeProto) -> Graph {
        self.nodes.push(n);
        self
    }

    /// Adds a float initialiser.
    pub fn init(mut self, name: &str, shape: &[usize], data: &[f32]) -> Graph {
        self.inits.push(float_tensor(name, shape, data));
        self
    }

    /// Adds an int64 initialiser.
    pub fn init_i(mut self, name: &str, shape: &[usize], data: &[i64]) -> Graph {
        self.inits.push(int_tensor(name, shape, data));
        self
    }

    /// Names the output (empty dims: unknown shape).
    pub fn output(mut self, name: &str, dims: &[i64]) -> Graph {
        self.output = (name.into(), dims.to_vec());
        self
    }

    /// The model message.
    pub fn proto(&self) -> ModelProto {
        let mut out = value_info(&self.output.0, &self.output.1);
        if self.output.1.is_empty() {
            out.r#type = None;
        }
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto { domain: String::new(), version: self.opset }],
            producer_name: "armoury-tests".into(),
            graph: Some(GraphProto {
                node: self.nodes.clone(),
                name: "test".into(),
                initializer: self.inits.clone(),
                input: vec![value_info("x", &self.input_dims)],
                output: vec![out],
                value_info: vec![],
            }),
            ..Default::default()
        }
    }

    /// The serialised model.
    pub fn bytes(&self) -> Vec<u8> {
        self.proto().encode_to_vec()
    }

    /// Loads the serialised model.
    pub fn model(&self) -> OnnxModel {
        OnnxModel::from_bytes(&self.bytes()).expect("test graph loads")
    }
}

/// A node.
pub fn node(op: &str, inputs: &[&str], outputs: &[&str], name: &str, attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        domain: String::new(),
        attribute,
    }
}

fn attr(name: &str, r#type: i32) -> AttributeProto {
    AttributeProto { name: name.into(), r#type, ..Default::default() }
}

/// An integer attribute.
pub fn attr_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto { i: v, ..attr(name, at::INT) }
}

/// A float attribute.
pub fn attr_f(name: &str, v: f32) -> AttributeProto {
    AttributeProto { f: v, ..attr(name, at::FLOAT) }
}

/// An integer-list attribute.
pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { ints: v.to_vec(), ..attr(name, at::INTS) }
}

/// A string attribute.
pub fn attr_s(name: &str, v: &str) -> AttributeProto {
    AttributeProto { s: v.as_bytes().to_vec(), ..attr(name, at::STRING) }
}

/// A tensor attribute.
pub fn attr_t(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto { t: Some(t), ..attr(name, at::TENSOR) }
}
