//! Reading a node's attributes: typed getters that remember what was read, so that any attribute an operator
//! does not understand becomes an error naming it.

use std::cell::RefCell;
use std::collections::HashSet;

use super::proto::{attribute_type as at, AttributeProto, NodeProto};
use super::value::{decode_tensor, Value};
use crate::{Error, Result};

/// Who a node is, for error messages.
#[derive(Clone, Debug)]
pub(crate) struct NodeInfo {
    /// The node's name (or, if it has none, its first output's name).
    pub(crate) name: String,
    /// The operator type.
    pub(crate) op: String,
    /// The default-domain opset of the model.
    pub(crate) opset: i64,
}

impl NodeInfo {
    pub(crate) fn new(node: &NodeProto, opset: i64) -> NodeInfo {
        let name = if node.name.is_empty() {
            node.output.first().map(|o| format!("<output {o}>")).unwrap_or_default()
        } else {
            node.name.clone()
        };
        NodeInfo { name, op: node.op_type.clone(), opset }
    }

    /// An [`Error::UnsupportedOnnx`] about `what` in this node.
    pub(crate) fn unsupported(&self, what: impl Into<String>) -> Error {
        Error::UnsupportedOnnx { what: what.into(), node: self.name.clone(), op: self.op.clone(), opset: self.opset }
    }

    /// An [`Error::BadFile`] about this node (a malformed model).
    pub(crate) fn malformed(&self, msg: impl AsRef<str>) -> Error {
        Error::bad_file("<onnx model>", format!("node '{}' ({}): {}", self.name, self.op, msg.as_ref()))
    }
}

/// The attributes of one node.
pub(crate) struct Attrs<'a> {
    /// The node, for error messages and the opset.
    pub(crate) info: &'a NodeInfo,
    /// The node itself (its outputs, for operators with optional ones).
    pub(crate) node: &'a NodeProto,
    attrs: &'a [AttributeProto],
    read: RefCell<HashSet<&'a str>>,
}

fn kind_of(a: &AttributeProto) -> i32 {
    if a.r#type != at::UNDEFINED {
        return a.r#type;
    }
    // IR version 1: infer from the field in use.
    if a.t.is_some() {
        at::TENSOR
    } else if !a.ints.is_empty() {
        at::INTS
    } else if !a.floats.is_empty() {
        at::FLOATS
    } else if !a.s.is_empty() {
        at::STRING
    } else if a.f != 0.0 {
        at::FLOAT
    } else {
        at::INT
    }
}

impl<'a> Attrs<'a> {
    pub(crate) fn new(info: &'a NodeInfo, node: &'a NodeProto) -> Attrs<'a> {
        Attrs { info, node, attrs: &node.attribute, read: RefCell::new(HashSet::new()) }
    }

    fn get(&self, name: &str, kind: i32) -> Result<Option<&'a AttributeProto>> {
        let Some(a) = self.attrs.iter().find(|a| a.name == name) else { return Ok(None) };
        self.read.borrow_mut().insert(a.name.as_str());
        if !a.ref_attr_name.is_empty() {
            return Err(self.info.unsupported(format!("attribute reference {name} → {}", a.ref_attr_name)));
        }
        if kind_of(a) != kind {
            return Err(self.info.malformed(format!("attribute {name} has type {}, expected {kind}", kind_of(a))));
        }
        Ok(Some(a))
    }

    /// Marks an attribute as understood without reading it (one that does not change inference).
    pub(crate) fn ignore(&self, name: &str) {
        if let Some(a) = self.attrs.iter().find(|a| a.name == name) {
            self.read.borrow_mut().insert(a.name.as_str());
        }
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.attrs.iter().any(|a| a.name == name)
    }

    pub(crate) fn int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.get(name, at::INT)?.map_or(default, |a| a.i))
    }

    pub(crate) fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        Ok(self.get(name, at::INT)?.map(|a| a.i))
    }

    pub(crate) fn float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.get(name, at::FLOAT)?.map_or(default, |a| a.f))
    }

    pub(crate) fn opt_float(&self, name: &str) -> Result<Option<f32>> {
        Ok(self.get(name, at::FLOAT)?.map(|a| a.f))
    }

    pub(crate) fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self.get(name, at::INTS)?.map(|a| a.ints.clone()))
    }

    pub(crate) fn floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        Ok(self.get(name, at::FLOATS)?.map(|a| a.floats.clone()))
    }

    pub(crate) fn string(&self, name: &str, default: &str) -> Result<String> {
        match self.get(name, at::STRING)? {
            Some(a) => String::from_utf8(a.s.clone()).map_err(|_| self.info.malformed(format!("{name} is not UTF-8"))),
            None => Ok(default.to_string()),
        }
    }

    pub(crate) fn tensor(&self, name: &str) -> Result<Option<Value>> {
        match self.get(name, at::TENSOR)? {
            Some(a) => {
                let t = a.t.as_ref().ok_or_else(|| self.info.malformed(format!("attribute {name} has no tensor")))?;
                Ok(Some(decode_tensor(t, &self.info.name)?))
            }
            None => Ok(None),
        }
    }

    /// Fails on the first attribute nobody read.
    pub(crate) fn finish(&self) -> Result<()> {
        let read = self.read.borrow();
        match self.attrs.iter().find(|a| !read.contains(a.name.as_str())) {
            Some(a) => Err(self.info.unsupported(format!("attribute '{}'", a.name))),
            None => Ok(()),
        }
    }
}
