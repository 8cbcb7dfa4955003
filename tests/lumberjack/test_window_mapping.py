"""Window → messages: the fast path for plain JSON windows agrees with the general one."""

from __future__ import annotations

import pytest

from gateway.errors import RemoteProtocolError
from gateway.model import Message, Source
from protocols.lumberjack.mapping import JSON, to_messages

SOURCE = Source("lumberjack", "beats", "127.0.0.1:1")
EVENTS: list[tuple[int, bytes | dict[str, str]]] = [
    (7, b'{"a":1}'),
    (8, b' {"b":"\xc3\xa9"} '),
    (9, b'{"c":[1,2]}'),
]


@pytest.mark.parametrize("validate", [True, False])
def test_json_window_becomes_messages_byte_for_byte(validate: bool) -> None:
    out = to_messages(EVENTS, SOURCE, "logs", validate=validate)
    expected = [Message("logs", p, {}, JSON, SOURCE) for _, p in EVENTS]  # type: ignore[misc]
    assert [type(m) for m in out] == [Message] * 3
    assert [(m.destination, m.body, dict(m.headers), m.content_type, m.source) for m in out] == [
        (m.destination, m.body, {}, m.content_type, m.source) for m in expected
    ]


@pytest.mark.parametrize(
    ("bad", "why"), [(b'{"x":', "not valid JSON"), (b"[1]", "not a JSON object"), (b"7", "object")]
)
def test_a_bad_event_is_named_by_its_sequence(bad: bytes, why: str) -> None:
    events = [*EVENTS, (42, bad)]
    with pytest.raises(RemoteProtocolError, match=f"seq 42 .*{why}"):
        to_messages(events, SOURCE, "logs")
    # Without validation the bytes pass through untouched.
    assert to_messages(events, SOURCE, "logs", validate=False)[-1].body == bad


def test_key_value_events_take_the_general_path() -> None:
    events: list[tuple[int, bytes | dict[str, str]]] = [(1, {"line": "x"}), (2, b'{"a":1}')]
    kv, js = to_messages(events, SOURCE, "logs")
    assert (kv.body, dict(kv.headers), kv.content_type) == (b"", {"line": "x"}, None)
    assert (js.body, js.content_type) == (b'{"a":1}', JSON)
