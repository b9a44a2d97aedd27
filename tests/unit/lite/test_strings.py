"""STRING tensors: stored in .spore files, checked by the validator, fed to and read from
the Interpreter; hostile string buffers are a ModelFormatError."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelFormatError, parse, serialize
from sporenet.lite import strings as string_layout
from sporenet.lite.dtypes import STRING
from sporenet.lite.graph import Tensor
from sporenet.lite.validate import validate
from tests.unit.lite.format_samples import raw_serialize, strings_model


def test_string_constants_round_trip_bit_for_bit():
    model = strings_model()
    again = parse(serialize(model))
    for before, after in zip(model.tensors, again.tensors, strict=True):
        assert after.dtype == before.dtype
        if before.data is not None:
            assert after.data.dtype == before.data.dtype
            assert after.data.tolist() == before.data.tolist()


def test_interpreter_maps_text_both_ways_and_accepts_unicode_arrays():
    interpreter = Interpreter(model_content=serialize(strings_model()))
    feeds = np.array(["cat", "dog", "中文", "", "x" * 300])  # fixed-width <U300, not object
    out = interpreter.run({"category": feeds})
    assert out["id"].tolist() == [4, -1, 2, 0, 3]
    assert out["name"].dtype == STRING
    assert out["name"].tolist() == ["cat", "?", "中文", "", "x" * 300]
    # bytes are decoded as UTF-8, like onnxruntime's string tensors
    again = interpreter.run({"category": np.array([b"\xc3\xa9", b"cat"], dtype=object)})
    assert again["id"].tolist() == [1, 4]


def test_encode_decode_layout():
    texts = np.array([["a", "bc"], ["", "ü"]], dtype=object)
    raw = string_layout.encode(texts)
    assert raw[:16].view("<u4").tolist() == [1, 2, 0, 2]
    decoded = string_layout.decode(raw.tobytes(), (2, 2), "t")
    assert decoded.tolist() == texts.tolist() and not decoded.flags.writeable


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\x01\x00\x00", "needs at least"),  # lengths truncated
        (b"\x05\x00\x00\x00ab", "sum to 5 bytes"),  # bytes truncated
        (b"\xff\xff\xff\xffab", "sum to"),  # a length far beyond the buffer
        (b"\x02\x00\x00\x00\xff\xfe", "not valid UTF-8"),
    ],
)
def test_hostile_string_buffers_are_model_format_errors(raw, message):
    with pytest.raises(ModelFormatError, match=message):
        string_layout.decode(raw, (1,), "t")


def test_hostile_string_tensor_in_a_file_is_a_model_format_error():
    model = strings_model()
    index = next(i for i, t in enumerate(model.tensors) if t.name == "names")
    # Declare 10**9 strings over the buffer of five: refused before any allocation.
    model.tensors[index].shape = (10**9,)
    data = raw_serialize(model)
    with pytest.raises(ModelFormatError):
        parse(data)


def test_validator_refuses_non_text_in_a_string_tensor_and_quantized_strings():
    model = strings_model()
    index = next(i for i, t in enumerate(model.tensors) if t.name == "names")
    model.tensors[index].data = np.array([1, 2, 3, 4, 5], dtype=object)
    with pytest.raises(ModelFormatError, match="holds only str"):
        validate(model)
    model = strings_model()
    model.tensors.append(Tensor("t", STRING, (1,), np.array(["a"], object), trainable=True))
    with pytest.raises(ModelFormatError, match="cannot be quantized, sparse or trainable"):
        validate(model)
