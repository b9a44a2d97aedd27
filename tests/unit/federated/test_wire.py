"""The hand-written payload chunks agree with protobuf's encoding of the same messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sporenet.federated.common.wire import (
    encode_model_chunk,
    encode_upload_chunk,
    split_model_chunk,
    split_upload_chunk,
)
from sporenet.federated.errors import TransferError, UpdateRejectedError
from sporenet.proto import federated_pb2 as pb


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**63 - 1), st.binary(max_size=300), st.integers(0, 2**63 - 1))
def test_chunks_round_trip_through_protobuf(offset: int, data: bytes, total: int) -> None:
    m = pb.ModelChunk.FromString(encode_model_chunk(offset, data, total))
    assert (m.offset, m.data, m.total_size) == (offset, data, total)
    at, view, size = split_model_chunk(m.SerializeToString())
    assert (at, bytes(view), size) == (offset, data, total)

    u = pb.UploadChunk.FromString(encode_upload_chunk(offset, data))
    assert (u.offset, u.data) == (offset, data)
    at, view = split_upload_chunk(pb.UploadChunk(offset=offset, data=data).SerializeToString())
    assert (at, bytes(view)) == (offset, data)


def test_headers_and_unknown_fields_fall_back_to_protobuf() -> None:
    raw = pb.UploadChunk(
        header=pb.UploadHeader(client_id="c"), offset=7, data=b"xyz"
    ).SerializeToString()
    at, view = split_upload_chunk(raw)
    assert (at, bytes(view)) == (7, b"xyz")


def test_malformed_chunks_raise_typed_errors() -> None:
    with pytest.raises(UpdateRejectedError, match="runs past"):
        split_upload_chunk(b"\x1a\x05ab")  # data says 5 bytes, 2 follow
    with pytest.raises(UpdateRejectedError, match="varint"):
        split_upload_chunk(b"\x10\xff")
    with pytest.raises(TransferError, match="ModelChunk: data field runs past"):
        split_model_chunk(b"\x12\x09abc")
    with pytest.raises(TransferError, match="malformed ModelChunk"):
        split_model_chunk(b"\x08\xff")
