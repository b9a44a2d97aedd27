"""int8/uint8 kernels with TFLite's integer semantics (one module per family).

The registry QUANTIZED_KERNELS lives in lite/kernels/__init__.py beside KERNELS; the
planner picks from it when a node's first input is a quantized int8/uint8 tensor.
"""
