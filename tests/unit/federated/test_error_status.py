"""Unexpected handler errors map to documented statuses, never UNKNOWN."""

from __future__ import annotations

import errno
import sqlite3

import grpc
import pytest
from google.protobuf.message import DecodeError

from sporenet.federated.errors import FederatedError, MalformedMessageError, UpdateRejectedError
from sporenet.federated.server.servicer import decoder, status_for, unexpected_status
from sporenet.federated.server.session import accepted
from sporenet.federated.server.validation import parse_metrics
from sporenet.proto import federated_pb2 as pb

C = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (DecodeError("bad wire type"), C.INVALID_ARGUMENT),
        (ValueError("Exceeds the limit (4300 digits)"), C.INVALID_ARGUMENT),
        (RecursionError("maximum recursion depth"), C.INVALID_ARGUMENT),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), C.INVALID_ARGUMENT),
        (OSError(errno.ENOSPC, "No space left on device"), C.RESOURCE_EXHAUSTED),
        (sqlite3.OperationalError("database or disk is full"), C.RESOURCE_EXHAUSTED),
        (sqlite3.OperationalError("disk I/O error"), C.UNAVAILABLE),
        (OSError(errno.EIO, "Input/output error"), C.UNAVAILABLE),
        (MemoryError(), C.RESOURCE_EXHAUSTED),
        (KeyError("x"), C.INTERNAL),
    ],
)
def test_unexpected_errors_get_a_documented_status(error: BaseException, code: C) -> None:
    got, message = unexpected_status(error)
    assert got == code
    assert type(error).__name__ in message and len(message) < 300


def test_a_bare_domain_error_is_internal_not_unknown() -> None:
    assert status_for(FederatedError("x")) == C.INTERNAL


def test_undecodable_bodies_become_malformed_message_errors() -> None:
    decode = decoder(pb.RegisterRequest)
    assert (
        accepted(decode(pb.RegisterRequest(client_name="a").SerializeToString())).client_name == "a"
    )
    with pytest.raises(MalformedMessageError, match="not a valid RegisterRequest"):
        accepted(decode(b"\xff\xff\xff"))


@pytest.mark.parametrize(
    "text",
    ["1" * 5000, '{"a": ' + "1" * 5000 + "}", "[" * 100_000, '{"a": {"b": 1}}', '{"a": 1e999}'],
)
def test_hostile_metrics_are_refused_as_bad_input(text: str) -> None:
    with pytest.raises(UpdateRejectedError, match="metrics_json"):
        parse_metrics(text, "metrics_json")


def test_braces_inside_metric_names_are_not_nesting() -> None:
    assert parse_metrics('{"a{[": 1, "b\\"{": 2}', "m") == {"a{[": 1.0, 'b"{': 2.0}
