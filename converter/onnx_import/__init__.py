"""Importing ONNX models into the sporenet IR: loading, per-op handlers, the importer."""
