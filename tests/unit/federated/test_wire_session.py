"""The hand-written Session framing agrees with protobuf's SessionRequest / SessionReply."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from sporenet.federated.common.wire import (
    SessionReplyField,
    SessionRequestField,
    encode_upload_chunk,
    frame_session,
    split_session,
)
from sporenet.federated.errors import MalformedMessageError
from sporenet.proto import federated_pb2 as pb

# Body sizes around the varint boundaries of the length prefix (1, 2 and 3 bytes) and a
# body as large as a full default chunk.
BODY_SIZES = [0, 1, 127, 128, 16383, 16384, 512 << 10]


@pytest.mark.parametrize("field", [1, 2, 3, 4])
@pytest.mark.parametrize("size", BODY_SIZES)
def test_frame_then_split_gives_back_the_field_and_body(field: int, size: int) -> None:
    body = bytes(i % 251 for i in range(size))
    framed = frame_session(field, body)
    got_field, view = split_session(framed)
    assert got_field == field
    assert bytes(view) == body
    assert view.obj is framed  # a view into the message, not a copy


@pytest.mark.parametrize(
    ("field", "name", "inner"),
    [
        (SessionRequestField.POLL, "poll", pb.TaskRequest(client_id="c1", wait_ms=2500)),
        (
            SessionRequestField.DOWNLOAD,
            "download",
            pb.DownloadRequest(client_id="c1", model_version=3, offset=1 << 33, chunk_size=4096),
        ),
        (
            SessionRequestField.UPLOAD,
            "upload",
            pb.UploadChunk(
                header=pb.UploadHeader(
                    client_id="c1", task_id="r1", upload_id="u", total_size=99, sha256="ab"
                )
            ),
        ),
        (SessionRequestField.HEARTBEAT, "heartbeat", pb.HeartbeatRequest()),  # an empty body
    ],
)
def test_framed_requests_are_what_protobuf_encodes(field: int, name: str, inner: Message) -> None:
    framed = frame_session(field, inner.SerializeToString())
    assert framed == pb.SessionRequest(**{name: inner}).SerializeToString()
    parsed = pb.SessionRequest.FromString(framed)
    assert parsed.WhichOneof("kind") == name
    assert getattr(parsed, name) == inner
    got_field, view = split_session(pb.SessionRequest(**{name: inner}).SerializeToString())
    assert got_field == field
    assert type(inner).FromString(bytes(view)) == inner


@pytest.mark.parametrize(
    ("field", "name", "inner"),
    [
        (
            SessionReplyField.TASK,
            "task",
            pb.Task(type=pb.TASK_FIT, round=2, task_id="r2", model_size=10),
        ),
        (
            SessionReplyField.MODEL,
            "model",
            pb.ModelChunk(offset=4, data=b"\x00" * 300, total_size=304),
        ),
        (SessionReplyField.UPLOAD_OFFSET, "upload_offset", pb.UploadOffsetReply()),  # received = 0
        (SessionReplyField.UPLOAD_REPLY, "upload_reply", pb.UploadReply(accepted=True, received=7)),
    ],
)
def test_framed_replies_are_what_protobuf_encodes(field: int, name: str, inner: Message) -> None:
    framed = frame_session(field, inner.SerializeToString())
    assert framed == pb.SessionReply(**{name: inner}).SerializeToString()
    parsed = pb.SessionReply.FromString(framed)
    assert parsed.WhichOneof("kind") == name
    assert getattr(parsed, name) == inner


@pytest.mark.parametrize("offset", [0, 1, 300, 2**40])
@pytest.mark.parametrize("size", [0, 5, 128, 70_000])
def test_session_upload_chunk_decodes_like_the_plain_one(offset: int, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    plain = pb.UploadChunk.FromString(encode_upload_chunk(offset, data))
    request = pb.SessionRequest.FromString(encode_upload_chunk(offset, data, session=True))
    assert request.WhichOneof("kind") == "upload"
    assert (request.upload.offset, request.upload.data) == (offset, data)
    assert (plain.offset, plain.data) == (offset, data)
    assert not request.upload.HasField("header")
    # The same bytes as framing the plain encoding, whether data is bytes or a view.
    framed = frame_session(SessionRequestField.UPLOAD, encode_upload_chunk(offset, data))
    assert encode_upload_chunk(offset, data, session=True) == framed
    assert encode_upload_chunk(offset, memoryview(data), session=True) == framed


@pytest.mark.parametrize(
    ("raw", "found"),
    [
        (b"\x1a", "truncated field header"),  # a key and no length
        (b"\x1a\x80", "truncated field header"),  # a length varint that never ends
        (b"\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "truncated field header"),
    ],
)
def test_truncated_headers_are_malformed(raw: bytes, found: str) -> None:
    with pytest.raises(MalformedMessageError, match=found):
        split_session(raw)


def test_an_empty_message_says_it_is_empty() -> None:
    # A SessionRequest with no oneof set.
    with pytest.raises(MalformedMessageError, match="empty Session message"):
        split_session(b"")


@pytest.mark.parametrize(
    ("raw", "found"),
    [
        # field 1 as a varint (value 0): not a message
        (b"\x08\x00", "found field 1 with wire type 0"),
        # field 1 as a fixed32
        (b"\x0d\x00\x00\x00\x00", "found field 1 with wire type 5"),
        # field 3 as a fixed64
        (b"\x19" + bytes(8), "found field 3 with wire type 1"),
    ],
)
def test_a_wrong_wire_type_is_malformed(raw: bytes, found: str) -> None:
    with pytest.raises(MalformedMessageError, match=found):
        split_session(raw)


def test_trailing_bytes_are_malformed() -> None:
    # A poll followed by a second field: protobuf would accept it, the framing must not.
    raw = frame_session(SessionRequestField.POLL, b"\x10\x01") + frame_session(
        SessionRequestField.HEARTBEAT, b""
    )
    with pytest.raises(MalformedMessageError) as info:
        split_session(raw)
    assert str(info.value) == (
        "malformed Session message: expected one field of 6 bytes, "
        "found field 1 of 2 bytes after a 2-byte header"
    )
    with pytest.raises(MalformedMessageError, match="of 5 bytes, found field 3 of 2 bytes"):
        split_session(frame_session(SessionRequestField.UPLOAD, b"ab") + b"\x00")


def test_a_body_shorter_than_its_length_is_malformed() -> None:
    with pytest.raises(MalformedMessageError, match="of 4 bytes, found field 1 of 5 bytes"):
        split_session(b"\x0a\x05ab")
