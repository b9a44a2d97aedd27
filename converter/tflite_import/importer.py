"""A parsed .tflite model -> sporenet IR Model: inputs, constants, per-op handlers, outputs."""

from __future__ import annotations

import struct
from collections import Counter

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.tflite_import.layout import LayoutContext, identity, quantization
from sporenet.converter.tflite_import.ops import HANDLERS
from sporenet.converter.tflite_import.reader import TfliteModel
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import DYNAMIC, Model


class UnsupportedTfliteOpError(ConversionError):
    """The model uses TFLite builtin ops the converter cannot import; all are listed."""

    def __init__(self, ops: Counter[str]) -> None:
        self.ops = dict(sorted(ops.items()))
        listed = ", ".join(f"{name} (x{count})" for name, count in self.ops.items())
        super().__init__(
            f"{len(self.ops)} unsupported TFLite op type(s) in {sum(ops.values())} "
            f"operator(s): {listed}. Supported: {', '.join(supported_tflite_ops())}."
        )


def supported_tflite_ops() -> list[str]:
    """TFLite builtin op names the converter imports, sorted."""
    return sorted(HANDLERS)


def _check(model: TfliteModel) -> None:
    """Refuse, all at once, the ops without a handler and the tensors the IR cannot hold."""
    unsupported = Counter(op.op for op in model.operators if op.op not in HANDLERS)
    if unsupported:
        raise UnsupportedTfliteOpError(unsupported)
    used = {i for op in model.operators for i in (*op.inputs, *op.outputs) if i != -1}
    used.update(model.inputs)
    bad = sorted(
        {
            f"{model.tensors[i].name!r} ({model.tensors[i].type_name})"
            for i in used
            if model.tensors[i].dtype is None
        }
    )
    if bad:
        raise ConversionError(f"tensors of types the IR cannot store: {', '.join(bad)}")
    sparse = sorted(model.tensors[i].name for i in used if model.tensors[i].sparse)
    if sparse:
        raise ConversionError(f"sparse TFLite tensors are not supported: {', '.join(sparse)}")


def import_tflite(model: TfliteModel) -> Model:
    """Translate the model's first subgraph into an IR Model."""
    _check(model)
    dynamic = any(DYNAMIC in model.tensors[i].signature for i in model.inputs)
    ctx = ImportContext(dynamic=dynamic, reserved=[model.tensors[i].name for i in model.inputs])
    lc = LayoutContext(model, ctx)
    for i in model.inputs:
        t = model.tensors[i]
        if t.data is not None:
            raise ConversionError(f"graph input {t.name!r} has constant data")
        if t.dtype is None:
            raise ConversionError(f"graph input {t.name!r} has type {t.type_name}")
        ir = ctx.graph_input(t.name, t.signature, t.dtype)
        lc.set_quantization(ir, quantization(t.quant, identity(len(t.shape))))
        lc.set(i, ir)
    for op in model.operators:
        lc.op = op
        ctx.where = f"operator {op.index} ({op.op})"
        for i in op.inputs:
            if i == -1 or i in lc.held:
                continue
            t = model.tensors[i]
            if t.data is None:
                raise lc.fail(
                    f"input {t.name!r} is neither a graph input, a constant nor "
                    "the output of an earlier operator"
                )
            ir = ctx.constant(t.name, t.data)
            lc.set_quantization(ir, quantization(t.quant, identity(len(t.shape))))
            lc.set(i, ir)
        try:
            HANDLERS[op.op](lc, op)
        except ConversionError as exc:
            message = str(exc)
            raise ConversionError(
                message if message.startswith(ctx.where) else f"{ctx.where}: {message}"
            ) from None
        except (struct.error, AttributeError) as exc:
            # Options are read lazily from the file: out of its bounds, or a table of
            # another op's options (the reader checks indices and buffers, not these).
            raise ConversionError(
                f"{ctx.where}: malformed operator options ({type(exc).__name__}: {exc})"
            ) from None
        except (ArithmeticError, LookupError, TypeError, ValueError, LiteError) as exc:
            raise ConversionError(
                f"{ctx.where}: cannot convert: {type(exc).__name__}: {exc}"
            ) from exc
        missing = [model.tensors[o].name for o in op.outputs if o not in lc.held]
        if missing:
            raise lc.fail(f"outputs {missing} were not produced")
    lc.op = None
    outputs: dict[str, int] = {}
    for i in model.outputs:
        if i not in lc.held:
            raise ConversionError(f"graph output {model.tensors[i].name!r} is not computed")
        index = lc.get(i)
        if index not in ctx.inputs:
            ctx.rename(index, model.tensors[i].name)
        outputs[ctx.tensors[index].name] = index
    return ctx.build(outputs, producer="sporenet-convert (tflite)", description=model.description)
