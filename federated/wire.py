"""Hand-written wire format of the two payload messages, ModelChunk and UploadChunk.

They carry most of the bytes. Going through protobuf objects costs two extra copies of
every chunk (message construction or parsing, then the bytes field), so the server and
the client write and read these two messages by hand. The encoding is plain proto3 wire
format, and anything unusual (a header, unknown fields) falls back to protobuf; the
committed federated_pb2 stays the schema.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from sporenet.federated.codec import MalformedPayload, read_varint
from sporenet.federated.errors import TransferError, UpdateRejectedError
from sporenet.federated.secagg.server import Stage
from sporenet.proto import federated_pb2 as pb

#: Secure-aggregation stage names (secagg's Stage) <-> the wire enum SecureStage.
SECURE_STAGES: dict[str, pb.SecureStage] = {
    Stage.ADVERTISE_KEYS.value: pb.SECURE_ADVERTISE_KEYS,
    Stage.SHARE_KEYS.value: pb.SECURE_SHARE_KEYS,
    Stage.MASKED_INPUT.value: pb.SECURE_MASKED_INPUT,
    Stage.UNMASK.value: pb.SECURE_UNMASK,
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


def encode_model_chunk(offset: int, data: bytes, total_size: int) -> bytes:
    """The wire bytes of ModelChunk(offset, data, total_size) with a single copy of `data`."""
    return b"".join(
        (b"\x08", _varint(offset), b"\x12", _varint(len(data)), data, b"\x18", _varint(total_size))
    )


def parse_upload_chunk(raw: bytes) -> pb.UploadChunk:
    """An UploadChunk through protobuf (the first one of a call, with its header)."""
    try:
        return pb.UploadChunk.FromString(raw)
    except DecodeError as e:
        raise UpdateRejectedError(f"UploadChunk is not valid protobuf: {e}") from None


def split_upload_chunk(raw: bytes) -> tuple[int, memoryview]:
    """(offset, data) of a header-less UploadChunk; `data` is a view into `raw`."""
    buf = memoryview(raw)
    pos, offset, data = 0, 0, buf[0:0]
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        if key == 0x10:  # field 2 (offset), varint
            offset, pos = _read_varint(buf, pos)
        elif key == 0x1A:  # field 3 (data), length-delimited
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise UpdateRejectedError("UploadChunk: data field runs past the message")
            data, pos = buf[pos : pos + length], pos + length
        else:  # a header or a field this fast path does not know
            msg = parse_upload_chunk(raw)
            return msg.offset, memoryview(msg.data)
    return offset, data


def encode_upload_chunk(offset: int, data: bytes | memoryview) -> bytes:
    """The wire bytes of a header-less UploadChunk(offset, data)."""
    return b"".join((b"\x10", _varint(offset), b"\x1a", _varint(len(data)), data))


def split_model_chunk(raw: bytes) -> tuple[int, memoryview, int]:
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
                msg = pb.ModelChunk.FromString(raw)
                return msg.offset, memoryview(msg.data), msg.total_size
    except (UpdateRejectedError, DecodeError) as e:
        raise TransferError(f"malformed ModelChunk: {e}") from None
    return offset, data, total
