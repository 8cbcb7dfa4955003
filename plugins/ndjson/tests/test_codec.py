"""The ndjson codec on its own: bytes in, events out, events in, bytes out; no I/O.

Golden byte vectors pin the wire format; every stream is also parsed split at
each byte; negative vectors and Hypothesis properties check that a peer can
only ever cause a :class:`RemoteProtocolError`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import interchange_ndjson.events
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from interchange_ndjson import (
    CLIENT,
    NEED_DATA,
    SERVER,
    Ack,
    ClientCodec,
    ConnectionClosed,
    Credit,
    Deliver,
    Error,
    Event,
    Nack,
    Ping,
    Pong,
    Publish,
    Published,
    ServerCodec,
    Subscribe,
    Unsubscribe,
)
from interchange_ndjson.codec import DEFAULT_MAX_LINE, CodecState, Role
from interchange_ndjson.events import Call, End, ItemResult, PublishMany, Replied, ReplyTo
from interchange_ndjson.frames import (
    DEFAULT_CALL_TIMEOUT,
    MAX_BATCH,
    MAX_CALL_TIMEOUT,
    MAX_WINDOW,
)

import gateway.sdk as toolkit
from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from gateway.core.filters import Condition, Filter, Op

# -- helpers ------------------------------------------------------------------------

#: The codec of each role.
CODECS: dict[Role, type[ServerCodec | ClientCodec]] = {SERVER: ServerCodec, CLIENT: ClientCodec}
NdjsonCodec = ServerCodec | ClientCodec


def drain(conn: NdjsonCodec) -> list[Event | ConnectionClosed]:
    """Every event ``conn`` can produce from what it has received so far."""
    events: list[Event | ConnectionClosed] = []
    while True:
        event = conn.next_event()
        if event is NEED_DATA:
            return events
        assert isinstance(event, Event | ConnectionClosed)
        events.append(event)
        if isinstance(event, ConnectionClosed):  # then ConnectionClosed every time
            return events


def parse_chunks(
    role: Role, chunks: Iterable[bytes], *, max_line: int = DEFAULT_MAX_LINE
) -> list[Event]:
    """Feed ``chunks`` then EOF to a fresh ``role`` codec; all the events, in order."""
    conn = CODECS[role](max_line=max_line)
    events: list[Event | ConnectionClosed] = []
    for chunk in chunks:
        if chunk:  # b"" would mean EOF
            conn.receive_data(chunk)
            events += drain(conn)
    conn.receive_data(b"")
    events += drain(conn)
    assert conn.state is CodecState.CLOSED
    return events


def parse_line(role: Role, line: bytes) -> Event:
    """The single event that one whole line parses to."""
    events = parse_chunks(role, [line])
    assert events[-1] == ConnectionClosed()
    assert len(events) == 2, events
    assert isinstance(events[0], Event)
    return events[0]


#: The subscription :func:`allowing` delivers tags on (no test uses this name).
HELPER_DEST = "allowing-helper-destination"


def receive_line(conn: NdjsonCodec, obj: dict[str, Any]) -> Event:
    """``conn`` receives ``obj`` as one line; the event it parses to."""
    conn.receive_data(json.dumps(obj).encode() + b"\n")
    event = conn.next_event()
    assert isinstance(event, Event), event
    return event


def allowing(conn: NdjsonCodec, event: Event) -> NdjsonCodec:
    """``conn``, brought to a state that lets it send ``event`` the way a peer that
    follows the protocol gets there (the lines that takes are dropped)."""
    if conn.role is SERVER:
        if isinstance(event, Published):
            receive_line(conn, {"op": "pub", "body": ""})
        elif isinstance(event, Replied):
            receive_line(conn, {"op": "call", "body": ""})
        elif isinstance(event, Deliver | End):
            receive_line(conn, {"op": "sub", "dest": event.destination})
    elif isinstance(event, Ack | Nack | ReplyTo):
        with suppress(LocalProtocolError):  # already subscribed
            conn.send(Subscribe(HELPER_DEST, window=MAX_WINDOW))
        call = isinstance(event, ReplyTo)
        msg = {"op": "msg", "tag": event.tag, "dest": HELPER_DEST, "body": "", "call": call}
        receive_line(conn, msg)
    elif isinstance(event, Credit | Unsubscribe):
        with suppress(LocalProtocolError):  # already subscribed
            conn.send(Subscribe(event.destination))
    elif isinstance(event, Subscribe):
        with suppress(LocalProtocolError):  # not subscribed
            conn.send(Unsubscribe(event.destination))
    return conn


def sent(role: Role, event: Event) -> bytes:
    """The bytes ``role`` sends for ``event`` in a state that allows it."""
    return allowing(CODECS[role](), event).send(event)


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
    # pub with messages: a batch, one answer.
    (
        b'{"op":"pub","id":1,"messages":[{"body":"a"},'
        b'{"dest":"x","body":"{\\"k\\":1}","headers":{"h":"v"},"content_type":"application/json"},'
        b'{"b64":"/wA="}]}\n',
        PublishMany(
            (
                Publish(b"a"),
                Publish(b'{"k":1}', "x", {"h": "v"}, "application/json"),
                Publish(b"\xff\x00"),
            ),
            id=1,
        ),
    ),
    (b'{"op":"pub","messages":[{"body":""}]}\n', PublishMany((Publish(b""),))),
    (
        b'{"op":"pub","id":"b","messages":[{"dest":"\xc3\xa9","b64":"//4A"}]}\n',
        PublishMany((Publish(b"\xff\xfe\x00", "\u00e9"),), "b"),
    ),
    # call.
    (
        b'{"op":"call","id":1,"dest":"svc","body":"ping","headers":{"a":"b"},'
        b'"content_type":"text/plain","timeout":5}\n',
        Call(b"ping", "svc", {"a": "b"}, "text/plain", 1, 5.0),
    ),
    (b'{"op":"call","body":"x","timeout":30}\n', Call(b"x")),
    (
        b'{"op":"call","id":"c","b64":"/w==","timeout":0.25}\n',
        Call(b"\xff", id="c", timeout=0.25),
    ),
    (b'{"op":"call","body":"","timeout":3600}\n', Call(b"", timeout=3600.0)),
    # reply, by tag.
    (
        b'{"op":"reply","tag":7,"body":"pong","headers":{"h":"v"},'
        b'"content_type":"text/plain","code":5,"error":"not found"}\n',
        ReplyTo(7, b"pong", {"h": "v"}, "text/plain", 5, "not found"),
    ),
    (b'{"op":"reply","tag":7}\n', ReplyTo(7)),
    (
        b'{"op":"reply","tag":1,"b64":"gA==","code":2147483647}\n',
        ReplyTo(1, b"\x80", code=2**31 - 1),
    ),
    (b'{"op":"reply","tag":2,"error":"e"}\n', ReplyTo(2, error="e")),
    # sub with a filter, a start and an end.
    (
        b'{"op":"sub","dest":"logs","window":100,'
        b'"filter":[["level","=","error"],["size",">",10]],"start":"earliest","end":"latest"}\n',
        Subscribe(
            "logs",
            filter=Filter((Condition("level", Op.EQ, "error"), Condition("size", Op.GT, 10))),
            start="earliest",
            end="latest",
        ),
    ),
    (
        b'{"op":"sub","dest":"o","window":100,"start":0,"end":12}\n',
        Subscribe("o", start=0, end=12),
    ),
    (
        b'{"op":"sub","dest":"o","window":100,"filter":[],"start":"latest"}\n',
        Subscribe("o", filter=Filter(), start="latest"),
    ),
    (
        b'{"op":"sub","dest":"o","window":1,"group":"g","credit":0,'
        b'"filter":[["ts",">=",{"date":"2024-01-01T00:00:00+00:00"}],'
        b'["k","!contains","\xc3\xa9"],["n","<=",0.5]],"end":9223372036854775807}\n',
        Subscribe(
            "o",
            group="g",
            credit=0,
            window=1,
            filter=Filter(
                (
                    Condition("ts", Op.GE, datetime(2024, 1, 1, tzinfo=UTC)),
                    Condition("k", Op.NOT_CONTAINS, "\u00e9"),
                    Condition("n", Op.LE, 0.5),
                )
            ),
            end=2**63 - 1,
        ),
    ),
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
    # ack with positions, and the answer to a batch.
    (
        b'{"op":"ack","id":1,"status":"delivered","pos":{"logs":41,"audit":0}}\n',
        Published(1, "delivered", positions={"logs": 41, "audit": 0}),
    ),
    (
        b'{"op":"ack","id":2,"status":"rejected","reason":"1 of 3",'
        b'"results":[{"status":"delivered"},{"status":"rejected","reason":"no route"},'
        b'{"status":"delivered","pos":{"x":3}}]}\n',
        Published(
            2,
            "rejected",
            "1 of 3",
            results=(
                ItemResult("delivered"),
                ItemResult("rejected", "no route"),
                ItemResult("delivered", positions={"x": 3}),
            ),
        ),
    ),
    (
        b'{"op":"ack","id":null,"status":"failed","results":[]}\n',
        Published(None, "failed", results=()),
    ),
    # reply, by id.
    (
        b'{"op":"reply","id":1,"code":0,"body":"pong","headers":{"h":"v"},'
        b'"content_type":"text/plain"}\n',
        Replied(1, b"pong", {"h": "v"}, "text/plain"),
    ),
    (
        b'{"op":"reply","id":"c","code":5,"error":"not found"}\n',
        Replied("c", code=5, error="not found"),
    ),
    (b'{"op":"reply","id":null,"code":0,"b64":"/w=="}\n', Replied(None, b"\xff")),
    # msg of a stored destination, and of a call.
    (
        b'{"op":"msg","tag":7,"dest":"svc","body":"ping","pos":12,"call":true,'
        b'"reply_within":4.5}\n',
        Deliver(7, "svc", b"ping", position=12, call=True, reply_within=4.5),
    ),
    (
        b'{"op":"msg","tag":8,"dest":"logs","body":"x","redelivered":true,"pos":0,'
        b'"headers":{"a":"b"}}\n',
        Deliver(8, "logs", b"x", {"a": "b"}, redelivered=True, position=0),
    ),
    (
        b'{"op":"msg","tag":9,"dest":"svc","b64":"gA==","call":true,"reply_within":5}\n',
        Deliver(9, "svc", b"\x80", call=True, reply_within=5.0),
    ),
    (b'{"op":"end","dest":"logs"}\n', End("logs")),
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
    # The batch as a person types it: json items, fields in any order.
    (
        b'{"op":"pub","id":1,"messages":[{"body":"a"},'
        b'{"json":{"k":1},"dest":"x","headers":{"h":"v"}},{"b64":"AAE="}]}\n',
        PublishMany(
            (
                Publish(b"a"),
                Publish(b'{"k":1}', "x", {"h": "v"}, "application/json"),
                Publish(b"\x00\x01"),
            ),
            id=1,
        ),
    ),
    (
        b'{"messages":[{"json":[1],"content_type":"a/b+json"}],"op":"pub","dest":null}\n',
        PublishMany((Publish(b"[1]", content_type="a/b+json"),)),
    ),
    # "messages": null is no batch.
    (b'{"op":"pub","messages":null,"body":"x"}\n', Publish(b"x")),
    (
        b'{"op":"call","json":{"q":1},"timeout":null}\n',
        Call(b'{"q":1}', content_type="application/json"),
    ),
    (b'{"op":"call","body":"x","timeout":0.001}\n', Call(b"x", timeout=0.001)),
    (b'{"op":"call","body":"x","timeout":3600.0}\n', Call(b"x", timeout=3600.0)),
    (b'{"op":"call","body":"x"}\n', Call(b"x", timeout=DEFAULT_CALL_TIMEOUT)),
    (b'{"op":"call","body":"x","timeout":1e1}\n', Call(b"x", timeout=10.0)),
    (
        b'{"op":"reply","tag":3,"json":[1]}\n',
        ReplyTo(3, b"[1]", content_type="application/json"),
    ),
    (b'{"op":"reply","tag":7,"code":0,"error":""}\n', ReplyTo(7)),
    (b'{"op":"reply","tag":7,"code":null,"error":null,"headers":null}\n', ReplyTo(7)),
    (b'{"op":"reply","tag":7,"body":""}\n', ReplyTo(7)),
    (
        b'{"op":"sub","dest":"q","filter":{"level":"error","code":500}}\n',
        Subscribe(
            "q", filter=Filter((Condition("level", Op.EQ, "error"), Condition("code", Op.EQ, 500)))
        ),
    ),
    (
        b'{"op":"sub","dest":"q","filter":[["t","<",{"date":0}]]}\n',
        Subscribe("q", filter=Filter((Condition("t", Op.LT, datetime(1970, 1, 1, tzinfo=UTC)),))),
    ),
    (b'{"op":"sub","dest":"q","filter":null,"start":null,"end":null}\n', Subscribe("q")),
    (b'{"op":"sub","dest":"q","filter":{}}\n', Subscribe("q", filter=Filter())),
    (b'{"op":"sub","dest":"q","start":"latest","end":0}\n', Subscribe("q", start="latest", end=0)),
]

SERVER_PARSE_ONLY: list[tuple[bytes, Event]] = [
    (
        b'{"op":"msg","tag":4,"dest":"d","json":[1, 2]}\n',
        Deliver(4, "d", b"[1,2]", content_type="application/json"),
    ),
    (b'{"op":"ack","status":"delivered"}\n', Published(None, "delivered")),
    (b'{"op":"pong"}\r\n', Pong()),
    # Empty or null positions and results are none.
    (b'{"op":"ack","id":1,"status":"delivered","pos":{}}\n', Published(1, "delivered")),
    (
        b'{"op":"ack","id":1,"status":"delivered","pos":null,"results":null}\n',
        Published(1, "delivered"),
    ),
    (
        b'{"op":"ack","id":1,"status":"failed","results":[{"status":"failed","pos":{},'
        b'"reason":null}]}\n',
        Published(1, "failed", results=(ItemResult("failed"),)),
    ),
    (b'{"op":"reply","id":1}\n', Replied(1)),
    (b'{"op":"reply","id":null,"code":null}\n', Replied(None)),
    (
        b'{"op":"reply","id":1,"json":{"a":1}}\n',
        Replied(1, b'{"a":1}', content_type="application/json"),
    ),
    # A client's reply is by tag; here the tag is just an unknown field.
    (b'{"op":"reply","id":4,"tag":4}\n', Replied(4)),
    (
        b'{"op":"msg","tag":1,"dest":"d","body":"x","pos":null,"call":false,"reply_within":null}\n',
        Deliver(1, "d", b"x"),
    ),
    (
        b'{"op":"msg","tag":1,"dest":"d","body":"x","call":true,"reply_within":0}\n',
        Deliver(1, "d", b"x", call=True, reply_within=0.0),
    ),
    (
        b'{"op":"msg","tag":1,"dest":"d","body":"x","call":true,"reply_within":86400.5}\n',
        Deliver(1, "d", b"x", call=True, reply_within=86400.5),
    ),
]


def _ids(vectors: Sequence[tuple[bytes, Event]]) -> list[str]:
    return [f"{i}-{type(event).__name__}" for i, (_, event) in enumerate(vectors)]


@pytest.mark.parametrize(("line", "event"), CLIENT_GOLDEN, ids=_ids(CLIENT_GOLDEN))
def test_client_golden_send(line: bytes, event: Event) -> None:
    assert sent(CLIENT, event) == line


@pytest.mark.parametrize(("line", "event"), SERVER_GOLDEN, ids=_ids(SERVER_GOLDEN))
def test_server_golden_send(line: bytes, event: Event) -> None:
    assert sent(SERVER, event) == line


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
    conn = ServerCodec()
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


def _streams(
    name: str, role: Role, vectors: Sequence[tuple[bytes, Event]], size: int = 16
) -> dict[str, tuple[Role, bytes, list[Event]]]:
    """``vectors`` as streams of ``size`` lines: splitting at every byte is quadratic."""
    return {
        f"{name}-{i // size}": (role, *_stream(vectors[i : i + size]))
        for i in range(0, len(vectors), size)
    }


STREAMS = {
    **_streams("to-server", SERVER, CLIENT_GOLDEN + CLIENT_PARSE_ONLY),
    **_streams("to-client", CLIENT, SERVER_GOLDEN + SERVER_PARSE_ONLY),
}


def test_streams_hold_every_op_both_ways() -> None:
    ops: dict[Role, set[str]] = {CLIENT: set(), SERVER: set()}
    for role, data, _ in STREAMS.values():
        for line in data.splitlines():
            if line.strip():
                ops[role].add(json.loads(line).get("op", "(bare)"))
    assert ops[SERVER] == {"(bare)", "pub", "call", "reply", "sub", "unsub", "credit"} | {
        "ack",
        "nack",
        "ping",
    }
    assert ops[CLIENT] == {"ack", "reply", "msg", "end", "pong", "error"}


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
    conn = CODECS[role]()
    got: list[Event] = []
    for i in range(len(data)):
        conn.receive_data(data[i : i + 1])
        new = drain(conn)
        if new:
            assert data[i : i + 1] == b"\n"
        got += new
    assert got == events[:-1]


def test_the_vocabulary_is_the_toolkits() -> None:
    """One ``NEED_DATA`` and one ``ConnectionClosed`` for every protocol's driver."""
    assert NEED_DATA is toolkit.NEED_DATA
    assert ConnectionClosed is toolkit.ConnectionClosed
    assert interchange_ndjson.events.ConnectionClosed is toolkit.ConnectionClosed
    assert parse_chunks(SERVER, []) == [toolkit.ConnectionClosed()]


# -- EOF and states -----------------------------------------------------------------


def test_initial_state_is_open() -> None:
    assert ServerCodec().state is CodecState.OPEN
    assert ClientCodec().state is CodecState.OPEN


def test_eof_after_complete_lines_closes() -> None:
    conn = ServerCodec()
    conn.receive_data(b'{"op":"ping"}\n{"op":"ack","tag":1}\n')
    conn.receive_data(b"")
    assert conn.next_event() == Ping()
    assert conn.state is CodecState.OPEN
    assert conn.next_event() == Ack(1)
    assert conn.next_event() == ConnectionClosed()
    assert conn.state is CodecState.CLOSED
    assert conn.next_event() == ConnectionClosed()
    assert conn.state is CodecState.CLOSED


def test_eof_on_empty_input_closes() -> None:
    conn = ClientCodec()
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    assert conn.next_event() == ConnectionClosed()
    assert conn.state is CodecState.CLOSED


@pytest.mark.parametrize("tail", [b" ", b"\r", b" \t\r", b"\n\n"])
def test_eof_after_trailing_whitespace_closes(tail: bytes) -> None:
    assert parse_chunks(SERVER, [b'{"op":"ping"}\n', tail]) == [Ping(), ConnectionClosed()]


@pytest.mark.parametrize("partial", [b"{", b'{"op":"ping"}', b'{"op":"ping"}\r', b"  x"])
def test_eof_in_the_middle_of_a_line_is_an_error(partial: bytes) -> None:
    conn = ServerCodec()
    conn.receive_data(b'{"op":"ping"}\n' + partial)
    assert conn.next_event() == Ping()
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn.state is CodecState.ERROR
    with pytest.raises(LocalProtocolError):
        conn.next_event()


def test_data_after_eof_is_a_local_error() -> None:
    conn = ServerCodec()
    conn.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        conn.receive_data(b"{}\n")


def test_error_state_is_sticky() -> None:
    conn = ServerCodec()
    conn.receive_data(b'{"op":"ping"}\nnot json\n{"op":"ping"}\n')
    assert conn.next_event() == Ping()
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn.state is CodecState.ERROR
    for _ in range(2):
        with pytest.raises(LocalProtocolError):
            conn.next_event()
    assert conn.state is CodecState.ERROR
    # Only an error line may still be sent.
    with pytest.raises(LocalProtocolError):
        conn.send(Pong())
    assert conn.send(Error("bye")) == b'{"op":"error","error":"bye"}\n'


def test_sending_error_enters_error_state() -> None:
    conn = ServerCodec()
    conn.send(Error("bad"))
    assert conn.state is CodecState.ERROR
    with pytest.raises(LocalProtocolError):
        conn.send(Pong())


def test_client_in_error_state_cannot_send() -> None:
    conn = ClientCodec()
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
    conn = ServerCodec(max_line=MAX)
    for i in range(0, MAX, step):
        conn.receive_data(line[i : i + step])
        assert conn.next_event() is NEED_DATA
    conn.receive_data(b"\n")
    assert conn.next_event() == Publish(body=line, content_type="application/json")


def test_line_over_max_line_with_its_newline_is_rejected() -> None:
    conn = ServerCodec(max_line=MAX)
    conn.receive_data(_bare_line(MAX + 1) + b"\n")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn.state is CodecState.ERROR


@pytest.mark.parametrize("step", [1, 5, 10, MAX, MAX + 1, 200])
def test_line_over_max_line_without_newline_is_rejected_early(step: int) -> None:
    conn = ServerCodec(max_line=MAX)
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
    assert conn.state is CodecState.ERROR


def test_limit_is_per_line() -> None:
    conn = ServerCodec(max_line=MAX)
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
    conn = ServerCodec(max_line=MAX)
    conn.receive_data(b" " * (MAX + 1))
    conn.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


# -- roles ------------------------------------------------------------------------

SERVER_ONLY_EVENTS: list[Event] = [
    Published(1, "delivered"),
    Published(1, "delivered", positions={"d": 1}, results=(ItemResult("delivered"),)),
    Replied(1, b"x"),
    Deliver(1, "d", b"x"),
    Deliver(1, "d", b"x", position=3, call=True, reply_within=1.0),
    End("d"),
    Pong(),
    Error("e"),
]
CLIENT_ONLY_EVENTS: list[Event] = [
    Publish(b"x"),
    PublishMany((Publish(b"x"),), 1),
    Call(b"x", "svc", id=1),
    ReplyTo(1, b"x"),
    Subscribe("d"),
    Subscribe("d", filter=Filter.equals(a="b"), start="earliest", end="latest"),
    Unsubscribe("d"),
    Credit("d", 1),
    Ack(1),
    Nack(1),
    Ping(),
]


@pytest.mark.parametrize("event", SERVER_ONLY_EVENTS, ids=lambda e: type(e).__name__)
def test_client_cannot_send_server_events(event: Event) -> None:
    conn = ClientCodec()
    with pytest.raises(LocalProtocolError):
        conn.send(event)
    assert conn.state is CodecState.OPEN


@pytest.mark.parametrize("event", CLIENT_ONLY_EVENTS, ids=lambda e: type(e).__name__)
def test_server_cannot_send_client_events(event: Event) -> None:
    conn = ServerCodec()
    with pytest.raises(LocalProtocolError):
        conn.send(event)
    assert conn.state is CodecState.OPEN


@pytest.mark.parametrize("event", [Event(), ConnectionClosed()], ids=["Event", "ConnectionClosed"])
@pytest.mark.parametrize("role", [CLIENT, SERVER], ids=["client", "server"])
def test_nobody_sends_pseudo_events(role: Role, event: Event) -> None:
    with pytest.raises(LocalProtocolError):
        CODECS[role]().send(event)


@pytest.mark.parametrize(
    "line",
    [line for line, _ in SERVER_GOLDEN if not line.startswith(b'{"op":"ack"')],
    ids=lambda line: line[:20].decode(),
)
def test_server_role_rejects_server_lines(line: bytes) -> None:
    conn = ServerCodec()
    conn.receive_data(line)
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


def test_server_role_rejects_published_ack() -> None:
    # "ack" from a client is Ack(tag); a Published line has no tag.
    conn = ServerCodec()
    conn.receive_data(b'{"op":"ack","id":7,"status":"delivered"}\n')
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


@pytest.mark.parametrize(
    "line",
    [line for line, _ in CLIENT_GOLDEN + CLIENT_PARSE_ONLY],
    ids=lambda line: line[:20].decode("utf-8", "replace"),
)
def test_client_role_rejects_client_lines(line: bytes) -> None:
    conn = ClientCodec()
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
    # pub with messages: 1 to MAX_BATCH items, each a message of its own.
    b'{"op":"pub","messages":[]}',
    b'{"op":"pub","messages":[' + b",".join([b'{"body":""}'] * (MAX_BATCH + 1)) + b"]}",
    b'{"op":"pub","messages":{"body":"a"}}',
    b'{"op":"pub","messages":"a"}',
    b'{"op":"pub","messages":true}',
    b'{"op":"pub","messages":["a"]}',
    b'{"op":"pub","messages":[null]}',
    b'{"op":"pub","messages":[[]]}',
    b'{"op":"pub","messages":[{}]}',
    b'{"op":"pub","messages":[{"dest":"x"}]}',
    b'{"op":"pub","messages":[{"body":"a","b64":"YQ=="}]}',
    b'{"op":"pub","messages":[{"body":"a"},{"body":"a","json":1}]}',
    b'{"op":"pub","messages":[{"body":"a","op":"pub"}]}',
    b'{"op":"pub","messages":[{"body":"a","op":null}]}',
    b'{"op":"pub","messages":[{"body":"a","id":1}]}',
    b'{"op":"pub","messages":[{"body":"a","id":null}]}',
    b'{"op":"pub","messages":[{"messages":[{"body":"a"}]}]}',
    b'{"op":"pub","messages":[{"b64":"YQ="}]}',
    b'{"op":"pub","messages":[{"body":1}]}',
    b'{"op":"pub","messages":[{"body":"a","dest":1}]}',
    b'{"op":"pub","messages":[{"body":"a","headers":{"k":1}}]}',
    b'{"op":"pub","messages":[{"body":"a","content_type":true}]}',
    b'{"op":"pub","messages":[{"body":"\\ud800"}]}',
    b'{"op":"pub","messages":[{"body":"a","dest":"\\udc00"}]}',
    b'{"op":"pub","messages":[{"body":"a"}],"body":"b"}',
    b'{"op":"pub","messages":[{"body":"a"}],"b64":"YQ=="}',
    b'{"op":"pub","messages":[{"body":"a"}],"json":null}',
    b'{"op":"pub","messages":[{"body":"a"}],"dest":"x"}',
    b'{"op":"pub","messages":[{"body":"a"}],"headers":{"k":"v"}}',
    b'{"op":"pub","messages":[{"body":"a"}],"content_type":"text/plain"}',
    b'{"op":"pub","messages":[{"body":"a"}],"id":true}',
    b'{"op":"pub","messages":[{"body":"a"}],"id":1.5}',
    # call: one body; a timeout in seconds, 0 < timeout <= 3600.
    b'{"op":"call","timeout":5}',
    b'{"op":"call","body":"a","b64":"YQ==","timeout":5}',
    b'{"op":"call","body":"a","timeout":0}',
    b'{"op":"call","body":"a","timeout":0.0}',
    b'{"op":"call","body":"a","timeout":-0.0}',
    b'{"op":"call","body":"a","timeout":-1}',
    b'{"op":"call","body":"a","timeout":-0.5}',
    b'{"op":"call","body":"a","timeout":true}',
    b'{"op":"call","body":"a","timeout":false}',
    b'{"op":"call","body":"a","timeout":3600.0001}',
    b'{"op":"call","body":"a","timeout":3601}',
    b'{"op":"call","body":"a","timeout":1e400}',
    b'{"op":"call","body":"a","timeout":-1e400}',
    b'{"op":"call","body":"a","timeout":' + b"9" * 400 + b"}",
    b'{"op":"call","body":"a","timeout":"5"}',
    b'{"op":"call","body":"a","timeout":[5]}',
    b'{"op":"call","body":"a","timeout":{}}',
    b'{"op":"call","body":"a","id":true}',
    b'{"op":"call","body":"a","dest":1}',
    b'{"op":"call","body":"a","dest":"\\ud800"}',
    b'{"op":"call","body":"a","headers":{"k":1}}',
    # reply (by tag): zero or one body, a code 0..2**31-1, an error string.
    b'{"op":"reply"}',
    b'{"op":"reply","id":1,"code":0,"body":"x"}',
    b'{"op":"reply","tag":0}',
    b'{"op":"reply","tag":"7"}',
    b'{"op":"reply","tag":true}',
    b'{"op":"reply","tag":7,"code":-1}',
    b'{"op":"reply","tag":7,"code":2147483648}',
    b'{"op":"reply","tag":7,"code":true}',
    b'{"op":"reply","tag":7,"code":false}',
    b'{"op":"reply","tag":7,"code":1.0}',
    b'{"op":"reply","tag":7,"code":"5"}',
    b'{"op":"reply","tag":7,"error":1}',
    b'{"op":"reply","tag":7,"error":"\\ud800"}',
    b'{"op":"reply","tag":7,"body":"a","json":1}',
    b'{"op":"reply","tag":7,"b64":"YQ="}',
    b'{"op":"reply","tag":7,"body":null}',
    b'{"op":"reply","tag":7,"headers":{"k":1}}',
    # sub: filter, start, end.
    b'{"op":"sub","dest":"q","filter":[["a","~","b"]]}',
    b'{"op":"sub","dest":"q","filter":"level = error"}',
    b'{"op":"sub","dest":"q","filter":1}',
    b'{"op":"sub","dest":"q","filter":true}',
    b'{"op":"sub","dest":"q","filter":[["a","="]]}',
    b'{"op":"sub","dest":"q","filter":[[1,"=","b"]]}',
    b'{"op":"sub","dest":"q","filter":[["","=","b"]]}',
    b'{"op":"sub","dest":"q","filter":{"a":true}}',
    b'{"op":"sub","dest":"q","filter":{"a":null}}',
    b'{"op":"sub","dest":"q","filter":[["a","prefix",1]]}',
    b'{"op":"sub","dest":"q","filter":[["a",">",1e400]]}',
    b'{"op":"sub","dest":"q","filter":[["t",">",{"date":"yesterday"}]]}',
    b'{"op":"sub","dest":"q","filter":[["t",">",{"date":1e300}]]}',
    b'{"op":"sub","dest":"q","filter":[["t",">",{"date":"' + b"9" * 400 + b'"}]]}',
    b'{"op":"sub","dest":"q","filter":[["t",">",{"when":1}]]}',
    b'{"op":"sub","dest":"q","filter":[' + b",".join([b'["a","=","b"]'] * 65) + b"]}",
    b'{"op":"sub","dest":"q","filter":[["a","=","\\ud800"]]}',
    b'{"op":"sub","dest":"q","filter":[["\\udc00","=","b"]]}',
    b'{"op":"sub","dest":"q","filter":{"\\ud800":"b"}}',
    b'{"op":"sub","dest":"q","start":"first"}',
    b'{"op":"sub","dest":"q","start":"LATEST"}',
    b'{"op":"sub","dest":"q","start":""}',
    b'{"op":"sub","dest":"q","start":-1}',
    b'{"op":"sub","dest":"q","start":1.5}',
    b'{"op":"sub","dest":"q","start":1.0}',
    b'{"op":"sub","dest":"q","start":true}',
    b'{"op":"sub","dest":"q","start":false}',
    b'{"op":"sub","dest":"q","start":[0]}',
    b'{"op":"sub","dest":"q","start":9223372036854775808}',
    b'{"op":"sub","dest":"q","end":"first"}',
    b'{"op":"sub","dest":"q","end":"earliest"}',
    b'{"op":"sub","dest":"q","end":-1}',
    b'{"op":"sub","dest":"q","end":1.5}',
    b'{"op":"sub","dest":"q","end":true}',
    b'{"op":"sub","dest":"q","end":{}}',
    # Server-only ops.
    b'{"op":"end","dest":"q"}',
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
    # ack: pos maps names to offsets; results hold one status per message.
    b'{"op":"ack","id":1,"status":"delivered","pos":{"x":-1}}',
    b'{"op":"ack","id":1,"status":"delivered","pos":{"x":"1"}}',
    b'{"op":"ack","id":1,"status":"delivered","pos":{"x":true}}',
    b'{"op":"ack","id":1,"status":"delivered","pos":{"x":1.5}}',
    b'{"op":"ack","id":1,"status":"delivered","pos":{"x":null}}',
    b'{"op":"ack","id":1,"status":"delivered","pos":{"x":9223372036854775808}}',
    b'{"op":"ack","id":1,"status":"delivered","pos":[1]}',
    b'{"op":"ack","id":1,"status":"delivered","pos":5}',
    b'{"op":"ack","id":1,"status":"delivered","pos":{"\\ud800":1}}',
    b'{"op":"ack","id":1,"status":"delivered","results":{}}',
    b'{"op":"ack","id":1,"status":"delivered","results":"delivered"}',
    b'{"op":"ack","id":1,"status":"delivered","results":[1]}',
    b'{"op":"ack","id":1,"status":"delivered","results":[null]}',
    b'{"op":"ack","id":1,"status":"delivered","results":[{}]}',
    b'{"op":"ack","id":1,"status":"delivered","results":[{"status":"ok"}]}',
    b'{"op":"ack","id":1,"status":"delivered","results":[{"status":null}]}',
    b'{"op":"ack","id":1,"status":"delivered","results":[{"status":"failed","reason":1}]}',
    b'{"op":"ack","id":1,"status":"delivered","results":[{"status":"failed","reason":"\\ud800"}]}',
    b'{"op":"ack","id":1,"status":"delivered","results":[{"status":"delivered","pos":{"x":-1}}]}',
    b'{"op":"ack","id":1,"status":"delivered","results":[{"status":"delivered","pos":[]}]}',
    b'{"op":"ack","id":1,"status":"delivered","results":['
    + b",".join([b'{"status":"delivered"}'] * (MAX_BATCH + 1))
    + b"]}",
    # reply (by id): id present, code 0..2**31-1, zero or one body.
    b'{"op":"reply","tag":7,"body":"x"}',
    b'{"op":"reply"}',
    b'{"op":"reply","id":true}',
    b'{"op":"reply","id":1.5}',
    b'{"op":"reply","id":"\\ud800"}',
    b'{"op":"reply","id":1,"code":-1}',
    b'{"op":"reply","id":1,"code":2147483648}',
    b'{"op":"reply","id":1,"code":true}',
    b'{"op":"reply","id":1,"code":1.5}',
    b'{"op":"reply","id":1,"body":"a","b64":"YQ=="}',
    b'{"op":"reply","id":1,"b64":"YQ="}',
    b'{"op":"reply","id":1,"error":1}',
    b'{"op":"reply","id":1,"error":"\\udfff"}',
    b'{"op":"reply","id":1,"headers":{"k":1}}',
    # msg: pos an offset, call a bool, reply_within finite seconds >= 0.
    b'{"op":"msg","tag":1,"dest":"d","body":"x","pos":-1}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","pos":"1"}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","pos":true}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","pos":1.5}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","pos":{"d":1}}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","call":"yes"}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","call":1}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","reply_within":-1}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","reply_within":-0.001}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","reply_within":"1"}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","reply_within":true}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","reply_within":1e400}',
    b'{"op":"msg","tag":1,"dest":"d","body":"x","reply_within":' + b"9" * 400 + b"}",
    # end.
    b'{"op":"end"}',
    b'{"op":"end","dest":null}',
    b'{"op":"end","dest":1}',
    b'{"op":"end","dest":"\\ud800"}',
    # Client-only ops.
    b'{"op":"call","body":"x","timeout":5}',
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
        conn = CODECS[role]()
        conn.receive_data(b'\n{"op":"ping"}\n' if role is SERVER else b'{"op":"pong"}\n')
        assert drain(conn) == [Ping() if role is SERVER else Pong()]
        conn.receive_data(line + ending)
        # Anything but RemoteProtocolError propagates and fails the test.
        with pytest.raises(RemoteProtocolError):
            conn.next_event()
        assert conn.state is CodecState.ERROR
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


# -- the call, batch, position and filter additions -----------------------------------


def _rejection(role: Role, line: bytes) -> str:
    conn = CODECS[role]()
    conn.receive_data(line + b"\n")
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert conn.state is CodecState.ERROR
    return str(info.value)


def test_constants() -> None:
    assert MAX_BATCH == 1000
    assert DEFAULT_CALL_TIMEOUT == 30.0
    assert MAX_CALL_TIMEOUT == 3600.0
    assert Call(b"").timeout == DEFAULT_CALL_TIMEOUT


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b'{"op":"sub","dest":"q","filter":[["a","~","b"]]}', ["field 'filter'", "'~'"]),
        (b'{"op":"sub","dest":"q","filter":"x"}', ["field 'filter'"]),
        (b'{"op":"sub","dest":"q","filter":[["a","=","\\ud800"]]}', ["'filter'", "Unicode"]),
        (b'{"op":"sub","dest":"q","start":"first"}', ["'start'", "'earliest'", "'latest'"]),
        (b'{"op":"sub","dest":"q","start":-1}', ["'start'"]),
        (b'{"op":"sub","dest":"q","end":"earliest"}', ["'end'", "'latest'"]),
        (b'{"op":"sub","dest":"q","end":true}', ["'end'"]),
        (b'{"op":"call","body":"a","timeout":0}', ["'timeout'", "3600"]),
        (b'{"op":"call","body":"a","timeout":true}', ["'timeout'"]),
        (b'{"op":"reply","tag":7,"code":-1}', ["'code'", "2147483647"]),
        (b'{"op":"pub","messages":[]}', ["'messages'", "1000"]),
        (b'{"op":"pub","messages":[{"body":"a"}],"body":"b"}', ["'messages'", "'body'"]),
        (b'{"op":"pub","messages":[{"body":"a"}],"dest":"x"}', ["'messages'", "'dest'"]),
        (b'{"op":"pub","messages":[{"body":"a"},{"body":"a","id":2}]}', ["messages[1]", "'id'"]),
        (b'{"op":"pub","messages":[{"body":"a","op":"pub"}]}', ["messages[0]", "'op'"]),
        (b'{"op":"pub","messages":[{"body":"a"},{"b64":"!"}]}', ["messages[1]", "base64"]),
        (b'{"op":"pub","messages":[{"body":"a"},"b"]}', ["messages[1]", "object"]),
    ],
)
def test_server_rejection_names_the_field(line: bytes, words: list[str]) -> None:
    message = _rejection(SERVER, line)
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b'{"op":"reply","tag":7,"body":"x"}', ["'id'"]),
        (b'{"op":"reply","id":1,"code":2147483648}', ["'code'"]),
        (b'{"op":"ack","id":1,"status":"delivered","pos":{"x":-1}}', ["'pos'"]),
        (
            b'{"op":"ack","id":1,"status":"delivered","results":[{"status":"delivered"},{}]}',
            ["results[1]", "'status'"],
        ),
        (
            b'{"op":"ack","id":1,"status":"delivered","results":[{"status":"ok"}]}',
            ["results[0]", "'ok'"],
        ),
        (b'{"op":"msg","tag":1,"dest":"d","body":"x","reply_within":-1}', ["'reply_within'"]),
    ],
)
def test_client_rejection_names_the_field(line: bytes, words: list[str]) -> None:
    message = _rejection(CLIENT, line)
    for word in words:
        assert word in message


def test_batch_of_max_batch_messages_round_trips() -> None:
    event = PublishMany(tuple(Publish(str(i).encode()) for i in range(MAX_BATCH)), 9)
    line = ClientCodec().send(event)
    assert parse_line(SERVER, line) == event
    results = tuple(ItemResult("delivered", positions={"d": i}) for i in range(MAX_BATCH))
    answer = Published(9, "delivered", results=results)
    assert parse_line(CLIENT, sent(SERVER, answer)) == answer


def test_batch_items_are_byte_exact() -> None:
    bodies = [b"", b"\x00", b"\xff\xfe", "é€😀".encode(), b"\xed\xa0\x80", b"a\nb\r", b'{"x":1}']
    event = PublishMany(tuple(Publish(b, content_type="t") for b in bodies))
    got = parse_line(SERVER, ClientCodec().send(event))
    assert isinstance(got, PublishMany)
    assert [m.body for m in got.messages] == bodies


@pytest.mark.parametrize(
    ("timeout", "wire"),
    [(5, b"5"), (5.0, b"5"), (0.25, b"0.25"), (3600.0, b"3600"), (1e-9, b"1e-09"), (30, b"30")],
)
def test_call_timeout_is_written_as_a_plain_number(timeout: float, wire: bytes) -> None:
    line = ClientCodec().send(Call(b"x", timeout=timeout))
    assert line == b'{"op":"call","body":"x","timeout":' + wire + b"}\n"
    event = parse_line(SERVER, line)
    assert isinstance(event, Call)
    assert event.timeout == timeout
    assert type(event.timeout) is float


@pytest.mark.parametrize(("seconds", "wire"), [(4.5, b"4.5"), (4.0, b"4"), (0, b"0")])
def test_reply_within_is_written_as_a_plain_number(seconds: float, wire: bytes) -> None:
    line = sent(SERVER, Deliver(1, "d", b"", call=True, reply_within=seconds))
    assert line == b'{"op":"msg","tag":1,"dest":"d","body":"","call":true,"reply_within":' + (
        wire + b"}\n"
    )


# Wrongly typed on purpose: what an untyped caller might pass.
NOT_A_PUBLISH: Any = Ping()
NOT_A_NUMBER: Any = "5"

LOCALLY_REFUSED: list[tuple[Role, Event]] = [
    (CLIENT, PublishMany(())),
    (CLIENT, PublishMany(tuple(Publish(b"") for _ in range(MAX_BATCH + 1)))),
    (CLIENT, PublishMany((Publish(b"a"), Publish(b"b", id=2)))),
    (CLIENT, PublishMany((NOT_A_PUBLISH,))),
    (CLIENT, Call(b"x", timeout=0)),
    (CLIENT, Call(b"x", timeout=-1.0)),
    (CLIENT, Call(b"x", timeout=True)),
    (CLIENT, Call(b"x", timeout=3600.5)),
    (CLIENT, Call(b"x", timeout=float("inf"))),
    (CLIENT, Call(b"x", timeout=float("nan"))),
    (CLIENT, Call(b"x", timeout=NOT_A_NUMBER)),
    (CLIENT, ReplyTo(1, code=-1)),
    (CLIENT, ReplyTo(1, code=2**31)),
    (CLIENT, ReplyTo(1, code=True)),
    (SERVER, Replied(1, code=-1)),
    (SERVER, Replied(1, code=2**31)),
    (SERVER, Deliver(1, "d", b"", call=True, reply_within=-0.5)),
    (SERVER, Deliver(1, "d", b"", call=True, reply_within=float("inf"))),
    (SERVER, Deliver(1, "d", b"", call=True, reply_within=float("nan"))),
    (SERVER, Published(1, "delivered", results=(ItemResult("delivered"),) * (MAX_BATCH + 1))),
]


@pytest.mark.parametrize(("role", "event"), LOCALLY_REFUSED)
def test_send_refuses_what_the_peer_would_reject(role: Role, event: Event) -> None:
    conn = allowing(CODECS[role](), event)  # refused for what it holds, not the state
    with pytest.raises(LocalProtocolError):
        conn.send(event)
    assert conn.state is CodecState.OPEN
    # The refusal leaves the connection usable.
    conn.send(Ping() if role is CLIENT else Pong())


def test_reply_is_read_by_role() -> None:
    # The same op, two events: by tag from a client, by id from the server.
    assert parse_line(SERVER, b'{"op":"reply","tag":3,"body":"x"}\n') == ReplyTo(3, b"x")
    assert parse_line(CLIENT, b'{"op":"reply","id":3,"code":0,"body":"x"}\n') == Replied(3, b"x")
    assert sent(CLIENT, ReplyTo(3, b"x")) == b'{"op":"reply","tag":3,"body":"x"}\n'
    assert sent(SERVER, Replied(3, b"x")) == b'{"op":"reply","id":3,"code":0,"body":"x"}\n'


def test_filter_is_the_gateway_filter() -> None:
    event = parse_line(
        SERVER, b'{"op":"sub","dest":"q","filter":[["size",">=",10],["k","prefix","a"]]}\n'
    )
    assert isinstance(event, Subscribe)
    assert event.filter is not None
    assert event.filter.matches({"size": "12", "k": "abc"})
    assert not event.filter.matches({"size": "9", "k": "abc"})
    assert not event.filter.matches({"k": "abc"})


# -- state: what each side may send (h11-style) ------------------------------------------


def subscriber(*dests: str, window: int = 100) -> NdjsonCodec:
    """A client codec subscribed to ``dests``."""
    conn = ClientCodec()
    for dest in dests:
        conn.send(Subscribe(dest, window=window))
    return conn


def deliver(conn: NdjsonCodec, tag: int, dest: str = "d", *, call: bool = False) -> None:
    msg = {"op": "msg", "tag": tag, "dest": dest, "body": "x", "call": call}
    assert receive_line(conn, msg) == Deliver(tag, dest, b"x", call=call)


def refused(conn: NdjsonCodec, event: Event, *words: str) -> None:
    """``conn`` refuses to send ``event``, saying ``words``, and stays usable."""
    with pytest.raises(LocalProtocolError) as info:
        conn.send(event)
    for word in words:
        assert word in str(info.value)
    assert conn.state is CodecState.OPEN


SETTLE = [Ack, Nack, lambda tag: ReplyTo(tag, b"r")]


@pytest.mark.parametrize("settle", SETTLE, ids=["ack", "nack", "reply"])
def test_a_client_settles_only_a_delivery_it_received_once(settle: Any) -> None:
    conn = subscriber("d")
    refused(conn, settle(1), "no unsettled delivery", "1")
    deliver(conn, 1, call=True)
    refused(conn, settle(2), "no unsettled delivery")
    assert conn.send(settle(1)).startswith(b'{"op":')
    refused(conn, settle(1), "no unsettled delivery")  # already settled
    refused(conn, Ack(1), "no unsettled delivery")


def test_a_client_replies_only_to_a_call() -> None:
    conn = subscriber("d")
    deliver(conn, 1)
    refused(conn, ReplyTo(1, b"r"), "not a call")
    assert conn.send(Ack(1)) == b'{"op":"ack","tag":1}\n'  # the refusal changed nothing
    deliver(conn, 2, call=True)
    assert conn.send(ReplyTo(2, b"r")) == b'{"op":"reply","tag":2,"body":"r"}\n'
    deliver(conn, 3, call=True)
    assert conn.send(Nack(3, requeue=False))  # a call may be settled without a reply
    refused(conn, ReplyTo(3, b"r"), "no unsettled delivery")


def test_a_delivery_for_a_destination_not_subscribed_cannot_be_settled() -> None:
    conn = ClientCodec()
    deliver(conn, 1, "elsewhere")  # parsed and returned as ever
    refused(conn, Ack(1), "no unsettled delivery")


@pytest.mark.parametrize("event", [Credit("d", 5), Unsubscribe("d")], ids=["credit", "unsub"])
def test_credit_and_unsub_need_a_subscription(event: Event) -> None:
    conn = ClientCodec()
    refused(conn, event, "not subscribed", "'d'")
    conn.send(Subscribe("other"))
    refused(conn, event, "not subscribed")
    conn.send(Subscribe("d"))
    conn.send(event)
    if isinstance(event, Credit):
        conn.send(Unsubscribe("d"))
    refused(conn, event, "not subscribed")  # after unsub
    conn.send(Subscribe("d"))
    assert receive_line(conn, {"op": "end", "dest": "d"}) == End("d")
    refused(conn, event, "not subscribed")  # after its end


def test_a_client_subscribes_once_until_unsub_or_end() -> None:
    conn = subscriber("d")
    refused(conn, Subscribe("d"), "already subscribed", "'d'")
    conn.send(Unsubscribe("d"))
    conn.send(Subscribe("d", start="earliest", end="latest"))
    receive_line(conn, {"op": "end", "dest": "d"})
    conn.send(Subscribe("d"))


def test_deliveries_of_an_ended_subscription_are_still_settled() -> None:
    conn = subscriber("d")
    deliver(conn, 1)
    deliver(conn, 2)
    receive_line(conn, {"op": "end", "dest": "d"})
    conn.send(Subscribe("d"))  # a new subscription meanwhile
    deliver(conn, 3)
    conn.send(Ack(2))
    conn.send(Ack(1))
    conn.send(Ack(3))


def test_unsub_forgets_its_deliveries_and_keeps_none_that_arrive_late() -> None:
    conn = subscriber("d", "e")
    deliver(conn, 1)
    deliver(conn, 2, "e")
    conn.send(Unsubscribe("d"))
    refused(conn, Ack(1), "no unsettled delivery")  # the server forgot it too
    deliver(conn, 3)  # written before the server read the unsub
    refused(conn, Ack(3), "no unsettled delivery")
    conn.send(Ack(2))  # other subscriptions keep theirs


def test_a_server_that_delivers_beyond_the_window_breaks_the_protocol() -> None:
    conn = subscriber("d", window=2)
    deliver(conn, 1)
    deliver(conn, 2)
    conn.send(Ack(1))
    deliver(conn, 3)  # room again after the ack
    conn.receive_data(b'{"op":"msg","tag":4,"dest":"d","body":"x"}\n')
    with pytest.raises(RemoteProtocolError, match="window"):
        conn.next_event()
    assert conn.state is CodecState.ERROR


def test_late_deliveries_after_unsub_count_on_a_new_subscription() -> None:
    """The old subscription's last deliveries may arrive after ``sub`` again: its window
    is added to the new one's, so a server that follows the protocol is never refused."""
    conn = subscriber("d", window=1)
    deliver(conn, 1)
    conn.send(Unsubscribe("d"))
    conn.send(Subscribe("d", window=1))
    deliver(conn, 2)  # late, of the old subscription
    deliver(conn, 3)
    conn.receive_data(b'{"op":"msg","tag":4,"dest":"d","body":"x"}\n')
    with pytest.raises(RemoteProtocolError, match="window"):
        conn.next_event()


def test_a_tag_delivered_again_before_it_was_settled_breaks_the_protocol() -> None:
    conn = subscriber("d", "e")
    deliver(conn, 1)
    conn.receive_data(b'{"op":"msg","tag":1,"dest":"e","body":"x"}\n')
    with pytest.raises(RemoteProtocolError, match="tag 1"):
        conn.next_event()


def test_a_settled_tag_may_be_delivered_again() -> None:
    conn = subscriber("d")
    deliver(conn, 1)
    conn.send(Nack(1))
    deliver(conn, 1)
    conn.send(Ack(1))


def test_a_server_delivers_only_to_a_subscription() -> None:
    conn = ServerCodec()
    for event in (Deliver(1, "d", b"x"), End("d")):
        refused(conn, event, "not subscribed", "'d'")
    receive_line(conn, {"op": "sub", "dest": "d"})
    conn.send(Deliver(1, "d", b"x"))
    refused(conn, Deliver(2, "e", b"x"), "not subscribed", "'e'")
    conn.send(End("d"))
    refused(conn, Deliver(2, "d", b"x"), "not subscribed")  # ended
    refused(conn, End("d"), "not subscribed")
    receive_line(conn, {"op": "sub", "dest": "d"})
    conn.send(Deliver(2, "d", b"x"))
    receive_line(conn, {"op": "unsub", "dest": "d"})
    refused(conn, Deliver(3, "d", b"x"), "not subscribed")


REQUESTS = {
    "pub": b'{"op":"pub","id":1,"body":"x"}\n',
    "bare": b'{"k":1}\n',
    "batch": b'{"op":"pub","id":1,"messages":[{"body":"a"},{"body":"b"}]}\n',
    "call": b'{"op":"call","id":1,"body":"x"}\n',
}


@pytest.mark.parametrize("request_line", REQUESTS.values(), ids=list(REQUESTS))
def test_a_server_answers_only_what_awaits_an_answer(request_line: bytes) -> None:
    conn = ServerCodec()
    refused(conn, Published(1, "delivered"), "no publish or call awaits")
    refused(conn, Replied(1), "no call awaits")
    conn.receive_data(request_line)
    assert isinstance(conn.next_event(), Publish | PublishMany | Call)
    if request_line is not REQUESTS["call"]:
        refused(conn, Replied(1), "no call awaits")  # a publish is answered by an ack
    conn.send(Published(1, "delivered"))
    refused(conn, Published(1, "delivered"), "no publish or call awaits")
    refused(conn, Replied(1), "no call awaits")


def test_answers_are_counted_not_matched_by_id() -> None:
    """Ids may repeat or be null: two publishes with one id get two answers, any id."""
    conn = ServerCodec()
    conn.receive_data(b'{"op":"pub","id":7,"body":"x"}\n{"op":"pub","id":7,"body":"y"}\n')
    drain(conn)
    conn.send(Published(None, "failed"))
    conn.send(Published(7, "delivered"))
    refused(conn, Published(7, "delivered"))


@settings(max_examples=100)
@given(
    requests=st.lists(st.sampled_from(["pub", "call"]), max_size=8),
    order=st.randoms(use_true_random=False),
    replies=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_a_server_answering_each_request_once_in_any_order_is_never_refused(
    requests: list[str], order: Any, replies: list[bool]
) -> None:
    conn = ServerCodec()
    for r in requests:
        conn.receive_data(REQUESTS[r])
    assert len(drain(conn)) == len(requests)
    answers: list[Event] = [
        Replied(1) if r == "call" and reply else Published(1, "delivered")
        for r, reply in zip(requests, replies, strict=False)
    ]
    order.shuffle(answers)
    for answer in answers:
        conn.send(answer)
    refused(conn, Published(1, "delivered"))
    refused(conn, Replied(1))


# -- strategies ----------------------------------------------------------------------

texts = st.text(max_size=12)
type_texts = st.none() | st.text(min_size=1, max_size=12)
headers_st = st.dictionaries(texts, texts, max_size=3)
bodies = st.binary(max_size=40) | st.text(max_size=20).map(str.encode)
big_ints = st.integers(0, 2**63 - 1)
tags = st.integers(1, 2**63 - 1)
ids = st.none() | st.text(max_size=8) | st.integers(-(2**70), 2**70)
offsets = st.integers(0, 2**63 - 1)
positions_st = st.none() | st.dictionaries(texts, offsets, min_size=1, max_size=3)
codes = st.integers(0, 2**31 - 1)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
# Seconds: any float in range (written back as the same float, or an int when
# integral), or a whole number.
timeouts = st.floats(0, MAX_CALL_TIMEOUT, exclude_min=True) | st.integers(1, 3600)
reply_windows = st.none() | st.floats(0, 1e300) | st.integers(0, 10**9)
numeric_ops = st.sampled_from([Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE])
filter_keys = st.text(min_size=1, max_size=8)
conditions = st.one_of(
    st.builds(Condition, filter_keys, st.sampled_from(list(Op)), texts),
    st.builds(Condition, filter_keys, numeric_ops, st.integers() | finite_floats),
    st.builds(
        Condition,
        filter_keys,
        numeric_ops,
        st.datetimes(datetime(2, 1, 1), datetime(9998, 1, 1), timezones=st.just(UTC)),
    ),
)
filters = st.lists(conditions, max_size=3).map(lambda cs: Filter(tuple(cs)))
publishes = st.builds(
    Publish,
    body=bodies,
    destination=st.none() | texts,
    headers=headers_st,
    content_type=type_texts,
    id=ids,
)

client_events: st.SearchStrategy[Event] = st.one_of(
    publishes,
    st.builds(
        PublishMany,
        messages=st.lists(
            publishes.map(lambda p: Publish(p.body, p.destination, p.headers, p.content_type)),
            min_size=1,
            max_size=4,
        ).map(tuple),
        id=ids,
    ),
    st.builds(
        Call,
        body=bodies,
        destination=st.none() | texts,
        headers=headers_st,
        content_type=type_texts,
        id=ids,
        timeout=timeouts,
    ),
    st.builds(
        ReplyTo,
        tag=tags,
        body=bodies,
        headers=headers_st,
        content_type=type_texts,
        code=codes,
        error=texts,
    ),
    st.builds(
        Subscribe,
        destination=texts,
        group=st.none() | texts,
        credit=st.none() | big_ints,
        window=st.integers(1, 10_000),
        filter=st.none() | filters,
        start=st.none() | st.sampled_from(["earliest", "latest"]) | offsets,
        end=st.none() | st.just("latest") | offsets,
    ),
    st.builds(Unsubscribe, destination=texts),
    st.builds(Credit, destination=texts, n=big_ints),
    st.builds(Ack, tag=tags),
    st.builds(Nack, tag=tags, requeue=st.booleans()),
    st.just(Ping()),
)

statuses = st.sampled_from(["delivered", "failed", "rejected"])
server_events: st.SearchStrategy[Event] = st.one_of(
    st.builds(
        Published,
        id=ids,
        status=statuses,
        reason=texts,
        positions=positions_st,
        results=st.none()
        | st.lists(
            st.builds(ItemResult, status=statuses, reason=texts, positions=positions_st),
            max_size=4,
        ).map(tuple),
    ),
    st.builds(
        Replied,
        id=ids,
        body=bodies,
        headers=headers_st,
        content_type=type_texts,
        code=codes,
        error=texts,
    ),
    st.builds(
        Deliver,
        tag=tags,
        destination=texts,
        body=bodies,
        headers=headers_st,
        content_type=type_texts,
        redelivered=st.booleans(),
        position=st.none() | offsets,
        call=st.booleans(),
        reply_within=reply_windows,
    ),
    st.builds(End, destination=texts),
    st.just(Pong()),
)


@settings(max_examples=100)
@given(
    events=st.lists(client_events, min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_client_to_server_round_trip(events: list[Event], cuts: list[int]) -> None:
    sender = ClientCodec()
    data = b"".join(allowing(sender, event).send(event) for event in events)
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
    sender = ServerCodec()
    data = b"".join(allowing(sender, event).send(event) for event in events)
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
    "messages",
    "timeout",
    "code",
    "filter",
    "start",
    "end",
    "pos",
    "results",
    "call",
    "reply_within",
]
OPS = [
    "pub",
    "sub",
    "unsub",
    "credit",
    "ack",
    "nack",
    "ping",
    "msg",
    "pong",
    "error",
    "call",
    "reply",
    "end",
    "x",
    1,
]


@st.composite
def mutated_lines(draw: st.DrawFn) -> bytes:
    """A line some codec sent, with up to three fields replaced, added or dropped."""
    sender = draw(st.sampled_from([CLIENT, SERVER]))
    event = draw(client_events if sender is CLIENT else server_events)
    obj: dict[str, Any] = json.loads(sent(sender, event))
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
    conn = CODECS[role](max_line=max_line)
    try:
        for chunk in split_at(data, cuts):
            conn.receive_data(chunk)
            for event in drain(conn):
                assert not isinstance(event, ConnectionClosed)
        conn.receive_data(b"")
        assert drain(conn) == [ConnectionClosed()]
        assert conn.state is CodecState.CLOSED
    except RemoteProtocolError:
        assert conn.state is CodecState.ERROR
        with pytest.raises(LocalProtocolError):
            conn.next_event()


@settings(max_examples=100)
@given(role=st.sampled_from([CLIENT, SERVER]), data=fuzz_inputs)
@example(role=SERVER, data=b'{"op":"pub","body":"x","dest":"\\ud800"}\n')
def test_whatever_parses_can_be_sent_again(role: Role, data: bytes) -> None:
    """An accepted event re-sent by the peer's role parses back to itself."""
    conn = CODECS[role]()
    conn.receive_data(data)
    conn.receive_data(b"")
    try:
        events = drain(conn)
    except RemoteProtocolError:
        return
    for event in events:
        if isinstance(event, ConnectionClosed):
            continue
        assert isinstance(event, Event)
        line = sent(peer_of(role), event)
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
    conn = CODECS[role](max_line=max(max_line, len(prefix)))
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
            assert conn.state is CodecState.ERROR
            return
    # Never crossed the limit: the unterminated line is only an error at EOF.
    conn.receive_data(b"")
    tail = b"".join(chunks)
    if tail.strip():
        with pytest.raises(RemoteProtocolError):
            conn.next_event()
    else:
        assert conn.next_event() == ConnectionClosed()


def test_held_bytes_count_the_lines_parsed_but_not_dropped_yet() -> None:
    conn = ServerCodec()
    line = b'{"op":"ping"}\n'
    conn.receive_data(line * 3 + b'{"op":"pi')
    conn.next_event()  # one line parsed: the buffer keeps it until half of it is parsed
    assert conn.held_bytes >= len(line) * 3 + 9
    while conn.next_event() is not NEED_DATA:
        pass
    assert 9 <= conn.held_bytes < len(line) * 3  # the partial line, the parsed ones dropped
    conn.receive_data(b'ng"}\n')
    assert conn.next_event() is not NEED_DATA
    assert conn.held_bytes == 0
