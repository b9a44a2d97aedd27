"""The .spore format: round trips (bytes, path, mmap) with bit-identical, zero-copy, aligned
weights, and one clear ModelFormatError for every documented kind of malformed file."""

from __future__ import annotations

import dataclasses
import mmap
import os
from unittest import mock

import numpy as np
import pytest

from sporenet.lite import (
    Interpreter,
    ModelFormatError,
    OpCode,
    ShapeError,
    format_write,
    load,
    parse,
    save,
    serialize,
)
from sporenet.lite.format import ALIGNMENT, FILE_IDENTIFIER, SCHEMA_VERSION
from sporenet.lite.graph import Graph, Model, Node, Signature, Tensor
from sporenet.proto import model_generated as fb
from tests.unit.lite.format_samples import mlp_model, raw_serialize, rich_model, weight_end


def _base(array: np.ndarray) -> object:
    """The object at the bottom of an array's .base chain (the buffer it views)."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _assert_same_model(a: Model, b: Model) -> None:
    assert len(a.tensors) == len(b.tensors)
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        assert (ta.name, ta.dtype, tuple(ta.shape), ta.trainable) == (
            tb.name,
            tb.dtype,
            tuple(tb.shape),
            tb.trainable,
        )
        assert (ta.data is None) == (tb.data is None)
        if ta.data is not None:
            assert tb.data.shape == ta.data.shape and tb.data.dtype == ta.data.dtype
            assert tb.data.tobytes() == np.ascontiguousarray(ta.data).tobytes()  # bit-identical
        assert (ta.quantization is None) == (tb.quantization is None)
        if ta.quantization is not None:
            qa, qb = ta.quantization, tb.quantization
            np.testing.assert_array_equal(qa.scale, qb.scale)
            np.testing.assert_array_equal(qa.zero_point, qb.zero_point)
            np.testing.assert_array_equal(qa.min, qb.min)
            np.testing.assert_array_equal(qa.max, qb.max)
            assert qa.axis == qb.axis
    assert len(a.graphs) == len(b.graphs)
    for ga, gb in zip(a.graphs, b.graphs, strict=True):
        assert (ga.name, ga.inputs, ga.outputs) == (gb.name, gb.inputs, gb.outputs)
        for na, nb in zip(ga.nodes, gb.nodes, strict=True):
            assert (na.op, na.inputs, na.outputs, na.version, na.name) == (
                nb.op,
                nb.inputs,
                nb.outputs,
                nb.version,
                nb.name,
            )
            assert na.attrs == nb.attrs
            assert [type(v) for v in na.attrs.values()] == [type(v) for v in nb.attrs.values()]
    assert a.signatures == b.signatures
    assert a.metadata == b.metadata
    assert (a.producer, a.producer_version, a.description) == (
        b.producer,
        b.producer_version,
        b.description,
    )


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("make", [mlp_model, rich_model])
def test_round_trip_through_bytes(make):
    model = make()
    data = serialize(model)
    assert data[4:8] == FILE_IDENTIFIER
    _assert_same_model(model, parse(data))
    assert serialize(parse(data)) == data  # parse and serialize are inverse and deterministic


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_parse_is_zero_copy_over_the_callers_buffer(kind):
    data = kind(serialize(rich_model()))
    model = parse(data)
    backing = np.frombuffer(data, np.uint8)
    for t in model.tensors:
        if t.data is not None and t.data.size:
            assert np.shares_memory(t.data, backing), t.name
            assert not t.data.flags.writeable  # weights are read-only views of the file


def test_weights_are_64_byte_aligned_in_the_file():
    data = serialize(rich_model())
    root = fb.Model.GetRootAs(data, 0)
    assert root.Buffers(0).Size() == 0  # the empty sentinel
    offsets = [root.Buffers(i).Offset() for i in range(1, root.BuffersLength())]
    assert len(offsets) == 12 and all(o % ALIGNMENT == 0 for o in offsets)
    model = parse(data)
    start = np.frombuffer(data, np.uint8).ctypes.data
    for t in model.tensors:
        if t.data is not None and t.data.size:
            assert (t.data.ctypes.data - start) % ALIGNMENT == 0, t.name


def test_save_then_load_memory_maps_the_weights(tmp_path):
    model = rich_model()
    path = save(model, tmp_path / "m.spore")
    assert path == tmp_path / "m.spore"
    assert path.read_bytes() == serialize(model)
    assert [p.name for p in tmp_path.iterdir()] == ["m.spore"]  # no temporary file left
    loaded = load(path)
    _assert_same_model(model, loaded)
    w = loaded.tensors[loaded.tensor_index("w_f32")].data
    mm = _base(w)
    assert isinstance(mm, mmap.mmap)
    assert np.shares_memory(w, np.frombuffer(mm, np.uint8))
    assert (w.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data) % ALIGNMENT == 0
    with pytest.raises(ValueError, match="read-only"):
        w[0, 0] = 1


def test_load_str_path_without_mmap_and_model_passthrough(tmp_path):
    model = mlp_model()
    path = str(save(model, tmp_path / "m.spore"))
    loaded = load(path, use_mmap=False)
    _assert_same_model(model, loaded)
    assert isinstance(_base(loaded.tensors[1].data), bytes)
    assert load(loaded) is loaded


def test_save_replaces_an_existing_file(tmp_path):
    path = tmp_path / "m.spore"
    path.write_bytes(b"old junk")
    save(mlp_model(), path)
    _assert_same_model(mlp_model(), load(path))


def test_saved_model_runs_like_the_built_one(tmp_path):
    model = mlp_model()
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    expected = Interpreter(model=model).run({"x": x})["probs"]
    path = save(model, tmp_path / "m.spore")
    np.testing.assert_array_equal(Interpreter(model_path=path).run({"x": x})["probs"], expected)
    content = Interpreter(model_content=serialize(model)).run({"x": x})["probs"]
    np.testing.assert_array_equal(content, expected)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="model file not found"):
        load(tmp_path / "nope.spore")


# --------------------------------------------------------------------------- damaged files


def test_empty_and_tiny_files(tmp_path):
    for data in (b"", b"SPOR", b"\x00" * 7):
        with pytest.raises(ModelFormatError, match=f"file is {len(data)} bytes"):
            parse(data)
    empty = tmp_path / "empty.spore"
    empty.write_bytes(b"")
    with pytest.raises(ModelFormatError, match="file is 0 bytes"):
        load(empty)


@pytest.mark.parametrize("make", [mlp_model, rich_model])
def test_truncated_at_every_cut_point(make):
    data = serialize(make())
    needed = weight_end(data)
    for cut in range(len(data)):
        if cut < needed:
            with pytest.raises(ModelFormatError):
                parse(data[:cut])
        else:  # only alignment padding after the last weight was cut: still a valid model
            parse(data[:cut])


def test_truncated_weights_name_the_buffer():
    data = serialize(mlp_model())
    with pytest.raises(
        ModelFormatError,
        match=r"buffer 2: bytes \d+\.\.\d+ lie outside the "
        r"\d+-byte file",
    ):
        parse(data[: weight_end(data) - 1])


def test_wrong_identifier():
    data = bytearray(serialize(mlp_model()))
    data[4:8] = b"TFL3"
    with pytest.raises(
        ModelFormatError,
        match=r"file identifier is b'TFL3', expected "
        r"b'SPOR' \(this is a TFLite model: convert it with `sporenet-convert",
    ):
        parse(bytes(data))
    with pytest.raises(ModelFormatError, match=r"\(not a \.spore model\)"):
        parse(b"PK\x03\x04" + bytes(100))  # a zip file, say
    onnx_head = b"\x08\x08\x12\x07pytorch"  # ir_version 8, producer_name "pytorch"
    with pytest.raises(ModelFormatError, match="this looks like an ONNX model: convert it"):
        parse(onnx_head + bytes(100))


def test_root_offset_outside_the_file():
    data = bytearray(serialize(mlp_model()))
    data[0:4] = (len(data) + 100).to_bytes(4, "little")
    with pytest.raises(ModelFormatError, match=r"root table offset \d+ lies outside the "):
        parse(bytes(data))


@pytest.mark.parametrize("shift", [-(1 << 30), 1 << 30])
def test_root_vtable_outside_the_file(shift):
    data = bytearray(serialize(mlp_model()))
    root = int.from_bytes(data[0:4], "little")
    # A table's first word is the signed distance back to its vtable.
    data[root : root + 4] = (root - shift).to_bytes(4, "little", signed=True)
    with pytest.raises(ModelFormatError, match=r"model: table at offset \d+ has its vtable at "):
        parse(bytes(data))


def test_buffer_offset_outside_the_file():
    model = mlp_model()
    data = raw_serialize(model, ranges=[(0, 0), (1 << 40, 48), (0, 12)])
    with pytest.raises(
        ModelFormatError,
        match=r"buffer 1: bytes 1099511627776\.\.\d+ lie "
        r"outside the \d+-byte file",
    ):
        parse(data)
    huge = raw_serialize(model, ranges=[(0, 0), (64, (1 << 64) - 1), (0, 12)])
    with pytest.raises(ModelFormatError, match=r"buffer 1: bytes 64\.\.\d+ lie outside"):
        parse(huge)


def test_buffer_zero_must_be_the_empty_sentinel():
    data = raw_serialize(mlp_model(), ranges=[(0, 8), (1088, 48), (1152, 12)])
    with pytest.raises(ModelFormatError, match="buffer 0 must be the empty sentinel"):
        parse(data)


def test_tensor_buffer_index_out_of_range():
    data = raw_serialize(mlp_model(), tensor_buffer=[0, 1, 7, 0, 0])
    with pytest.raises(
        ModelFormatError,
        match=r"tensor 2 \('fc\.bias'\): buffer index 7 out "
        r"of range \(the model has 3\)",
    ):
        parse(data)


def test_buffer_shorter_than_shape_times_dtype():
    good = serialize(mlp_model())
    root = fb.Model.GetRootAs(good, 0)
    w_offset = root.Buffers(1).Offset()
    data = raw_serialize(mlp_model(), ranges=[(0, 0), (w_offset, 44), (0, 12)])
    with pytest.raises(
        ModelFormatError,
        match=r"tensor 1 \('fc\.weight'\): buffer 1 holds 44 "
        r"bytes but shape \(3, 4\) x float32 needs 48",
    ):
        parse(data)


def test_constant_with_dynamic_shape_and_bad_dims():
    model = mlp_model()
    weight = model.tensors[1]
    model.tensors[1] = dataclasses.replace(weight, shape=(-1, 4))
    with pytest.raises(ModelFormatError, match="a constant tensor needs a static shape"):
        parse(raw_serialize(model))
    model.tensors[1] = dataclasses.replace(weight, data=None, shape=(-2, 4))
    with pytest.raises(ModelFormatError, match=r"shape \(-2, 4\) has a negative dimension"):
        parse(raw_serialize(model, tensor_buffer=[0] * 5))
    model.tensors[1] = dataclasses.replace(weight, data=None, shape=(1,) * 17)
    with pytest.raises(ModelFormatError, match="rank 17 exceeds the maximum 16"):
        parse(raw_serialize(model, tensor_buffer=[0] * 5))


def test_unknown_dtype_code():
    with mock.patch.object(format_write, "to_ir_dtype", lambda dtype: 42):
        data = raw_serialize(mlp_model())
    with pytest.raises(ModelFormatError, match=r"unknown dtype code 42; expected one of \[0, "):
        parse(data)


def test_unknown_attribute_kind():
    with mock.patch.object(format_write, "_attr_kind", lambda name, value: 9):
        data = raw_serialize(mlp_model())
    with pytest.raises(ModelFormatError, match="attribute 'activation': unknown attribute kind 9"):
        parse(data)


def test_invalid_utf8_in_a_name():
    data = bytearray(serialize(mlp_model()))
    at = data.index(b"fc.weight")
    data[at] = 0xFF
    with pytest.raises(ModelFormatError, match=r"tensor 1: string is not valid UTF-8"):
        parse(bytes(data))


def test_schema_version_newer_or_zero():
    for version in (SCHEMA_VERSION + 1, 0):
        data = raw_serialize(mlp_model(), schema_version=version)
        with pytest.raises(
            ModelFormatError,
            match=f"schema version {version} is not supported; "
            f"this runtime reads 1..{SCHEMA_VERSION}",
        ):
            parse(data)


def _with_node(model: Model, index: int, **changes) -> Model:
    graph = model.graphs[0]
    nodes = list(graph.nodes)
    nodes[index] = dataclasses.replace(nodes[index], **changes)
    return dataclasses.replace(model, graphs=[dataclasses.replace(graph, nodes=nodes)])


def test_unknown_op_code():
    data = raw_serialize(_with_node(mlp_model(), 1, op=999))
    with pytest.raises(ModelFormatError, match="graph 0 node 1: unknown op code 999"):
        parse(data)


def test_op_version_newer_than_supported():
    data = raw_serialize(_with_node(mlp_model(), 1, version=7))
    with pytest.raises(
        ModelFormatError,
        match=r"node 1 \(SOFTMAX\): op version 7 is not "
        r"supported \(this runtime has 1\.\.1\)",
    ):
        parse(data)
    data = raw_serialize(_with_node(mlp_model(), 1, version=0))
    with pytest.raises(ModelFormatError, match="op version 0 is not supported"):
        parse(data)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "inputs",
            [0, 1, 99],
            r"node 0 \(FULLY_CONNECTED\) input: tensor index 99 out of range "
            r"\(0\.\.4\)",
        ),
        ("inputs", [-5, 1, 2], "tensor index -5 out of range"),
        ("outputs", [5], r"node 0 \(FULLY_CONNECTED\) output: tensor index 5 out of range"),
    ],
)
def test_node_tensor_index_out_of_range(field, value, message):
    data = raw_serialize(_with_node(mlp_model(), 0, **{field: value}))
    with pytest.raises(ModelFormatError, match=message):
        parse(data)


def test_graph_and_signature_indices_out_of_range():
    model = mlp_model()
    graph = dataclasses.replace(model.graphs[0], outputs=[40])
    with pytest.raises(ModelFormatError, match=r"graph 0 \('main'\) output: tensor index 40 "):
        parse(raw_serialize(dataclasses.replace(model, graphs=[graph])))
    sig = dataclasses.replace(model.signatures["infer"], graph=3)
    with pytest.raises(
        ModelFormatError,
        match=r"signature 'infer': graph 3 out of range "
        r"\(the model has 1\)",
    ):
        parse(raw_serialize(dataclasses.replace(model, signatures={"infer": sig})))
    sig = dataclasses.replace(model.signatures["infer"], inputs={"x": 3})
    with pytest.raises(
        ModelFormatError,
        match=r"input 'x' \(tensor 3\) is not an input of "
        r"graph 0",
    ):
        parse(raw_serialize(dataclasses.replace(model, signatures={"infer": sig})))


def _chain_model(nodes: list[Node]) -> Model:
    tensors = [Tensor(f"t{k}", np.dtype(np.float32), (2,)) for k in range(4)]
    return Model(tensors=tensors, graphs=[Graph("g", [0], [3], nodes)])


def test_cycle_is_named():
    nodes = [
        Node(OpCode.ADD, [0, 2], [1]),
        Node(OpCode.RELU, [1], [2]),
        Node(OpCode.RELU, [2], [3]),
    ]
    with pytest.raises(
        ModelFormatError,
        match=r"node 0 \(ADD\): input 't2' is produced by "
        r"node 1, which does not come before it "
        r"\(a cycle\)",
    ):
        parse(raw_serialize(_chain_model(nodes)))
    self_loop = [Node(OpCode.RELU, [1], [1]), Node(OpCode.RELU, [1], [3])]
    with pytest.raises(ModelFormatError, match="a cycle"):
        parse(raw_serialize(_chain_model(self_loop)))


def test_tensor_defined_twice_or_never():
    twice = [Node(OpCode.RELU, [0], [1]), Node(OpCode.RELU, [0], [1]), Node(OpCode.RELU, [1], [3])]
    with pytest.raises(ModelFormatError, match="output tensor 't1' is already defined by node 0"):
        parse(raw_serialize(_chain_model(twice)))
    never = [Node(OpCode.RELU, [2], [3])]
    with pytest.raises(ModelFormatError, match="input 't2' is never produced"):
        parse(raw_serialize(_chain_model(never)))
    overwrite_input = [Node(OpCode.RELU, [3], [0]), Node(OpCode.RELU, [0], [3])]
    with pytest.raises(ModelFormatError, match="already defined by a graph input"):
        parse(raw_serialize(_chain_model(overwrite_input)))


def test_inconsistent_shapes_are_found_when_planning():
    tensors = [
        Tensor("a", np.dtype(np.float32), (2, 3)),
        Tensor("b", np.dtype(np.float32), (4,)),
        Tensor("c", np.dtype(np.float32), (2, 3)),
    ]
    model = Model(
        tensors=tensors,
        graphs=[Graph("g", [0, 1], [2], [Node(OpCode.ADD, [0, 1], [2], name="sum")])],
    )
    data = serialize(model)  # structurally valid: parse accepts it
    parse(data)
    with pytest.raises(
        ModelFormatError,
        match=r"node 0 'sum' \(ADD\): ADD: shapes \[2, 3\] and "
        r"\[4\] do not broadcast",
    ) as info:
        Interpreter(model_content=data)
    assert isinstance(info.value, ShapeError)


def test_declared_shape_must_match_the_constant_data():
    model = mlp_model()
    model.tensors[1] = dataclasses.replace(model.tensors[1], shape=(4, 3))
    with pytest.raises(
        ModelFormatError,
        match=r"tensor 1 \('fc\.weight'\): declared "
        r"float32\[4, 3\] but its data is "
        r"float32\[3, 4\]",
    ):
        serialize(model)  # the writer validates: a bad model is never written


def test_constant_graph_input_is_rejected():
    model = mlp_model()
    graph = dataclasses.replace(model.graphs[0], inputs=[0, 1])
    with pytest.raises(ModelFormatError, match=r"input tensor 'fc\.weight' is a constant"):
        parse(raw_serialize(dataclasses.replace(model, graphs=[graph])))


def test_signature_names_and_tensors_of_different_length(monkeypatch):
    model = mlp_model()
    sig = model.signatures["infer"]

    class Lopsided(dict):
        def values(self):
            return [*super().values(), 0]

    bad = Signature(sig.key, sig.graph, Lopsided(sig.inputs), sig.outputs)
    data = raw_serialize(dataclasses.replace(model, signatures={"infer": bad}))
    with pytest.raises(ModelFormatError, match="signature 0: names and tensor lists differ"):
        parse(data)


def test_vector_length_past_the_end_of_the_file():
    data = bytearray(serialize(mlp_model()))
    root = fb.Model.GetRootAs(bytes(data), 0)
    # The tensor table's length field: rewrite it to claim a billion tensors.
    tab = root._tab
    field = tab.Offset(4 + 2 * 5)
    vec = tab.Vector(field)
    data[vec - 4 : vec] = (10**9).to_bytes(4, "little")
    with pytest.raises(
        ModelFormatError,
        match=r"tensor table: vector of 1000000000 elements at "
        r"offset \d+ runs past the end",
    ):
        parse(bytes(data))


def test_sparse_formats_other_than_bitmask_are_refused_at_write():
    model = mlp_model()
    from sporenet.lite.graph import Sparsity

    model.tensors[1] = dataclasses.replace(model.tensors[1], sparsity=Sparsity(1, (3, 4)))
    with pytest.raises(ModelFormatError, match="sparse format CSR is not supported"):
        serialize(model)


def test_large_weight_is_memory_mapped(tmp_path):
    # A 16 MB weight is a view of the mapped file, not a copy read into memory.
    big = np.zeros((4096, 1024), np.float32)
    big[-1, -1] = 7
    from sporenet.lite import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 1024))
    w = b.constant("w", big)
    b.output(b.op(OpCode.MATMUL, [w, b.op(OpCode.TRANSPOSE, [x])]))
    path = save(b.build(), tmp_path / "big.spore")
    assert os.path.getsize(path) > big.nbytes
    loaded = load(path)
    data = loaded.tensors[1].data
    assert isinstance(_base(data), mmap.mmap)
    assert data[-1, -1] == 7


def test_release_pages_is_called_as_weights_are_copied_and_changes_no_byte(monkeypatch):
    """serialize(release_pages=f) calls f after every RELEASE_EVERY bytes of tensor data
    it copies (a converter drops a mapped source's pages so), with the same bytes out."""
    model = mlp_model()
    monkeypatch.setattr(format_write, "RELEASE_EVERY", 12)  # after both (48, 12 bytes)
    calls: list[int] = []
    data = serialize(model, release_pages=lambda: calls.append(1))
    assert data == serialize(model)
    assert len(calls) == 2
