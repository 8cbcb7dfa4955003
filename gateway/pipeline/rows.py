"""The rows of the ``interchange`` data source: its exact schema, and stored events
turned into Arrow record batches.

Spark's Python data sources move data as Arrow, and Spark takes a
``pyarrow.RecordBatch`` as is only when its schema *equals* the one Spark
derives from the declared schema (``to_arrow_schema(schema, timezone="UTC")``):
``string`` not ``large_string``, ``int32`` for INT, ``timestamp[us, tz=UTC]``
for TIMESTAMP, ``map<string, string>`` (entries and keys not null) for the
headers, every column nullable. :data:`ARROW_SCHEMA` is that schema, written
out; a test reads it back through Spark.

One row per stored event:

==================  ===========  ==============================================
column              type         an envelope (a hub message)  / a raw event
==================  ===========  ==============================================
``destination``     string       the destination read
``partition``       int          its partition (the segment ``destination/N``)
``offset``          bigint       the event's byte offset in the segment
``timestamp``       timestamp    when the gateway stored it   / null
``source_protocol`` string       the protocol it came in by   / null
``listener``        string       the listener it came in by   / null
``peer``            string       the sender's address (null when unknown) / null
``content_type``    string       its content type, or null    / null
``headers``         map          its headers (empty: none)    / empty
``body``            binary       the body                     / the event's bytes
==================  ===========  ==============================================

Raw events are what a segment-append writer sent as its own bytes; envelopes
are what every other protocol published, and what a writer in envelope mode
(the ``interchange`` sink) appended. :func:`decode_chunk` builds the columns
of a whole read run in one pass (the body sliced out of each envelope; what
follows it, shared by the events of one publish, decoded once per distinct
run of bytes), then one ``RecordBatch``: Python does per-event work only
where it cannot be avoided.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from gateway.durable.envelope import VERSION

__all__ = ["ARROW_SCHEMA", "COLUMNS", "DDL", "ENVELOPE", "RAW", "decode_chunk", "empty_batch"]

#: The payload formats a read reports (the store's RecordFormat values).
RAW = 0
ENVELOPE = 1

#: The data source's schema as Spark DDL.
DDL = (
    "destination STRING, partition INT, offset BIGINT, timestamp TIMESTAMP,"
    " source_protocol STRING, listener STRING, peer STRING, content_type STRING,"
    " headers MAP<STRING, STRING>, body BINARY"
)

#: The Arrow schema Spark expects for :data:`DDL`, exactly.
ARROW_SCHEMA = pa.schema(
    [
        ("destination", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("source_protocol", pa.string()),
        ("listener", pa.string()),
        ("peer", pa.string()),
        ("content_type", pa.string()),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
    ]
)
COLUMNS = tuple(ARROW_SCHEMA.names)

_HEADER = struct.Struct(">ii")
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_NO_HEADERS: dict[str, str] = {}


class _Source(msgspec.Struct, gc=False):
    """The source map of an envelope (``o``), the keys the rows show."""

    p: str
    l: str  # noqa: E741 (the envelope's key)
    a: str | None = None


class _Meta(msgspec.Struct, gc=False):
    """An envelope but its version and body: what events of one publish share."""

    s: int
    h: dict[str, str] = _NO_HEADERS
    c: str | None = None
    o: _Source | None = None


class _Envelope(msgspec.Struct, gc=False):
    """A whole envelope (:mod:`gateway.durable.envelope`) as the rows need it:
    msgspec checks the types and skips the keys not named here."""

    v: int
    b: bytes
    s: int
    h: dict[str, str] = _NO_HEADERS
    c: str | None = None
    o: _Source | None = None


_decode_meta = msgspec.msgpack.Decoder(_Meta).decode
_decode_envelope = msgspec.msgpack.Decoder(_Envelope).decode
#: How the gateway writes an envelope's start (a map of k keys, ``v`` = VERSION, ``b``),
#: by the number of keys.
_PREFIXES = {bytes([0x80 | k, 0xA1, 0x76, VERSION, 0xA1, 0x62]): k for k in range(3, 16)}
_BIN_SIZES = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def _frames(data: bytes, begin: int, stop: int) -> tuple[list[int], list[int]]:
    """The positions and payload lengths of the events in ``data[begin:stop]``;
    ValueError unless that is exactly whole events."""
    unpack = _HEADER.unpack_from
    positions: list[int] = []
    lengths: list[int] = []
    pos = begin
    try:
        while pos < stop:
            kind, length = unpack(data, pos)
            if kind or length < 0:
                break
            positions.append(pos)
            lengths.append(length)
            pos += 8 + length
    except struct.error:
        pass
    if pos != stop:
        raise ValueError(f"bad event framing at byte {pos} of the chunk")
    return positions, lengths


_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from


class _Scan:
    """Envelopes split into body and metadata. The events of one publish share
    everything after the body byte for byte (stored time, headers, content type,
    source), so the metadata after the body is decoded once per distinct run of
    bytes; only envelopes not laid out as the gateway writes them are decoded
    whole (the result is the same). The per-event loop compares bytes in place
    (``startswith`` with bounds) rather than slicing: it runs once per row."""

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.bodies: list[bytes] = []
        self.which: list[int] = []
        self.metas: list[_Meta] = []
        self._known: dict[bytes, int] = {}

    def scan(self, data: bytes, pos: int, stop: int) -> None:
        """The events framed in ``data[pos:stop]``; ValueError for bad framing,
        msgspec's errors for a bad envelope (``self.positions[-1]`` is where)."""
        unpack = _HEADER.unpack_from
        add_position, add_body, add_which = (
            self.positions.append,
            self.bodies.append,
            self.which.append,
        )
        prefix, tail, index = b"", b"", -1
        while pos < stop:
            kind, length = unpack(data, pos)
            start, end = pos + 8, pos + 8 + length
            if kind or length < 0 or end > stop:
                raise ValueError(f"bad event framing at byte {pos} of the chunk")
            add_position(pos)
            pos = end
            if not (prefix and data.startswith(prefix, start, end)):
                prefix = self._prefix(data, start, end)
                if not prefix:
                    add_body(self._whole(data[start:end]))
                    add_which(len(self.metas) - 1)
                    tail, index = b"", -1
                    continue
            if data[start + 6] == 0xC4:  # bodies under 256 bytes, the usual case
                body = start + 8
                body_end = body + data[start + 7]
            else:
                body = start + 7 + _BIN_SIZES[data[start + 6]]
                body_end = body + _length(data, start + 6)
            if body_end > end:
                raise ValueError("the body runs past the envelope")
            add_body(data[body:body_end])
            if end - body_end != len(tail) or not data.startswith(tail, body_end, end):
                tail = data[body_end:end]
                index = self._meta(tail, _PREFIXES[prefix[:6]])
            add_which(index)

    @staticmethod
    def _prefix(data: bytes, start: int, end: int) -> bytes:
        """The envelope's first 7 bytes when laid out as the gateway writes it
        (map header, ``v``, ``b`` and a bin header), else b""."""
        head = data[start : start + 7]
        if end - start > 7 and head[:6] in _PREFIXES and head[6] in _BIN_SIZES:
            return head
        return b""

    def _meta(self, tail: bytes, keys: int) -> int:
        index = self._known.get(tail)
        if index is None:
            index = self._known[tail] = len(self.metas)
            self.metas.append(_decode_meta(bytes([0x80 | (keys - 2)]) + tail))
        return index

    def _whole(self, envelope: bytes) -> bytes:
        whole = _decode_envelope(envelope)
        if whole.v > VERSION:
            raise ValueError(f"version {whole.v} (this gateway reads 1 to {VERSION})")
        self.metas.append(_Meta(whole.s, whole.h, whole.c, whole.o))
        return whole.b


def _length(data: bytes, at: int) -> int:
    """The length of the msgpack bin whose header byte is ``data[at]``."""
    size = data[at]
    if size == 0xC4:
        return data[at + 1]
    if size == 0xC5:
        return int(_U16(data, at + 1)[0])
    return int(_U32(data, at + 1)[0])


def _scan(data: bytes, base: int, begin: int, stop: int) -> _Scan:
    """The envelopes in ``data[begin:stop]``; ValueError naming the first bad one."""
    scan = _Scan()
    try:
        scan.scan(data, begin, stop)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, struct.error) as e:
        at = scan.positions[-1] if scan.positions else begin
        raise ValueError(f"bad envelope at byte {base + at}: {e}") from None
    return scan


def _envelope_batch(
    destination: str, partition: int, base: int, data: bytes, begin: int, stop: int
) -> pa.RecordBatch:
    """Rows of envelopes: the metadata columns built for each distinct metadata,
    then spread to the rows by Arrow's ``take``."""
    scan = _scan(data, base, begin, stop)
    positions, metas = scan.positions, scan.metas
    which = pa.array(scan.which, pa.int32())
    sources = [m.o for m in metas]
    headers = [m.h for m in metas]
    header_map = pa.MapArray.from_arrays(
        pa.array(list(accumulate(map(len, headers), initial=0)), pa.int32()),
        pa.array([k for h in headers for k in h], pa.string()),
        pa.array([v for h in headers for v in h.values()], pa.string()),
        type=ARROW_SCHEMA.field("headers").type,
    )
    texts = [
        [s.p if s else None for s in sources],
        [s.l if s else None for s in sources],
        [s.a if s else None for s in sources],
        [m.c for m in metas],
    ]
    return _batch(
        destination,
        partition,
        np.asarray(positions, dtype=np.int64) + base,
        pa.array([m.s * 1000 for m in metas], _TIMESTAMP).take(which),
        [pa.array(text, pa.string()).take(which) for text in texts],
        header_map.take(which),
        scan.bodies,
    )


def _raw_batch(
    destination: str, partition: int, base: int, data: bytes, begin: int, stop: int
) -> pa.RecordBatch:
    """Rows of raw events: only the offset and the body are known."""
    positions, lengths = _frames(data, begin, stop)
    n = len(positions)
    no_text = pa.nulls(n, pa.string())
    no_headers = pa.MapArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)),
        pa.array([], pa.string()),
        pa.array([], pa.string()),
        type=ARROW_SCHEMA.field("headers").type,
    )
    return _batch(
        destination,
        partition,
        np.asarray(positions, dtype=np.int64) + base,
        pa.nulls(n, _TIMESTAMP),
        [no_text, no_text, no_text, no_text],
        no_headers,
        [data[p + 8 : p + 8 + ln] for p, ln in zip(positions, lengths, strict=True)],
    )


def _batch(
    destination: str,
    partition: int,
    offsets: Any,
    timestamps: pa.Array,
    texts: list[pa.Array],
    headers: pa.Array,
    bodies: list[bytes],
) -> pa.RecordBatch:
    """The batch of the columns, the constant ones filled in."""
    n = len(offsets)
    arrays: list[Any] = [
        pa.array([destination] * n, pa.string()),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets, pa.int64()),
        timestamps,
        *texts,
        headers,
        pa.array(bodies, pa.binary()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def decode_chunk(
    destination: str,
    partition: int,
    offset: int,
    data: bytes,
    formats: Sequence[tuple[int, int]],
) -> Iterator[pa.RecordBatch]:
    """The rows of the whole events in ``data``, read from byte ``offset`` of the
    segment of ``partition``: a batch per run of ``formats``, the read's
    ``(offset, format)`` entries (each format holds from its offset to the next
    entry's). ValueError for bad framing, a bad envelope or a format other than
    raw and envelope (a record the store found damaged), naming the byte."""
    runs = list(formats) or [(offset, RAW)]
    for i, (at, kind) in enumerate(runs):
        begin = at - offset
        stop = runs[i + 1][0] - offset if i + 1 < len(runs) else len(data)
        if begin == stop:
            continue
        if kind == ENVELOPE:
            yield _envelope_batch(destination, partition, offset, data, begin, stop)
        elif kind == RAW:
            yield _raw_batch(destination, partition, offset, data, begin, stop)
        else:
            raise ValueError(f"the events at byte {at} have format {kind} (damaged in the store)")


def empty_batch() -> pa.RecordBatch:
    """A batch of no rows with :data:`ARROW_SCHEMA`."""
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
