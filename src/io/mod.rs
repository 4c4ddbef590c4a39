//! Model files: safetensors (and, later, ONNX import).

mod safetensors;

pub use self::safetensors::{
    load_module, load_module_from, load_tensors, load_tensors_any, read_i64, save_module, save_module_with_metadata,
    save_tensors, save_tensors_any, AnyTensor, SafetensorsFile,
};
