"""A ``trio.abc.Stream`` whose bytes travel in WebSocket binary messages.

The protocol above reads and writes bytes as over TCP; this stream turns each
``send_all`` into one binary message and hands back the data of the messages
it receives, as it arrives (message boundaries mean nothing to a byte
stream, so a message is never gathered whole). ``wsproto`` does the framing;
this class only moves bytes and answers what needs an answer: a ping gets its
pong inline, a peer's close gets its close and reads as the end of the stream.
"""

from __future__ import annotations

import trio
from wsproto import ConnectionState, WSConnection
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    TextMessage,
)

from gateway.sdk import RemoteProtocolError

__all__ = ["CLOSE_TIMEOUT", "RECEIVE_CHUNK", "WebSocketStream"]

#: Bytes read from the socket at a time: with ``max_bytes`` reads, what is kept per connection.
RECEIVE_CHUNK = 65536
#: How long :meth:`WebSocketStream.aclose` waits for the peer's close frame.
CLOSE_TIMEOUT = 2.0
NORMAL_CLOSURE = 1000
MESSAGE_TOO_BIG = 1009


class WebSocketStream(trio.abc.Stream):
    """The protocol's stream over an open WebSocket connection (handshake done)."""

    def __init__(
        self,
        transport_stream: trio.abc.Stream,
        connection: WSConnection,
        *,
        max_message: int,
        subprotocol: str | None = None,
    ) -> None:
        self.transport_stream = transport_stream
        #: The subprotocol both ends agreed on in the opening handshake, if any.
        self.subprotocol = subprotocol
        #: The close code the peer sent (None until it closed).
        self.close_code: int | None = None
        self._ws = connection
        self._max_message = max_message
        self._message_size = 0
        self._pending = bytearray()
        self._eof = False
        self._closed = False
        self._receiving = False
        #: Whether bytes that came with the handshake were looked at (they are in ``_ws``).
        self._primed = False
        self._peer_closed = trio.Event()
        self._send_lock = trio.Lock()

    # -- receiving ------------------------------------------------------------------------
    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Message data as it arrives; b"" once the peer closed (after answering its close)."""
        if self._closed:
            raise trio.ClosedResourceError("the websocket stream was closed")
        self._receiving = True
        try:
            while not self._pending and not self._eof:
                await self._pump()
        finally:
            self._receiving = False
        await trio.lowlevel.checkpoint()
        n = len(self._pending) if max_bytes is None else max_bytes
        chunk = bytes(self._pending[:n])
        del self._pending[:n]
        return chunk

    async def _pump(self) -> None:
        """Read once from the socket and act on the events it completes."""
        if not self._primed:
            self._primed = True
            await self._process()
            return
        data = await self.transport_stream.receive_some(RECEIVE_CHUNK)
        if not data:
            # A hang-up without a close frame (1006): the end of the stream, as over TCP.
            self._eof = True
            self._peer_closed.set()
            return
        self._ws.receive_data(bytes(data))
        await self._process()

    async def _process(self) -> None:
        """Act on the events wsproto has ready, up to the end of the stream."""
        for event in self._ws.events():
            await self._handle(event)
            if self._eof:
                return

    async def _handle(self, event: Event) -> None:
        if isinstance(event, (BytesMessage, TextMessage)):
            if not self._take(event):
                await self.fail(MESSAGE_TOO_BIG, "message too big")
                raise RemoteProtocolError(
                    f"websocket: a message larger than max_message ({self._max_message} bytes)"
                )
        elif isinstance(event, Ping):
            await self._send(event.response())
        elif isinstance(event, CloseConnection):
            await self._closing(event)
        # Pongs answer nothing we need: the protocols keep their own keepalives.

    def _take(self, event: BytesMessage | TextMessage) -> bool:
        """Buffer message data (text as its UTF-8); False past ``max_message`` bytes."""
        data = event.data.encode() if isinstance(event, TextMessage) else event.data
        self._message_size += len(data)
        if self._message_size > self._max_message:
            return False
        self._pending += data
        if event.message_finished:
            self._message_size = 0
        return True

    async def _closing(self, event: CloseConnection) -> None:
        """A close frame from the peer, or one wsproto made for bytes that broke the protocol."""
        state = self._ws.state
        if state is ConnectionState.REMOTE_CLOSING:
            self.close_code = event.code
            self._eof = True
            self._peer_closed.set()
            await self._send_quietly(event.response())
        elif state is ConnectionState.CLOSED:  # the answer to our own close
            self.close_code = event.code
            self._eof = True
            self._peer_closed.set()
        else:  # still OPEN: wsproto refused the peer's bytes and tells us the code to close with
            await self.fail(event.code, event.reason or "protocol error")
            raise RemoteProtocolError(f"websocket: {event.reason} (closed with {event.code})")

    # -- sending --------------------------------------------------------------------------
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` as one binary message (nothing for empty data)."""
        if self._closed:
            raise trio.ClosedResourceError("the websocket stream was closed")
        if not data:
            await trio.lowlevel.checkpoint()
            return
        await self._send(Message(data=bytes(data)))

    async def _send(self, event: Event) -> None:
        """Serialize and write one event; the lock keeps pongs and messages whole."""
        async with self._send_lock:
            if self._ws.state is not ConnectionState.OPEN and not isinstance(
                event, CloseConnection
            ):
                raise trio.BrokenResourceError("websocket: the connection is closing")
            payload = self._ws.send(event)
            await self.transport_stream.send_all(payload)

    async def _send_quietly(self, event: Event) -> None:
        """Send a close frame; a peer already gone is no error at this point."""
        try:
            await self._send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    # -- closing --------------------------------------------------------------------------
    async def fail(self, code: int, reason: str) -> None:
        """Send a close frame with ``code`` and read nothing more (a broken peer, a limit)."""
        self._eof = True
        if self._ws.state is ConnectionState.OPEN:
            await self._send_quietly(CloseConnection(code=code, reason=reason))

    async def aclose(self) -> None:
        """Close 1000, wait up to :data:`CLOSE_TIMEOUT` for the peer's close, close the socket."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            if self._ws.state is ConnectionState.OPEN:
                await self._send_quietly(CloseConnection(code=NORMAL_CLOSURE))
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await self._await_peer_close()
        except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError):
            pass
        finally:
            await self.transport_stream.aclose()

    async def _await_peer_close(self) -> None:
        """The peer's close frame: seen by a reading task, or read here (data discarded)."""
        if self._receiving:
            await self._peer_closed.wait()
            return
        self._pending.clear()
        while not self._peer_closed.is_set():
            await self._pump()
            self._pending.clear()
