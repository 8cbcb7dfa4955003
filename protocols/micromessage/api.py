"""A Micromessage2 client for Python programs: publish, subscribe, receive, ack (trio).

Usable without the gateway's runtime: it drives the sans-IO
:class:`~.codec.ClientCodec` over one TCP (or TLS) stream::

    async with await Client.connect("localhost", 7072) as client:
        await client.publish("orders", b"body", {"age": "42"})
        await client.wait_acked()
        await client.subscribe("news", filter="age>=N18")
        msg = await client.receive()
        ...                          # handle it, then:
        client.ack(msg.seq)

Delivery guarantees (at least once, both ways):

* **Publishing**: :meth:`Client.publish` returns once the MESSAGE frame is
  queued for the socket. The server acks it when it stored or delivered it
  (a gateway topic: when every subscriber acked its copy); until then it is
  held and sent again after each ``expire`` without an ack.
  :meth:`Client.wait_acked` waits for those acks. At most ``window``
  messages are unacked at once: ``publish`` waits for room.
* **Receiving**: a received message is acked by :meth:`Client.ack` once the
  program handled it; the ack is cumulative (it covers every message
  received before it). What is left unacked is sent again after the
  server's expiry (the codec drops a resend it already returned) and, when
  the connection goes, delivered again: to another consumer of the queue or
  group, or to this program after it reconnects. So a program may see a
  message twice (at least once): handling should be idempotent.

Failures end the connection: an ERROR frame from the server makes the
pending call, and every later one, raise :class:`ServerError`; a closed or
broken connection, or bytes that break the protocol, raise
:class:`ConnectionLost` (the server gets an ERROR frame saying why, in the
last case). A client does not reconnect by itself. Leaving the ``async
with`` writes what is queued (the last acks) within :data:`FLUSH_TIMEOUT`,
then closes; later calls raise ``trio.ClosedResourceError``.

One background reader task feeds the codec, one writer task sends what the
calls queued (so :meth:`Client.ack` need not await), one task resends what
is due; they run in a nursery the ``async with`` owns.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import trio

from gateway.sdk import NEED_DATA, ConnectionClosed, ProtocolError, RemoteProtocolError

from .codec import ClientCodec
from .commands import Subscribe, Unsubscribe
from .events import Ack, Answered, Duplicate, Error, Established, Message, Messages, TypeName
from .handshake import ExtensionSpec
from .negotiation import Settings
from .properties import format_properties, parse_properties
from .windows import AckSettings, ack_spec

__all__ = ["Client", "ConnectionLost", "Received", "ServerError"]

_READ = 65536
#: How long closing may take to write what is queued (the last acks, an ERROR frame).
FLUSH_TIMEOUT = 1.0


class ServerError(Exception):
    """The server sent an ERROR frame (``message``) and closed the connection."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConnectionLost(trio.BrokenResourceError):
    """The connection closed, broke, or the server broke the protocol."""


@dataclass(frozen=True, slots=True)
class Received:
    """One MESSAGE delivered to this client: ack ``seq`` once it was handled."""

    seq: int
    destination: str
    #: The typed properties as text (``N42`` is ``"42"``; see :mod:`.properties`).
    headers: dict[str, str] = field(default_factory=dict)
    payload: bytes = b""
    #: The ``dotnet`` type the server named last (None: none, or not negotiated).
    type_name: str | None = None


def settings_for(
    identity: str, window: int, expire: float, *, pubsub: bool, dotnet: bool, json: bool
) -> Settings:
    """The client's offer: ``batch-ack`` with the window it wants, plus what it asks for
    (required: a server without it refuses the connection)."""
    ack = AckSettings(window, max(1, round(expire * 1000)))
    required = [ack_spec("batch-ack", ack)]
    required += [ExtensionSpec(n) for n, on in (("pubsub", pubsub), ("dotnet", dotnet)) if on]
    if json:
        required.append(ExtensionSpec("json"))
    return Settings(identity=identity, required=tuple(required), ack=ack)


async def _handshake(stream: trio.abc.Stream, codec: ClientCodec) -> None:
    """Offer, read the answer, send the final message: until the codec is established."""
    await stream.send_all(codec.send(codec.offer))
    while True:
        event = codec.next_event()
        if event is NEED_DATA:
            codec.receive_data(await stream.receive_some(_READ))
        elif isinstance(event, Answered):
            await stream.send_all(codec.send(event.final))
        elif isinstance(event, Established):
            return
        elif isinstance(event, Error):
            raise ServerError(event.message)
        elif isinstance(event, ConnectionClosed):
            raise ConnectionLost("the server closed the connection during the handshake")


class Client:
    """One Micromessage2 connection (see the module docstring); make it with :meth:`connect`
    and use it in ``async with``."""

    def __init__(self, stream: trio.abc.Stream, codec: ClientCodec) -> None:
        assert codec.negotiated is not None
        assert codec.negotiated.ack is not None
        self.stream = stream
        self.codec = codec
        #: The ack window both directions use (what the server granted).
        self.window = codec.negotiated.ack.max_count
        self._inbox_send, self._inbox = trio.open_memory_channel[Received](self.window)
        self._error: BaseException | None = None
        self._changed = trio.lowlevel.ParkingLot()  # acks, writes, failure
        self._output = bytearray()
        self._output_ready = trio.lowlevel.ParkingLot()
        self._queued = 0  # bytes queued for the socket, in total
        self._written = 0  # of those, bytes written
        self._publish_lock = trio.Lock()
        self._published = 0
        self._acked = 0
        self._type_in: str | None = None
        self._type_out: str | None = None
        self._scope = trio.CancelScope()
        self._manager: Any = None

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        identity: str = "python",
        window: int = 100,
        expire: float = 0.5,
        pubsub: bool = True,
        dotnet: bool = False,
        json: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        handshake_timeout: float = 10.0,
    ) -> Client:
        """Connect and complete the handshake; ``window`` MESSAGE frames may be unacked
        at once (the server may grant fewer), ``expire`` seconds before a resend.

        Raises :class:`ServerError` or :class:`ConnectionLost` (a refused handshake
        included) and ``trio.TooSlowError`` after ``handshake_timeout``.
        """
        stream: trio.abc.Stream
        if ssl_context is None:
            stream = await trio.open_tcp_stream(host, port)
        else:
            stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=ssl_context)
        return await cls.over(
            stream,
            identity=identity,
            window=window,
            expire=expire,
            pubsub=pubsub,
            dotnet=dotnet,
            json=json,
            handshake_timeout=handshake_timeout,
        )

    @classmethod
    async def over(
        cls,
        stream: trio.abc.Stream,
        *,
        identity: str = "python",
        window: int = 100,
        expire: float = 0.5,
        pubsub: bool = True,
        dotnet: bool = False,
        json: bool = False,
        handshake_timeout: float = 10.0,
    ) -> Client:
        """:meth:`connect` over a stream of the caller's (a unix socket, TLS of its own
        making): the handshake is done on it; it is closed if that fails."""
        settings = settings_for(identity, window, expire, pubsub=pubsub, dotnet=dotnet, json=json)
        codec = ClientCodec(settings, clock=trio.current_time)
        try:
            with trio.fail_after(handshake_timeout):
                await _handshake(stream, codec)
        except BaseException as e:
            await trio.aclose_forcefully(stream)
            broken = isinstance(e, ProtocolError | trio.BrokenResourceError | OSError)
            if broken and not isinstance(e, ConnectionLost):  # a refusal, a reset, TLS
                raise ConnectionLost(f"handshake failed: {e}") from e
            raise
        return cls(stream, codec)

    def has(self, extension: str) -> bool:
        """Whether ``extension`` (``pubsub``, ``dotnet``, ``json``, ...) was negotiated."""
        return self.codec.has(extension)

    # -- lifetime ---------------------------------------------------------------------------
    async def __aenter__(self) -> Client:
        self._manager = trio.open_nursery()
        nursery = await self._manager.__aenter__()
        nursery.start_soon(self._background)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the background tasks and close the connection; what was not acked either
        way is resent (by the server: delivered again)."""
        self._fail(trio.ClosedResourceError("the client was closed"), flush=True)
        try:
            # The body's own exception propagates as it is, not wrapped in a group:
            # the background tasks never raise (they record their failure).
            await self._manager.__aexit__(None, None, None)
        finally:
            await trio.aclose_forcefully(self.stream)

    async def _background(self) -> None:
        with self._scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._guard, self._read)
                nursery.start_soon(self._guard, self._write_out)
                nursery.start_soon(self._guard, self._resend)

    async def _guard(self, task: Any) -> None:
        """Run one background task; its failure ends the connection (recorded, not raised)."""
        try:
            await task()
        except (ServerError, ConnectionLost) as e:
            self._fail(e)
        except trio.Cancelled:
            raise
        except ProtocolError as e:
            self._protocol_error(e)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self._fail(ConnectionLost(f"connection lost: {e}"))

    def _protocol_error(self, error: ProtocolError) -> None:
        """The server broke the protocol (or we did): close, after an ERROR frame that
        says why when it was the server."""
        if isinstance(error, RemoteProtocolError) and self._error is None:
            self._write(self.codec.send(Error(str(error))))
        self._fail(ConnectionLost(f"protocol error: {error}"), flush=True)

    def _fail(self, error: BaseException, *, flush: bool = False) -> None:
        """The connection is over: every waiting and later call raises ``error``.

        ``flush``: what is queued (our last acks, an ERROR frame) is written first,
        within a second; else the background tasks stop at once.
        """
        if self._error is not None:
            return
        self._error = error
        self._inbox_send.close()
        self._changed.unpark_all()
        if flush and self._output:
            self._scope.deadline = trio.current_time() + FLUSH_TIMEOUT
            self._output_ready.unpark_all()
        else:
            self._scope.cancel()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    # -- the background tasks ------------------------------------------------------------
    async def _read(self) -> None:
        codec = self.codec
        while True:
            event = codec.next_event()
            if event is NEED_DATA:
                codec.receive_data(await self.stream.receive_some(_READ))
            elif isinstance(event, ConnectionClosed):
                raise ConnectionLost("the server closed the connection")
            else:
                self._on_event(event)

    def _on_event(self, event: Any) -> None:
        if type(event) is Messages:
            for frame in event.frames:
                self._deliver(frame)
        elif isinstance(event, Ack):
            if event.settled:
                self._acked += event.settled
                self._changed.unpark_all()
        elif isinstance(event, Duplicate):
            if event.acked:  # our ack was lost or late: say it again
                self._write(self.codec.reack(event))
        elif isinstance(event, TypeName):
            self._type_in = event.name
        elif isinstance(event, Error):
            raise ServerError(event.message)
        # Extension frames of extensions not negotiated are skipped by their length.

    def _deliver(self, frame: Message) -> None:
        headers = parse_properties(frame.properties) if frame.properties else {}
        received = Received(frame.seq, frame.destination, headers, frame.payload, self._type_in)
        try:
            self._inbox_send.send_nowait(received)
        except trio.WouldBlock:  # the codec's receive window holds no more than this
            raise RemoteProtocolError("more MESSAGE frames unacked than the window") from None

    async def _write_out(self) -> None:
        while True:
            while not self._output:
                if self._error is not None:
                    self._scope.cancel()  # closing, and everything queued was written
                await self._output_ready.park()
            data = bytes(self._output)
            self._output.clear()
            await self.stream.send_all(data)
            self._written += len(data)
            self._changed.unpark_all()

    async def _resend(self) -> None:
        codec = self.codec
        while True:
            due = codec.next_due
            if due is None:
                await self._changed.park()  # woken by each publish
                continue
            await trio.sleep_until(due)
            while self._written < self._queued:  # one round of resends in flight at most
                await self._changed.park()
            wire = codec.due()
            if wire:
                self._write(wire)

    def _write(self, data: bytes) -> None:
        if data:
            self._output += data
            self._queued += len(data)
            self._output_ready.unpark_all()

    def _send(self, event: Any) -> None:
        self._write(self.codec.send(event))

    async def _flush(self) -> None:
        """Wait until what is queued so far was written to the socket."""
        target = self._queued
        while self._written < target:
            self._check()
            await self._changed.park()
        self._check()

    # -- publishing -------------------------------------------------------------------------
    async def publish(
        self,
        destination: str,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        type_name: str | None = None,
    ) -> int:
        """Send one MESSAGE to ``destination``; returns its sequence number.

        Waits while the window is full (``window`` unacked). ``headers`` become typed
        properties (a canonical integer ``N``, an ISO UTC time ``D``, else text);
        ``type_name`` is sent as a ``dotnet`` frame when it changes (needs ``dotnet``).
        Returns once queued for the socket; :meth:`wait_acked` waits for the ack.
        """
        props = format_properties(headers) if headers else ""
        async with self._publish_lock:  # one at a time: frames go out in seq order
            while True:
                self._check()
                if self.codec.window_room:
                    break
                await self._changed.park()
            out = b""
            if type_name is not None and type_name != self._type_out:
                out = self.codec.send(TypeName(type_name))
                self._type_out = type_name
            seq = self.codec.next_seq
            self._write(out + self.codec.send(Message(seq, destination, props, payload)))
            self._published += 1
            self._changed.unpark_all()  # the resend task starts its clock
            return seq

    async def wait_acked(self) -> None:
        """Wait until every MESSAGE published before this call was acked by the server."""
        target = self._published
        while self._acked < target:
            self._check()
            await self._changed.park()

    @property
    def unacked(self) -> int:
        """Published MESSAGE frames the server has not acked yet."""
        return self._published - self._acked

    # -- subscribing and receiving ------------------------------------------------------------
    async def subscribe(
        self,
        destination: str,
        *,
        filter: str = "",
        group: str | None = None,
        start: str | None = None,
    ) -> None:
        """Receive ``destination``'s messages that match ``filter`` (e.g. ``age>=N18``).

        ``group``: a named subscription whose members share its messages and which
        keeps collecting while none is connected; ``start``: ``earliest``,
        ``latest`` or an offset (log destinations). Returns once the command is
        written: the protocol has no reply, so a refusal (a bad filter, an unknown
        destination) arrives as :class:`ServerError` from a later call.
        """
        self._check()
        self._send(Subscribe(destination, filter, group, start))
        await self._flush()

    async def unsubscribe(self, destination: str) -> None:
        """Stop receiving ``destination``; what was received is still to be acked."""
        self._check()
        self._send(Unsubscribe(destination))
        await self._flush()

    async def receive(self) -> Received:
        """The next message delivered (waits for one); ack it once handled.

        Once the connection failed this raises at once, even if messages were still
        queued: they were not acked, so the server delivers them again.
        """
        self._check()
        try:
            return await self._inbox.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._check()
            raise

    def ack(self, seq: int) -> bool:
        """Ack every message received up to ``seq`` (cumulative): the server may forget
        them. False, and nothing sent, when ``seq`` is not received-and-unacked."""
        self._check()
        wire = self.codec.send(Ack(seq))
        self._write(wire)
        return bool(wire)
