//! Model files: safetensors (and, later, ONNX import).
