"""Window → messages: the fast path for plain JSON windows agrees with the general one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import RemoteProtocolError
from gateway.core.model import Message, Source
from protocols.lumberjack import mapping
from protocols.lumberjack.mapping import (
    JSON,
    beats_metadata,
    json_object_error,
    to_messages,
    to_payload,
    to_payloads,
)

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


# -- what counts as a JSON object --------------------------------------------------------

OBJECTS = [
    b"{}",
    b' {"a":1}',
    b'{"a":1}\n',
    b'{"\xc3\xa9":"\xf0\x9f\x98\x80"}',
    b'{"a":"\\ud83d\\ude00"}',
    b'{"a":[1,-0.5e3,true,null,{"b":{}}]}',
    b'{"a":123456789012345678901234567890}',
]
NOT_OBJECTS = [
    (b"", "not valid JSON"),
    (b"[]", "not a JSON object"),
    (b'"{}"', "not a JSON object"),
    (b"{}{}", "not valid JSON"),
    (b'{"a":1,}', "not valid JSON"),
    (b'{"a":NaN}', "not valid JSON"),
    (b'{"a":"\\ud800"}', "not valid JSON"),  # a lone surrogate
    (b'{"a":"\t"}', "not valid JSON"),  # a raw control character
    (b'{"a":"\xff"}', "not UTF-8"),
    (b'{"a":"\xed\xa0\x80"}', "not UTF-8"),  # a surrogate encoded in UTF-8
    (b'{"a":"\xc3"}', "not UTF-8"),
    (b"\xef\xbb\xbf{}", "not valid JSON"),  # a byte order mark
    (b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
]


@pytest.mark.parametrize("payload", OBJECTS, ids=repr)
def test_json_objects_are_accepted_alone_and_in_a_window(payload: bytes) -> None:
    assert json_object_error(payload) is None
    events: list[tuple[int, bytes | dict[str, str]]] = [(1, b"{}"), (2, payload), (3, b"{}")]
    assert [m.body for m in to_messages(events, SOURCE, "logs")] == [b"{}", payload, b"{}"]


@pytest.mark.parametrize(("payload", "why"), NOT_OBJECTS, ids=lambda v: repr(v)[:40])
def test_anything_else_is_refused_alone_and_in_a_window(payload: bytes, why: str) -> None:
    problem = json_object_error(payload)
    assert problem is not None
    assert why in problem
    events: list[tuple[int, bytes | dict[str, str]]] = [(1, b"{}"), (2, payload), (3, b"{}")]
    with pytest.raises(RemoteProtocolError, match=f"seq 2 .*{why}"):
        to_messages(events, SOURCE, "logs")


def test_utf8_split_across_events_is_still_refused() -> None:
    """Two halves of one UTF-8 sequence in neighbouring events are each invalid."""
    events: list[tuple[int, bytes | dict[str, str]]] = [(1, b'{"a":"\xc3'), (2, b'\xa9"}')]
    with pytest.raises(RemoteProtocolError, match="seq 1"):
        to_messages(events, SOURCE, "logs")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            _json_values.map(lambda v: json.dumps(v, ensure_ascii=False).encode()),
            st.dictionaries(st.text(), _json_values, max_size=4).map(
                lambda v: json.dumps(v, ensure_ascii=False).encode()
            ),
            st.binary(max_size=12),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_window_is_accepted_exactly_when_each_event_is_an_object(payloads: list[bytes]) -> None:
    """The window-wide check agrees with the one-event check, and both with the
    standard library's parser (where it is strict: no NaN, no lone surrogates)."""
    events: list[tuple[int, bytes | dict[str, str]]] = list(enumerate(payloads, 1))
    verdicts = [json_object_error(p) is None for p in payloads]
    for p, ok in zip(payloads, verdicts, strict=True):
        assert ok == _stdlib_says_object(p), p
    if all(verdicts):
        assert [m.body for m in to_messages(events, SOURCE, "logs")] == payloads
    else:
        first_bad = verdicts.index(False) + 1
        with pytest.raises(RemoteProtocolError, match=f"seq {first_bad} "):
            to_messages(events, SOURCE, "logs")


def _stdlib_says_object(payload: bytes) -> bool:
    def refuse(value: str) -> None:
        raise ValueError(value)

    try:
        text = payload.decode("utf-8")
        value = json.loads(text, parse_constant=refuse)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    # The standard library lets lone surrogate escapes through; JSON text must not.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return isinstance(value, dict)


# -- outbound: @metadata for Logstash ----------------------------------------------------

#: JSON values only (no Infinity, which json.dumps writes but JSON does not have).
_strict_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
METADATA = beats_metadata("interchange", "_doc", "1.2.3")
METADATA_VALUE = {"beat": "interchange", "type": "_doc", "version": "1.2.3"}


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["@metadata", "message", "a", "@timestamp", "\u00e9"]),
        _strict_json_values,
    ),
    st.sampled_from(["", " ", "\n  "]),
)
def test_metadata_is_added_exactly_when_the_object_has_none(
    event: dict[str, Any], space: str
) -> None:
    body = space + json.dumps(event, ensure_ascii=False, indent=1 if space else None) + space
    raw = body.encode()
    out = to_payload(Message("d", raw, {}, JSON), METADATA)
    if "@metadata" in event:
        assert out == raw  # a Beats event: forwarded byte for byte
    else:
        assert json.loads(out) == {"@metadata": METADATA_VALUE, **event}
        # Only the member is inserted; everything around it is the sender's bytes.
        assert out.replace(METADATA + (b"," if event else b""), b"", 1) == raw


@pytest.mark.parametrize(
    ("body", "has"),
    [
        (b'{"\\u0040metadata":{}}', True),  # the key, escaped
        (b'{"x":{"@metadata":1}}', False),  # not at the top level
        (b'{"x":"\\"@metadata\\""}', False),  # inside a string
        (b'["@metadata"]', False),  # not an object: wrapped
        (b'{"@metadata":"\xff"}', False),  # not UTF-8: wrapped
        (b'{"@metadata":1', False),  # not JSON: wrapped
    ],
)
def test_metadata_key_is_found_however_it_is_spelled(body: bytes, has: bool) -> None:
    out = to_payload(Message("d", body, {}, JSON), METADATA)
    assert (out == body) is has
    assert "@metadata" in json.loads(out)


def test_wrapped_bodies_get_metadata_too() -> None:
    out = to_payload(Message("d", b"plain", {"k": "v"}), METADATA)
    assert json.loads(out) == {"@metadata": METADATA_VALUE, "message": "plain", "k": "v"}
    out = to_payload(Message("d", b"", {"line": "x"}), METADATA)
    assert json.loads(out) == {"@metadata": METADATA_VALUE, "line": "x"}
    # Without metadata, nothing is added.
    assert to_payload(Message("d", b'{"a":1}', {}, JSON)) == b'{"a":1}'


_bodies = st.one_of(
    st.dictionaries(
        st.sampled_from(["@metadata", "message", "a"]), _strict_json_values, max_size=3
    ).map(lambda v: json.dumps(v).encode()),
    st.sampled_from(
        [b" {}", b"{} ", b"[]", b"text", b"", b'{"a":"\xff"}', b'{"x":{"@metadata":1}}']
    ),
    st.binary(max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_bodies, st.sampled_from([{}, {"k": "v"}])), min_size=1, max_size=6),
    st.sampled_from([b"", METADATA]),
)
def test_a_window_of_payloads_is_each_message_s_payload(
    items: list[tuple[bytes, dict[str, str]]], metadata: bytes
) -> None:
    """The window-at-a-time path agrees with the one-message path, whatever the bodies."""
    messages = [Message("d", body, headers) for body, headers in items]
    assert to_payloads(messages, metadata) == [to_payload(m, metadata) for m in messages]


def test_a_window_too_deep_to_read_as_one_array_falls_back_to_each_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Joined into one array, an object at msgspec's nesting limit is one level too deep
    (msgspec's limit is Python's recursion limit, so where it falls depends on the call
    stack): the window is then read one message at a time."""

    class TooDeep:
        def decode(self, data: bytes) -> None:
            raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(mapping, "_METADATA_PROBES", TooDeep())
    messages = [Message("d", b'{"a":1}'), Message("d", b'{"@metadata":{}}')]
    assert to_payloads(messages, METADATA) == [to_payload(m, METADATA) for m in messages]
    assert json.loads(to_payloads(messages, METADATA)[0])["@metadata"] == METADATA_VALUE
