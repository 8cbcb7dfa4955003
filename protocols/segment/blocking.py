"""A blocking segment-append client: stdlib sockets over the sans-IO codec, no trio.

This is the client for code that cannot run an event loop: Spark's Python
workers, scripts, threads. It imports no trio and nothing of the gateway's
runtime (only the codec), so importing it in an executor costs milliseconds.

:class:`SegmentClient` reads: a segment's retained start and durable end
(:meth:`~SegmentClient.info`), a destination's partitions, event boundaries
computed from the store's index without reading the data
(:meth:`~SegmentClient.locate`), and exactly the events of a byte range
(:meth:`~SegmentClient.read`, or :meth:`~SegmentClient.read_chunks` for whole
runs of events to decode at once). Replies are pipelined: several reads are
in flight, so the network and the server work while the caller decodes.

:class:`BlockingWriter` appends events whose numbers the caller chooses: a
task retried with the same writer id and the same numbers has what the
server stored already skipped, so each event is stored once
(:meth:`~BlockingWriter.append`).

A client is picklable: it connects on first use, and pickling drops the
connection (a Spark driver builds one, executors use copies). TLS settings
that must travel with it are given as :class:`TlsFiles`, built into a
context where the client connects; an ``ssl.SSLContext`` cannot be pickled.

Errors: :class:`~.errors.NoSuchSegmentError`,
:class:`~.errors.SegmentTruncatedError` (``start_offset`` says where reading
can go on) and the other :class:`~.errors.SegmentError` are the server
refusing a request; :class:`~.errors.SegmentClientError` is an answer the
client cannot go on with (the connection is dropped, the next call makes a
new one); network failures are ``OSError`` (``TimeoutError`` once
``timeout`` passes without progress on a socket operation).
"""

from __future__ import annotations

import itertools
import socket
import ssl
import struct
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

from gateway.sdk import NEED_DATA, ConnectionClosed, RemoteProtocolError

from .codec import ClientCodec
from .errors import (
    NoSuchSegmentError,
    SegmentClientError,
    SegmentError,
    SegmentTruncatedError,
    refusal,
)
from .events import (
    NULL_EVENT_NUMBER,
    READ_FORMATS,
    AppendSetup,
    AuthTokenCheckFailed,
    Command,
    DataAppended,
    ErrorMessage,
    GetStreamSegmentInfo,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    LocateOffset,
    NoSuchSegment,
    OffsetLocated,
    OperationUnsupported,
    PayloadFormat,
    ReadSegment,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentRead,
    SetupAppend,
    StreamSegmentInfo,
    WrongHost,
)
from .frames import HEADER

__all__ = [
    "BlockingWriter",
    "NoSuchSegmentError",
    "SegmentClient",
    "SegmentClientError",
    "SegmentError",
    "SegmentInfo",
    "SegmentTruncatedError",
    "StoredEvent",
    "TlsFiles",
]

#: Payload formats, as the store keeps them.
RAW: Final = int(PayloadFormat.RAW)
ENVELOPE: Final = int(PayloadFormat.ENVELOPE)
_RECEIVE_SIZE: Final = 1 << 20
#: Bytes one read request asks for (a gateway answers at most ``max_read_bytes``,
#: 1 MiB by default; a shorter answer is asked again for the rest).
_PIECE: Final = 1 << 20
#: Read requests in flight at once.
_READ_DEPTH: Final = 4
#: Targets located in one round trip while planning chunk boundaries.
_LOCATE_BATCH: Final = 64
#: Segments probed in one round trip by :meth:`SegmentClient.partitions`.
_PROBE_BATCH: Final = 16
_FORMAT_ENTRY: Final = struct.Struct(">qb")
_MAX_I64: Final = 2**63 - 1
_ERROR_REPLIES: Final = (
    NoSuchSegment,
    SegmentIsSealed,
    SegmentAlreadyExists,
    SegmentIsTruncated,
    WrongHost,
    OperationUnsupported,
    AuthTokenCheckFailed,
    ErrorMessage,
)


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What a server says of a segment (``StreamSegmentInfo``).

    ``start`` is the retained start and ``end`` the durable end: reads of
    ``[start, end)`` always return the same bytes. ``first_event`` and
    ``next_event`` are the event indexes at ``start`` and ``end`` (-1 from a
    server that does not say), so ``next_event - first_event`` events are
    readable. A missing segment has ``exists`` false and zeros.
    """

    segment: str
    exists: bool
    sealed: bool
    start: int
    end: int
    first_event: int
    next_event: int
    last_modified_ms: int


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event read back: where its frame starts, its payload format, its payload."""

    offset: int
    #: 0 raw (a segment writer's own bytes), 1 envelope (a message the hub stored).
    format: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """TLS settings as file paths: picklable, turned into a context where it connects."""

    #: The CA bundle that signs the server's certificate (None: the system's).
    ca_file: str | None = None
    #: A client certificate and its key, for a listener that asks for one.
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


# -- one connection --------------------------------------------------------------------------


def _parse_addresses(address: str) -> list[str]:
    """``"h1:p1,h2:p2"`` as a list, each checked to be ``host:port`` or ``unix:/path``."""
    out = [part.strip() for part in address.split(",") if part.strip()]
    if not out:
        raise ValueError(f"no address in {address!r}")
    for one in out:
        if not one.startswith("unix:"):
            host, sep, port = one.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"address {one!r} is not host:port or unix:/path")
    return out


def _open_socket(address: str, timeout: float) -> socket.socket:
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address[5:])
        except BaseException:
            sock.close()
            raise
        return sock
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _Connection:
    """One socket and its codec: requests out, events in, replies matched by request id."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.codec = ClientCodec()
        #: Request ids sent and not answered yet, and replies that came before
        #: the one being waited for (another request of the same pipeline).
        self.pending: set[int] = set()
        self.early: dict[int, object] = {}
        #: Where bytes are received (the codec copies them into its buffer).
        self._received = bytearray(_RECEIVE_SIZE)
        self._view = memoryview(self._received)
        self.sock.sendall(self.codec.send(Hello()))

    def close(self) -> None:
        self.sock.close()

    def send(self, commands: Sequence[Command]) -> None:
        """Send requests at once; those with a request id are then awaited with :meth:`reply`."""
        wire = b"".join(map(self.codec.send, commands))
        for command in commands:
            rid = getattr(command, "request_id", -1)
            if rid > 0:
                self.pending.add(rid)
        self.sock.sendall(wire)

    def event(self) -> object:
        """The next event the server sent (``Hello`` and ``KeepAlive`` skipped)."""
        codec = self.codec
        while True:
            try:
                event = codec.next_event()
            except RemoteProtocolError as e:
                raise SegmentClientError(f"the server broke the protocol: {e}") from e
            if event is NEED_DATA:
                n = self.sock.recv_into(self._received)
                codec.receive_data(self._view[:n])
            elif isinstance(event, ConnectionClosed):
                raise ConnectionResetError("the server closed the connection")
            elif not isinstance(event, Hello | KeepAlive):
                return event

    def reply(self, rid: int) -> object:
        """The reply to request ``rid``; replies to other pending requests are kept
        for their turn, those to requests given up are dropped."""
        if rid in self.early:
            self.pending.discard(rid)
            return self.early.pop(rid)
        while True:
            event = self.event()
            got = getattr(event, "request_id", -1)
            if got == rid:
                self.pending.discard(rid)
                return event
            if got in self.pending:
                self.early[got] = event
            elif got == -1 and isinstance(event, _ERROR_REPLIES):
                raise SegmentClientError(f"the server refused and closes: {event!r}")
            # Anything else answers a request given up (an abandoned read): dropped.

    def forget(self, rids: Sequence[int]) -> None:
        """Requests whose replies are no longer wanted."""
        for rid in rids:
            self.pending.discard(rid)
            self.early.pop(rid, None)


# -- the client ------------------------------------------------------------------------------


class SegmentClient:
    """A blocking client of a segment-append server (one connection, opened on first use).

    ``address`` is ``host:port`` (or ``unix:/path``), or a comma list of them:
    the first that connects is used, starting from the one that last worked.
    Not thread-safe: one client per thread (clients are cheap).
    """

    def __init__(
        self,
        address: str,
        *,
        ssl_context: ssl.SSLContext | TlsFiles | None = None,
        server_hostname: str | None = None,
        timeout: float = 30.0,
        token: str = "",
    ) -> None:
        self.address = address
        self.addresses = _parse_addresses(address)
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.timeout = timeout
        self.token = token
        self._conn: _Connection | None = None
        self._next_id = 1
        self._preferred = 0

    # -- lifecycle --------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        if isinstance(self.ssl_context, ssl.SSLContext):
            raise TypeError(
                "a SegmentClient with an ssl.SSLContext cannot be pickled; pass"
                " ssl_context=TlsFiles(ca_file=..., cert_file=..., key_file=...) instead"
            )
        state = self.__dict__.copy()
        state["_conn"] = None
        return state

    def __enter__(self) -> SegmentClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _open(self) -> _Connection:
        """A new connection to the first address that answers (TLS if configured)."""
        errors: list[str] = []
        n = len(self.addresses)
        for k in range(n):
            i = (self._preferred + k) % n
            address = self.addresses[i]
            try:
                sock = self._socket(address)
            except OSError as e:
                errors.append(f"{address}: {e}")
                continue
            self._preferred = i
            try:
                return _Connection(sock)
            except BaseException:
                sock.close()
                raise
        raise ConnectionError(f"cannot connect to {self.address}: {'; '.join(errors)}")

    def _socket(self, address: str) -> socket.socket:
        sock = _open_socket(address, self.timeout)
        context = self.ssl_context
        if context is None:
            return sock
        if isinstance(context, TlsFiles):
            context = context.context()
        host = self.server_hostname
        if host is None and not address.startswith("unix:"):
            host = address.rpartition(":")[0].strip("[]")
        try:
            return context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise

    def _connection(self) -> _Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _ids(self, n: int) -> list[int]:
        first = self._next_id
        self._next_id += n
        return list(range(first, first + n))

    def _call(self, requests: Sequence[GetStreamSegmentInfo | LocateOffset]) -> list[object]:
        """Send requests at once and return their replies, in order. A refusal is
        raised (the connection stays); anything else failing drops the connection."""
        try:
            conn = self._connection()
            conn.send(requests)
            replies = [conn.reply(r.request_id) for r in requests]
        except BaseException:
            self.close()
            raise
        return replies

    def _expect(self, reply: object, kind: type[Any]) -> Any:
        if isinstance(reply, kind):
            return reply
        if isinstance(reply, NoSuchSegment | SegmentIsTruncated | SegmentIsSealed):
            raise refusal(reply)
        self.close()
        if isinstance(reply, _ERROR_REPLIES):
            raise refusal(reply)
        raise SegmentClientError(f"expected {kind.__name__}, the server answered {reply!r}")

    # -- what a segment holds ---------------------------------------------------------------
    def info(self, segment: str) -> SegmentInfo:
        """The segment's retained start, durable end and event indexes."""
        return self._infos([segment])[0]

    def _infos(self, segments: Sequence[str]) -> list[SegmentInfo]:
        rids = self._ids(len(segments))
        requests = [
            GetStreamSegmentInfo(r, s, self.token) for r, s in zip(rids, segments, strict=True)
        ]
        out = []
        for reply in self._call(requests):
            i = self._expect(reply, StreamSegmentInfo)
            out.append(
                SegmentInfo(
                    i.segment,
                    i.exists,
                    i.is_sealed,
                    i.start_offset,
                    i.write_offset,
                    i.first_event,
                    i.next_event,
                    i.last_modified,
                )
            )
        return out

    def partitions(self, destination: str) -> list[SegmentInfo]:
        """The segments ``destination/0``, ``destination/1``, … that exist, in order
        ([] when ``destination/0`` does not): a durable destination's partitions."""
        found: list[SegmentInfo] = []
        while True:
            names = [f"{destination}/{len(found) + k}" for k in range(_PROBE_BATCH)]
            for info in self._infos(names):
                if not info.exists:
                    return found
                found.append(info)

    def locate(self, segment: str, target: int, events: int | None = None) -> tuple[int, int]:
        """``(offset, event_index)`` of the last event boundary at or before ``target``
        (clamped into the retained, durable range); with ``events``, of the boundary
        that many events after it (at most the durable end). Computed from the
        store's index, without reading the segment."""
        return self._locate_many(segment, [target], events)[0]

    def _locate_many(
        self, segment: str, targets: Sequence[int], events: int | None = None
    ) -> list[tuple[int, int]]:
        n = -1 if events is None else events
        rids = self._ids(len(targets))
        requests = [
            LocateOffset(r, segment, t, self.token, n) for r, t in zip(rids, targets, strict=True)
        ]
        out = []
        for reply in self._call(requests):
            located = self._expect(reply, OffsetLocated)
            out.append((located.offset, located.event_index))
        return out

    # -- reading ----------------------------------------------------------------------------
    def read(
        self, segment: str, start: int, end: int, *, chunk: int = 4 << 20
    ) -> Iterator[StoredEvent]:
        """Exactly the events of ``[start, end)``, both event boundaries (offsets that
        :meth:`info`, :meth:`locate` or an earlier read gave), in order."""
        for offset, data, formats in self.read_chunks(segment, start, end, chunk=chunk):
            yield from _split(segment, offset, data, formats)

    def read_chunks(
        self, segment: str, start: int, end: int, *, chunk: int = 4 << 20
    ) -> Iterator[tuple[int, bytes, list[tuple[int, int]]]]:
        """The events of ``[start, end)`` as ``(offset, data, formats)`` runs of about
        ``chunk`` bytes: ``data`` is whole event frames (``[0][len][payload]`` each)
        starting at ``offset``, and ``formats`` lists ``(offset, format)`` where the
        payload format changes, the first at ``offset``. Chunks end on event boundaries
        that the server locates from its index, so nothing here walks the events."""
        if not 0 <= start <= end:
            raise ValueError(f"bad range [{start}, {end})")
        if chunk < 1:
            raise ValueError("chunk must be positive")
        reads = _Reads(self, segment)
        try:
            yield from reads.chunks(self._cuts(segment, start, end, chunk), start)
        except BaseException as e:
            reads.abandon(keep=isinstance(e, SegmentError | GeneratorExit))
            raise

    def _cuts(self, segment: str, start: int, end: int, chunk: int) -> Iterator[int]:
        """Event boundaries about ``chunk`` apart from ``start``, ending with ``end``."""
        last = start
        target = start + chunk
        while target < end:
            targets = list(itertools.islice(range(target, end, chunk), _LOCATE_BATCH))
            for offset, _ in self._locate_many(segment, targets):
                if last < offset < end:
                    yield offset
                    last = offset
            target = targets[-1] + chunk
        if end > last:
            yield end

    # -- writing ----------------------------------------------------------------------------
    def writer(self, segment: str, writer_id: UUID, *, envelope: bool = False) -> BlockingWriter:
        """A writer of ``segment`` with caller-chosen event numbers, on a connection of its
        own (set up now: its ``last_event_number`` says what the server stored)."""
        return BlockingWriter(self, segment, writer_id, envelope=envelope)


def _merge_formats(runs: list[tuple[int, int]], formats: bytes | None, offset: int) -> None:
    """Add a reply's format entries to ``runs``, keeping only the changes."""
    if not formats:
        if not runs:
            runs.append((offset, RAW))  # a server that does not say: raw
        return
    for at, fmt in _FORMAT_ENTRY.iter_unpack(formats):
        if not runs or runs[-1][1] != fmt:
            runs.append((at, fmt))


def _split(
    segment: str, offset: int, data: bytes, formats: list[tuple[int, int]]
) -> Iterator[StoredEvent]:
    """The events of one chunk, a run of one payload format at a time."""
    unpack = HEADER.unpack_from
    end = len(data)
    run_ends = [at - offset for at, _ in formats[1:]] + [end]
    p = 0
    for (_, fmt), run_end in zip(formats, run_ends, strict=True):
        while p < run_end:
            code, length = unpack(data, p) if end - p >= 8 else (-1, -1)
            stop = p + 8 + length
            if code or length < 0 or stop > end:
                raise SegmentClientError(
                    f"segment {segment!r}: no whole event at offset {offset + p} (start and"
                    " end must be event boundaries)"
                )
            yield StoredEvent(offset + p, fmt, data[p + 8 : stop])
            p = stop


class _Reads:
    """The read requests of one :meth:`SegmentClient.read_chunks`: several in flight,
    each asking for at most one piece of one chunk, and a short answer asked again
    for its rest."""

    def __init__(self, client: SegmentClient, segment: str) -> None:
        self.client = client
        self.segment = segment
        #: Requests sent: (request id, offset, length, whether it ends a chunk).
        self.sent: deque[tuple[int, int, int, bool]] = deque()

    def chunks(
        self, cuts: Iterator[int], start: int
    ) -> Iterator[tuple[int, bytes, list[tuple[int, int]]]]:
        pieces = self._pieces(cuts, start)
        parts: list[bytes] = []
        runs: list[tuple[int, int]] = []
        chunk_start = start
        more = True
        while True:
            while more and len(self.sent) < _READ_DEPTH:
                more = self._send_next(pieces)
            if not self.sent:
                return
            rid, offset, length, last = self.sent.popleft()
            self._receive(rid, offset, length, parts, runs)
            if last:
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                yield chunk_start, data, runs
                chunk_start = offset + length
                parts, runs = [], []

    @staticmethod
    def _pieces(cuts: Iterator[int], start: int) -> Iterator[tuple[int, int, bool]]:
        """``(offset, length, ends a chunk)`` of every request, in order."""
        at = start
        for cut in cuts:
            while at < cut:
                n = min(_PIECE, cut - at)
                yield at, n, at + n == cut
                at += n

    def _send_next(self, pieces: Iterator[tuple[int, int, bool]]) -> bool:
        piece = next(pieces, None)  # may locate the next cuts first (another round trip)
        if piece is None:
            return False
        offset, length, last = piece
        self._request(offset, length, last)
        return True

    def _request(self, offset: int, length: int, last: bool) -> None:
        client = self.client
        (rid,) = client._ids(1)
        request = ReadSegment(self.segment, offset, length, client.token, rid, READ_FORMATS)
        client._connection().send([request])
        self.sent.append((rid, offset, length, last))

    def _receive(
        self, rid: int, offset: int, length: int, parts: list[bytes], runs: list[tuple[int, int]]
    ) -> None:
        """The bytes ``[offset, offset + length)`` into ``parts`` (asking again while the
        server answers less), their formats into ``runs``."""
        client = self.client
        while True:
            reply = client._expect(client._connection().reply(rid), SegmentRead)
            data = reply.data
            if reply.offset != offset or len(data) > length:
                raise SegmentClientError(
                    f"segment {self.segment!r}: asked {length} bytes at {offset}, got"
                    f" {len(data)} at {reply.offset}"
                )
            if data:
                parts.append(data)
                _merge_formats(runs, reply.formats, offset)
            offset += len(data)
            length -= len(data)
            if not length:
                return
            if reply.at_tail:
                raise SegmentClientError(
                    f"segment {self.segment!r} ends at {offset} (durable), before the end asked"
                )
            (rid,) = client._ids(1)
            request = ReadSegment(self.segment, offset, length, client.token, rid, READ_FORMATS)
            client._connection().send([request])

    def abandon(self, *, keep: bool) -> None:
        """The read stops early: its replies still to come are dropped when they arrive
        (``keep``: the connection is fine), or the connection is closed."""
        conn = self.client._conn
        if conn is None:
            return
        if keep:
            conn.forget([rid for rid, *_ in self.sent])
        else:
            self.client.close()
        self.sent.clear()


# -- the writer ------------------------------------------------------------------------------


class _Stale(Exception):
    """The server refused a block as already stored (another attempt of the same writer
    got there first): set up again and skip what is stored now."""


class BlockingWriter:
    """Appends to one segment as one writer id, with the caller's event numbers.

    Event numbers are the caller's: ``append(payloads, first)`` numbers the
    events ``first, first + 1, …``. The server keeps, per writer id, the last
    number it stored (:attr:`last_event_number`), and a writer sends only the
    events above it, so a retried task that appends the same events with the
    same numbers stores nothing twice, even while the first attempt still runs.
    Numbers start at 1 and may jump; an append whose numbers are all at or below
    :attr:`last_event_number` stores nothing.
    """

    #: Bytes of events in one append block, and blocks in flight at once.
    block_bytes = 1 << 20
    max_blocks_in_flight = 8
    #: Reconnects an append makes after a lost connection (or a refusal as stale)
    #: that brought no progress, before it raises.
    retries = 5

    def __init__(
        self, client: SegmentClient, segment: str, writer_id: UUID, *, envelope: bool = False
    ) -> None:
        self.client = client
        self.segment = segment
        self.writer_id = writer_id
        self.envelope = envelope
        #: The last event number the server stored for this writer (None: none).
        self.last_event_number: int | None = None
        self._conn: _Connection | None = None
        self._rid = 0
        #: Events this writer stored, in all.
        self._stored = 0
        #: (last number, events) of the blocks sent and not acked when the last
        #: connection ended: the next ``AppendSetup`` says which were stored.
        self._unacked: deque[tuple[int, int]] = deque()
        self._set_up()

    def __enter__(self) -> BlockingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _set_up(self) -> None:
        """A new connection and ``SetupAppend``: what the server stored for this writer."""
        self.close()
        client = self.client
        conn = client._open()
        try:
            (self._rid,) = client._ids(1)
            fmt = ENVELOPE if self.envelope else RAW
            setup = SetupAppend(self._rid, self.writer_id, self.segment, client.token, fmt)
            conn.send([setup])
            reply = conn.reply(self._rid)
            if isinstance(reply, _ERROR_REPLIES):
                raise refusal(reply)
            if not isinstance(reply, AppendSetup):
                raise SegmentClientError(f"SetupAppend answered with {reply!r}")
            if self.envelope and reply.payload_format != ENVELOPE:
                raise SegmentClientError(
                    f"the server at {client.address} does not accept envelope appends (its"
                    " AppendSetup did not echo payload format 1): the gateway is too old for"
                    " envelope writers; upgrade it, or write raw events"
                )
        except BaseException:
            conn.close()
            raise
        last = reply.last_event_number
        self.last_event_number = None if last in (NULL_EVENT_NUMBER, 0) else last
        stored = max(last, 0)
        for number, count in self._unacked:  # stored, with their acks lost
            self._stored += max(0, min(number, stored) - (number - count))
        self._unacked.clear()
        self._conn = conn

    def append(self, payloads: Sequence[bytes], first_event_number: int) -> int:
        """Append ``payloads`` as events ``first_event_number …``; return how many this
        call stored (those at or below :attr:`last_event_number` are skipped, not sent).

        Returns once the server acknowledged every event sent (durable, for a gateway).
        A lost connection, or a refusal because another attempt of the same writer
        stored some of them first, makes it set up again and go on with what is not
        stored yet. Events whose acks the lost connection took count as stored by
        this call when the new ``AppendSetup`` covers them: while two attempts with
        one writer id race, both may count such an event (it is stored once)."""
        n = len(payloads)
        if first_event_number < 1 or first_event_number + n - 1 > _MAX_I64:
            raise ValueError(f"event numbers {first_event_number}..+{n} are outside 1..2**63-1")
        before = self._stored
        seen = self.last_event_number
        failures = 0
        while True:
            try:
                if self._conn is None:
                    self._set_up()
                self._send(payloads, first_event_number)
                return self._stored - before
            except (_Stale, OSError) as e:
                self.close()
                failures = 0 if self.last_event_number != seen else failures + 1
                seen = self.last_event_number
                if failures > self.retries:
                    raise
                if isinstance(e, OSError):
                    time.sleep(min(0.05 * 2**failures, 2.0))
            except BaseException:
                self.close()
                self._unacked.clear()
                raise

    def _send(self, payloads: Sequence[bytes], first: int) -> None:
        """Send the events above the last stored number in blocks of about
        :attr:`block_bytes`, several in flight, and wait for every ack."""
        conn = self._conn
        assert conn is not None
        last = self.last_event_number
        i = 0 if last is None else min(max(last - first + 1, 0), len(payloads))
        skip = i
        ends = list(itertools.accumulate([len(p) + 8 for p in payloads[skip:]]))
        in_flight = self._unacked  # (last number, events) of each block
        while i < len(payloads) or in_flight:
            if i < len(payloads) and len(in_flight) < self.max_blocks_in_flight:
                base = ends[i - skip - 1] if i > skip else 0
                j = skip + max(bisect_right(ends, base + self.block_bytes), i - skip + 1)
                number = first + j - 1
                conn.sock.sendall(
                    conn.codec.append(self.writer_id, payloads[i:j], number, block_size=0)
                )
                in_flight.append((number, j - i))
                i = j
            else:
                self._acked(conn, in_flight)

    def _acked(self, conn: _Connection, in_flight: deque[tuple[int, int]]) -> None:
        """Wait for the next ack and count the events it covers."""
        event = conn.event()
        if isinstance(event, DataAppended) and event.writer_id == self.writer_id:
            while in_flight and in_flight[0][0] <= event.event_number:
                self._stored += in_flight.popleft()[1]
            self.last_event_number = event.event_number
            return
        if isinstance(event, InvalidEventNumber):
            raise _Stale(f"writer {self.writer_id}: events stored by another attempt")
        if isinstance(event, _ERROR_REPLIES):
            raise refusal(event)
        raise SegmentClientError(f"unexpected {event!r} on a writer connection")
