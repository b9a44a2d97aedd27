"""The interceptor's ownership check reads the client ids a request names as protobuf does:
every occurrence, nested headers and oneof members included, whatever else the bytes hold."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from sporenet.federated.common.wire import CLIENT_ID_PATHS, named_clients
from sporenet.proto import federated_pb2 as pb

SESSION = CLIENT_ID_PATHS["Session"]


@pytest.mark.parametrize(
    ("message", "method", "names"),
    [
        (pb.TaskRequest(client_id="a", wait_ms=5), "Poll", [b"a"]),
        (pb.EvaluationReport(client_id="a", loss=1.0), "ReportEvaluation", [b"a"]),
        (
            pb.SecureChunk(header=pb.SecureHeader(client_id="a", task_id="t"), data=b"x" * 300),
            "SubmitSecure",
            [b"a"],
        ),
        (pb.SecureChunk(data=b"\x0a\x01b"), "SubmitSecure", []),  # bytes that look like one
        (pb.SessionRequest(poll=pb.TaskRequest(client_id="a")), "Session", [b"a"]),
        (pb.SessionRequest(download=pb.DownloadRequest(client_id="a")), "Session", [b"a"]),
        (pb.SessionRequest(heartbeat=pb.HeartbeatRequest(client_id="a")), "Session", [b"a"]),
        (
            pb.SessionRequest(upload=pb.UploadChunk(header=pb.UploadHeader(client_id="a"))),
            "Session",
            [b"a"],
        ),
        (pb.SessionRequest(upload=pb.UploadChunk(offset=7, data=b"\x0a\x01b")), "Session", []),
    ],
)
def test_the_named_client_is_found_where_the_schema_puts_it(
    message: object, method: str, names: list[bytes]
) -> None:
    assert named_clients(message.SerializeToString(), CLIENT_ID_PATHS[method]) == names  # type: ignore[attr-defined]


def test_every_occurrence_counts_not_only_the_one_protobuf_keeps() -> None:
    # Two polls in one message: protobuf keeps the last ("victim"); both are reported.
    raw = (
        pb.SessionRequest(poll=pb.TaskRequest(client_id="me")).SerializeToString()
        + pb.SessionRequest(poll=pb.TaskRequest(client_id="victim")).SerializeToString()
    )
    assert pb.SessionRequest.FromString(raw).poll.client_id == "victim"
    assert named_clients(raw, SESSION) == [b"me", b"victim"]
    # A header split over two occurrences merges; its client id is still seen.
    header = pb.UploadChunk(header=pb.UploadHeader(task_id="t")).SerializeToString()
    other = pb.UploadChunk(header=pb.UploadHeader(client_id="victim")).SerializeToString()
    raw = pb.SessionRequest(upload=pb.UploadChunk.FromString(header)).SerializeToString()
    raw += b"\x1a" + bytes([len(other)]) + other
    assert pb.SessionRequest.FromString(raw).upload.header.client_id == "victim"
    assert named_clients(raw, SESSION) == [b"victim"]


def test_fields_around_the_client_id_are_skipped_as_protobuf_skips_them() -> None:
    body = pb.TaskRequest(client_id="a").SerializeToString()
    # Unknown fields of every wire type, a group among them, before the client id.
    unknown = b"\x28\x96\x01" + b"\x31" + b"\x00" * 8 + b"\x3d" + b"\x00" * 4
    group = b"\x43" + b"\x08\x01" + b"\x44"  # field 8: start group, a varint, end group
    raw = unknown + group + body
    assert pb.TaskRequest.FromString(raw).client_id == "a"
    assert named_clients(raw, CLIENT_ID_PATHS["Poll"]) == [b"a"]


@pytest.mark.parametrize("raw", [b"\xff", b"\x0a\x05ab", b"\x43\x08\x01", b"\x07", b"\x00\x00"])
def test_bytes_protobuf_refuses_are_not_read(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        pb.TaskRequest.FromString(raw)
    assert named_clients(raw, CLIENT_ID_PATHS["Poll"]) is None
