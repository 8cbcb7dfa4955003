"""The ndjson codec on its own: bytes in, events out, events in, bytes out; no I/O.

Golden byte vectors pin the wire format; every stream is also parsed split at
each byte; negative vectors and Hypothesis properties check that a peer can
only ever cause a :class:`RemoteProtocolError`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from interchange_ndjson import (
    CLIENT,
    NEED_DATA,
    SERVER,
    Ack,
    ConnectionClosed,
    Credit,
    Deliver,
    Error,
    Event,
    Nack,
    NdjsonConnection,
    Ping,
    Pong,
    Publish,
    Published,
    Subscribe,
    Unsubscribe,
)
from interchange_ndjson.codec import DEFAULT_MAX_LINE, Role, State

from gateway.errors import LocalProtocolError, RemoteProtocolError

# -- helpers ------------------------------------------------------------------------


def drain(conn: NdjsonConnection) -> list[Event]:
    """Every event ``conn`` can produce from what it has received so far."""
    events: list[Event] = []
    while True:
        event = conn.next_event()
        if event is NEED_DATA:
            return events
        assert isinstance(event, Event)
        events.append(event)


def parse_chunks(
    role: Role, chunks: Iterable[bytes], *, max_line: int = DEFAULT_MAX_LINE
) -> list[Event]:
    """Feed ``chunks`` then EOF to a fresh ``role`` codec; all the events, in order."""
    conn = NdjsonConnection(role, max_line=max_line)
    events: list[Event] = []
    for chunk in chunks:
        if chunk:  # b"" would mean EOF
            conn.receive_data(chunk)
            events += drain(conn)
    conn.receive_data(b"")
    events += drain(conn)
    assert conn.state is State.CLOSED
    return events


def parse_line(role: Role, line: bytes) -> Event:
    """The single event that one whole line parses to."""
    events = parse_chunks(role, [line])
    assert events[-1] == ConnectionClosed()
    assert len(events) == 2, events
    return events[0]


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (taken modulo ``len(data) + 1``)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def peer_of(role: Role) -> Role:
    return SERVER if role is CLIENT else CLIENT


# -- golden vectors ---------------------------------------------------------------
# (line, event): ``send(event)`` by the role that may send it is exactly ``line``,
# and the peer's codec parses ``line`` back to ``event``.

CLIENT_GOLDEN: list[tuple[bytes, Event]] = [
    (
        b'{"op":"pub","id":7,"dest":"orders","body":"hello",'
        b'"headers":{"k":"v"},"content_type":"text/plain"}\n',
        Publish(
            body=b"hello",
            destination="orders",
            headers={"k": "v"},
            content_type="text/plain",
            id=7,
        ),
    ),
    (b'{"op":"pub","body":"x"}\n', Publish(body=b"x")),
    (b'{"op":"pub","body":""}\n', Publish(body=b"")),
    # Not UTF-8: base64.
    (b'{"op":"pub","b64":"//4A"}\n', Publish(body=b"\xff\xfe\x00")),
    # An encoded surrogate is not UTF-8 either.
    (b'{"op":"pub","b64":"7aCA"}\n', Publish(body=b"\xed\xa0\x80")),
    # Non-ASCII text stays UTF-8 text on the wire, not \u escapes.
    (
        b'{"op":"pub","id":"a-1","body":"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"}\n',
        Publish(body="héllo € 😀".encode(), id="a-1"),
    ),
    # A text body that happens to be JSON is still a string field.
    (
        b'{"op":"pub","body":"{\\"a\\":1}","content_type":"application/json"}\n',
        Publish(body=b'{"a":1}', content_type="application/json"),
    ),
    (
        b'{"op":"pub","body":"line1\\nline2\\r"}\n',
        Publish(body=b"line1\nline2\r"),
    ),
    (
        b'{"op":"sub","dest":"orders","window":10,"group":"g1","credit":5}\n',
        Subscribe("orders", group="g1", credit=5, window=10),
    ),
    (b'{"op":"sub","dest":"o","window":100}\n', Subscribe("o")),
    (b'{"op":"sub","dest":"o","window":1,"credit":0}\n', Subscribe("o", credit=0, window=1)),
    (b'{"op":"sub","dest":"o","window":10000}\n', Subscribe("o", window=10_000)),
    (b'{"op":"unsub","dest":"orders"}\n', Unsubscribe("orders")),
    (b'{"op":"credit","dest":"orders","n":3}\n', Credit("orders", 3)),
    (b'{"op":"credit","dest":"orders","n":0}\n', Credit("orders", 0)),
    (b'{"op":"ack","tag":5}\n', Ack(5)),
    (b'{"op":"ack","tag":9223372036854775807}\n', Ack(2**63 - 1)),
    (b'{"op":"nack","tag":5,"requeue":false}\n', Nack(5, requeue=False)),
    (b'{"op":"nack","tag":6,"requeue":true}\n', Nack(6)),
    (b'{"op":"ping"}\n', Ping()),
]

SERVER_GOLDEN: list[tuple[bytes, Event]] = [
    (b'{"op":"ack","id":7,"status":"delivered"}\n', Published(7, "delivered")),
    (
        b'{"op":"ack","id":"abc","status":"rejected","reason":"no route"}\n',
        Published("abc", "rejected", "no route"),
    ),
    (b'{"op":"ack","id":null,"status":"failed","reason":"x"}\n', Published(None, "failed", "x")),
    (
        b'{"op":"msg","tag":1,"dest":"orders","body":"hi","redelivered":true,'
        b'"headers":{"a":"b"},"content_type":"text/plain"}\n',
        Deliver(
            tag=1,
            destination="orders",
            body=b"hi",
            headers={"a": "b"},
            content_type="text/plain",
            redelivered=True,
        ),
    ),
    (b'{"op":"msg","tag":2,"dest":"o","b64":"gA=="}\n', Deliver(2, "o", b"\x80")),
    (
        b'{"op":"msg","tag":3,"dest":"\xc3\xa9t\xc3\xa9","body":"\xc3\xa7a"}\n',
        Deliver(3, "été", "ça".encode()),
    ),
    (b'{"op":"pong"}\n', Pong()),
    (b'{"op":"error","error":"bad line"}\n', Error("bad line")),
]

# Lines a peer may send that are not what ``send`` writes: (line, event).
CLIENT_PARSE_ONLY: list[tuple[bytes, Event]] = [
    # ``json``: the value re-serialized compactly, typed application/json.
    (
        b'{"op": "pub", "json": {"a": [1, 2.5, true, null], "b": "\xc3\xa9\\u00e9"}}\n',
        Publish(
            body=b'{"a":[1,2.5,true,null],"b":"\xc3\xa9\xc3\xa9"}',
            content_type="application/json",
        ),
    ),
    (
        b'{"op":"pub","json":"s","content_type":"application/x+json","dest":"q"}\n',
        Publish(body=b'"s"', destination="q", content_type="application/x+json"),
    ),
    (b'{"op":"pub","json":null}\n', Publish(body=b"null", content_type="application/json")),
    # A bare object: the line itself, byte for byte, as application/json.
    (
        b'{"a": 1,   "b" : "\xc3\xa9\\u00e9", "dest": "ignored"}\n',
        Publish(
            body=b'{"a": 1,   "b" : "\xc3\xa9\\u00e9", "dest": "ignored"}',
            content_type="application/json",
        ),
    ),
    (b"{}\n", Publish(body=b"{}", content_type="application/json")),
    # CRLF: the \r is not part of the line.
    (b'{"x":[]}\r\n', Publish(body=b'{"x":[]}', content_type="application/json")),
    (b'{"op":"ping"}\r\n', Ping()),
    # An escaped surrogate *pair* is one valid character.
    (b'{"op":"pub","body":"\\ud83d\\ude00"}\n', Publish(body="😀".encode())),
    (b'{"op":"pub","b64":""}\n', Publish(body=b"")),
    (b'{"op":"nack","tag":5}\n', Nack(5, requeue=True)),
    (
        b'{"op":"sub","dest":"q","window":null,"credit":null,"group":null}\n',
        Subscribe("q"),
    ),
    # Unknown fields are ignored.
    (b'{"op":"ping","extra":[1]}\n', Ping()),
]

SERVER_PARSE_ONLY: list[tuple[bytes, Event]] = [
    (
        b'{"op":"msg","tag":4,"dest":"d","json":[1, 2]}\n',
        Deliver(4, "d", b"[1,2]", content_type="application/json"),
    ),
    (b'{"op":"ack","status":"delivered"}\n', Published(None, "delivered")),
    (b'{"op":"pong"}\r\n', Pong()),
]


def _ids(vectors: Sequence[tuple[bytes, Event]]) -> list[str]:
    return [f"{i}-{type(event).__name__}" for i, (_, event) in enumerate(vectors)]


@pytest.mark.parametrize(("line", "event"), CLIENT_GOLDEN, ids=_ids(CLIENT_GOLDEN))
def test_client_golden_send(line: bytes, event: Event) -> None:
    assert NdjsonConnection(CLIENT).send(event) == line


@pytest.mark.parametrize(("line", "event"), SERVER_GOLDEN, ids=_ids(SERVER_GOLDEN))
def test_server_golden_send(line: bytes, event: Event) -> None:
    assert NdjsonConnection(SERVER).send(event) == line


@pytest.mark.parametrize(
    ("line", "event"),
    CLIENT_GOLDEN + CLIENT_PARSE_ONLY,
    ids=_ids(CLIENT_GOLDEN + CLIENT_PARSE_ONLY),
)
def test_server_parses_client_line(line: bytes, event: Event) -> None:
    assert parse_line(SERVER, line) == event


@pytest.mark.parametrize(
    ("line", "event"),
    SERVER_GOLDEN + SERVER_PARSE_ONLY,
    ids=_ids(SERVER_GOLDEN + SERVER_PARSE_ONLY),
)
def test_client_parses_server_line(line: bytes, event: Event) -> None:
    assert parse_line(CLIENT, line) == event


def test_bare_object_body_is_the_exact_line() -> None:
    line = b'  {"z":1e3, "a":"\\u00e9\xc3\xa9",\t"n":[ ]}  '
    event = parse_line(SERVER, line + b"\r\n")
    assert event == Publish(body=line, content_type="application/json")


def test_json_field_is_compact_utf8() -> None:
    event = parse_line(SERVER, b'{"op":"pub","json":{ "k" : [ 1 , "\\u20ac" ] }}\n')
    assert isinstance(event, Publish)
    assert event.body == '{"k":[1,"€"]}'.encode()
    assert event.content_type == "application/json"


def test_json_field_body_is_strict_json() -> None:
    # 1e400 is valid JSON but a float overflow: the body must not become b"Infinity",
    # which no strict JSON parser accepts, while being typed application/json.
    conn = NdjsonConnection(SERVER)
    conn.receive_data(b'{"op":"pub","json":[1e400]}\n')
    try:
        event = conn.next_event()
    except RemoteProtocolError:
        return
    assert isinstance(event, Publish)
    json.loads(event.body, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- streams, split everywhere ----------------------------------------------------------


def _stream(vectors: Sequence[tuple[bytes, Event]]) -> tuple[bytes, list[Event]]:
    """All lines, with blank lines, whitespace-only lines and CRLF mixed in."""
    data = bytearray(b"\n")
    events: list[Event] = []
    for i, (line, event) in enumerate(vectors):
        if i % 3 == 1 and not line.endswith(b"\r\n"):
            line = line[:-1] + b"\r\n"
        data += line
        if i % 4 == 2:
            data += b"\n \t \r\n\r\n"
        events.append(event)
    events.append(ConnectionClosed())
    return bytes(data), events


STREAMS = {
    "to-server": (SERVER, *_stream(CLIENT_GOLDEN + CLIENT_PARSE_ONLY)),
    "to-client": (CLIENT, *_stream(SERVER_GOLDEN + SERVER_PARSE_ONLY)),
}


@pytest.mark.parametrize("name", STREAMS)
def test_stream_one_shot(name: str) -> None:
    role, data, events = STREAMS[name]
    assert parse_chunks(role, [data]) == events


@pytest.mark.parametrize("name", STREAMS)
def test_stream_split_in_two_at_every_byte(name: str) -> None:
    role, data, events = STREAMS[name]
    for i in range(len(data) + 1):
        assert parse_chunks(role, [data[:i], data[i:]]) == events, f"split at {i}"


@pytest.mark.parametrize("name", STREAMS)
def test_stream_one_byte_at_a_time(name: str) -> None:
    role, data, events = STREAMS[name]
    assert parse_chunks(role, [data[i : i + 1] for i in range(len(data))]) == events


@pytest.mark.parametrize("name", STREAMS)
def test_stream_events_appear_as_soon_as_their_newline_arrives(name: str) -> None:
    role, data, events = STREAMS[name]
    conn = NdjsonConnection(role)
    got: list[Event] = []
    for i in range(len(data)):
        conn.receive_data(data[i : i + 1])
        new = drain(conn)
        if new:
            assert data[i : i + 1] == b"\n"
        got += new
    assert got == events[:-1]


# -- EOF and states -----------------------------------------------------------------


def test_initial_state_is_open() -> None:
    assert NdjsonConnection(SERVER).state is State.OPEN
    assert NdjsonConnection(CLIENT).state is State.OPEN


def test_eof_after_complete_lines_closes() -> None:
    conn = NdjsonConnection(SERVER)
    conn.receive_data(b'{"op":"ping"}\n{"op":"ack","tag":1}\n')
    conn.receive_data(b"")
    assert conn.next_event() == Ping()
    assert conn.state is State.OPEN
    assert conn.next_event() == Ack(1)
    assert conn.next_event() == ConnectionClosed()
    assert conn.state is State.CLOSED
    assert conn.next_event() is NEED_DATA
    assert conn.state is State.CLOSED


def test_eof_on_empty_input_closes() -> None:
    conn = NdjsonConnection(CLIENT)
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    assert conn.next_event() == ConnectionClosed()
    assert conn.state is State.CLOSED


@pytest.mark.parametrize("tail", [b" ", b"\r", b" \t\r", b"\n\n"])
def test_eof_after_trailing_whitespace_closes(tail: bytes) -> None:
    assert parse_chunks(SERVER, [b'{"op":"ping"}\n', tail]) == [Ping(), ConnectionClosed()]


@pytest.mark.parametrize("partial", [b"{", b'{"op":"ping"}', b'{"op":"ping"}\r', b"  x"])
def test_eof_in_the_middle_of_a_line_is_an_error(partial: bytes) -> None:
    conn = NdjsonConnection(SERVER)
    conn.receive_data(b'{"op":"ping"}\n' + partial)
    assert conn.next_event() == Ping()
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        conn.next_event()


def test_data_after_eof_is_a_local_error() -> None:
    conn = NdjsonConnection(SERVER)
    conn.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        conn.receive_data(b"{}\n")


def test_error_state_is_sticky() -> None:
    conn = NdjsonConnection(SERVER)
    conn.receive_data(b'{"op":"ping"}\nnot json\n{"op":"ping"}\n')
    assert conn.next_event() == Ping()
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn.state is State.ERROR
    for _ in range(2):
        with pytest.raises(LocalProtocolError):
            conn.next_event()
    assert conn.state is State.ERROR
    # Only an error line may still be sent.
    with pytest.raises(LocalProtocolError):
        conn.send(Pong())
    assert conn.send(Error("bye")) == b'{"op":"error","error":"bye"}\n'


def test_sending_error_enters_error_state() -> None:
    conn = NdjsonConnection(SERVER)
    conn.send(Error("bad"))
    assert conn.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        conn.send(Pong())


def test_client_in_error_state_cannot_send() -> None:
    conn = NdjsonConnection(CLIENT)
    conn.receive_data(b"[]\n")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    with pytest.raises(LocalProtocolError):
        conn.send(Ping())


# -- line length limit ---------------------------------------------------------------

MAX = 64


def _bare_line(length: int) -> bytes:
    """A bare JSON object line of exactly ``length`` bytes, without its newline."""
    line = b'{"p":"' + b"x" * (length - 8) + b'"}'
    assert len(line) == length
    return line


@pytest.mark.parametrize("pieces", [1, 3, MAX])
def test_line_of_exactly_max_line_is_accepted(pieces: int) -> None:
    line = _bare_line(MAX)
    step = -(-MAX // pieces)
    conn = NdjsonConnection(SERVER, max_line=MAX)
    for i in range(0, MAX, step):
        conn.receive_data(line[i : i + step])
        assert conn.next_event() is NEED_DATA
    conn.receive_data(b"\n")
    assert conn.next_event() == Publish(body=line, content_type="application/json")


def test_line_over_max_line_with_its_newline_is_rejected() -> None:
    conn = NdjsonConnection(SERVER, max_line=MAX)
    conn.receive_data(_bare_line(MAX + 1) + b"\n")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn.state is State.ERROR


@pytest.mark.parametrize("step", [1, 5, 10, MAX, MAX + 1, 200])
def test_line_over_max_line_without_newline_is_rejected_early(step: int) -> None:
    conn = NdjsonConnection(SERVER, max_line=MAX)
    fed = 0
    while True:
        conn.receive_data(b"y" * step)
        fed += step
        if fed <= MAX:
            assert conn.next_event() is NEED_DATA
            continue
        # The first receive that takes the pending line past max_line must fail.
        with pytest.raises(RemoteProtocolError):
            conn.next_event()
        break
    assert fed <= MAX + step
    assert conn.state is State.ERROR


def test_limit_is_per_line() -> None:
    conn = NdjsonConnection(SERVER, max_line=MAX)
    line = _bare_line(MAX)
    conn.receive_data(line + b"\n" + line[:-1])
    assert conn.next_event() == Publish(body=line, content_type="application/json")
    assert conn.next_event() is NEED_DATA
    conn.receive_data(line[-1:] + b"\n" + line + b"\n")
    assert drain(conn) == [Publish(body=line, content_type="application/json")] * 2
    conn.receive_data(line + b"z")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


def test_limit_applies_before_eof_check() -> None:
    conn = NdjsonConnection(SERVER, max_line=MAX)
    conn.receive_data(b" " * (MAX + 1))
    conn.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


# -- roles ------------------------------------------------------------------------

SERVER_ONLY_EVENTS: list[Event] = [
    Published(1, "delivered"),
    Deliver(1, "d", b"x"),
    Pong(),
    Error("e"),
]
CLIENT_ONLY_EVENTS: list[Event] = [
    Publish(b"x"),
    Subscribe("d"),
    Unsubscribe("d"),
    Credit("d", 1),
    Ack(1),
    Nack(1),
    Ping(),
]


@pytest.mark.parametrize("event", SERVER_ONLY_EVENTS, ids=lambda e: type(e).__name__)
def test_client_cannot_send_server_events(event: Event) -> None:
    conn = NdjsonConnection(CLIENT)
    with pytest.raises(LocalProtocolError):
        conn.send(event)
    assert conn.state is State.OPEN


@pytest.mark.parametrize("event", CLIENT_ONLY_EVENTS, ids=lambda e: type(e).__name__)
def test_server_cannot_send_client_events(event: Event) -> None:
    conn = NdjsonConnection(SERVER)
    with pytest.raises(LocalProtocolError):
        conn.send(event)
    assert conn.state is State.OPEN


@pytest.mark.parametrize("event", [Event(), ConnectionClosed()], ids=["Event", "ConnectionClosed"])
@pytest.mark.parametrize("role", [CLIENT, SERVER], ids=["client", "server"])
def test_nobody_sends_pseudo_events(role: Role, event: Event) -> None:
    with pytest.raises(LocalProtocolError):
        NdjsonConnection(role).send(event)


@pytest.mark.parametrize(
    "line",
    [line for line, _ in SERVER_GOLDEN if not line.startswith(b'{"op":"ack"')],
    ids=lambda line: line[:20].decode(),
)
def test_server_role_rejects_server_lines(line: bytes) -> None:
    conn = NdjsonConnection(SERVER)
    conn.receive_data(line)
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


def test_server_role_rejects_published_ack() -> None:
    # "ack" from a client is Ack(tag); a Published line has no tag.
    conn = NdjsonConnection(SERVER)
    conn.receive_data(b'{"op":"ack","id":7,"status":"delivered"}\n')
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


@pytest.mark.parametrize(
    "line",
    [line for line, _ in CLIENT_GOLDEN + CLIENT_PARSE_ONLY],
    ids=lambda line: line[:20].decode("utf-8", "replace"),
)
def test_client_role_rejects_client_lines(line: bytes) -> None:
    conn = NdjsonConnection(CLIENT)
    conn.receive_data(line)
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


# -- negative vectors -------------------------------------------------------------

TO_SERVER_BAD: list[bytes] = [
    # Not JSON, or not an object.
    b"not json",
    b"{",
    b'{"op":"ping"',
    b'{"op":"ping"}}',
    b"{'op':'ping'}",
    b"[1,2]",
    b"[]",
    b'"str"',
    b"42",
    b"null",
    b"true",
    b"\xff\xfe",
    b'{"op":"pub","body":"\xff"}',
    # Unknown op.
    b'{"op":"bogus"}',
    b'{"op":"PING"}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x"}',
    b'{"op":1}',
    b'{"op":null}',
    b'{"op":["ping"]}',
    # pub: exactly one of body/b64/json.
    b'{"op":"pub"}',
    b'{"op":"pub","body":"a","b64":"YQ=="}',
    b'{"op":"pub","body":"a","json":1}',
    b'{"op":"pub","b64":"YQ==","json":1}',
    b'{"op":"pub","body":"a","b64":"YQ==","json":1}',
    b'{"op":"pub","body":null}',
    b'{"op":"pub","body":1}',
    b'{"op":"pub","b64":null}',
    # Bad base64.
    b'{"op":"pub","b64":"YQ="}',
    b'{"op":"pub","b64":"abc"}',
    b'{"op":"pub","b64":"!!!!"}',
    b'{"op":"pub","b64":"YQ==\\n"}',
    # Headers.
    b'{"op":"pub","body":"a","headers":{"k":1}}',
    b'{"op":"pub","body":"a","headers":{"k":null}}',
    b'{"op":"pub","body":"a","headers":{"k":["v"]}}',
    b'{"op":"pub","body":"a","headers":{"k":true}}',
    b'{"op":"pub","body":"a","headers":"k=v"}',
    b'{"op":"pub","body":"a","headers":[["k","v"]]}',
    # Other pub fields.
    b'{"op":"pub","body":"a","dest":1}',
    b'{"op":"pub","body":"a","id":1.5}',
    b'{"op":"pub","body":"a","id":true}',
    b'{"op":"pub","body":"a","id":{}}',
    b'{"op":"pub","body":"a","content_type":1}',
    # sub.
    b'{"op":"sub"}',
    b'{"op":"sub","dest":null}',
    b'{"op":"sub","dest":1}',
    b'{"op":"sub","dest":"q","window":0}',
    b'{"op":"sub","dest":"q","window":10001}',
    b'{"op":"sub","dest":"q","window":-1}',
    b'{"op":"sub","dest":"q","window":"5"}',
    b'{"op":"sub","dest":"q","window":5.0}',
    b'{"op":"sub","dest":"q","window":true}',
    b'{"op":"sub","dest":"q","credit":-1}',
    b'{"op":"sub","dest":"q","credit":false}',
    b'{"op":"sub","dest":"q","credit":9223372036854775808}',
    b'{"op":"sub","dest":"q","group":1}',
    # unsub, credit.
    b'{"op":"unsub"}',
    b'{"op":"unsub","dest":[]}',
    b'{"op":"credit","dest":"q"}',
    b'{"op":"credit","n":1}',
    b'{"op":"credit","dest":"q","n":-1}',
    b'{"op":"credit","dest":"q","n":true}',
    b'{"op":"credit","dest":"q","n":1.0}',
    b'{"op":"credit","dest":"q","n":null}',
    # ack, nack.
    b'{"op":"ack"}',
    b'{"op":"ack","tag":"5"}',
    b'{"op":"ack","tag":true}',
    b'{"op":"ack","tag":0}',
    b'{"op":"ack","tag":-1}',
    b'{"op":"ack","tag":1.0}',
    b'{"op":"ack","tag":null}',
    b'{"op":"ack","tag":9223372036854775808}',
    b'{"op":"ack","tag":' + b"1" * 5000 + b"}",
    b'{"op":"nack","tag":"5"}',
    b'{"op":"nack","tag":false}',
    b'{"op":"nack","tag":1,"requeue":"yes"}',
    b'{"op":"nack","tag":1,"requeue":1}',
    # Lone surrogates cannot be UTF-8.
    b'{"op":"pub","body":"\\ud800"}',
    b'{"op":"pub","body":"\\udc00"}',
    b'{"op":"pub","body":"a\\ud800b"}',
    b'{"op":"pub","body":"\\ude00\\ud83d"}',
    b'{"op":"pub","json":["\\ud800"]}',
    b'{"op":"pub","json":{"\\udfff":1}}',
]

TO_CLIENT_BAD: list[bytes] = [
    b"not json",
    b"[]",
    b"{}",
    b'{"a":1}',
    b'{"op":"pub","body":"x"}',
    b'{"op":"ping"}',
    b'{"op":"bogus"}',
    b'{"op":"ack"}',
    b'{"op":"ack","tag":1}',
    b'{"op":"ack","id":1,"status":"ok"}',
    b'{"op":"ack","id":1,"status":null}',
    b'{"op":"ack","id":1,"status":"delivered","reason":1}',
    b'{"op":"ack","id":false,"status":"delivered"}',
    b'{"op":"msg","dest":"d","body":"x"}',
    b'{"op":"msg","tag":"1","dest":"d","body":"x"}',
    b'{"op":"msg","tag":true,"dest":"d","body":"x"}',
    b'{"op":"msg","tag":0,"dest":"d","body":"x"}',
    b'{"op":"msg","tag":1,"body":"x"}',
    b'{"op":"msg","tag":1,"dest":"d"}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","b64":"eA=="}',
    b'{"op":"msg","tag":1,"dest":"d","b64":"eA="}',
    b'{"op":"msg","tag":1,"dest":"d","body":"\\ud800"}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","headers":{"k":2}}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","redelivered":"yes"}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","redelivered":0}',
    b'{"op":"error"}',
    b'{"op":"error","error":1}',
]

# Found while writing these tests: inputs the codec should reject but does not, or
# rejects with an exception other than RemoteProtocolError.
BUG_VECTORS: list[tuple[Role, bytes]] = [
    # ValueError (not binascii.Error) escapes from b64decode for a non-ASCII string.
    (SERVER, b'{"op":"pub","b64":"\xc3\xa9"}'),
    (SERVER, b'{"op":"pub","b64":"\\u00e9"}'),
    (SERVER, b'{"op":"pub","b64":"\\ud800"}'),
    (CLIENT, b'{"op":"msg","tag":1,"dest":"d","b64":"\xc3\xa9"}'),
    # RecursionError escapes from json.loads (well within max_line).
    (SERVER, b"[" * 100_000),
    (SERVER, b'{"op":"pub","json":' + b"[" * 100_000),
    (CLIENT, b'{"op":"msg","tag":1,"dest":"d","json":' + b"{" * 50_000),
    # NaN and Infinity are not JSON; the bare object or the json field would be
    # forwarded as application/json.
    (SERVER, b'{"x":NaN}'),
    (SERVER, b'{"op":"pub","json":NaN}'),
    (SERVER, b'{"op":"pub","json":-Infinity}'),
    (CLIENT, b'{"op":"msg","tag":1,"dest":"d","json":Infinity}'),
    # json.loads(bytes) auto-detects UTF-16/32: lines are UTF-8.
    (SERVER, '{"op":"ping"}'.encode("utf-16-le")),
    (SERVER, '{"a":1}'.encode("utf-16-be")),
    (CLIENT, '{"op":"pong"}'.encode("utf-32-le")),
    # Lone surrogates in fields other than the body: events that no codec can send.
    (SERVER, b'{"op":"pub","body":"x","dest":"\\ud800"}'),
    (SERVER, b'{"op":"pub","body":"x","headers":{"k":"\\udc00"}}'),
    (SERVER, b'{"op":"pub","body":"x","headers":{"\\udc00":"v"}}'),
    (SERVER, b'{"op":"pub","body":"x","content_type":"\\ud800"}'),
    (SERVER, b'{"op":"pub","body":"x","id":"\\ud800"}'),
    (SERVER, b'{"op":"sub","dest":"\\ud800"}'),
    (SERVER, b'{"op":"sub","dest":"q","group":"\\ud800"}'),
    (SERVER, b'{"op":"unsub","dest":"\\ud800"}'),
    (SERVER, b'{"op":"credit","dest":"\\ud800","n":1}'),
    (CLIENT, b'{"op":"msg","tag":1,"dest":"\\ud800","body":"x"}'),
    (CLIENT, b'{"op":"ack","id":"\\ud800","status":"failed"}'),
    (CLIENT, b'{"op":"error","error":"\\ud800"}'),
]


def _assert_rejected(role: Role, line: bytes) -> None:
    for ending in (b"\n", b"\r\n"):
        conn = NdjsonConnection(role)
        conn.receive_data(b'\n{"op":"ping"}\n' if role is SERVER else b'{"op":"pong"}\n')
        assert drain(conn) == [Ping() if role is SERVER else Pong()]
        conn.receive_data(line + ending)
        # Anything but RemoteProtocolError propagates and fails the test.
        with pytest.raises(RemoteProtocolError):
            conn.next_event()
        assert conn.state is State.ERROR
        with pytest.raises(LocalProtocolError):
            conn.next_event()


@pytest.mark.parametrize("line", TO_SERVER_BAD, ids=lambda b: b[:48].decode("utf-8", "replace"))
def test_server_rejects(line: bytes) -> None:
    _assert_rejected(SERVER, line)


@pytest.mark.parametrize("line", TO_CLIENT_BAD, ids=lambda b: b[:48].decode("utf-8", "replace"))
def test_client_rejects(line: bytes) -> None:
    _assert_rejected(CLIENT, line)


@pytest.mark.parametrize(
    ("role", "line"),
    BUG_VECTORS,
    ids=[f"{r.value}-{b[:40].decode('utf-8', 'replace')}" for r, b in BUG_VECTORS],
)
def test_rejects_hostile_json(role: Role, line: bytes) -> None:
    _assert_rejected(role, line)


# -- strategies ----------------------------------------------------------------------

texts = st.text(max_size=12)
type_texts = st.none() | st.text(min_size=1, max_size=12)
headers_st = st.dictionaries(texts, texts, max_size=3)
bodies = st.binary(max_size=40) | st.text(max_size=20).map(str.encode)
big_ints = st.integers(0, 2**63 - 1)
tags = st.integers(1, 2**63 - 1)
ids = st.none() | st.text(max_size=8) | st.integers(-(2**70), 2**70)

client_events: st.SearchStrategy[Event] = st.one_of(
    st.builds(
        Publish,
        body=bodies,
        destination=st.none() | texts,
        headers=headers_st,
        content_type=type_texts,
        id=ids,
    ),
    st.builds(
        Subscribe,
        destination=texts,
        group=st.none() | texts,
        credit=st.none() | big_ints,
        window=st.integers(1, 10_000),
    ),
    st.builds(Unsubscribe, destination=texts),
    st.builds(Credit, destination=texts, n=big_ints),
    st.builds(Ack, tag=tags),
    st.builds(Nack, tag=tags, requeue=st.booleans()),
    st.just(Ping()),
)

server_events: st.SearchStrategy[Event] = st.one_of(
    st.builds(
        Published,
        id=ids,
        status=st.sampled_from(["delivered", "failed", "rejected"]),
        reason=texts,
    ),
    st.builds(
        Deliver,
        tag=tags,
        destination=texts,
        body=bodies,
        headers=headers_st,
        content_type=type_texts,
        redelivered=st.booleans(),
    ),
    st.just(Pong()),
)


@settings(max_examples=100)
@given(
    events=st.lists(client_events, min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_client_to_server_round_trip(events: list[Event], cuts: list[int]) -> None:
    sender = NdjsonConnection(CLIENT)
    data = b"".join(sender.send(event) for event in events)
    assert data.count(b"\n") == len(events)
    assert parse_chunks(SERVER, split_at(data, cuts)) == [*events, ConnectionClosed()]


@settings(max_examples=100)
@given(
    events=st.lists(server_events, max_size=6),
    error=st.none() | st.builds(Error, texts),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_server_to_client_round_trip(
    events: list[Event], error: Error | None, cuts: list[int]
) -> None:
    if error is not None:
        events = [*events, error]  # the last thing a server sends
    sender = NdjsonConnection(SERVER)
    data = b"".join(sender.send(event) for event in events)
    assert data.count(b"\n") == len(events)
    assert parse_chunks(CLIENT, split_at(data, cuts)) == [*events, ConnectionClosed()]


# Arbitrary JSON values, with strings that are often hostile: lone surrogates
# (escaped by ensure_ascii), non-ASCII, almost-base64, NaN-like.
hostile_strings = st.sampled_from(
    ["", "é", "\ud800", "a\udfffb", "YQ==", "YQ=", "\u00e9==", "delivered", "NaN", "-1"]
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(st.characters() | st.characters(categories=["Cs"]), max_size=6)
    | hostile_strings,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(hostile_strings | texts, inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = [
    "op",
    "dest",
    "body",
    "b64",
    "json",
    "headers",
    "content_type",
    "id",
    "group",
    "credit",
    "window",
    "n",
    "tag",
    "requeue",
    "status",
    "reason",
    "redelivered",
    "error",
]
OPS = ["pub", "sub", "unsub", "credit", "ack", "nack", "ping", "msg", "pong", "error", "x", 1]


@st.composite
def mutated_lines(draw: st.DrawFn) -> bytes:
    """A line some codec sent, with up to three fields replaced, added or dropped."""
    sender = draw(st.sampled_from([CLIENT, SERVER]))
    event = draw(client_events if sender is CLIENT else server_events)
    obj: dict[str, Any] = json.loads(NdjsonConnection(sender).send(event))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(obj) or FIELDS) | st.sampled_from(FIELDS))
        action = draw(st.sampled_from(["set", "set", "del", "op"]))
        if action == "del":
            obj.pop(key, None)
        elif action == "op":
            obj["op"] = draw(st.sampled_from(OPS))
        else:
            obj[key] = draw(hostile_strings | json_values)
    # ensure_ascii keeps lone surrogates as valid \u escapes; without it they become
    # invalid UTF-8.
    ascii_only = draw(st.sampled_from([True, True, False]))
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


FRAGMENTS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b'"op"',
    b'"pub"',
    b'"msg"',
    b'"b64"',
    b'"',
    b"\\ud800",
    b"1",
    b"-",
    b"e9",
    b"true",
    b"null",
    b" ",
    b"\r",
    b"\n",
    b"\xc3\xa9",
    b"\xff",
]
fuzz_inputs = st.one_of(
    st.binary(max_size=200),
    st.lists(st.sampled_from(FRAGMENTS), max_size=40).map(b"".join),
    st.lists(
        st.tuples(mutated_lines(), st.sampled_from([b"\n", b"\r\n", b"\n\n"])).map(b"".join),
        max_size=4,
    ).map(b"".join),
)


@settings(max_examples=150)
@given(
    role=st.sampled_from([CLIENT, SERVER]),
    data=fuzz_inputs,
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    max_line=st.sampled_from([DEFAULT_MAX_LINE, 16]),
)
@example(role=SERVER, data=b'{"op":"pub","b64":"\xc3\xa9"}\n', cuts=[], max_line=DEFAULT_MAX_LINE)
@example(
    role=CLIENT,
    data=b'{"op":"msg","tag":1,"dest":"d","b64":"\\ud800"}\n',
    cuts=[3, 30],
    max_line=DEFAULT_MAX_LINE,
)
@example(role=SERVER, data=b"[" * 3_000 + b"\n", cuts=[7], max_line=DEFAULT_MAX_LINE)
def test_arbitrary_input_only_raises_remote_protocol_error(
    role: Role, data: bytes, cuts: list[int], max_line: int
) -> None:
    conn = NdjsonConnection(role, max_line=max_line)
    try:
        for chunk in split_at(data, cuts):
            conn.receive_data(chunk)
            for event in drain(conn):
                assert not isinstance(event, ConnectionClosed)
        conn.receive_data(b"")
        assert drain(conn) == [ConnectionClosed()]
        assert conn.state is State.CLOSED
    except RemoteProtocolError:
        assert conn.state is State.ERROR
        with pytest.raises(LocalProtocolError):
            conn.next_event()


@settings(max_examples=100)
@given(role=st.sampled_from([CLIENT, SERVER]), data=fuzz_inputs)
@example(role=SERVER, data=b'{"op":"pub","body":"x","dest":"\\ud800"}\n')
def test_whatever_parses_can_be_sent_again(role: Role, data: bytes) -> None:
    """An accepted event re-sent by the peer's role parses back to itself."""
    conn = NdjsonConnection(role)
    conn.receive_data(data)
    conn.receive_data(b"")
    try:
        events = drain(conn)
    except RemoteProtocolError:
        return
    for event in events:
        if isinstance(event, ConnectionClosed):
            continue
        line = NdjsonConnection(peer_of(role)).send(event)
        assert parse_line(role, line) == event


@settings(max_examples=150)
@given(
    role=st.sampled_from([CLIENT, SERVER]),
    max_line=st.integers(1, 300),
    prefix=st.sampled_from([b"", b"\n\r\n", b"{}\n", b'{"op":"pong"}\n']),
    chunks=st.lists(
        st.binary(min_size=1, max_size=80).map(lambda b: b.replace(b"\n", b"")).filter(bool),
        min_size=1,
        max_size=30,
    ),
)
def test_pending_bytes_never_exceed_max_line_unnoticed(
    role: Role, max_line: int, prefix: bytes, chunks: list[bytes]
) -> None:
    # A complete line first (one the role accepts, if any): the limit counts from
    # the start of the next line.
    if role is CLIENT:
        prefix = prefix.replace(b"{}", b'{"op":"pong"}')
    else:
        prefix = prefix.replace(b"pong", b"ping")
    conn = NdjsonConnection(role, max_line=max(max_line, len(prefix)))
    limit = conn.max_line
    if prefix:
        conn.receive_data(prefix)
        assert len(drain(conn)) == prefix.count(b"{")
    pending = 0
    for chunk in chunks:
        conn.receive_data(chunk)
        pending += len(chunk)
        if pending <= limit:
            assert conn.next_event() is NEED_DATA
        else:
            # Raised on the very receive that crossed the limit, so at most
            # limit + one chunk was ever held.
            with pytest.raises(RemoteProtocolError):
                conn.next_event()
            assert conn.state is State.ERROR
            return
    # Never crossed the limit: the unterminated line is only an error at EOF.
    conn.receive_data(b"")
    tail = b"".join(chunks)
    if tail.strip():
        with pytest.raises(RemoteProtocolError):
            conn.next_event()
    else:
        assert conn.next_event() == ConnectionClosed()
