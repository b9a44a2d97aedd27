"""Sample models and an unchecked serializer for the model-format and fuzz tests.

`raw_serialize` writes a Model the way lite.format.serialize does but skips validation and
lets a test override the buffer table, the tensor -> buffer map and the schema version, so
hostile files come out of the real writer rather than from hand-assembled bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from unittest import mock

import numpy as np

from sporenet.lite import format as fmt
from sporenet.lite import format_write, lowp
from sporenet.lite.builder import ModelBuilder
from sporenet.lite.graph import Graph, Model, Node, Quantization, Signature, Tensor
from sporenet.lite.ops import OpCode


def mlp_model() -> Model:
    """x[-1, 4] -> FullyConnected(relu) -> Softmax, with two float32 weights."""
    b = ModelBuilder(description="tiny mlp")
    x = b.input("x", (-1, 4))
    w = b.constant("fc.weight", np.arange(12, dtype=np.float32).reshape(3, 4) / 10, trainable=True)
    bias = b.constant("fc.bias", np.array([0.5, -0.5, 0.0], np.float32), trainable=True)
    y = b.op(OpCode.FULLY_CONNECTED, [x, w, bias], activation="relu")
    b.output(b.op(OpCode.SOFTMAX, [y], axis=-1), name="probs")
    b.metadata["labels"] = "cat,dog,bird"
    return b.build()


def rich_model() -> Model:
    """Every feature of the format: dtypes, scalars, empty tensors, quantization, all
    attribute kinds, several graphs and signatures, metadata, dynamic dims."""
    rng = np.random.default_rng(0)
    special = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, 3.4e38], np.float32)
    special_bits = special.view(np.uint32).copy()
    special_bits[0] = 0x7FC0_1234  # a NaN payload must survive bit for bit
    constants = {
        "w_f32": rng.normal(size=(8, 4)).astype(np.float32),
        "special": special_bits.view(np.float32),
        "w_f16": rng.normal(size=(3, 5)).astype(np.float16),
        "w_f64": rng.normal(size=(2, 2)),
        "w_i8": rng.integers(-128, 127, size=(4, 3), dtype=np.int8),
        "w_u8": rng.integers(0, 255, size=(7,), dtype=np.uint8),
        "w_i16": rng.integers(-999, 999, size=(2, 3), dtype=np.int16),
        "w_i32": rng.integers(-999, 999, size=(5,), dtype=np.int32),
        "w_i64": np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max]),
        "mask": rng.random((3, 3)) > 0.5,
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }
    tensors = [
        Tensor("x", np.dtype(np.float32), (-1, 4)),
        Tensor("y", np.dtype(np.float32), (-1, 8)),
        Tensor("z", np.dtype(np.float32), (-1, 8)),
    ]
    for name, value in constants.items():
        quant = None
        if name == "w_i8":
            quant = Quantization(
                scale=np.array([0.1, 0.2, 0.3], np.float32),
                zero_point=np.array([0, 1, -1], np.int64),
                axis=1,
                min=np.array([-1.0], np.float32),
                max=np.array([1.0], np.float32),
            )
        tensors.append(
            Tensor(
                name,
                value.dtype,
                value.shape,
                data=value,
                quantization=quant,
                trainable=name == "w_f32",
            )
        )
    w = [t.name for t in tensors].index("w_f32")
    nodes = [
        Node(
            OpCode.MATMUL,
            [0, w],
            [1],
            name="mm",
            attrs={
                "transpose_b": 1,
                "alpha": 1.0,
                "mode": "fast",
                "perm": [1, 0, -1],
                "scales": [0.5, 2.0],
            },
        ),
        Node(OpCode.RELU, [1], [2], name="act", version=1),
    ]
    main = Graph("main", inputs=[0], outputs=[2], nodes=nodes)
    head = Graph("head", inputs=[0], outputs=[1], nodes=[nodes[0]])
    return Model(
        tensors=tensors,
        graphs=[main, head],
        signatures={
            "infer": Signature("infer", 0, {"input": 0}, {"output": 2}),
            "features": Signature("features", 1, {"input": 0}, {"hidden": 1}),
        },
        metadata={"labels": "é,ü,中", "normalization": '{"mean": [0.5]}'},
        producer="tests",
        producer_version="9.9",
        description="rich model",
    )


def raw_serialize(
    model: Model,
    *,
    ranges: Sequence[tuple[int, int]] | None = None,
    tensor_buffer: Sequence[int] | None = None,
    schema_version: int | None = None,
    pad_to: int | None = None,
) -> bytes:
    """The bytes serialize() would write, without validating the model first.

    `ranges`/`tensor_buffer` replace the buffer table and the tensor -> buffer map (weights
    are then laid out as usual but the table may point anywhere); `pad_to` sets the file
    length (truncating or zero-padding the weight segment).
    """
    blobs = [np.ascontiguousarray(t.data) for t in model.tensors if t.data is not None]
    default_map, k = [], 0
    for t in model.tensors:
        k += t.data is not None
        default_map.append(k if t.data is not None else 0)
    tmap = list(tensor_buffer) if tensor_buffer is not None else default_map
    placeholder = [(0, 0)] * (len(ranges) if ranges is not None else len(blobs) + 1)
    with mock.patch.object(
        format_write,
        "SCHEMA_VERSION",
        fmt.SCHEMA_VERSION if schema_version is None else schema_version,
    ):
        head_size = len(fmt._Writer(model, list(placeholder), tmap).build())
        offset = fmt._align(head_size)
        layout: list[tuple[int, int]] = [(0, 0)]
        for blob in blobs:
            layout.append((offset, blob.nbytes))
            offset = fmt._align(offset + blob.nbytes)
        table = list(ranges) if ranges is not None else layout
        head = fmt._Writer(model, table, tmap).build()
    out = bytearray(max(offset, len(head)))
    out[: len(head)] = head
    for (start, size), blob in zip(layout[1:], blobs, strict=True):
        out[start : start + size] = blob.tobytes()
    if pad_to is not None:
        out = out[:pad_to] + bytearray(max(0, pad_to - len(out)))
    return bytes(out)


def weight_end(data: bytes) -> int:
    """One past the last byte any buffer of `data` (a valid model file) refers to."""
    from sporenet.proto import model_generated as fb

    root = fb.Model.GetRootAs(data, 0)
    ends = [root.Buffers(i).Offset() + root.Buffers(i).Size() for i in range(root.BuffersLength())]
    return max(ends, default=0)


def strings_model() -> Model:
    """Text in and out: STRING constants (empty, multi-byte and long texts) read by
    LABEL_ENCODER, category names -> ids -> names."""
    names = np.array(["", "é", "中文", "x" * 300, "cat"], dtype=object)
    ids = np.arange(5, dtype=np.int64)
    b = ModelBuilder(description="strings")
    x = b.input("category", (-1,), dtype=object)
    keys = b.constant("names", names)
    values = b.constant("ids", ids)
    missing = b.constant("missing", np.array(-1, np.int64))
    encoded = b.op(OpCode.LABEL_ENCODER, [x, keys, values, missing])
    fallback = b.constant("unknown", np.array("?", dtype=object))
    back = b.op(OpCode.LABEL_ENCODER, [encoded, values, keys, fallback])
    b.output(encoded, name="id")
    b.output(back, name="name")
    return b.build()


def lowp_model() -> Model:
    """Low-precision element types in and out (lite/lowp.py): a bfloat16 input cast to
    float32 and added to a float8 constant; an odd-sized int4 constant (packed nibbles,
    the last byte half used) and a uint2 one cast up and added; the sum cast to bfloat16."""
    b = ModelBuilder(description="low precision")
    x = b.input("x", (2, 3), dtype=lowp.BFLOAT16)
    f8 = b.constant("f8", lowp.encode(np.linspace(-3, 3, 6).reshape(2, 3), lowp.FLOAT8E4M3FN))
    i4 = b.constant("i4", lowp.encode(np.array([[-8, -1, 7], [0, 3, -5]]), lowp.INT4))
    u2 = b.constant("u2", lowp.encode(np.array([[0, 1, 2], [3, 2, 1]]), lowp.UINT2))
    wide = b.op(OpCode.CAST, [x], to=1)
    total = b.op(OpCode.ADD, [wide, b.op(OpCode.CAST, [f8], to=1)])
    ints = b.op(OpCode.ADD, [b.op(OpCode.CAST, [i4], to=1), b.op(OpCode.CAST, [u2], to=1)])
    b.output(b.op(OpCode.CAST, [b.op(OpCode.ADD, [total, ints])], to=16), name="y")
    b.output(b.op(OpCode.CAST, [wide], to=22), name="as_int4")
    return b.build()
