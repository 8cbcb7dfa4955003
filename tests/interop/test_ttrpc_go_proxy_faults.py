"""A hostile client's Data through our proxy to containerd's Go ttrpc server (Debian's
1.2.4, which dies of a Data frame for a stream it ended or for a unary method, whatever
the Request's flags, taking every client of the upstream down with it).

Each sequence runs against a Go Echo server of its own, through a real gateway's
transparent proxy (``interchange.test.*`` routed to it, ``Sum`` and ``Chat`` named as
the upstream's ``client_streaming`` methods, as Go's service registers them), written
frame by frame by the test. The proxy's answers must be what a Go server answers for
that input (or, where 1.2.4 dies, what it answers for a stream it does not hold:
INVALID_ARGUMENT ``StreamID is no longer active``); and afterwards the Go server must be
alive, without a panic in its log, and still serve another client's call.

Go and its ttrpc library come from Debian (``bash .ci/go-interop-deps``); without them
these tests fail, or skip with ``INTERCHANGE_SKIP_GO=1`` (see ``go_ttrpc.py``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from google.protobuf import wrappers_pb2
from harness import running_gateway
from interop import go_ttrpc
from interop.echo_service import SERVICE
from interop.go_ttrpc import check_go_log, go_server, proxy_config

from protocols.ttrpc import Flags, Frame, FrameReader, MessageType, encode_frame, ttrpc_pb2
from protocols.ttrpc.client import open_client
from protocols.ttrpc.status import status_of

# The helpers' fixtures, bound here so that pytest finds them in this module.
go_peer = go_ttrpc.go_peer
socket_dir = go_ttrpc.socket_dir

RC, RO, ND = Flags.REMOTE_CLOSED, Flags.REMOTE_OPEN, Flags.NO_DATA
REQ, RESP, DATA = MessageType.REQUEST, MessageType.RESPONSE, MessageType.DATA
#: How long any awaited frame may take.
WAIT = 10.0
#: The first stream id of the barrier calls (above every id a sequence opens).
BARRIER = 101

#: What the Go server answers, as :func:`describe` renders it.
INACTIVE = ("response", 3, "StreamID is no longer active", b"")
STREAM_CLOSED = ("response", 3, "data handling error: ttrpc: stream closed", b"")
REUSED = ("response", 3, "StreamID cannot be re-used and must increment", b"")
OVERSIZE = (
    "response",
    8,
    f"message length {(4 << 20) + 1} exceed maximum message size of 4194304",
    b"",
)
SERVER_CLOSE = ("data", RC | ND, b"")


def bv(value: bytes) -> bytes:
    return wrappers_pb2.BytesValue(value=value).SerializeToString()


def sv(value: str) -> bytes:
    return wrappers_pb2.StringValue(value=value).SerializeToString()


def request(sid: int, method: str, flags: int = 0, payload: bytes = b"") -> bytes:
    body = ttrpc_pb2.Request(service=SERVICE, method=method, payload=payload)
    return encode_frame(sid, REQ, flags, body.SerializeToString())


def data(sid: int, flags: int, message: bytes = b"") -> bytes:
    return encode_frame(sid, DATA, flags, message)


def ok(value: bytes) -> tuple[object, ...]:
    """An OK Response carrying a BytesValue."""
    return ("response", 0, "", value)


def message(value: bytes) -> tuple[object, ...]:
    return ("data", 0, value)


def describe(frame: Frame) -> tuple[object, ...]:
    """A Response as (response, code, message, BytesValue value), Data as (data, flags,
    BytesValue value)."""
    if frame.type == RESP:
        response = ttrpc_pb2.Response.FromString(frame.data)
        status = status_of(response)
        return (
            "response",
            status.code,
            status.message,
            wrappers_pb2.BytesValue.FromString(response.payload).value,
        )
    return ("data", frame.flags, wrappers_pb2.BytesValue.FromString(frame.data).value)


class Hostile:
    """A raw connection to the proxy: the test writes the frames, reads what comes back."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = FrameReader()
        self.frames: list[Frame] = []
        self.barrier = BARRIER

    async def send(self, *frames: bytes) -> None:
        await self.stream.send_all(b"".join(frames))

    async def until(self, done: Callable[[list[Frame]], bool]) -> None:
        with trio.fail_after(WAIT):
            while not done(self.frames):
                chunk = await self.stream.receive_some(1 << 16)
                assert chunk, f"the proxy closed the connection; so far: {self.frames}"
                self.reader.receive_data(chunk)
                self.frames += [f for f in self.reader.frames() if isinstance(f, Frame)]

    async def got(self, sid: int, count: int) -> list[tuple[object, ...]]:
        """The first ``count`` frames for stream ``sid``, once they are all here."""
        await self.until(lambda frames: sum(f.stream_id == sid for f in frames) >= count)
        return [describe(f) for f in self.frames if f.stream_id == sid][:count]

    async def settled(self, sid: int) -> list[tuple[object, ...]]:
        """Every frame for stream ``sid``, once a call made after it all was answered:
        the proxy answers a client's frames in order, and what it relayed reached the
        Go server before the barrier's Request did (Go answers bad input from its
        reader, in order; a handler's reply may come at any time, so wait for those
        with :meth:`got` first)."""
        barrier = self.barrier
        self.barrier += 2
        await self.send(request(barrier, "Echo", 0, bv(b"barrier")))
        await self.until(lambda frames: any(f.stream_id == barrier for f in frames))
        return [describe(f) for f in self.frames if f.stream_id == sid]

    async def expect(self, sid: int, *frames: tuple[object, ...], ordered: bool = True) -> None:
        """Stream ``sid`` gets ``frames`` (in this order, or in any), and nothing more."""
        await self.got(sid, len(frames))
        got = await self.settled(sid)
        if ordered:
            assert got == list(frames)
        else:
            assert Counter(got) == Counter(frames), got


Sequence = Callable[[Hostile], Awaitable[None]]


async def unary_remote_open_then_a_message(h: Hostile) -> None:
    """The first trigger of the issue: a unary method called ``remote open``, a message
    at once (Go 1.2.4: a nil pointer dereference)."""
    await h.send(request(1, "Echo", RO, bv(b"x")), data(1, 0, bv(b"m")))
    await h.expect(1, INACTIVE, ok(b"x"), ordered=False)


async def unary_remote_open_then_its_close(h: Hostile) -> None:
    await h.send(request(1, "Sleep", RO, sv("50ms")), data(1, RC | ND))
    await h.expect(1, INACTIVE, ok(b"50ms"), ordered=False)


async def unary_remote_open_a_message_after_its_response(h: Hostile) -> None:
    """Go has forgotten the stream: 1.2.4 dies of its Data."""
    await h.send(request(1, "Echo", RO, bv(b"x")))
    assert await h.got(1, 1) == [ok(b"x")]
    await h.send(data(1, 0, bv(b"late")))
    await h.expect(1, ok(b"x"), INACTIVE)


async def unary_call_then_a_message(h: Hostile) -> None:
    await h.send(request(1, "Echo", 0, bv(b"x")), data(1, 0, bv(b"m")))
    await h.expect(1, INACTIVE, ok(b"x"), ordered=False)


async def server_streaming_remote_open_then_a_message(h: Hostile) -> None:
    """Count is server streaming: the client's messages are not its to take."""
    await h.send(request(1, "Count", RO, bv(b"2")), data(1, 0, bv(b"m")))
    await h.expect(1, INACTIVE, message(b"0"), message(b"1"), SERVER_CLOSE, ordered=False)
    got = [f for f in await h.settled(1) if f != INACTIVE]
    assert got == [message(b"0"), message(b"1"), SERVER_CLOSE]


async def server_streaming_a_message_after_its_end(h: Hostile) -> None:
    await h.send(request(1, "Count", RC, bv(b"1")))
    assert await h.got(1, 2) == [message(b"0"), SERVER_CLOSE]
    await h.send(data(1, 0, bv(b"late")))
    await h.expect(1, message(b"0"), SERVER_CLOSE, INACTIVE)


async def bidi_the_server_closed_then_a_message(h: Hostile) -> None:
    """The second trigger: Data after the server's Data ``remote closed``, the client's
    side still open (Go 1.2.4: Data for a stream it forgot)."""
    await h.send(request(1, "Chat", RO), data(1, 0, bv(b"hi")), data(1, 0, bv(b"bye")))
    assert await h.got(1, 3) == [message(b"HI"), message(b"BYE"), SERVER_CLOSE]
    await h.send(data(1, 0, bv(b"late")))
    await h.expect(1, message(b"HI"), message(b"BYE"), SERVER_CLOSE, INACTIVE)


async def bidi_the_server_closed_then_the_client_s_close(h: Hostile) -> None:
    await h.send(request(1, "Chat", RO), data(1, 0, bv(b"bye")))
    assert await h.got(1, 2) == [message(b"BYE"), SERVER_CLOSE]
    await h.send(data(1, RC | ND))
    await h.expect(1, message(b"BYE"), SERVER_CLOSE, INACTIVE)


async def client_streaming_closed_then_messages(h: Hostile) -> None:
    """Go answers a message after the client's close, then forgets the stream (its next
    Data would kill 1.2.4); the call's own Response still comes."""
    await h.send(
        request(1, "Sum", RO), data(1, 0, bv(b"a")), data(1, RC | ND), data(1, 0, bv(b"b"))
    )
    assert Counter(await h.got(1, 2)) == Counter([STREAM_CLOSED, ok(b"a")])
    await h.send(data(1, 0, bv(b"c")), data(1, RC | ND))
    await h.expect(1, STREAM_CLOSED, ok(b"a"), INACTIVE, INACTIVE, ordered=False)


async def client_streaming_closed_then_closed_again(h: Hostile) -> None:
    """A repeated close, or a frame without data, is nothing to Go: nothing here."""
    await h.send(request(1, "Sum", RO), data(1, 0, bv(b"a")), data(1, RC | ND))
    await h.send(data(1, RC | ND), data(1, ND))
    await h.expect(1, ok(b"a"))


async def client_streaming_answered_then_a_message(h: Hostile) -> None:
    await h.send(request(1, "Sum", RO), data(1, 0, bv(b"a")), data(1, RC | ND))
    assert await h.got(1, 1) == [ok(b"a")]
    await h.send(data(1, 0, bv(b"late")))
    await h.expect(1, ok(b"a"), INACTIVE)


async def a_message_for_a_stream_never_opened(h: Hostile) -> None:
    await h.send(data(7, 0, bv(b"m")), data(9, RC | ND))
    await h.expect(7, INACTIVE)
    await h.expect(9, INACTIVE)


async def a_message_for_a_request_the_upstream_refused(h: Hostile) -> None:
    """Go answers an unknown method and holds no stream for it (its Data: a panic)."""
    await h.send(request(1, "Nope", RO), data(1, 0, bv(b"m")))
    await h.expect(1, ("response", 12, "method Nope", b""), INACTIVE, ordered=False)


async def a_second_request_on_a_live_id(h: Hostile) -> None:
    """Answered here (Go would also forget the live stream, and die of its next Data);
    the relayed stream goes on."""
    await h.send(request(1, "Sum", RO), request(1, "Echo", 0, bv(b"x")))
    assert await h.got(1, 1) == [REUSED]
    await h.send(data(1, 0, bv(b"a")), data(1, RC | ND))
    await h.expect(1, REUSED, ok(b"a"))


async def odd_flags_and_a_message_with_the_close(h: Hostile) -> None:
    """A message with flags Go ignores, and the last one with the close in one frame
    (which Go answers INVALID_ARGUMENT, then forgets the stream): relayed as Go's client
    sends them."""
    await h.send(request(1, "Sum", RO), data(1, RO | 0xF0, bv(b"a")), data(1, RC, bv(b"b")))
    await h.expect(1, ok(b"a,b"))


async def a_close_carrying_bytes_and_no_data(h: Hostile) -> None:
    await h.send(request(1, "Sum", RO), data(1, 0, bv(b"a")), data(1, RC | ND, bv(b"junk")))
    await h.expect(1, ok(b"a"))


async def an_oversize_frame_then_a_message(h: Hostile) -> None:
    """Answered here (the call runs on upstream, its reply dropped); its Data after that
    is the client's bad input, never relayed."""
    length = (4 << 20) + 1
    header = length.to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([DATA, 0])
    await h.send(request(1, "Sum", RO), header + bytes(length))
    await h.got(1, 1)
    await h.send(data(1, 0, bv(b"a")), data(1, RC | ND))
    await h.expect(1, OVERSIZE, INACTIVE, INACTIVE)


SEQUENCES: dict[str, Sequence] = {
    f.__name__: f
    for f in (
        unary_remote_open_then_a_message,
        unary_remote_open_then_its_close,
        unary_remote_open_a_message_after_its_response,
        unary_call_then_a_message,
        server_streaming_remote_open_then_a_message,
        server_streaming_a_message_after_its_end,
        bidi_the_server_closed_then_a_message,
        bidi_the_server_closed_then_the_client_s_close,
        client_streaming_closed_then_messages,
        client_streaming_closed_then_closed_again,
        client_streaming_answered_then_a_message,
        a_message_for_a_stream_never_opened,
        a_message_for_a_request_the_upstream_refused,
        a_second_request_on_a_live_id,
        odd_flags_and_a_message_with_the_close,
        a_close_carrying_bytes_and_no_data,
        an_oversize_frame_then_a_message,
    )
}


@pytest.mark.parametrize("name", list(SEQUENCES))
async def test_a_hostile_client_s_data_never_reaches_the_go_upstream_unless_it_takes_it(
    name: str, go_peer: Path, socket_dir: Path, tmp_path: Path
) -> None:
    async with go_server(go_peer, f"unix:{socket_dir / 'go.sock'}") as server:
        config = proxy_config(tmp_path, f"unix:{socket_dir / 'gw.sock'}", server.address)
        async with running_gateway(config) as gw:
            proxy = gw.addresses["rpc"][0]
            stream = await trio.open_unix_socket(proxy.removeprefix("unix:"))
            async with stream:
                try:
                    await SEQUENCES[name](Hostile(stream))
                except (AssertionError, trio.TooSlowError):
                    check_go_log(server)  # a Go server that died: say that first
                    raise
            # Another client's call through the same proxy, on the upstream connection
            # the sequence used: the Go server still serves it.
            with trio.fail_after(WAIT):
                async with open_client(proxy) as client:
                    reply = await client.call(SERVICE, "Echo", bv(b"still here"))
            assert reply == bv(b"still here")
        check_go_log(server)


async def test_the_proxy_says_which_method_a_client_s_messages_were_refused_for(
    go_peer: Path, socket_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Messages for a method not among the upstream's ``client_streaming`` are refused:
    the gateway's log says so, once per method, so a missing entry is found."""
    async with go_server(go_peer, f"unix:{socket_dir / 'go.sock'}") as server:
        config = proxy_config(tmp_path, f"unix:{socket_dir / 'gw.sock'}", server.address)
        async with running_gateway(config) as gw:
            proxy = gw.addresses["rpc"][0]
            with caplog.at_level(logging.WARNING):
                async with await trio.open_unix_socket(proxy.removeprefix("unix:")) as stream:
                    h = Hostile(stream)
                    await h.send(request(1, "Echo", RO, bv(b"x")), data(1, 0, bv(b"m")))
                    await h.send(request(3, "Echo", RO, bv(b"x")), data(3, 0, bv(b"m")))
                    assert INACTIVE in await h.settled(3)
        check_go_log(server)
    warnings = [r.getMessage() for r in caplog.records if "not relayed" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per method
    assert warnings[0].endswith(
        f"a client's messages for {SERVICE}/Echo are not relayed (answered INVALID_ARGUMENT):"
        " it is not among upstream go's client_streaming methods"
    )
