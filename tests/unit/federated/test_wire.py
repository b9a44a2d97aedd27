"""The hand-written payload chunks agree with protobuf's encoding of the same messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sporenet.federated.common.wire import (
    encode_model_chunk,
    encode_upload_chunk,
    split_first_upload_chunk,
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


@given(st.integers(0, 2**63 - 1), st.binary(max_size=300), st.text(max_size=20))
def test_first_chunks_split_as_protobuf_reads_them(offset: int, data: bytes, cid: str) -> None:
    header = pb.UploadHeader(client_id=cid, upload_id="u", total_size=len(data), crc32=5)
    raw = pb.UploadChunk(header=header, offset=offset, data=data).SerializeToString()
    got, at, view = split_first_upload_chunk(raw)
    assert got == header and (at, bytes(view)) == (offset, data)


def test_first_chunks_this_path_does_not_know_go_through_protobuf() -> None:
    one = pb.UploadChunk(header=pb.UploadHeader(client_id="c"), offset=7, data=b"xyz")
    two = pb.UploadChunk(header=pb.UploadHeader(upload_id="u"))  # protobuf merges headers
    raw = one.SerializeToString() + two.SerializeToString()
    expected = pb.UploadChunk.FromString(raw)
    got, at, view = split_first_upload_chunk(raw)
    assert got == expected.header and (at, bytes(view)) == (7, b"xyz")
    assert got.client_id == "c" and got.upload_id == "u"
    assert split_first_upload_chunk(pb.UploadChunk(offset=3).SerializeToString())[0] is None
    unknown = one.SerializeToString() + b"\x20\x01"  # field 4, varint
    assert split_first_upload_chunk(unknown)[0] == one.header
    with pytest.raises(UpdateRejectedError, match="header field runs past"):
        split_first_upload_chunk(b"\x0a\x05ab")
    with pytest.raises(UpdateRejectedError, match="not valid protobuf"):
        split_first_upload_chunk(b"\x0a\x02\xff\xff")


def test_malformed_chunks_raise_typed_errors() -> None:
    with pytest.raises(UpdateRejectedError, match="runs past"):
        split_upload_chunk(b"\x1a\x05ab")  # data says 5 bytes, 2 follow
    with pytest.raises(UpdateRejectedError, match="varint"):
        split_upload_chunk(b"\x10\xff")
    with pytest.raises(TransferError, match="ModelChunk: data field runs past"):
        split_model_chunk(b"\x12\x09abc")
    with pytest.raises(TransferError, match="malformed ModelChunk"):
        split_model_chunk(b"\x08\xff")
