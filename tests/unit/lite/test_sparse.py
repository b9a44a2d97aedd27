"""Sparse (BITMASK) storage of constant tensors: round trips from bytes and paths with
bit-identical dense arrays (float32, float16, int8 with quantization), the size it saves,
and a ModelFormatError naming the tensor for every inconsistency a hostile file can hold."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from unittest import mock

import numpy as np
import pytest

from sporenet.lite import (
    Interpreter,
    ModelFormatError,
    OpCode,
    load,
    parse,
    save,
    serialize,
    sparse,
)
from sporenet.lite import format as fmt
from sporenet.lite.builder import ModelBuilder
from sporenet.lite.graph import Model, Quantization
from sporenet.proto import model_generated as fb
from tests.unit.lite.format_samples import rich_model


def _pruned(shape: tuple[int, ...], sparsity: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=shape).astype(np.float32)
    w[rng.random(shape) < sparsity] = 0.0
    return w


def _sparse_model() -> Model:
    """x[-1, 64] -> FC(relu, 80%-sparse 128x64) -> FC(80%-sparse 10x128): float32 weights,
    plus an int8 tensor with per-channel quantization and a float16 one that no node reads
    (the writer stores every constant)."""
    b = ModelBuilder()
    x = b.input("x", (-1, 64))
    w1 = b.constant("fc1.weight", _pruned((128, 64), 0.8, 1))
    b1 = b.constant("fc1.bias", np.linspace(-1, 1, 128, dtype=np.float32))
    h = b.op(OpCode.FULLY_CONNECTED, [x, w1, b1], activation="relu")
    w2 = b.constant("fc2.weight", _pruned((10, 128), 0.8, 2))
    b.output(b.op(OpCode.FULLY_CONNECTED, [h, w2]), name="logits")
    q = np.clip(np.round(_pruned((16, 9), 0.7, 3) * 40), -127, 127).astype(np.int8)
    b.tensor(
        "conv.weight_q",
        q.shape,
        np.int8,
        data=q,
        quantization=Quantization(
            scale=np.linspace(0.01, 0.02, 16, dtype=np.float32),
            zero_point=np.zeros(16, np.int64),
            axis=0,
        ),
    )
    half = _pruned((33,), 0.9, 4).astype(np.float16)
    b.tensor("aux.half", half.shape, np.float16, data=half)
    return b.build()


def _assert_same_constants(a: Model, b: Model) -> None:
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        assert (ta.name, ta.dtype, tuple(ta.shape)) == (tb.name, tb.dtype, tuple(tb.shape))
        assert (ta.data is None) == (tb.data is None)
        if ta.data is not None:
            assert tb.data.tobytes() == np.ascontiguousarray(ta.data).tobytes()


def test_round_trip_from_bytes_and_path_is_bit_identical(tmp_path):
    model = _sparse_model()
    data = serialize(model, sparsify=True)
    from_bytes = parse(data)
    path = save(model, tmp_path / "m.spore", sparsify=True)
    assert path.read_bytes() == data
    for loaded in (from_bytes, load(path), load(path, use_mmap=False)):
        _assert_same_constants(model, loaded)
        stored = {t.name for t in loaded.tensors if t.sparsity is not None}
        # The dense bias saves nothing stored sparse; every pruned tensor is stored sparse.
        assert stored == {"fc1.weight", "fc2.weight", "conv.weight_q", "aux.half"}
        for t in loaded.tensors:
            if t.data is not None:
                assert not t.data.flags.writeable
    q = from_bytes.tensors[from_bytes.tensor_index("conv.weight_q")].quantization
    np.testing.assert_array_equal(q.scale, np.linspace(0.01, 0.02, 16, dtype=np.float32))
    x = np.random.default_rng(5).normal(size=(3, 64)).astype(np.float32)
    want = Interpreter(model=model).run({"x": x})["logits"]
    np.testing.assert_array_equal(Interpreter(model_content=data).run({"x": x})["logits"], want)


def test_sparse_file_is_a_quarter_of_the_dense_one():
    model = _sparse_model()
    dense, packed = len(serialize(model)), len(serialize(model, sparsify=True))
    # 80% zeros: values 0.2 of the bytes plus one bit per 32 bits of float32.
    assert packed < 0.35 * dense


def test_every_format_feature_survives_sparsify():
    # NaN payloads and -0.0 are kept bit for bit (the mask tests bits, not values).
    model = rich_model()
    _assert_same_constants(model, parse(serialize(model, sparsify=True)))


def test_negative_zeros_are_values():
    # -0.0 is stored as a value (bit exact); +0.0 is what the mask leaves out.
    w = _pruned((64, 64), 0.8)
    b = ModelBuilder()
    x = b.input("x", (-1, 64))
    b.output(b.op(OpCode.MATMUL, [x, b.constant("w", w * np.float32(-1.0))]), name="y")
    model = b.build()
    assert len(serialize(model, sparsify=True)) > 0.9 * len(serialize(model))
    back = parse(serialize(model, sparsify=True)).tensors[1].data
    assert back.tobytes() == model.tensors[1].data.tobytes()
    model.tensors[1].data = model.tensors[1].data + np.float32(0.0)  # -0.0 + 0.0 = +0.0
    assert len(serialize(model, sparsify=True)) < 0.35 * len(serialize(model))


def test_dense_tensors_stay_dense_and_marked_ones_stay_sparse():
    model = _sparse_model()
    model.tensors[model.tensor_index("fc1.weight")].data = np.ones((128, 64), np.float32)
    loaded = parse(serialize(model, sparsify=True))
    assert loaded.tensors[loaded.tensor_index("fc1.weight")].sparsity is None
    # A tensor read sparse is written sparse again without asking (a federated splice or a
    # converter pass keeps the file's layout), and all-zero tensors have no values at all.
    again = parse(serialize(parse(serialize(_sparse_model(), sparsify=True))))
    assert again.tensors[again.tensor_index("fc2.weight")].sparsity is not None
    k = model.tensor_index("fc1.bias")
    model.tensors[k] = dataclasses.replace(
        model.tensors[k], data=np.zeros(128, np.float32), sparsity=sparse.bitmask((128,))
    )
    out = parse(serialize(model)).tensors[k]
    assert out.sparsity is not None and not out.data.any()


def test_marker_must_match_the_tensor():
    model = _sparse_model()
    model.tensors[1].sparsity = sparse.bitmask((64, 128))
    with pytest.raises(ModelFormatError, match=r"'fc1.weight'.*dense_shape \[64, 128\]"):
        serialize(model)
    model = _sparse_model()
    model.tensors[0].sparsity = sparse.bitmask((-1, 64))
    with pytest.raises(ModelFormatError, match="only constant tensors can be stored sparse"):
        serialize(model)


# --------------------------------------------------------------------------- hostile files


@contextmanager
def _hostile(*, values: Any = None, mask: Any = None, **fields: Any) -> Iterator[None]:
    """serialize() with the sparse encoder and the sparsity table replaced: `values` and
    `mask` map the honest arrays to the stored ones; `fields` override schema fields."""
    honest = sparse.encode

    def encode(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        v, m = honest(data)
        return (values(v) if values else v), (mask(m) if mask else m)

    def write(self: Any, shape: tuple[int, ...], mask_index: int) -> int:
        b = self.b
        dense = self._ints(
            fb.SparsityParamsStartDenseShapeVector, list(fields.get("dense_shape", shape)), "q"
        )
        block = (
            self._ints(fb.SparsityParamsStartBlockShapeVector, fields["block_shape"], "i")
            if "block_shape" in fields
            else None
        )
        fb.SparsityParamsStart(b)
        fb.SparsityParamsAddFormat(b, fields.get("format", sparse.BITMASK))
        fb.SparsityParamsAddIndptrBuffer(b, fields.get("indptr", 0))
        fb.SparsityParamsAddIndicesBuffer(b, fields.get("mask_index", mask_index))
        fb.SparsityParamsAddDenseShape(b, dense)
        if block is not None:
            fb.SparsityParamsAddBlockShape(b, block)
        return fb.SparsityParamsEnd(b)

    with (
        mock.patch.object(sparse, "encode", encode),
        mock.patch.object(fmt._Writer, "_sparsity", write),
    ):
        yield


def _one_sparse_tensor() -> Model:
    """One 3x3 float32 constant (9 bits: the mask's second byte has 7 unused bits)."""
    b = ModelBuilder()
    x = b.input("x", (-1, 3))
    w = np.array([[1, 0, 0], [0, 2, 0], [0, 0, 3]], np.float32)
    wi = b.constant("w", w)
    b.tensors[wi].sparsity = sparse.bitmask(w.shape)
    b.output(b.op(OpCode.MATMUL, [x, wi]), name="y")
    return b.build()


HOSTILE = {
    "mask one byte short": (
        dict(mask=lambda m: m[:1]),
        r"mask buffer 2 holds 1 bytes but "
        r"shape \[3, 3\] needs 2",
    ),
    "mask one byte long": (dict(mask=lambda m: np.concatenate([m, m[:1]])), "holds 3 bytes"),
    "fewer values than set bits": (
        dict(values=lambda v: v[:2]),
        "mask marks 3 nonzero elements but the values buffer holds 2",
    ),
    "more values than set bits": (dict(values=lambda v: np.concatenate([v, v[:1]])), "holds 4"),
    "trailing bits set": (
        dict(mask=lambda m: m | np.array([0, 1], np.uint8)),
        "unused trailing bits of the mask are not zero",
    ),
    "values not whole elements": (
        dict(values=lambda v: v.view(np.uint8)[:11]),
        "11 bytes is not a whole number of float32",
    ),
    "dense_shape differs": (
        dict(dense_shape=[9]),
        r"dense_shape \[9\] differs from the "
        r"tensor's shape \[3, 3\]",
    ),
    "dense_shape of another rank": (dict(dense_shape=[3, 3, 1]), "dense_shape"),
    "mask buffer out of range": (dict(mask_index=99), r"mask buffer index 99 out of range"),
    "mask buffer is the sentinel": (dict(mask_index=0), "mask buffer index 0 out of range"),
    "csr format": (dict(format=int(fb.SparseFormat.CSR)), "sparse format CSR is not supported"),
    "unknown format": (dict(format=77), "sparse format 77 is not supported"),
    "indptr buffer given": (dict(indptr=1), "has no indptr buffer"),
    "block shape given": (dict(block_shape=[1, 4]), "has no block_shape"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_sparse_tensor_is_refused_naming_it(case):
    options, message = HOSTILE[case]
    with _hostile(**options):
        data = serialize(_one_sparse_tensor())
    with pytest.raises(ModelFormatError, match=message) as info:
        parse(data)
    assert "tensor 1 ('w')" in str(info.value)


def test_huge_shapes_are_refused_before_allocating():
    # 2^40 x 2^40 elements would overflow int64 and need 2^77 bytes of mask: refused from
    # the mask buffer's size, nothing allocated.
    model = _one_sparse_tensor()
    huge = (2**40, 2**40)

    def write_huge_shape(self: Any, t: Any, buffer_index: int, mask_index: Any) -> int:
        return honest_tensor(self, dataclasses.replace(t, shape=huge), buffer_index, mask_index)

    honest_tensor = fmt._Writer._tensor
    with (
        _hostile(dense_shape=list(huge)),
        mock.patch.object(fmt._Writer, "_tensor", write_huge_shape),
    ):
        data = serialize(model)
    with pytest.raises(
        ModelFormatError,
        match=r"mask buffer 2 holds 2 bytes but shape "
        r"\[1099511627776, 1099511627776\] needs",
    ):
        parse(data)


def test_sparsity_on_an_activation_is_refused():
    # The input tensor (buffer 0) carries a sparsity table pointing at a one-byte mask.
    model = _one_sparse_tensor()
    model.tensors[0] = dataclasses.replace(model.tensors[0], sparsity=sparse.bitmask((-1, 3)))
    head = fmt._Writer(model, [(0, 0), (0, 0)], [0, 0, 0], {0: 1}).build()
    with pytest.raises(
        ModelFormatError, match=r"tensor 0 \('x'\): a sparse tensor must be a constant"
    ):
        parse(head)


def test_truncated_and_mutated_sparse_files_raise_model_format_error_only():
    data = serialize(_sparse_model(), sparsify=True)
    with pytest.raises(ModelFormatError):
        parse(data[: len(data) - 100])
    rng = random.Random(0)
    for _ in range(300):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutant[rng.randrange(len(mutant))] = rng.randrange(256)
        with suppress(ModelFormatError):
            parse(bytes(mutant))
