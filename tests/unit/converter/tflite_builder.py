"""Writing small .tflite files with the generated FlatBuffers builder functions
(proto/tflite_schema_generated.py), for tests that compare the import against LiteRT."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flatbuffers
import numpy as np

from sporenet.proto import tflite_schema_generated as tfl

TYPES = {
    np.dtype(np.float32): tfl.TensorType.FLOAT32,
    np.dtype(np.float16): tfl.TensorType.FLOAT16,
    np.dtype(np.int32): tfl.TensorType.INT32,
    np.dtype(np.int64): tfl.TensorType.INT64,
    np.dtype(np.int8): tfl.TensorType.INT8,
    np.dtype(np.uint8): tfl.TensorType.UINT8,
    np.dtype(np.int16): tfl.TensorType.INT16,
    np.dtype(np.bool_): tfl.TensorType.BOOL,
    np.dtype(np.complex64): tfl.TensorType.COMPLEX64,
}
RESOURCE = "resource"  # the dtype of a VAR_HANDLE output
SAME = tfl.Padding.SAME


class TfliteBuilder:
    """Collects tensors and operators of one subgraph, then writes the .tflite bytes.
    `subgraph()` adds another subgraph (for CALL_ONCE, IF, WHILE) sharing the buffers."""

    def __init__(self, parent: TfliteBuilder | None = None) -> None:
        self.tensors: list[dict[str, Any]] = []
        self.buffers: list[bytes] = parent.buffers if parent else [b""]  # 0: the sentinel
        self.ops: list[tuple[int, list[int], list[int], str | None, dict[str, Any]]] = []
        # (builtin code, custom code or None, version) per operator code, shared by the
        # subgraphs
        self.codes: list[tuple[int, str | None, int]] = parent.codes if parent else []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.subgraphs: list[TfliteBuilder] = []
        self.custom_options: dict[int, bytes] = {}  # operator position -> options
        self.signatures: list[tuple[str, dict[str, int], dict[str, int]]] = []

    def subgraph(self) -> tuple[TfliteBuilder, int]:
        """A new subgraph of this model, and its subgraph index."""
        sub = TfliteBuilder(self)
        self.subgraphs.append(sub)
        return sub, len(self.subgraphs)

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        dtype: Any = np.float32,
        *,
        data: np.ndarray | None = None,
        signature: Sequence[int] | None = None,
        quant: tuple[Sequence[float], Sequence[int], int] | None = None,
        variable: bool = False,
    ) -> int:
        buffer = 0
        if data is not None:
            data = np.array(data, dtype=dtype, order="C")  # keeps 0-d scalars 0-d
            assert data.shape == tuple(shape), (name, data.shape, shape)
            self.buffers.append(data.tobytes())
            buffer = len(self.buffers) - 1
        self.tensors.append(
            {
                "name": name,
                "shape": list(shape),
                "type": tfl.TensorType.RESOURCE if dtype == RESOURCE else TYPES[np.dtype(dtype)],
                "buffer": buffer,
                "signature": signature,
                "quant": quant,
                "variable": variable,  # state a kernel keeps between invokes (zeros first)
            }
        )
        return len(self.tensors) - 1

    def input(self, name: str, shape: Sequence[int], dtype: Any = np.float32, **kw: Any) -> int:
        index = self.tensor(name, shape, dtype, **kw)
        self.inputs.append(index)
        return index

    def const(self, name: str, value: Any, dtype: Any = np.float32) -> int:
        value = np.asarray(value, dtype=dtype)
        return self.tensor(name, value.shape, dtype, data=value)

    def op(
        self,
        name: str,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options: str | None = None,
        *,
        custom_options: bytes | None = None,
        version: int = 1,
        **fields: Any,
    ) -> None:
        """An operator: `name` is a builtin ("CONV_2D") or "CUSTOM:<code>"; `version` is
        the operator code's (some kernels LiteRT registers start past 1)."""
        custom = name.split(":", 1)[1] if name.startswith("CUSTOM:") else None
        code = (
            tfl.BuiltinOperator.CUSTOM if custom else getattr(tfl.BuiltinOperator, name),
            custom,
            version,
        )
        if code not in self.codes:
            self.codes.append(code)
        if custom_options is not None:
            self.custom_options[len(self.ops)] = custom_options
        self.ops.append((self.codes.index(code), list(inputs), list(outputs), options, fields))

    def output(self, index: int) -> int:
        self.outputs.append(index)
        return index

    def signature(self, key: str, inputs: dict[str, int], outputs: dict[str, int]) -> None:
        """A SignatureDef on the subgraph: names of its own for inputs and outputs."""
        self.signatures.append((key, inputs, outputs))

    # ---- serialization
    def build(self) -> bytes:
        b = flatbuffers.Builder(1024)
        buffers = []
        for data in self.buffers:
            data_v = None
            if data:
                b.StartVector(1, len(data), 16)
                b.head = b.head - len(data)
                b.Bytes[b.head : b.head + len(data)] = data
                data_v = b.EndVector()
            tfl.BufferStart(b)
            if data_v is not None:
                tfl.BufferAddData(b, data_v)
            buffers.append(tfl.BufferEnd(b))
        subgraphs = [g._subgraph(b) for g in (self, *self.subgraphs)]
        codes = []
        for code, custom, version in self.codes:
            custom_v = b.CreateString(custom) if custom is not None else None
            tfl.OperatorCodeStart(b)
            tfl.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
            tfl.OperatorCodeAddBuiltinCode(b, code)
            tfl.OperatorCodeAddVersion(b, version)
            if custom_v is not None:
                tfl.OperatorCodeAddCustomCode(b, custom_v)
            codes.append(tfl.OperatorCodeEnd(b))
        codes_v, subgraphs_v = vector(b, codes), vector(b, subgraphs)
        buffers_v = vector(b, buffers)
        signatures_v = self._signature_defs(b)
        description = b.CreateString("sporenet test model")
        tfl.ModelStart(b)
        tfl.ModelAddVersion(b, 3)
        tfl.ModelAddOperatorCodes(b, codes_v)
        tfl.ModelAddSubgraphs(b, subgraphs_v)
        tfl.ModelAddDescription(b, description)
        tfl.ModelAddBuffers(b, buffers_v)
        if signatures_v is not None:
            tfl.ModelAddSignatureDefs(b, signatures_v)
        b.Finish(tfl.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    def _signature_defs(self, b: flatbuffers.Builder) -> int | None:
        """The SignatureDefs (all on subgraph 0), or None without any."""
        signatures = []
        for key, sig_inputs, sig_outputs in self.signatures:
            maps = []
            for names in (sig_inputs, sig_outputs):
                entries = []
                for name, index in names.items():
                    name_s = b.CreateString(name)
                    tfl.TensorMapStart(b)
                    tfl.TensorMapAddName(b, name_s)
                    tfl.TensorMapAddTensorIndex(b, index)
                    entries.append(tfl.TensorMapEnd(b))
                maps.append(vector(b, entries))
            key_s = b.CreateString(key)
            tfl.SignatureDefStart(b)
            tfl.SignatureDefAddInputs(b, maps[0])
            tfl.SignatureDefAddOutputs(b, maps[1])
            tfl.SignatureDefAddSignatureKey(b, key_s)
            tfl.SignatureDefAddSubgraphIndex(b, 0)
            signatures.append(tfl.SignatureDefEnd(b))
        return vector(b, signatures) if signatures else None

    def _subgraph(self, b: flatbuffers.Builder) -> int:
        def ints(values: Sequence[int]) -> int:
            return b.CreateNumpyVector(np.asarray(values, np.int32))

        tensors = []
        for t in self.tensors:
            name, shape = b.CreateString(t["name"]), ints(t["shape"])
            signature = ints(t["signature"]) if t["signature"] is not None else None
            quant = None
            if t["quant"] is not None:
                scale, zero, axis = t["quant"]
                scale_v = b.CreateNumpyVector(np.asarray(scale, np.float32))
                zero_v = b.CreateNumpyVector(np.asarray(zero, np.int64))
                tfl.QuantizationParametersStart(b)
                tfl.QuantizationParametersAddScale(b, scale_v)
                tfl.QuantizationParametersAddZeroPoint(b, zero_v)
                tfl.QuantizationParametersAddQuantizedDimension(b, axis)
                quant = tfl.QuantizationParametersEnd(b)
            tfl.TensorStart(b)
            tfl.TensorAddShape(b, shape)
            tfl.TensorAddType(b, t["type"])
            tfl.TensorAddBuffer(b, t["buffer"])
            tfl.TensorAddName(b, name)
            if signature is not None:
                tfl.TensorAddShapeSignature(b, signature)
            if quant is not None:
                tfl.TensorAddQuantization(b, quant)
            if t["variable"]:
                tfl.TensorAddIsVariable(b, True)
            tensors.append(tfl.TensorEnd(b))
        operators = []
        for k, (code, inputs, outputs, options, fields) in enumerate(self.ops):
            in_v, out_v = ints(inputs), ints(outputs)
            custom_v = (
                b.CreateNumpyVector(np.frombuffer(self.custom_options[k], np.uint8))
                if k in self.custom_options
                else None
            )
            table = None
            # strings (VAR_HANDLE's names) and int lists (SQUEEZE's dims) are written
            # before the table that holds them
            fields = {f: _field(b, v) for f, v in fields.items()}
            if options is not None:
                # Vector fields (SqueezeDims, NewShape) are written before the table.
                made = {
                    k: ints(v) if isinstance(v, list | tuple | np.ndarray) else v
                    for k, v in fields.items()
                }
                getattr(tfl, f"{options}Start")(b)
                for field, value in made.items():
                    getattr(tfl, f"{options}Add{field}")(b, value)
                table = getattr(tfl, f"{options}End")(b)
            tfl.OperatorStart(b)
            tfl.OperatorAddOpcodeIndex(b, code)
            tfl.OperatorAddInputs(b, in_v)
            tfl.OperatorAddOutputs(b, out_v)
            if table is not None:
                tfl.OperatorAddBuiltinOptionsType(b, getattr(tfl.BuiltinOptions, options))
                tfl.OperatorAddBuiltinOptions(b, table)
            if custom_v is not None:
                tfl.OperatorAddCustomOptions(b, custom_v)
            operators.append(tfl.OperatorEnd(b))

        tensors_v, ops_v = vector(b, tensors), vector(b, operators)
        inputs_v, outputs_v = ints(self.inputs), ints(self.outputs)
        tfl.SubGraphStart(b)
        tfl.SubGraphAddTensors(b, tensors_v)
        tfl.SubGraphAddInputs(b, inputs_v)
        tfl.SubGraphAddOutputs(b, outputs_v)
        tfl.SubGraphAddOperators(b, ops_v)
        return tfl.SubGraphEnd(b)


def _field(b: flatbuffers.Builder, value: Any) -> Any:
    if isinstance(value, str):
        return b.CreateString(value)
    if isinstance(value, (list, tuple)):
        return b.CreateNumpyVector(np.asarray(value, np.int32))
    return value


def vector(b: flatbuffers.Builder, items: list[int]) -> int:
    b.StartVector(4, len(items), 4)
    for item in reversed(items):
        b.PrependUOffsetTRelative(item)
    return b.EndVector()


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """Seeded normal float32 values of `shape`, times `scale`."""
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def run_litert(
    data: bytes, feeds: dict[str, np.ndarray], *, reference: bool = False
) -> dict[str, np.ndarray]:
    """The outputs LiteRT computes for `data` on `feeds` (by input name); with `reference`
    on TFLite's reference kernels, as int8 models must be compared (tests/references.py)."""
    from ai_edge_litert.interpreter import Interpreter  # the test extra

    from tests.references import litert_reference_interpreter

    interpreter = (
        litert_reference_interpreter(data) if reference else Interpreter(model_content=data)
    )
    for d in interpreter.get_input_details():
        if tuple(d["shape"]) != feeds[d["name"]].shape:
            interpreter.resize_tensor_input(d["index"], feeds[d["name"]].shape)
    interpreter.allocate_tensors()
    for d in interpreter.get_input_details():
        interpreter.set_tensor(d["index"], feeds[d["name"]])
    interpreter.invoke()
    return {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


def conv(
    b: TfliteBuilder,
    x: int,
    cin: int,
    cout: int,
    size: tuple[int, int],
    *,
    k: int = 3,
    stride: int = 1,
    dilation: int = 1,
    padding: int = SAME,
    act: int = 0,
    seed: int = 1,
    weights_dtype=np.float32,
) -> int:
    """A CONV_2D of `x` (NHWC, `cin` channels) with seeded weights and bias; its output
    tensor is (1, *size, cout)."""
    w = b.const(f"w{seed}", rand(cout, k, k, cin, seed=seed, scale=0.3), weights_dtype)
    if weights_dtype == np.float16:
        w16, w = w, b.tensor(f"w{seed}_dequantized", [cout, k, k, cin])
        b.op("DEQUANTIZE", [w16], [w])
    bias = b.const(f"b{seed}", rand(cout, seed=seed + 100))
    y = b.tensor(f"conv{seed}", [1, *size, cout])
    b.op(
        "CONV_2D",
        [x, w, bias],
        [y],
        "Conv2DOptions",
        Padding=padding,
        StrideW=stride,
        StrideH=stride,
        DilationWFactor=dilation,
        DilationHFactor=dilation,
        FusedActivationFunction=act,
    )
    return y
