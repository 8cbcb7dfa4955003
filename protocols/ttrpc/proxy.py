"""The transparent ttrpc proxy: calls for routed services go to an upstream, frames untouched.

A listener's ``[[listeners.services]]`` routes map service names (globs, as
``containerd.task.v2.*``) to configured upstreams. A :class:`ProxySession`
serves a client connection like :class:`~.server.TtrpcSession` (local
services, such as the messaging service, are answered here) and relays the
calls of routed services:

* the client's Request and Data frames go to a connection of the upstream's
  :class:`Pool` under an id of that connection's own; what the server sends
  back comes to the client under the client's id, type, flags and bytes as
  sent (a Request is re-encoded only to shrink ``timeout_nano`` by the time
  it spent here; its payload bytes stay the same);
* bad input is answered here with the Go server's statuses (oversize, even
  or reused ids, undecodable Requests, unknown services) and never reaches
  the upstream, nor does a client's Data that the upstream's state of the
  stream does not take (Go servers up to 1.2.7 crash on Data for a stream
  they ended or for a unary method): only the methods an upstream names in
  ``client_streaming`` get the client's messages (see the proxy pair in
  ``codec``);
* a client that goes away leaves its calls running upstream (ttrpc cannot
  cancel them; closing the shared connection would fail other clients'
  calls) and their replies are dropped; a client that does not read what
  is relayed to it (``max_backlog`` bytes waiting) is disconnected, so it
  never holds up the upstream connection's reader;
* an upstream connection that is lost fails the calls that were on it with
  UNAVAILABLE, and only those.

A client's half-close of its socket is not relayed: Go servers read it as
"client gone" and drop replies still owed to everyone on that connection.

The codecs name each other, never the sessions: each :class:`ProxySession`
keeps its upstream codecs' :class:`Link` (``_links``), and each :class:`Link`
the sessions of the client codecs it carries streams for (``clients``), both
filled when a stream is relayed.
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from gateway.sdk import Session, Upstream, describe_error, first_leaf

from . import status as statuses
from . import ttrpc_pb2
from .codec import ProxyClientCodec, ProxyServerCodec
from .events import BadInput, Call, HalfClosed, Message
from .server import TtrpcSession, too_many_calls
from .status import Code, Status

__all__ = ["Pool", "ProxySession", "Route", "Routes"]

log = logging.getLogger(__name__)

#: Bytes relayed to a client and not yet written before it is disconnected.
MAX_BACKLOG = 16 * 1024 * 1024
#: Methods a pool warns about (a client's messages not relayed), each once.
MAX_WARNED = 64


@dataclass(frozen=True, slots=True)
class Route:
    """Calls of services matching ``match`` (a glob) go to the upstream ``upstream``."""

    match: str
    upstream: str


class Routes:
    """A listener's routes, first match wins, decisions cached by service name."""

    def __init__(self, routes: Sequence[Route], pools: dict[str, Pool]) -> None:
        self.routes = list(routes)
        self.pools = pools
        self._cache: dict[str, Pool | None] = {}

    def pool_for(self, service: str) -> Pool | None:
        try:
            return self._cache[service]
        except KeyError:
            pass
        pool = None
        for route in self.routes:
            if fnmatch.fnmatchcase(service, route.match):
                pool = self.pools[route.upstream]
                break
        if len(self._cache) < 4096:
            self._cache[service] = pool
        return pool


class Link(Session):
    """One connection to an upstream server, carrying many clients' streams."""

    codec: ProxyClientCodec
    timed_reads = False  # calls end by their own deadlines, upstream

    def __init__(self, stream: trio.abc.Stream, pool: Pool, peer: str) -> None:
        super().__init__(
            stream,
            ProxyClientCodec(client_streaming=pool.client_streaming),
            log=pool.log,
            unit_timeout=0,
            linger=0,
            write_timeout=pool.write_timeout,
        )
        self.pool = pool
        self.peer = peer
        self.lost = False
        #: The session of each client codec with streams relayed here (its own, until
        #: it ends: :meth:`ProxySession.run`).
        self.clients: dict[ProxyServerCodec, ProxySession] = {}

    async def handle(self, event: object) -> None:
        """The codec makes no events: what it receives goes to the clients."""

    def received(self) -> None:
        self.deliver()

    def flush_codec(self) -> None:
        """Write what clients queued on this connection's codec."""
        data = self.codec.data_to_send()
        if data:
            self.write_now(data)

    def deliver(self) -> None:
        """Hand each client connection what the server sent for it."""
        for client, data in self.codec.take_relayed():
            session = self.clients.get(client)
            if session is not None:  # (a client that ended has its streams orphaned)
                session.relayed(data)

    def end_of_input(self) -> None:
        self.stop()


class Pool:
    """Connections to one upstream, shared by every client connection of the gateway.

    A new call goes to the open connection with the fewest active streams;
    another connection is opened while each carries ``streams_per_connection``
    or more, up to ``max_connections``. One connect runs at a time; after a
    failed one, calls fail at once (UNAVAILABLE) until ``retry_after`` passed.
    ``client_streaming``: the upstream's methods (``service/method``) that take
    the client's messages; no other stream gets a client's Data.
    """

    def __init__(
        self,
        upstream: Upstream,
        nursery: trio.Nursery,
        *,
        max_connections: int = 4,
        streams_per_connection: int = 256,
        write_timeout: float = 30.0,
        client_streaming: Iterable[str] = (),
    ) -> None:
        self.upstream = upstream
        self.name = upstream.name
        self.nursery = nursery
        self.max_connections = max_connections
        self.streams_per_connection = streams_per_connection
        self.write_timeout = write_timeout
        self.client_streaming = frozenset(client_streaming)
        #: Methods whose client messages were refused, warned about once each.
        self.warned: set[str] = set()
        self.retry_after = upstream.settings.backoff_initial
        self.log = log
        self.links: list[Link] = []
        self._connecting = trio.Lock()
        self._failed_at = -math.inf
        self._failure = ""

    def ready_link(self) -> Link | None:
        """The connection for a new stream when one is ready without connecting."""
        best, streams = self._best()
        if best is not None and (
            streams < self.streams_per_connection or len(self.links) >= self.max_connections
        ):
            return best
        return None

    def _best(self) -> tuple[Link | None, int]:
        """The usable connection with the fewest active streams, and their number."""
        best, fewest = None, 0
        for link in self.links:
            codec = link.codec
            if link.lost or codec.exhausted:
                continue
            streams = codec.active_streams
            if best is None or streams < fewest:
                best, fewest = link, streams
        return best, fewest

    async def link(self) -> Link:
        """A connection for a new stream; ``OSError`` when the upstream cannot be reached."""
        ready = self.ready_link()
        if ready is not None:
            return ready
        async with self._connecting:
            ready = self.ready_link()  # another call may have connected meanwhile
            if ready is not None:
                return ready
            best, _ = self._best()
            if trio.current_time() - self._failed_at < self.retry_after:
                if best is not None:
                    return best
                raise OSError(self._failure)
            try:
                with trio.fail_after(self.upstream.settings.connect_timeout):
                    stream, info = await self.upstream.connect()
            except (OSError, trio.TooSlowError) as e:
                self._failed_at = trio.current_time()
                self._failure = f"upstream {self.name}: cannot connect ({describe_error(e)})"
                self.log.warning("%s", self._failure)
                if best is not None:
                    return best
                raise OSError(self._failure) from None
            link = Link(stream, self, info.peer)
            self.links.append(link)
            self.nursery.start_soon(self._run, link)
            self.log.info("upstream %s: connected to %s", self.name, info.peer)
            return link

    async def adopt(self, stream: trio.abc.Stream, peer: str) -> None:
        """Carry calls on a connection made elsewhere (the upstream's own, kept open and
        reconnected by the runtime with its backoff) until it is lost, then raise
        ``ConnectionError`` saying why."""
        link = Link(stream, self, peer)
        self.links.append(link)
        self._failed_at = -math.inf
        reason = await self._run(link)
        raise ConnectionError(reason)

    async def _run(self, link: Link) -> str:
        reason = "the server closed the connection"
        try:
            async with link.stream:
                await link.run()
        except* Exception as eg:  # the stream's errors, a write timeout, a fault of ours:
            reason = describe_error(first_leaf(eg))  # each fails the calls on it, logged below
        finally:
            link.lost = True
            self.links.remove(link)
            status = Status(Code.UNAVAILABLE, f"upstream {self.name}: connection lost ({reason})")
            failed = link.codec.fail_all(status)
            link.deliver()
            if failed:
                self.log.warning(
                    "upstream %s: connection to %s lost (%s): %d calls failed",
                    self.name,
                    link.peer,
                    reason,
                    failed,
                )
        return reason

    async def aclose(self) -> None:
        for link in list(self.links):
            link.stop()
            await link.stream.aclose()


class ProxySession(TtrpcSession):
    """A client connection: local services answered here, routed ones relayed."""

    codec: ProxyServerCodec

    def __init__(
        self,
        stream: trio.abc.Stream,
        services: dict[str, Any],
        routes: Routes,
        *,
        max_backlog: int = MAX_BACKLOG,
        **kwargs: Any,
    ) -> None:
        codec = ProxyServerCodec(self._ready_upstream, has_room=self._has_room)
        super().__init__(stream, services, codec=codec, **kwargs)
        self.routes = routes
        self.max_backlog = max_backlog
        self._overrun = False
        #: The link of each upstream codec this session relayed a stream on.
        self._links: dict[ProxyClientCodec, Link] = {}

    def open_calls(self) -> int:
        """Calls answered here and calls relayed: ``max_calls`` bounds them together."""
        return self.codec.relayed_streams + super().open_calls()

    def busy(self) -> bool:
        return bool(self.codec.relayed_streams) or super().busy()

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            self.codec.orphan_all()
            for link in self._links.values():
                link.clients.pop(self.codec, None)

    def _attach(self, link: Link) -> ProxyClientCodec:
        """Streams of this session go on ``link``: each side can find the other's session
        from its codec. Links lost meanwhile are forgotten (their streams are over)."""
        if link.codec not in self._links:
            if len(self._links) >= 16:
                self._links = {c: one for c, one in self._links.items() if not one.lost}
            self._links[link.codec] = link
        link.clients[self.codec] = self
        return link.codec

    def _has_room(self, upstream: ProxyClientCodec) -> bool:
        """Whether an upstream codec's :class:`Link` takes more output now."""
        return self._links[upstream].has_room

    def _ready_upstream(self, service: str) -> ProxyClientCodec | None:
        """The codec's router: the upstream connection to relay a new stream on at once,
        or None (the stream comes out as a Call: local, refused, or relayed once a
        connection is ready)."""
        if self._draining or service in self.services:
            return None
        pool = self.routes.pool_for(service)
        if pool is None or self.open_calls() >= self.max_calls:
            return None
        link = pool.ready_link()
        if link is None or not link.has_room:
            return None
        return self._attach(link)

    def received(self) -> None:
        touched = self.codec.take_touched()
        if touched:
            for upstream in touched:
                self._links[upstream].flush_codec()
            if self.guard is not None:
                self.guard.progress()

    async def handle(self, event: object) -> None:
        if isinstance(event, Call):
            service = event.request.service
            if service not in self.services and not self._draining:
                pool = self.routes.pool_for(service)
                if pool is not None:
                    await self._open(event, pool)
                    return
        elif isinstance(event, Message | HalfClosed):
            upstream = self.codec.upstream_of(event.stream_id)
            if upstream is not None:
                await self._relay_later(event, self._links[upstream])
                return
        elif isinstance(event, BadInput) and event.note:
            self._undeclared(event.stream_id, event.note)
        await super().handle(event)

    def _undeclared(self, stream_id: int, method: str) -> None:
        """A client sent messages for a method its upstream is not known to take them on:
        they are answered here; say so once per method (a misconfiguration, or a client
        that would crash a Go upstream)."""
        upstream = self.codec.upstream_of(stream_id)
        if upstream is None:
            return
        pool = self._links[upstream].pool
        if method in pool.warned or len(pool.warned) >= MAX_WARNED:
            return
        pool.warned.add(method)
        self.log.warning(
            "a client's messages for %s are not relayed (answered INVALID_ARGUMENT): it is"
            " not among upstream %s's client_streaming methods",
            method,
            pool.name,
        )

    async def _relay_later(self, event: Message | HalfClosed, link: Link) -> None:
        """Relay a message of a relayed stream once its upstream connection has room
        (the reader waits meanwhile: backpressure reaches this client's socket)."""
        self.received()  # what was relayed before it goes first
        await link.wait_for_room()
        if isinstance(event, Message):
            self.codec.relay_data(event.stream_id, event.data, False)
        else:
            self.codec.relay_data(event.stream_id, None, True)
        self.received()

    async def _open(self, call: Call, pool: Pool) -> None:
        """Relay a call once a connection of ``pool`` is ready and has room (the router
        found none), its deadline shrunk by the time spent waiting."""
        self.received()  # what was relayed before this call goes first
        arrived = trio.current_time()
        sid = call.stream_id
        if self.open_calls() >= self.max_calls:
            self.write(self.codec.respond(sid, status=too_many_calls(self.max_calls)))
            return
        try:
            link = await pool.link()
        except OSError as e:
            self.write(self.codec.respond(sid, status=Status(Code.UNAVAILABLE, str(e))))
            return
        await link.wait_for_room()
        if link.lost or self.codec.stream_state(sid) is None:
            # The upstream went while we waited, or the client's stream ended meanwhile.
            if self.codec.stream_state(sid) is not None:
                self.write(self.codec.respond(sid, status=_lost(pool)))
            return
        request = call.data
        timeout = call.request.timeout_nano
        if timeout > 0:
            left = timeout - int((trio.current_time() - arrived) * 1e9)
            if left <= 0:
                self.write(self.codec.respond(sid, status=statuses.deadline_exceeded()))
                return
            shrunk = ttrpc_pb2.Request()
            shrunk.CopyFrom(call.request)
            shrunk.timeout_nano = left
            request = shrunk.SerializeToString()
        self.codec.relay(call, request, self._attach(link))
        self.received()

    def relayed(self, data: bytes) -> None:
        """Frames the upstream sent for this client (:meth:`Link.deliver`)."""
        self.write_now(data)
        if not self.codec.relayed_streams:
            self.progress()  # a drain may wait for this (busy() is over)
        if self.unsent > self.max_backlog and not self._overrun:
            # The client does not read: it must not make the shared upstream reader wait.
            self._overrun = True
            self.log.warning("closing: %d bytes relayed to this client are not read", self.unsent)
            self.nursery.cancel_scope.cancel()


def _lost(pool: Pool) -> Status:
    return Status(Code.UNAVAILABLE, f"upstream {pool.name}: connection lost")
