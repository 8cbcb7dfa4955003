"""A made-up transport for tests: ``toy://host:port``.

TCP underneath, with a handshake and a framing of its own, so that a protocol
only works over it if the runtime really routes every byte through the
transport:

* handshake: the client sends ``TOY/1 hello\\n`` and the server answers
  ``TOY/1 welcome\\n``;
* framing: every chunk written is sent as a 4-byte big-endian length and the
  chunk; a reader gets the chunks back.

It is registered the way a third party's package would be (see
:func:`toy_registered`), and nothing in ``gateway/`` knows it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import trio

from gateway.runtime.registry import Registered
from gateway.sdk import RemoteProtocolError, Transport
from gateway.transports.tcp import format_sockaddr
from gateway.transports.tcp import transport as tcp

__all__ = ["CLIENT_HELLO", "SERVER_HELLO", "ToyStream", "ToyTransport", "toy_registered"]

PREFIX = "toy://"
CLIENT_HELLO = b"TOY/1 hello\n"
SERVER_HELLO = b"TOY/1 welcome\n"
#: Largest frame a reader accepts (checked before reading the body).
MAX_FRAME = 1 << 20
_LENGTH = struct.Struct(">I")


def parse_toy(address: str) -> tuple[str, int]:
    """``toy://host:port`` → ``(host, port)``; ``ValueError`` in the toy's own words."""
    if not address.lower().startswith(PREFIX):
        raise ValueError(f"toy addresses look like toy://HOST:PORT, not {address!r}")
    rest = address[len(PREFIX) :]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or "/" in rest:
        raise ValueError("toy addresses look like toy://HOST:PORT (a host and a port, no path)")
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"toy port must be a number 0..65535, not {port!r}")
    return host.strip("[]"), int(port)


class ToyStream(trio.abc.Stream):
    """Length-prefixed chunks over ``transport_stream`` (after the handshake)."""

    def __init__(self, transport_stream: trio.abc.Stream, buffered: bytes = b"") -> None:
        self.transport_stream = transport_stream
        self._in = bytearray(buffered)
        self._frame = b""  # the part of the current frame not yet returned
        self.frames_received = 0

    async def _fill(self, n: int) -> bool:
        """Read until ``n`` bytes are buffered; False at EOF with nothing buffered."""
        while len(self._in) < n:
            data = await self.transport_stream.receive_some(65536)
            if not data:
                if self._in:
                    raise RemoteProtocolError("toy: connection closed inside a frame")
                return False
            self._in += data
        return True

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self._frame:
            if not await self._fill(_LENGTH.size):
                return b""
            (length,) = _LENGTH.unpack_from(self._in)
            if length == 0 or length > MAX_FRAME:
                raise RemoteProtocolError(f"toy: bad frame length {length}")
            await self._fill(_LENGTH.size + length)
            self._frame = bytes(self._in[_LENGTH.size : _LENGTH.size + length])
            del self._in[: _LENGTH.size + length]
            self.frames_received += 1
        n = len(self._frame) if max_bytes is None else max_bytes
        chunk, self._frame = self._frame[:n], self._frame[n:]
        return chunk

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        for start in range(0, len(view), MAX_FRAME):
            part = view[start : start + MAX_FRAME]
            await self.transport_stream.send_all(_LENGTH.pack(len(part)) + bytes(part))

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.transport_stream.aclose()


class ToyListener(trio.abc.Listener[trio.abc.Stream]):
    """Not a ``trio.SocketListener``: hands out raw TCP streams, handshake not done."""

    def __init__(self, inner: trio.SocketListener) -> None:
        self.inner = inner

    async def accept(self) -> trio.abc.Stream:
        return await self.inner.accept()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _read_line(stream: trio.abc.Stream, limit: int = 64) -> tuple[bytes, bytes]:
    """One ``\\n``-terminated line and whatever arrived after it."""
    data = b""
    while b"\n" not in data:
        chunk = await stream.receive_some(limit)
        if not chunk:
            raise RemoteProtocolError("toy: closed during the handshake")
        data += chunk
        if len(data) > limit and b"\n" not in data:
            raise RemoteProtocolError("toy: greeting too long")
    line, _, rest = data.partition(b"\n")
    return line + b"\n", rest


class ToyTransport(Transport):
    name = "toy"
    schemes = ("toy",)

    def __init__(self) -> None:
        self.handshakes_done = 0

    def check_address(self, address: str) -> None:
        parse_toy(address)

    async def listen(self, address: str) -> Sequence[trio.abc.Listener[trio.abc.Stream]]:
        host, port = parse_toy(address)
        return [ToyListener(sl) for sl in await trio.open_tcp_listeners(port, host=host)]

    def listener_name(self, listener: trio.abc.Listener[Any]) -> str:
        assert isinstance(listener, ToyListener)
        return PREFIX + format_sockaddr(listener.inner.socket.getsockname())

    def peer_name(self, stream: trio.abc.Stream) -> str:
        return tcp.peer_name(stream)

    async def connect(self, address: str) -> trio.abc.Stream:
        host, port = parse_toy(address)
        return await trio.open_tcp_stream(host, port)

    async def accepted(self, stream: trio.abc.Stream, address: str) -> trio.abc.Stream:
        line, rest = await _read_line(stream)
        if line != CLIENT_HELLO:
            raise RemoteProtocolError(f"toy: expected {CLIENT_HELLO!r}, got {line!r}")
        await stream.send_all(SERVER_HELLO)
        self.handshakes_done += 1
        return ToyStream(stream, rest)

    async def connected(self, stream: trio.abc.Stream, address: str) -> trio.abc.Stream:
        await stream.send_all(CLIENT_HELLO)
        line, rest = await _read_line(stream)
        if line != SERVER_HELLO:
            raise RemoteProtocolError(f"toy: expected {SERVER_HELLO!r}, got {line!r}")
        return ToyStream(stream, rest)


def toy_registered(transport: ToyTransport | None = None) -> Registered:
    """The toy as a third-party entry point would register it."""
    return Registered(
        "toy",
        "toy_transport:ToyTransport",
        "interchange-toy",
        "0.1",
        plugin=transport or ToyTransport(),
    )
