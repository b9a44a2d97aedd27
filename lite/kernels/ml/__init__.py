"""Kernels of classic machine learning (ONNX's ai.onnx.ml): tree ensembles, linear and
support vector classifiers, label encoding. Their semantics follow onnxruntime, the
reference that scikit-learn exports are checked against."""
