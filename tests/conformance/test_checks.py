"""The conformance checks themselves: each one fails a codec that breaks its rule.

Each broken codec below is the template's, with one rule of the shared
lifecycle undone; the check for that rule must reject it, so a check that
stopped checking would fail here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from template_cases import SERVER

from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from gateway.protocol.conformance import (
    CHECKS,
    CodecCase,
    Golden,
    check_cut_input,
    check_errors_sticky,
    check_goldens,
    check_held_bytes_bounded,
    check_same_answer_after_close,
    check_sends_refused,
    splits,
)
from gateway.protocol.events import NEED_DATA, ConnectionClosed
from gateway.protocol.lifecycle import CodecState, WrongState
from protocols._template import Limits, Ok, Publish, ServerCodec


class _PartialAtEnd(ServerCodec):
    """Returns a line cut by the end of input as if it were whole."""

    def _line(self) -> Any:
        buf = self._buffer
        if buf.eof and buf.find(b"\n") < 0 and len(buf):
            line = bytes(buf.data[buf.pos :])
            buf.advance(len(buf.data))
            return line
        return super()._line()


class _NeedDataAfterClose(ServerCodec):
    """Answers NEED_DATA once closed (what ndjson's codec used to do)."""

    def _not_open(self) -> Any:
        if self._state is CodecState.CLOSED:
            return NEED_DATA
        return super()._not_open()


class _NotSticky(ServerCodec):
    """Raises the peer's error but stays open."""

    def _fail(self, error: RemoteProtocolError | str) -> Any:
        raise RemoteProtocolError(error) if isinstance(error, str) else error


class _RefusesLate(ServerCodec):
    """Counts an answer as sent before refusing it."""

    def send(self, event: Any) -> bytes:
        self.owed -= 1
        return super().send(event)


def _with(make: Callable[[], Any], **changes: Any) -> CodecCase:
    return dataclasses.replace(SERVER, make=make, **changes)


def test_the_template_passes_every_check() -> None:
    for check in CHECKS:
        check(SERVER)


@pytest.mark.parametrize(
    ("case", "check"),
    [
        (
            _with(SERVER.make, goldens=[Golden("wrong", b"PUB a\n", [Publish(b"b")])]),
            check_goldens,
        ),
        (_with(_PartialAtEnd), check_cut_input),
        (_with(_NeedDataAfterClose), check_same_answer_after_close),
        (_with(_NotSticky), check_errors_sticky),
        (
            _with(SERVER.make, refused=[lambda codec: codec.held_bytes]),  # refuses nothing
            check_sends_refused,
        ),
        (_with(_RefusesLate), check_sends_refused),
        (_with(lambda: ServerCodec(Limits(max_line=10**6))), check_held_bytes_bounded),
    ],
    ids=[
        "golden-events",
        "partial-event-at-end",
        "need-data-after-close",
        "error-not-sticky",
        "send-not-refused",
        "refusal-changes-state",
        "held-unbounded",
    ],
)
def test_a_check_rejects_a_codec_that_breaks_its_rule(case: CodecCase, check: Any) -> None:
    with pytest.raises(AssertionError):
        check(case)


def test_splits_cut_at_every_byte_then_one_byte_at_a_time() -> None:
    assert list(splits(b"ab")) == [[b"", b"ab"], [b"a", b"b"], [b"ab", b""], [b"a", b"b"]]
    assert list(splits(b"")) == [[b"", b""], []]


def test_wrong_state_names_the_state_and_the_action() -> None:
    codec = ServerCodec()
    codec.receive_data(b"GET /\n")
    with pytest.raises(RemoteProtocolError):
        codec.next_event()
    with pytest.raises(WrongState, match="next_event: refused in the ERROR state") as info:
        codec.next_event()
    assert isinstance(info.value, LocalProtocolError)
    assert (info.value.state, info.value.action) == (CodecState.ERROR, "next_event")
    with pytest.raises(WrongState, match="send Ok: refused in the ERROR state"):
        codec.send(Ok())


def test_closed_is_closed() -> None:
    codec = ServerCodec()
    codec.receive_data(b"PUB x\nPUB cut")
    codec.receive_data(b"")
    assert [codec.next_event() for _ in range(4)] == [Publish(b"x")] + [ConnectionClosed()] * 3
    assert codec.state is CodecState.CLOSED
    assert codec.held_bytes == 0
