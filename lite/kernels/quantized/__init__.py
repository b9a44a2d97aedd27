"""int8/uint8 kernels with TFLite's integer semantics (one module per family).

An op's int8 kernel is declared with the op (lite/opset/); QUANTIZED_KERNELS is their view, the
planner picks from it when a node's first input is a quantized int8/uint8 tensor.
"""
