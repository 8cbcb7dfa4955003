"""The message envelope: every Message round-trips, and what is not an envelope of
this version is refused with a ValueError that says why."""

from __future__ import annotations

import itertools

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.model import Message, PeerIdentity, Source
from gateway.durable.envelope import VERSION, decode, decode_many, encode, encode_many

STORED = 1_700_000_000.25

text = st.text(max_size=20)
identities = st.builds(
    PeerIdentity, text, st.lists(text, max_size=3).map(tuple), st.text("0123456789abcdef")
)
sources = st.builds(
    Source,
    protocol=text,
    listener=text,
    peer=text,
    identity=st.none() | identities,
    # Whole milliseconds: the envelope keeps the receive time to the millisecond.
    received_at=st.integers(0, 4_000_000_000_000).map(lambda ms: ms / 1000),
    upstream=text,
)
messages = st.builds(
    Message,
    destination=st.just("d"),
    body=st.binary(max_size=200),
    headers=st.dictionaries(text, text, max_size=5),
    content_type=st.none() | text,
    source=st.none() | sources,
)


@given(messages)
def test_every_message_round_trips(message: Message) -> None:
    assert decode(encode(message, STORED), "d") == message


@given(st.lists(messages, max_size=10))
def test_a_batch_round_trips_and_shares_sources(batch: list[Message]) -> None:
    payloads = encode_many(batch, STORED)
    assert payloads == [encode(m, STORED) for m in batch]
    back = decode_many(payloads, "d")
    assert back == batch
    for (prev_before, before), (prev_after, after) in zip(
        itertools.pairwise(batch), itertools.pairwise(back), strict=True
    ):
        if before.source is not None and before.source == prev_before.source:
            assert after.source is prev_after.source


def test_the_layout_is_the_documented_one() -> None:
    identity = PeerIdentity("CN=a", ("DNS:a",), "ff")
    source = Source("ndjson", "main", "1.2.3.4:5", identity, 1_700_000_000.5, "")
    message = Message("d", b"body", {"k": "v"}, "text/plain", source)
    assert msgpack.unpackb(encode(message, STORED)) == {
        "v": VERSION,
        "b": b"body",
        "h": {"k": "v"},
        "c": "text/plain",
        "s": 1_700_000_000_250,
        "p": 1_700_000_000_500,
        "o": {
            "p": "ndjson",
            "l": "main",
            "a": "1.2.3.4:5",
            "i": {"s": "CN=a", "n": ["DNS:a"], "f": "ff"},
        },
    }
    # A plain message is three keys; the destination comes from the reader.
    plain = encode(Message("d", b"x"), STORED)
    assert msgpack.unpackb(plain) == {"v": VERSION, "b": b"x", "s": 1_700_000_000_250}
    assert decode(plain, "other") == Message("other", b"x")


def test_unknown_keys_are_ignored() -> None:
    doc = {"v": VERSION, "b": b"x", "s": 1, "future": [1, 2], "h": {"a": "b"}, "zz": None}
    assert decode(msgpack.packb(doc), "d") == Message("d", b"x", {"a": "b"})
    source = {"p": "ndjson", "l": "main", "later": 3}
    back = decode(msgpack.packb({"v": 1, "b": b"", "s": 1, "o": source}), "d")
    assert back.source == Source("ndjson", "main")


def envelope(**changes: object) -> bytes:
    doc: dict[str, object] = {"v": VERSION, "b": b"x", "s": 1}
    doc.update(changes)
    return msgpack.packb({k: v for k, v in doc.items() if v is not ...})


BAD_PAYLOADS: list[tuple[bytes, str]] = [
    (b"", "not msgpack"),
    (b"\xc1", "not msgpack"),
    (msgpack.packb({"v": 1, "b": b"x", "s": 1}) + b"\x00", "not msgpack"),
    (msgpack.packb({1: 2}), "not msgpack"),
    (msgpack.packb([1, b"x"]), "an envelope is a map"),
    (envelope(v=...), "version"),
    (envelope(v="1"), "version"),
    (envelope(v=VERSION + 1), f"version {VERSION + 1}"),
    (envelope(v=0), "version 0"),
    (envelope(b=...), "body"),
    (envelope(b="text"), "body"),
    (envelope(s=...), "stored"),
    (envelope(s=1.5), "stored"),
    (envelope(p="now"), "published"),
    (envelope(c=b"bytes"), "content type"),
    (envelope(c=None), "content type"),
    (envelope(h=None), "headers"),
    (envelope(h=["k", "v"]), "headers"),
    (envelope(h={"k": 1}), "headers"),
    (envelope(h={"k": b"v"}), "headers"),
    (envelope(o="ndjson"), "source"),
    (envelope(o={"p": "ndjson"}), "protocol"),
    (envelope(o={"p": "ndjson", "l": "m", "a": 5}), "peer"),
    (envelope(o={"p": "ndjson", "l": "m", "u": None}), "upstream"),
    (envelope(o={"p": "ndjson", "l": "m", "i": "CN=a"}), "identity"),
    (envelope(o={"p": "ndjson", "l": "m", "i": {"n": []}}), "subject"),
    (envelope(o={"p": "ndjson", "l": "m", "i": {"s": "a", "n": "b"}}), "SANs"),
    (envelope(o={"p": "ndjson", "l": "m", "i": {"s": "a", "f": 1}}), "fingerprint"),
    (
        msgpack.packb({"v": 1, "b": b"x", "s": 1, "h": {"k": b"\xff"}}, use_bin_type=False),
        "not msgpack",
    ),
]


@pytest.mark.parametrize(
    ("payload", "says"),
    BAD_PAYLOADS,
    ids=[f"{i}-{says.replace(' ', '-')}" for i, (_, says) in enumerate(BAD_PAYLOADS)],
)
def test_bad_payloads_are_refused_saying_why(payload: bytes, says: str) -> None:
    with pytest.raises(ValueError, match="bad envelope") as info:
        decode(payload, "d")
    assert says in str(info.value)
    with pytest.raises(ValueError, match="bad envelope"):
        decode_many([encode(Message("d", b"ok"), STORED), payload], "d")


def test_encode_defaults_to_now() -> None:
    stored = msgpack.unpackb(encode(Message("d", b"x")))["s"]
    assert stored > 1_700_000_000_000
