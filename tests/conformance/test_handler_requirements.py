"""Every import handler declares exactly the IR ops it emits.

The ONNX handlers' `requires` and the TFLite handlers' `emits` decide which ops the
converter offers (an op is listed only when the runtime has a kernel for each of them).
Here every model of the two conformance suites (ONNX's backend node tests, the generated
single-op TFLite cases) is imported with the emitted ops recorded per handler, and for
each handler the union of what it emitted must equal what it declares: an undeclared op
is a promise the listing cannot check; a declared op never emitted is a stale entry.
Branches the suites do not reach are listed in NOT_IN_SUITE, each with the input that
takes them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from sporenet.lite.ops import OpCode

O = OpCode  # noqa: E741 - the tables below read as the registries do

# ONNX handler -> declared ops no backend node case reaches, and the input that does.
ONNX_NOT_IN_SUITE: dict[str, tuple[set[OpCode], str]] = {
    "Gemm": ({O.FULLY_CONNECTED}, "a constant B (the suite feeds B as an input)"),
    "MatMul": ({O.FULLY_CONNECTED, O.TRANSPOSE}, "a constant 2-D B, or one computed at load"),
    "MatMulInteger": ({O.FULLY_CONNECTED}, "a constant 2-D B"),
    "Clip": ({O.CLIP}, "constant bounds (the suite feeds them as inputs)"),
    "CumSum": ({O.MATMUL, O.TRANSPOSE}, "a constant axis (the suite feeds it as an input)"),
    "Hardmax": ({O.FLATTEN, O.RESHAPE}, "opset < 13 on a 3-D input (2-D coercion)"),
    "Softmax": ({O.FLATTEN, O.RESHAPE}, "opset < 13 on a 3-D input (2-D coercion)"),
    "LogSoftmax": ({O.FLATTEN, O.RESHAPE}, "opset < 13 on a 3-D input (2-D coercion)"),
    "ConvTranspose": ({O.ADD}, "a bias (input 2)"),
    "RMSNormalization": ({O.CAST}, "a stash_type wider than the input"),
    "QuantizeLinear": ({O.QUANTIZE}, "an activation's QDQ pair (a float graph input)"),
    "DequantizeLinear": ({O.DEQUANTIZE}, "an activation's QDQ pair"),
    "QLinearConv": ({O.DEQUANTIZE, O.QUANTIZE, O.RESHAPE}, "per-channel or computed params"),
    "QLinearMatMul": (
        {O.DEQUANTIZE, O.FULLY_CONNECTED, O.QUANTIZE, O.RESHAPE},
        "a constant B, or computed params",
    ),
    "ai.onnx.ml.TreeEnsemble": ({O.FLATTEN, O.UNSQUEEZE}, "a 1-D or 3-D feature input"),
    "ai.onnx.ml.ArrayFeatureExtractor": ({O.CAST, O.RESHAPE, O.UNSQUEEZE}, "a 1-D input"),
}
ONNX_ANY = {O.CAST}  # widening low-precision inputs (lowp_compute) to a computed dtype


def _mismatches(
    emitted: dict[str, set[OpCode]],
    declared: dict[str, set[OpCode]],
    allowed: set[OpCode],
    not_in_suite: dict[str, tuple[set[OpCode], str]],
) -> dict[str, Any]:
    wrong: dict[str, Any] = {}
    for name, ops in sorted(emitted.items()):
        want = declared[name]
        extra = ops - want - allowed
        unused = want - ops - not_in_suite.get(name, (set(), ""))[0]
        if extra or unused:
            wrong[name] = {
                "undeclared": sorted(o.name for o in extra),
                "never emitted": sorted(o.name for o in unused),
            }
    return wrong


def test_onnx_handlers_declare_the_ops_they_emit() -> None:
    from sporenet.converter.onnx_import.importer import import_onnx, recording_emitted_ops
    from sporenet.converter.onnx_import.registry import HANDLERS
    from tests.conformance import onnx_backend as ob

    with recording_emitted_ops() as emitted:
        for case in ob.iter_cases(("node",)):
            model = case.model
            if model is None or not all(ob.is_supported(op) for op in ob.case_ops(model)):
                continue
            with contextlib.suppress(Exception):  # a failing case still recorded its ops
                import_onnx(model)
    declared = {name: set(h.requires) for name, h in HANDLERS.items()}
    assert _mismatches(emitted, declared, ONNX_ANY, ONNX_NOT_IN_SUITE) == {}
    stale = sorted(n for n in ONNX_NOT_IN_SUITE if n not in HANDLERS)
    assert not stale, f"NOT_IN_SUITE names handlers that no longer exist: {stale}"


def test_tflite_handlers_declare_the_ops_they_emit() -> None:
    from sporenet.converter import supported_tflite_ops
    from sporenet.converter.tflite_import.importer import import_tflite
    from sporenet.converter.tflite_import.ops import HANDLERS, LAYOUT, RUNS_SUBGRAPHS
    from sporenet.converter.tflite_import.reader import read_tflite
    from tests.conformance.tflite_cases import cases
    from tests.conformance.tflite_suite import build

    claimed = frozenset(supported_tflite_ops())
    emitted: dict[str, set[OpCode]] = {}
    for case in cases():
        if case.op not in claimed or case.slow:
            continue
        data, _ = build(case)
        with contextlib.suppress(Exception):  # a failing case still recorded its ops
            import_tflite(read_tflite(data), emitted=emitted)
    for name in RUNS_SUBGRAPHS:
        emitted.pop(name, None)  # their subgraphs' operators are recorded under their own names
    declared = {name: set(e.emits) for name, e in HANDLERS.items()}
    assert _mismatches(emitted, declared, set(LAYOUT), TFLITE_NOT_IN_SUITE) == {}


# TFLite handler -> declared ops no generated case reaches, and the input that does.
_ACTS = {O.RELU, O.RELU6, O.TANH, O.CLIP}  # float fused activations run as their own nodes
TFLITE_NOT_IN_SUITE: dict[str, tuple[set[OpCode], str]] = {
    **{
        name: ({O.TANH, O.CLIP}, "fused TANH or RELU_N1_TO_1 on a float op")
        for name in ("ADD", "SUB", "MUL", "DIV")
    },
    **{
        name: (_ACTS, "a fused activation on a float op")
        for name in ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D", "CONCATENATION")
    },
    "TRANSPOSE_CONV": (_ACTS | {O.ADD}, "a float bias, a fused activation"),
    "BATCH_TO_SPACE_ND": ({O.SLICE}, "nonzero crops"),
    "SPACE_TO_BATCH_ND": ({O.PAD}, "nonzero paddings"),
    "CAST": ({O.COMPLEX_PART}, "a complex64 input"),
    "SOFTMAX": ({O.MUL}, "beta other than 1"),
    "QUANTIZE": ({O.REQUANTIZE}, "an int8 input"),
    "FILL": ({O.EXPAND}, "dims computed at run time"),
    "SHAPE": ({O.SHAPE, O.GATHER, O.EXPAND}, "a dynamic dimension"),
    "ZEROS_LIKE": ({O.SHAPE, O.EXPAND}, "a dynamic dimension"),
}
