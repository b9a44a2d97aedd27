"""ONNX op handlers, one module per op family; the registry lists them explicitly."""
