"""One accepted connection, from its handshake to its close.

A :class:`Connection` is made by its listener's accept loop for every stream
it admits, and runs in the listener's connection nursery:

1. **handshake**: the TLS layer's (its verified client certificate becomes
   the connection's :class:`~gateway.core.model.PeerIdentity`), then the
   transport's own (a WebSocket upgrade), together within
   ``handshake_timeout``: one cancel scope for both;
2. **serve**: the protocol plugin's ``serve`` gets a
   :class:`~gateway.protocol.plugin.ServerConnection` whose stream is a
   :class:`~gateway.runtime.stream.TrackedStream` carrying the connection's
   :class:`~gateway.protocol.guard.Guard`, in a nursery of its own next to
   the idle watchdog (``idle_timeout`` without progress and with nothing
   pending closes it);
3. **close**: the reason, the duration and the bytes each way in one log
   line (at debug), the budget account and the listener's counts released,
   the stream closed: gracefully within :data:`CLOSE_GRACE` (a WebSocket's
   close frame, TLS's close_notify), then by force.

A fault closes this connection only. The peer's faults (a protocol error, a
timeout, a hang-up) are warnings or information, rate-limited per listener
and reason; a fault of ours is logged with its traceback. The Guard's
callbacks are this object's methods: :meth:`touch`, :meth:`refused`,
:meth:`warn` and the abandoned-publish counter.
"""

from __future__ import annotations

import logging
import ssl

import trio
from prometheus_client import Counter

from gateway.core.errors import ProtocolError, first_leaf
from gateway.core.model import PeerIdentity
from gateway.ops.logsetup import log_context
from gateway.protocol.guard import Guard
from gateway.protocol.plugin import ConnectionInfo, ServerConnection, describe_error
from gateway.runtime.state import ListenerState, Shared
from gateway.runtime.stream import TrackedStream
from gateway.transports.tls import describe_handshake_failure, ssl_error_words

__all__ = ["LOST", "Connection", "lost_reason"]

#: What a peer that went away raises: the connection is lost, not failed.
#: Seconds a closing stream may take for its own goodbye (a WebSocket close frame and
#: the peer's answer, TLS's close_notify) before it is closed by force.
CLOSE_GRACE = 1.0

LOST = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, ConnectionError)


class Connection:
    """One accepted stream of a listener, served by the listener's protocol."""

    def __init__(
        self,
        listener: ListenerState,
        shared: Shared,
        stream: trio.abc.Stream,
        host: str | None = None,
    ) -> None:
        ls = listener.settings
        self.listener = listener
        self.settings = ls
        self.shared = shared
        #: The stream as accepted, then as the handshakes left it.
        self.stream = stream
        #: The peer's IP address, as the listener counted it (None: not counted).
        self.host = host
        self.peer = listener.transport.peer_name(stream)
        self.prefix = f"[{ls.name} {self.peer}]"
        self.log = logging.getLogger(f"gateway.protocol.{ls.protocol}")
        #: Why the connection closed, for its closing line (the first reason given wins).
        self.why = ""
        self.identity: PeerIdentity | None = None
        self.tracked: TrackedStream | None = None
        self.conn: ServerConnection | None = None
        metrics = shared.metrics
        self._errors = metrics.connection_errors.labels(listener=ls.name)
        self._open = metrics.connections_open.labels(listener=ls.name)
        self._account = shared.budget.account(shared.connection_memory)
        self._started = trio.current_time()

    # -- the Guard's callbacks ---------------------------------------------------------
    def touch(self) -> None:
        """Useful progress: the idle timeout starts again."""
        if self.conn is not None:
            self.conn.touch()

    def warn(self, reason: str, msg: str, *args: object) -> None:
        """A warning about this connection, rate-limited per listener and ``reason``."""
        self.listener.throttle.warning(
            f"{self.settings.name}:{reason}", f"{self.prefix} {msg}", *args
        )

    def refused(self, reason: str) -> None:
        """The connection is closed by a protection or for the peer's fault (counted)."""
        self._closing(reason.replace("_", " "))
        self.shared.metrics.refused_connections.labels(
            listener=self.settings.name, reason=reason
        ).inc()

    def abandoned(self, count: int) -> None:
        """``count`` publishes were settled as failed because the peer left."""
        self.shared.metrics.abandoned_publishes.labels(listener=self.settings.name).inc(count)

    # -- life ----------------------------------------------------------------------
    async def run(self) -> None:
        """Handshake, serve, close; whatever happens, only this connection ends."""
        name = self.settings.name
        self.shared.metrics.connections.labels(listener=name).inc()
        self._open.inc()
        log_context(listener=name, peer=self.peer)
        self.log.debug("%s connection accepted", self.prefix)
        try:
            await self._run()
        finally:
            self._log_closed()
            self._account.close()
            self._open.dec()
            self.listener.release(self.host)
            self.shared.connection_ended.unpark_all()
            await close(self.stream)

    async def _run(self) -> None:
        """Handshake and serve, turning what ends the connection into its reason."""
        try:
            if await self._handshake():
                await self._serve()
        except* ProtocolError as eg:
            # The peer's fault, not a fault of ours: each protocol counts its own.
            self.refused("protocol_error")
            self.warn("protocol_error", "protocol error: %s; closing", first_leaf(eg))
        except* trio.TooSlowError as eg:
            self._errors.inc()
            self.refused("timeout")
            self.warn("timeout", "timed out: %s; closing", first_leaf(eg))
        except* LOST as eg:
            lost = lost_reason(first_leaf(eg))
            self._closing(f"lost: {lost}")
            self.log.info("%s connection lost: %s", self.prefix, lost)
        except* Exception as eg:
            self._errors.inc()
            self._closing(f"error: {type(first_leaf(eg)).__name__}")
            self.log.error("%s connection failed; closing it", self.prefix, exc_info=first_leaf(eg))

    def _closing(self, why: str) -> None:
        self.why = self.why or why

    # -- handshake -----------------------------------------------------------------------
    async def _handshake(self) -> bool:
        """TLS, then the transport's own handshake, within ``handshake_timeout``.

        They run here, in the connection's task, never in the accept loop.
        False when one failed or timed out (logged and counted; the
        connection then closes).
        """
        state = self.listener
        stage = "TLS"
        try:
            with trio.move_on_after(self.settings.handshake_timeout) as handshake:
                if state.tls_layer is not None and state.tls_context is not None:
                    self.stream, self.identity = await state.tls_layer.wrap_server(
                        self.stream, state.tls_context
                    )
                stage = state.transport.name
                self.stream = await state.transport.accepted(self.stream, self.settings.bind)
        except Exception as e:
            self._handshake_failed(stage, e)
            return False
        if handshake.cancelled_caught:
            self._errors.inc()
            self.refused("handshake_timeout")
            if stage == "TLS":
                self._tls_failures("timeout").inc()
            self.warn("handshake_timeout", "%s handshake timed out; closing", stage)
            return False
        return True

    def _handshake_failed(self, stage: str, error: Exception) -> None:
        """Log a handshake that raised, and say why the connection closes.

        A TLS handshake the peer broke (a certificate refused, no certificate,
        not TLS at all, a hang-up) is counted by its reason and logged with
        OpenSSL's words for it.
        """
        leaf = first_leaf(error)
        if isinstance(leaf, LOST):
            if stage == "TLS":
                reason, detail = describe_handshake_failure(leaf)
                self._tls_failed(reason, detail, getattr(leaf, "subject", None))
                return
            lost = lost_reason(leaf)
            self._closing(f"lost: {lost}")
            self.log.info(
                "%s connection lost during the %s handshake: %s", self.prefix, stage, lost
            )
            return
        self._errors.inc()
        self._closing(f"{stage} handshake failed")
        if isinstance(leaf, ProtocolError | trio.TooSlowError | ValueError):
            self.warn("handshake_failed", "%s handshake failed: %s; closing", stage, leaf)
        else:
            self.log.error("%s %s handshake failed; closing", self.prefix, stage, exc_info=leaf)

    def _tls_failed(self, reason: str, detail: str, subject: str | None) -> None:
        """A TLS handshake that failed: counted, logged, and kept for the status.

        A refusal (a certificate refused or missing, no common version, not
        TLS) is a warning, with the client certificate's subject when one was
        presented, and the listener keeps it for the status page's hints. A
        peer that hung up during the handshake (``eof``: a port probe, a load
        balancer's health check) is information only.
        """
        words = reason.replace("_", " ")
        self._closing(f"TLS handshake failed: {words}")
        self._tls_failures(reason).inc()
        whose = f" (client certificate {subject})" if subject else ""
        if reason == "eof":
            level = logging.INFO
        else:
            level = logging.WARNING
            self.listener.tls_refused(f"{self.peer}{whose}: {words}: {detail}")
        self.listener.throttle.log(
            level,
            f"{self.settings.name}:tls:{reason}",
            f"{self.prefix} TLS handshake failed (%s): %s%s",
            words,
            detail,
            whose,
        )

    def _tls_failures(self, reason: str) -> Counter:
        return self.shared.metrics.tls_handshake_failures.labels(
            listener=self.settings.name, reason=reason
        )

    # -- serve ---------------------------------------------------------------------
    async def _serve(self) -> None:
        """The protocol's ``serve`` on the guarded stream, next to the idle watchdog."""
        ls = self.settings
        state = self.listener
        metrics = self.shared.metrics
        guard = Guard(
            self._account,
            on_progress=self.touch,
            on_abandoned=self.abandoned,
            on_refused=self.refused,
            warn=self.warn,
        )
        self.tracked = TrackedStream(
            self.stream,
            metrics.bytes_received.labels(listener=ls.name),
            metrics.bytes_sent.labels(listener=ls.name),
            guard,
        )
        self.conn = conn = ServerConnection(
            self.tracked,
            self._info(),
            ls,
            state.facade,
            state.draining,
            metrics,
            self.shared.upstreams.get(ls.protocol),
        )
        self.tracked.conn = conn
        async with trio.open_nursery() as nursery:
            if ls.idle_timeout > 0:
                nursery.start_soon(watch_idle, conn, guard, nursery.cancel_scope)
            await state.plugin.serve(conn)
            nursery.cancel_scope.cancel()

    def _info(self) -> ConnectionInfo:
        state = self.listener
        return ConnectionInfo(
            protocol=self.settings.protocol,
            endpoint=self.settings.name,
            peer=self.peer,
            local=state.addresses[0] if state.addresses else "",
            identity=self.identity,
            tls=state.tls_context is not None,
        )

    # -- close ---------------------------------------------------------------------
    def _log_closed(self) -> None:
        """The closing line (debug): how long, why, and the bytes each way."""
        if not self.log.isEnabledFor(logging.DEBUG):
            return
        self._closing("shutdown" if self.shared.draining.is_set() else "peer closed")
        duration = trio.current_time() - self._started
        tracked = self.tracked
        bytes_in = tracked.bytes_in if tracked is not None else 0
        bytes_out = tracked.bytes_out if tracked is not None else 0
        self.log.debug(
            "%s connection closed after %.3fs (%s): %d bytes in, %d bytes out",
            self.prefix,
            duration,
            self.why,
            bytes_in,
            bytes_out,
            extra={
                "duration": round(duration, 6),
                "close_reason": self.why,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
            },
        )


async def watch_idle(conn: ServerConnection, guard: Guard, scope: trio.CancelScope) -> None:
    """Close the connection once it made no useful progress for ``idle_timeout``.

    Progress is what the protocol's driver reports (see :class:`Guard`); a
    connection with work pending (unsettled publishes, open subscriptions) is
    never idle.
    """
    timeout = conn.listener.idle_timeout
    while True:
        now = trio.current_time()
        deadline = conn.last_activity + timeout
        if now >= deadline:
            if not (conn.busy or guard.pending()):
                guard.refused("idle")
                conn.log.info("no progress for %gs; closing", timeout)
                scope.cancel()
                return
            deadline = now + timeout
        await trio.sleep_until(deadline)


def lost_reason(error: BaseException) -> str:
    """Why a connection broke, in words: OpenSSL's, the socket error's, or trio's."""
    e: BaseException | None = error
    for _ in range(8):
        if e is None:
            break
        if isinstance(e, ssl.SSLError):
            return ssl_error_words(e)
        e = e.__cause__ or e.__context__
    return describe_error(error)


async def close(stream: trio.abc.Stream) -> None:
    """Close ``stream`` gracefully within :data:`CLOSE_GRACE`, else by force (also when
    the connection is being cancelled)."""
    try:
        with trio.move_on_after(CLOSE_GRACE):
            await stream.aclose()
    finally:
        await trio.aclose_forcefully(stream)
