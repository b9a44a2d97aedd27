"""Hand-written wire format of the two payload messages, ModelChunk and UploadChunk, and
of the Session messages that wrap them.

They carry most of the bytes. Going through protobuf objects costs two extra copies of
every chunk (message construction or parsing, then the bytes field), so the server and
the client write and read these two messages by hand. The encoding is plain proto3 wire
format, and anything unusual (a header, unknown fields) falls back to protobuf; the
committed federated_pb2 stays the schema.
"""

from __future__ import annotations

import functools
from enum import IntEnum

from google.protobuf.message import DecodeError

from sporenet.federated.common.codec import MalformedPayload, read_varint
from sporenet.federated.errors import MalformedMessageError, TransferError, UpdateRejectedError
from sporenet.federated.secagg.server import Stage
from sporenet.proto import federated_pb2 as pb

#: The gRPC service's full name, as federated.proto declares it.
SERVICE: str = pb.DESCRIPTOR.services_by_name["Federated"].full_name


def method_path(name: str) -> str:
    """The full gRPC method name of `name` (what signed requests cover)."""
    return f"/{SERVICE}/{name}"


#: The stage a device of a secure async buffer answers once trained (its update held).
READY = "ready"
#: A FIT task's config key: train, hold the update, answer READY (a secure async buffer).
SECURE_BUFFER_KEY = "secure_buffer"
#: A secure stage's config key: the staleness weight to scale the held update by.
SECURE_WEIGHT_KEY = "secure_weight"
#: Secure-aggregation stage names (secagg's Stage, and READY) <-> the wire enum SecureStage.
SECURE_STAGES: dict[str, pb.SecureStage] = {
    Stage.ADVERTISE_KEYS.value: pb.SECURE_ADVERTISE_KEYS,
    Stage.SHARE_KEYS.value: pb.SECURE_SHARE_KEYS,
    Stage.MASKED_INPUT.value: pb.SECURE_MASKED_INPUT,
    Stage.UNMASK.value: pb.SECURE_UNMASK,
    READY: pb.SECURE_READY,
}
STAGE_NAMES: dict[int, str] = {code: name for name, code in SECURE_STAGES.items()}


def identity(payload: bytes) -> bytes:
    """The (de)serializer of a message handled as raw bytes."""
    return payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    try:
        return read_varint(buf, pos, len(buf))
    except MalformedPayload:
        raise UpdateRejectedError("truncated or overlong varint in a payload chunk") from None


def encode_model_chunk(
    offset: int, data: bytes, total_size: int, *, session: bool = False
) -> bytes:
    """The wire bytes of ModelChunk(offset, data, total_size), as a SessionReply when
    `session`, with a single copy of `data`."""
    head = b"".join((b"\x08", _varint(offset), b"\x12", _varint(len(data))))
    tail = b"\x18" + _varint(total_size)
    if not session:
        return b"".join((head, data, tail))
    size = len(head) + len(data) + len(tail)
    return b"".join((_field_head(SessionReplyField.MODEL, size), head, data, tail))


def encode_model_chunks(
    data: bytes, chunk_size: int, *, session: bool = False
) -> list[tuple[bytes, int]]:
    """The whole model as (encoded ModelChunk, payload size) pairs, each encoded once for
    every client; as SessionReply messages when `session`."""
    return [
        (
            encode_model_chunk(at, data[at : at + chunk_size], len(data), session=session),
            len(data[at : at + chunk_size]),
        )
        for at in range(0, len(data), chunk_size)
    ]


class SessionRequestField(IntEnum):
    """The fields of SessionRequest's oneof (federated.proto): what a client asks."""

    POLL = 1
    DOWNLOAD = 2
    UPLOAD = 3
    HEARTBEAT = 4


class SessionReplyField(IntEnum):
    """The fields of SessionReply's oneof (federated.proto): what the server answers."""

    TASK = 1
    MODEL = 2
    UPLOAD_OFFSET = 3
    UPLOAD_REPLY = 4


def _field_head(field: int, length: int) -> bytes:
    """The key and length that open a length-delimited `field` of `length` bytes."""
    return bytes([field << 3 | 2]) + _varint(length)


def frame_session(field: int, message: bytes | memoryview) -> bytes:
    """A SessionRequest or SessionReply whose oneof `field` holds the encoded `message`."""
    return b"".join((_field_head(field, len(message)), message))


def split_session(raw: bytes) -> tuple[int, memoryview]:
    """(oneof field number, encoded inner message) of a SessionRequest or SessionReply;
    the inner message is a view into `raw`. Raises MalformedMessageError when `raw` is not
    exactly one length-delimited field."""
    buf = memoryview(raw)
    if not buf:
        raise MalformedMessageError(
            "empty Session message: expected one of its request or reply fields"
        )
    try:
        key, pos = read_varint(buf, 0, len(buf))
        if key & 7 != 2:
            raise MalformedMessageError(
                f"malformed Session message: expected a length-delimited field (wire type 2), "
                f"found field {key >> 3} with wire type {key & 7}"
            )
        length, pos = read_varint(buf, pos, len(buf))
    except MalformedPayload:
        raise MalformedMessageError("malformed Session message: truncated field header") from None
    if pos + length != len(buf):
        raise MalformedMessageError(
            f"malformed Session message: expected one field of {len(buf)} bytes, found "
            f"field {key >> 3} of {length} bytes after a {pos}-byte header"
        )
    return key >> 3, buf[pos:]


def parse_upload_chunk(raw: bytes | memoryview) -> pb.UploadChunk:
    """An UploadChunk through protobuf (the first one of a call, with its header)."""
    try:
        return pb.UploadChunk.FromString(bytes(raw) if isinstance(raw, memoryview) else raw)
    except DecodeError as e:
        raise UpdateRejectedError(f"UploadChunk is not valid protobuf: {e}") from None


def _upload_field(buf: memoryview, pos: int, name: str) -> tuple[memoryview, int]:
    """(view, next position) of the length-delimited UploadChunk field whose length is at
    `pos`; UpdateRejectedError when it runs past the message."""
    length, pos = _read_varint(buf, pos)
    if pos + length > len(buf):
        raise UpdateRejectedError(f"UploadChunk: {name} field runs past the message")
    return buf[pos : pos + length], pos + length


def split_upload_chunk(raw: bytes | memoryview) -> tuple[int, memoryview]:
    """(offset, data) of a header-less UploadChunk; `data` is a view into `raw`."""
    buf = memoryview(raw)
    pos, offset, data = 0, 0, buf[0:0]
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        if key == 0x10:  # field 2 (offset), varint
            offset, pos = _read_varint(buf, pos)
        elif key == 0x1A:  # field 3 (data), length-delimited
            data, pos = _upload_field(buf, pos, "data")
        else:  # a header or a field this fast path does not know
            msg = parse_upload_chunk(raw)
            return msg.offset, memoryview(msg.data)
    return offset, data


def split_first_upload_chunk(
    raw: bytes | memoryview,
) -> tuple[pb.UploadHeader | None, int, memoryview]:
    """(header, offset, data) of the first UploadChunk of an upload: only the header goes
    through protobuf, `data` is a view into `raw` (protobuf would copy the update's bytes
    twice). Anything this fast path does not know (a repeated header, an unknown field)
    goes through protobuf whole, with the same result."""
    buf = memoryview(raw)
    pos, offset, data, header = 0, 0, buf[0:0], None
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        if key == 0x0A and header is None:  # field 1 (header), length-delimited
            field, pos = _upload_field(buf, pos, "header")
            try:
                header = pb.UploadHeader.FromString(bytes(field))
            except DecodeError as e:
                raise UpdateRejectedError(f"UploadChunk is not valid protobuf: {e}") from None
        elif key == 0x10:  # field 2 (offset), varint
            offset, pos = _read_varint(buf, pos)
        elif key == 0x1A:  # field 3 (data), length-delimited
            data, pos = _upload_field(buf, pos, "data")
        else:
            msg = parse_upload_chunk(raw)
            if not msg.HasField("header"):
                return None, msg.offset, memoryview(msg.data)
            copied = pb.UploadHeader()
            copied.CopyFrom(msg.header)  # its own message: dropping the data frees it
            return copied, msg.offset, memoryview(msg.data)
    return header, offset, data


def encode_upload_chunk(offset: int, data: bytes | memoryview, *, session: bool = False) -> bytes:
    """The wire bytes of a header-less UploadChunk(offset, data), as a SessionRequest when
    `session`, with a single copy of `data`."""
    head = b"".join((b"\x10", _varint(offset), b"\x1a", _varint(len(data))))
    if not session:
        return b"".join((head, data))
    return b"".join((_field_head(SessionRequestField.UPLOAD, len(head) + len(data)), head, data))


def split_model_chunk(raw: bytes | memoryview) -> tuple[int, memoryview, int]:
    """(offset, data, total_size) of a ModelChunk; `data` is a view into `raw`."""
    buf = memoryview(raw)
    pos, offset, total, data = 0, 0, 0, buf[0:0]
    try:
        while pos < len(buf):
            key, pos = _read_varint(buf, pos)
            if key == 0x08:
                offset, pos = _read_varint(buf, pos)
            elif key == 0x12:
                length, pos = _read_varint(buf, pos)
                if pos + length > len(buf):
                    raise TransferError("ModelChunk: data field runs past the message")
                data, pos = buf[pos : pos + length], pos + length
            elif key == 0x18:
                total, pos = _read_varint(buf, pos)
            else:
                msg = pb.ModelChunk.FromString(bytes(raw))
                return msg.offset, memoryview(msg.data), msg.total_size
    except (UpdateRejectedError, DecodeError) as e:
        raise TransferError(f"malformed ModelChunk: {e}") from None
    return offset, data, total


#: Where each call's messages name the client they act for: paths of field numbers from
#: the message to a `client_id` string (federated.proto). A path through a sub-message
#: (a SessionRequest's poll, an UploadChunk's header) follows every occurrence of it.
CLIENT_ID_PATHS: dict[str, tuple[tuple[int, ...], ...]] = {
    "ReportEvaluation": ((1,),),  # EvaluationReport.client_id
    "Poll": ((1,),),  # TaskRequest.client_id
    "SubmitSecure": ((1, 1),),  # SecureChunk.header.client_id
    # SessionRequest: poll, download and heartbeat name it; an upload in its header.
    "Session": ((1, 1), (2, 1), (3, 1, 1), (4, 1)),
}


def named_clients(
    raw: bytes | memoryview, paths: tuple[tuple[int, ...], ...]
) -> list[bytes] | None:
    """Every client id `raw` names along `paths`, as protobuf would read them (repeated
    occurrences included: a check that saw only the last could be fooled by the first);
    None when `raw` is not protobuf wire format (protobuf refuses it too)."""
    found: list[bytes] = []
    try:
        _collect(memoryview(raw), _path_tree(paths), found)
    except MalformedPayload:
        return None
    return found


#: Field number -> (whether a client id ends a path there, the paths' further fields).
PathTree = dict[int, tuple[bool, "PathTree"]]


@functools.lru_cache(maxsize=64)  # one per call kind
def _path_tree(paths: tuple[tuple[int, ...], ...]) -> PathTree:
    """`paths` merged by their leading fields, so one pass over a message follows all."""
    root: PathTree = {}
    for path in paths:
        node = root
        for k, number in enumerate(path):
            leaf, children = node.get(number, (False, {}))
            node[number] = (leaf or k == len(path) - 1, children)
            node = children
    return root


def _collect(buf: memoryview, tree: PathTree, found: list[bytes]) -> None:
    """Append the values at the paths of `tree` in `buf` to `found`, in the order they
    occur (MalformedPayload if unparsable)."""
    pos, end = 0, len(buf)
    while pos < end:
        number, wire, value, pos = _wire_field(buf, pos, end)
        node = tree.get(number)
        if node is None or wire != 2:
            continue
        leaf, children = node
        if leaf:
            found.append(bytes(value))
        if children:
            _collect(value, children, found)


def _wire_field(buf: memoryview, pos: int, end: int) -> tuple[int, int, memoryview, int]:
    """(number, wire type, value, next position) of any protobuf field, groups skipped
    whole: accepts whatever protobuf's parser accepts."""
    key, pos = read_varint(buf, pos, end)
    number, wire = key >> 3, key & 7
    if number == 0:
        raise MalformedPayload("field number 0")
    start = pos
    if wire == 0:
        _, pos = read_varint(buf, pos, end)
    elif wire == 2:
        length, pos = read_varint(buf, pos, end)
        start = pos
        pos += length
    elif wire in (1, 5):
        pos += 8 if wire == 1 else 4
    elif wire == 3:  # a group: its fields, up to the matching end-group key
        while True:
            if pos >= end:
                raise MalformedPayload(f"group {number} does not end")
            inner, inner_wire, _, after = _wire_field_or_end(buf, pos, end)
            pos = after
            if inner_wire == 4:
                if inner != number:
                    raise MalformedPayload(f"group {number} ends as group {inner}")
                break
    else:
        raise MalformedPayload(f"unexpected wire type {wire}")
    if pos > end:
        raise MalformedPayload(f"field {number} runs past its message")
    return number, wire, buf[start:pos], pos


def _wire_field_or_end(buf: memoryview, pos: int, end: int) -> tuple[int, int, memoryview, int]:
    """`_wire_field`, or an end-group key (wire type 4) as a field of its own."""
    key, after = read_varint(buf, pos, end)
    if key & 7 == 4:
        return key >> 3, 4, buf[after:after], after
    return _wire_field(buf, pos, end)
