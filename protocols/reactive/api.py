"""A reactive-streams library for Python programs: subscribe with demand, publish (trio).

Usable without the gateway's runtime: it drives the sans-IO
:class:`~.codec.Connection` over any ``trio.abc.Stream`` (TCP, TLS, a unix
socket, a memory stream pair). Both peers may subscribe on one connection, so
one :class:`Peer` is subscriber and publisher at once::

    async with await Peer.connect("localhost", 7073) as peer:
        async with peer.subscribe("logs?from=earliest", demand=10) as sub:
            async for element in sub:      # bytes, never more than requested
                ...                        # handle it, then ask for one more:
                sub.request(1)

        await peer.publish("numbers", source)   # source: an AsyncIterable[bytes]

Guarantees:

* **Demand**: a :class:`Subscription` receives at most what it requested
  (``demand``, then each :meth:`Subscription.request`): the protocol forbids
  the publisher to send more, and the codec treats over-delivery as a protocol
  error, so what a subscription holds unread never exceeds its demand.
  Elements packed by the publisher come out one by one; an element sent in
  parts comes out whole.
* **Publishing**: :meth:`Peer.publish` pulls from its source only when the
  subscriber's demand allows one more element, so a source is never read
  ahead of the subscriber.

Errors: ``onError`` for a subscription raises :class:`PublisherError` from it
(a refusal from ``async with peer.subscribe(...)``, later ones from its
iterator); the peer's goodbye ends each subscription the same way
(``"goodbye: <reason>"``). A closed or broken connection, or bytes that break
the protocol, raise :class:`ConnectionLost` from every pending and later call
(the peer gets ``goodbye("protocol-error: ...")`` in the last case). After
leaving the peer's ``async with``, calls raise ``trio.ClosedResourceError``.

One reader task feeds the codec (answering pings and the peer's goodbye),
one writer task sends what the calls queued (so :meth:`Subscription.request`
need not await); both run in a nursery the ``async with`` owns. Leaving it
says goodbye, waits at most :data:`FLUSH_TIMEOUT` for the answer, and closes.
"""

from __future__ import annotations

import enum
import ssl
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Final

import trio

from gateway.sdk import NEED_DATA, ConnectionClosed, RemoteProtocolError

from . import messages as m
from .codec import Connection, Phase, Role, goodbye_reason
from .events import (
    Accepted,
    BadRequest,
    Cancelled,
    Completed,
    DemandAdded,
    Elements,
    Failed,
    GoodbyeReceived,
    Pinged,
    SubscribeRequested,
)
from .messages import Limits

__all__ = [
    "FLUSH_TIMEOUT",
    "PART_SIZE",
    "ConnectionLost",
    "Ending",
    "Peer",
    "PublisherError",
    "Role",
    "Subscription",
    "serve_tcp",
]

_READ: Final = 65536
#: How long leaving a peer may wait for the answer to its goodbye (and the last writes).
FLUSH_TIMEOUT: Final = 1.0
#: Elements larger than this are published in parts (``onNextPart``...).
PART_SIZE: Final = 64 * 1024
#: Queued bytes above which a publisher waits for the writer before pulling more.
_HIGH_WATER: Final = 256 * 1024
#: The goodbye reason sent when a peer is left.
BYE: Final = "done"
_MAX_REASON: Final = 1000


class PublisherError(Exception):
    """The publisher ended (or refused) a subscription with ``onError(reason)``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ConnectionLost(trio.BrokenResourceError):
    """The connection closed, broke, or a peer broke the protocol."""


class Ending(enum.Enum):
    """How a published stream ended (what :meth:`Peer.publish` returns)."""

    #: The source ended: the subscriber got ``onComplete``.
    COMPLETED = "completed"
    #: The subscriber ended it: a cancel, its goodbye, or a request of 0 or less.
    CANCELLED = "cancelled"


class Subscription:
    """One subscription of this peer (see :meth:`Peer.subscribe`): an async context
    manager and an async iterator of elements (``bytes``)."""

    def __init__(self, peer: Peer, publisher: str, demand: int) -> None:
        if demand < 0:
            raise ValueError(f"demand {demand}: it is 0 or more")
        self.peer = peer
        self.publisher = publisher
        #: The id of this subscription on the connection (None: not sent yet).
        self.id: int | None = None
        #: Each element's fixed size, from ``subscribed`` (0: any; None: not yet).
        self.element_size: int | None = None
        self._initial = min(demand, m.MAX_DEMAND)
        self._buffer: deque[bytes] = deque()
        self._ended = False
        self._error: PublisherError | None = None
        self._lot = trio.lowlevel.ParkingLot()

    # -- lifetime ---------------------------------------------------------------------------
    async def __aenter__(self) -> Subscription:
        """Send the subscribe and wait for the answer: PublisherError if refused."""
        await self._start()
        try:
            while self.element_size is None and not self._ended:
                await self._wait()
        except BaseException:
            self.cancel()
            raise
        if self.element_size is None and self._error is not None:
            raise self._error
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Cancel the subscription unless it ended."""
        self.cancel()

    async def _start(self) -> None:
        if self.id is not None or self._ended:  # sent, or cancelled before
            return
        await self.peer._ready()
        self.id = self.peer._add(self)
        self.peer._send(m.Subscribe(self.publisher, self.id, self._initial))

    async def _wait(self) -> None:
        self.peer._check()
        await self._lot.park()

    def _wake(self) -> None:
        self._lot.unpark_all()

    # -- demand -----------------------------------------------------------------------------
    def request(self, n: int) -> None:
        """Ask for ``n`` more elements (n > 0; demand adds up, saturating at 2**63-1,
        which means unbounded). A no-op once the subscription ended."""
        if n <= 0:
            raise ValueError(f"request({n}): a request is 1 or more")
        n = min(n, m.MAX_DEMAND)
        if self.id is None:
            self._initial = min(self._initial + n, m.MAX_DEMAND)
        elif not self._ended:
            self.peer._send(m.Request(self.id, n))

    def cancel(self) -> None:
        """End the subscription now: elements still unread are dropped, and iteration
        stops. Idempotent; a no-op once ended."""
        live = self.id is not None and not self._ended
        self._ended, self._error = True, None
        self._buffer.clear()
        if self.id is None or not live:
            return
        self.peer._drop(self.id)
        if self.peer._error is None and self.peer.codec.phase in (Phase.HELLO, Phase.OPEN):
            self.peer._send(m.Cancel(self.id))
        self._wake()

    # -- elements ---------------------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        """The next element; StopAsyncIteration after ``onComplete`` (or a cancel),
        PublisherError after ``onError``, ConnectionLost if the connection went first."""
        await self._start()
        while not self._buffer:
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            await self._wait()
        return self._buffer.popleft()

    # -- what the reader reports --------------------------------------------------------------
    def _accepted(self, element_size: int) -> None:
        self.element_size = element_size
        self._wake()

    def _elements(self, elements: tuple[bytes, ...]) -> None:
        self._buffer.extend(elements)
        self._wake()

    def _end(self, error: str | None) -> None:
        self._ended = True
        self._error = None if error is None else PublisherError(error)
        self._wake()


class _Offer:
    """A publisher this peer offers (:meth:`Peer.publish`) and its one stream."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: The subscriber's id once the peer subscribed.
        self.id: int | None = None
        self.cancelled = False
        self.lot = trio.lowlevel.ParkingLot()

    def wake(self) -> None:
        self.lot.unpark_all()


class Peer:
    """One reactive-streams connection, subscriber and publisher (see the module
    docstring); use it in ``async with``."""

    def __init__(
        self, stream: trio.abc.Stream, role: Role = Role.CLIENT, *, limits: Limits | None = None
    ) -> None:
        self.stream = stream
        self.codec = Connection(role, limits)
        self._error: BaseException | None = None
        self._subs: dict[int, Subscription] = {}
        self._next_id = 1
        self._offers: dict[str, _Offer] = {}
        self._streams: dict[int, _Offer] = {}
        self._changed = trio.lowlevel.ParkingLot()  # the hello, writes, the goodbye, failure
        self._output = bytearray()
        self._output_ready = trio.lowlevel.ParkingLot()
        self._scope = trio.CancelScope()
        self._bye = BYE  # the goodbye that ended the connection
        self._closing = False  # the writer stops once what is queued was written
        self._stopped = False  # the background tasks ended
        self._manager: Any = None

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        role: Role = Role.CLIENT,
        limits: Limits | None = None,
    ) -> Peer:
        """A peer over a new TCP connection (TLS with ``ssl_context``); enter it with
        ``async with``. Connection failures raise ``OSError``."""
        stream: trio.abc.Stream
        if ssl_context is None:
            stream = await trio.open_tcp_stream(host, port)
        else:
            stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=ssl_context)
        return cls(stream, role, limits=limits)

    @classmethod
    async def connect_unix(
        cls, path: str, *, role: Role = Role.CLIENT, limits: Limits | None = None
    ) -> Peer:
        """A peer over a new unix socket connection to ``path``."""
        return cls(await trio.open_unix_socket(path), role, limits=limits)

    # -- lifetime ---------------------------------------------------------------------------
    async def __aenter__(self) -> Peer:
        """Start the reader and the writer; our hello is the first thing written."""
        self._manager = trio.open_nursery()
        nursery = await self._manager.__aenter__()
        self._write(self.codec.hello())
        nursery.start_soon(self._background)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Say goodbye, wait for the answer (at most FLUSH_TIMEOUT), close."""
        try:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + FLUSH_TIMEOUT
                await self._goodbye()
        finally:
            self._scope.cancel()
            self._error = trio.ClosedResourceError("the peer was closed")
            try:
                # The body's own exception propagates as it is: the background
                # tasks never raise (they record their failure).
                await self._manager.__aexit__(None, None, None)
            finally:
                await trio.aclose_forcefully(self.stream)

    async def _goodbye(self) -> None:
        """Our goodbye, if the connection is still up, and wait for its answer. Calls
        still waiting (in other tasks) raise ``trio.ClosedResourceError`` at once."""
        up = self._error is None and self.codec.phase in (Phase.HELLO, Phase.OPEN)
        self._record(trio.ClosedResourceError("the peer was closed"))
        if not up:
            return
        self._write(self.codec.send(m.Goodbye(BYE)))
        while self.codec.phase is not Phase.DONE and not self._stopped:
            await self._changed.park()

    async def _background(self) -> None:
        with self._scope:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._guard, self._read)
                    nursery.start_soon(self._guard, self._write_out)
            finally:
                self._stopped = True
                self._changed.unpark_all()

    async def _guard(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run one background task; its failure ends the connection (recorded, not raised)."""
        try:
            await task()
        except RemoteProtocolError as e:
            if self.codec.phase not in (Phase.GOODBYE_SENT, Phase.DONE):
                self._write(self.codec.send(m.Goodbye(goodbye_reason(e))))
            self._fail(ConnectionLost(f"protocol error: {e}"), flush=True)
        except ConnectionLost as e:
            self._fail(e, flush=True)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self._fail(ConnectionLost(f"connection lost: {e!r}"))

    def _fail(self, error: BaseException, *, flush: bool = False) -> None:
        """The connection is over: record ``error`` and stop the background tasks.

        ``flush``: what is queued (a goodbye) is written first, within
        FLUSH_TIMEOUT; else they stop at once.
        """
        self._record(error)
        if flush:
            self._closing = True
            self._scope.deadline = min(self._scope.deadline, trio.current_time() + FLUSH_TIMEOUT)
            self._output_ready.unpark_all()
        else:
            self._scope.cancel()

    def _record(self, error: BaseException) -> None:
        """Every waiting and later call raises ``error`` (the first recorded)."""
        if self._error is None:
            self._error = error
            self._wake_all()

    def _wake_all(self) -> None:
        self._changed.unpark_all()
        for sub in self._subs.values():
            sub._wake()
        for offer in self._offers.values():
            offer.wake()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    async def _ready(self) -> None:
        """Wait until we may subscribe: a server waits for the client's hello."""
        while self.codec.role is Role.SERVER and not self.codec.peer_hello:
            self._check()
            await self._changed.park()
        self._check()

    # -- the background tasks ------------------------------------------------------------
    async def _read(self) -> None:
        codec = self.codec
        while True:
            event = codec.next_event()
            if event is NEED_DATA:
                if codec.phase is Phase.DONE:
                    raise ConnectionLost(f"the connection ended: goodbye {self._bye!r}")
                codec.receive_data(await self.stream.receive_some(_READ))
            elif isinstance(event, ConnectionClosed):
                raise ConnectionLost("the peer closed the connection")
            else:
                self._on_event(event)
                self._changed.unpark_all()

    def _on_event(self, event: object) -> None:
        if isinstance(event, Elements):
            sub = self._subs.get(event.subscriber)
            if sub is not None:
                sub._elements(event.elements)
        elif isinstance(event, Accepted | Completed | Failed):
            self._on_mine(event)
        elif isinstance(event, SubscribeRequested):
            self._on_subscribe(event)
        elif isinstance(event, DemandAdded | Cancelled | BadRequest):
            self._on_theirs(event)
        elif isinstance(event, Pinged):
            self._write(self.codec.send(m.Pong(event.payload)))
        elif isinstance(event, GoodbyeReceived):
            self._bye = event.reason
            if not event.answers_ours:
                self._write(self.codec.send(m.Goodbye(event.reason)))
        # Hello, GoodbyeAnswered (phase DONE), Ponged, Skipped: nothing to do.

    def _on_mine(self, event: Accepted | Completed | Failed) -> None:
        sub = self._subs.get(event.subscriber)
        if sub is None:
            return
        if isinstance(event, Accepted):
            sub._accepted(event.element_size)
            return
        del self._subs[event.subscriber]
        sub._end(event.error if isinstance(event, Failed) else None)

    def _on_subscribe(self, event: SubscribeRequested) -> None:
        sid, name = event.subscriber, event.publisher
        offer = self._offers.get(name)
        if offer is None:
            self._write(self.codec.send(m.OnError(sid, f"no publisher {name}")))
        elif offer.id is not None:
            self._write(self.codec.send(m.OnError(sid, f"publisher {name} has a subscriber")))
        else:
            offer.id = sid
            self._streams[sid] = offer
            self._write(self.codec.send(m.Subscribed(sid, 0)))
            offer.wake()

    def _on_theirs(self, event: DemandAdded | Cancelled | BadRequest) -> None:
        offer = self._streams.get(event.subscriber)
        if isinstance(event, BadRequest):
            self._write(self.codec.send(m.OnError(event.subscriber, event.error)))
        if offer is None:
            return
        if not isinstance(event, DemandAdded):
            offer.cancelled = True
        offer.wake()

    async def _write_out(self) -> None:
        while True:
            while not self._output:
                if self._closing:
                    self._scope.cancel()  # closing, and everything queued was written
                await self._output_ready.park()
            data = bytes(self._output)
            self._output.clear()
            await self.stream.send_all(data)
            self._changed.unpark_all()

    def _write(self, data: bytes) -> None:
        if data:
            self._output += data
            self._output_ready.unpark_all()

    def _send(self, message: m.Message) -> None:
        """Queue ``message`` (raises the connection's error once it failed)."""
        self._check()
        self._write(self.codec.send(message))

    # -- subscribing --------------------------------------------------------------------------
    def subscribe(self, publisher: str, demand: int = 0) -> Subscription:
        """A subscription to ``publisher`` (the peer's name for it, passed as is: the
        gateway takes ``NAME?group=&from=&to=&filter=``) with ``demand`` elements
        requested at once. Use it in ``async with`` (which sends the subscribe, waits
        for the answer, and cancels when left early), then ``async for``."""
        return Subscription(self, publisher, demand)

    def _add(self, sub: Subscription) -> int:
        self._check()
        sid, self._next_id = self._next_id, self._next_id + 1
        self._subs[sid] = sub
        return sid

    def _drop(self, sid: int) -> None:
        self._subs.pop(sid, None)

    # -- publishing ---------------------------------------------------------------------------
    async def publish(
        self,
        name: str,
        source: AsyncIterable[bytes],
        *,
        part_size: int = PART_SIZE,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> Ending:
        """Offer publisher ``name`` until one subscriber took it and the stream ended.

        Elements are pulled from ``source`` one at a time, and only when the
        subscriber's demand allows one more; those above ``part_size`` bytes go
        in parts. The source's end sends ``onComplete`` (:attr:`Ending.COMPLETED`);
        a cancel, the peer's goodbye or a bad request ends it early
        (:attr:`Ending.CANCELLED`, the source is closed). If the source raises,
        the subscriber gets ``onError("<type>: <message>")`` and the exception
        propagates. The offer is made before the first checkpoint (``task_status``:
        started then); a subscribe that arrives before it is refused.
        """
        if part_size < 1:
            raise ValueError(f"part_size {part_size}: it is 1 or more")
        self._check()
        if name in self._offers:
            raise ValueError(f"publisher {name!r} is already offered")
        offer = self._offers[name] = _Offer(name)
        task_status.started()
        try:
            while offer.id is None:
                await self._park(offer)
            return await self._serve(offer, aiter(source), part_size)
        finally:
            del self._offers[name]
            if offer.id is not None:
                self._streams.pop(offer.id, None)

    async def _park(self, offer: _Offer) -> None:
        self._check()
        await offer.lot.park()

    async def _serve(self, offer: _Offer, it: AsyncIterator[bytes], part_size: int) -> Ending:
        """Send ``it``'s elements within the subscriber's demand."""
        assert offer.id is not None
        sid = offer.id
        while True:
            while not self._may_send(offer, sid):
                await self._park(offer)
            if offer.cancelled:
                return await _closed(it)
            try:
                element = await anext(it)
                if not isinstance(element, bytes | bytearray | memoryview):
                    raise TypeError(f"an element is bytes, not {type(element).__name__}")
            except StopAsyncIteration:
                if not offer.cancelled:
                    self._send(m.OnComplete(sid))
                return Ending.COMPLETED if not offer.cancelled else Ending.CANCELLED
            except Exception as e:
                if not offer.cancelled and self._error is None:
                    self._send(m.OnError(sid, f"{type(e).__name__}: {e}"[:_MAX_REASON]))
                raise
            if offer.cancelled:  # while we pulled it: dropped
                return await _closed(it)
            self._send_element(sid, bytes(element), part_size)
            await self._room()

    def _may_send(self, offer: _Offer, sid: int) -> bool:
        """Whether the stream ended or has demand (raises the connection's error)."""
        if offer.cancelled:
            return True
        self._check()
        return self.codec.outstanding(sid) > 0

    def _send_element(self, sid: int, element: bytes, part_size: int) -> None:
        self._check()
        if len(element) > part_size:
            self._write(self.codec.send_split(sid, element, part_size))
        else:
            self._write(self.codec.send_elements(sid, [element]))

    async def _room(self) -> None:
        """Backpressure: wait while the writer has much queued."""
        await trio.lowlevel.checkpoint()
        while len(self._output) >= _HIGH_WATER:
            self._check()
            await self._changed.park()


async def _closed(it: AsyncIterator[bytes]) -> Ending:
    """The subscriber ended the stream: close the source if it can be closed."""
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        await aclose()
    return Ending.CANCELLED


async def serve_tcp(
    handler: Callable[[Peer], Awaitable[object]],
    port: int,
    *,
    host: str | None = None,
    limits: Limits | None = None,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on ``port`` for ever, calling ``handler(peer)`` for each in the
    SERVER role (``task_status``: the listeners, as ``trio.serve_tcp`` gives them).

    The peer is entered before ``handler`` runs and left (goodbye) when it returns; a
    connection lost meanwhile ends only that connection. A subscribe is answered when
    it is read, so ``handler`` offers its publishers first, before awaiting anything
    else.
    """

    async def one(stream: trio.SocketStream) -> None:
        try:
            async with Peer(stream, Role.SERVER, limits=limits) as peer:
                await handler(peer)
        except ConnectionLost:
            pass

    await trio.serve_tcp(one, port, host=host, task_status=task_status)
