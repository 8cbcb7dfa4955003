"""ttrpc call status: gRPC's codes, the Status message, and the Go server's own texts.

A Response without a status is OK (Go omits it), and so is one whose code is
0 (ttrpc-rust sends ``Status{code: OK}``): :func:`status_of` treats both alike.
A failed call surfaces as :class:`TtrpcError` carrying the code, the message
and the details (``google.protobuf.Any``) exactly as received.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from google.protobuf import any_pb2

from . import ttrpc_pb2
from .frames import MAX_DATA

__all__ = [
    "Code",
    "Status",
    "TtrpcError",
    "data_after_close",
    "deadline_exceeded",
    "id_not_odd",
    "id_reused",
    "oversize",
    "status_of",
    "stream_closed",
    "stream_inactive",
    "unknown_method",
    "unknown_service",
    "unmarshal_request",
]


class Code(enum.IntEnum):
    """gRPC status codes, which ttrpc uses unchanged."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


@dataclass(frozen=True, slots=True)
class Status:
    """A call's outcome. ``code`` stays an int: a peer may send a code this table lacks."""

    code: int
    message: str = ""
    details: tuple[any_pb2.Any, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.code == Code.OK

    def to_pb(self) -> ttrpc_pb2.Status:
        return ttrpc_pb2.Status(code=self.code, message=self.message, details=self.details)

    @classmethod
    def from_pb(cls, status: ttrpc_pb2.Status) -> Status:
        return cls(status.code, status.message, tuple(status.details))

    def error(self) -> TtrpcError:
        return TtrpcError(self.code, self.message, self.details)


OK = Status(Code.OK)


class TtrpcError(Exception):
    """A call failed with a non-OK status (from the peer, or decided locally)."""

    def __init__(self, code: int, message: str = "", details: Sequence[any_pb2.Any] = ()) -> None:
        self.code = code
        self.message = message
        self.details = tuple(details)
        try:
            name = Code(code).name
        except ValueError:
            name = f"code {code}"
        super().__init__(f"{name}: {message}" if message else name)

    @property
    def status(self) -> Status:
        return Status(self.code, self.message, self.details)


def status_of(response: ttrpc_pb2.Response) -> Status:
    """The status of a decoded Response: absent means OK, as does code 0."""
    if not response.HasField("status"):
        return OK
    return Status.from_pb(response.status)


# -- the Go server's replies to bad input (containerd/ttrpc 1.2) --


def oversize(length: int) -> Status:
    return Status(
        Code.RESOURCE_EXHAUSTED,
        f"message length {length} exceed maximum message size of {MAX_DATA}",
    )


def id_not_odd() -> Status:
    return Status(Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams")


def id_reused() -> Status:
    return Status(Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment")


def stream_inactive() -> Status:
    return Status(Code.INVALID_ARGUMENT, "StreamID is no longer active")


def stream_closed() -> Status:
    """A message on a stream the client already closed (its handler still running)."""
    return Status(Code.INVALID_ARGUMENT, "data handling error: ttrpc: stream closed")


def data_after_close() -> Status:
    return Status(Code.INVALID_ARGUMENT, "data close message cannot include data")


def unmarshal_request(reason: str) -> Status:
    return Status(Code.INVALID_ARGUMENT, f"unmarshal request error: {reason}")


def unknown_service(service: str) -> Status:
    return Status(Code.UNIMPLEMENTED, f"service {service}")


def unknown_method(method: str) -> Status:
    return Status(Code.UNIMPLEMENTED, f"method {method}")


def deadline_exceeded() -> Status:
    return Status(Code.DEADLINE_EXCEEDED, "context deadline exceeded")
