"""TCP and Unix socket transports over real loopback sockets."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest
import trio

from gateway.transports import SocketTransport
from gateway.transports.tcp import TcpTransport, format_sockaddr, parse_address
from gateway.transports.tcp import transport as tcp
from gateway.transports.unix import UnixTransport
from gateway.transports.unix import transport as unix


async def receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        assert chunk, "stream closed early"
        data += chunk
    return data


async def echo_round_trip(
    transport: SocketTransport, listener: trio.SocketListener, address: str
) -> tuple[trio.abc.Stream, trio.SocketStream]:
    """Connect, accept, and bounce bytes both ways; return (client, server) streams."""
    with trio.fail_after(10):
        client = await transport.connect(address)
        server = await listener.accept()
        await client.send_all(b"ping")
        assert await receive_exactly(server, 4) == b"ping"
        await server.send_all(b"PONG")
        assert await receive_exactly(client, 4) == b"PONG"
    return client, server


def keepalive(stream: trio.abc.Stream) -> int:
    assert isinstance(stream, trio.SocketStream)
    return stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)


def ipv6_loopback_works() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_entry_point_instances() -> None:
    assert isinstance(tcp, TcpTransport)
    assert isinstance(unix, UnixTransport)
    assert (tcp.name, unix.name) == ("tcp", "unix")
    assert tcp.kind == unix.kind == "socket"


# --- TCP ------------------------------------------------------------------------------


async def test_tcp_listen_port_zero_connect_echo() -> None:
    listeners = await tcp.listen("127.0.0.1:0")
    assert len(listeners) == 1
    listener = listeners[0]
    name = tcp.listener_name(listener)
    host, port = parse_address(name)
    assert host == "127.0.0.1"
    assert port == listener.socket.getsockname()[1]
    assert port != 0
    client, server = await echo_round_trip(tcp, listener, name)
    try:
        assert tcp.peer_name(client) == name
        client_port = client.socket.getsockname()[1]  # type: ignore[attr-defined]
        assert tcp.peer_name(server) == f"127.0.0.1:{client_port}"
        assert keepalive(client) != 0
        assert keepalive(server) != 0
    finally:
        await client.aclose()
        await server.aclose()
        await listener.aclose()


async def test_tcp_localhost_name_resolves() -> None:
    listeners = await tcp.listen("127.0.0.1:0")
    port = parse_address(tcp.listener_name(listeners[0]))[1]
    client, server = await echo_round_trip(tcp, listeners[0], f"localhost:{port}")
    for closeable in (client, server, *listeners):
        await closeable.aclose()


@pytest.mark.skipif(not ipv6_loopback_works(), reason="no IPv6 loopback here")
async def test_tcp_ipv6_loopback() -> None:
    listeners = await tcp.listen("[::1]:0")
    listener = listeners[0]
    name = tcp.listener_name(listener)
    assert name.startswith("[::1]:")
    assert not name.endswith(":0")
    client, server = await echo_round_trip(tcp, listener, name)
    try:
        assert tcp.peer_name(client) == name
        assert tcp.peer_name(server).startswith("[::1]:")
    finally:
        for closeable in (client, server, listener):
            await closeable.aclose()


@pytest.mark.parametrize("address", ["*:0", ":0"])
async def test_tcp_wildcard_port_zero_shares_one_port(address: str) -> None:
    listeners = await tcp.listen(address)
    try:
        ports = {parse_address(tcp.listener_name(lst))[1] for lst in listeners}
        assert len(ports) == 1
        assert ports != {0}
        port = ports.pop()
        client, server = await echo_round_trip(tcp, listeners[0], f"127.0.0.1:{port}")
        await client.aclose()
        await server.aclose()
    finally:
        for listener in listeners:
            await listener.aclose()


async def test_tcp_connect_refused_is_oserror() -> None:
    with socket.socket() as s:  # a port that was just free and nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(OSError):
        await tcp.connect(f"127.0.0.1:{port}")


@pytest.mark.parametrize("address", ["*:5044", ":5044", "127.0.0.1:0"])
async def test_tcp_connect_needs_host_and_port(address: str) -> None:
    with pytest.raises(ValueError, match="cannot connect"):
        await tcp.connect(address)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:5044", ("127.0.0.1", 5044)),
        ("localhost:0", ("localhost", 0)),
        ("gw-1.example.net:65535", ("gw-1.example.net", 65535)),
        ("[::1]:5044", ("::1", 5044)),
        ("[fe80::1%eth0]:80", ("fe80::1%eth0", 80)),
        ("*:5044", (None, 5044)),
        (":5044", (None, 5044)),
    ],
)
def test_tcp_parse_good(address: str, expected: tuple[str | None, int]) -> None:
    tcp.check_address(address)
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("", "expected host:port, e.g. 127.0.0.1:5044"),
        ("localhost", "expected host:port, e.g. 127.0.0.1:5044"),
        ("localhost:", "missing port"),
        ("localhost:http", "port must be a number 0..65535"),
        ("localhost:-1", "port must be a number 0..65535"),
        ("localhost:65536", "port must be 0..65535"),
        ("localhost:99999999", "port must be 0..65535"),
        ("::1:5044", "IPv6 addresses need brackets"),
        ("[::1:5044", "missing ']'"),
        ("[::1]5044", "expected [v6addr]:port"),
        ("[127.0.0.1]:5044", "not an IPv6 address"),
        ("bad host:80", "without spaces"),
        (" 127.0.0.1:80", "without spaces"),
        ("bad_host!:80", "not a valid host name"),
        ("-x:80", "not a valid host name"),
        ("127.0.0.1:\uff15\uff10", "port must be a number"),  # fullwidth digits
    ],
)
def test_tcp_check_address_errors(address: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        tcp.check_address(address)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("address", "claimed"),
    [
        ("127.0.0.1:5044", True),
        ("localhost:5044", True),
        ("[::1]:5044", True),
        ("*:5044", True),
        (":5044", True),
        ("localhost", True),  # malformed, but TCP-shaped: TCP explains what is wrong
        ("localhost:", True),
        ("unix:/run/x.sock", False),
        ("unix:relative.sock", False),
        ("tls:foo", False),
    ],
)
def test_tcp_claims(address: str, claimed: bool) -> None:
    assert tcp.claims(address) is claimed


@pytest.mark.parametrize(
    ("sockaddr", "text"),
    [
        (("1.2.3.4", 5678), "1.2.3.4:5678"),
        (("::1", 5678, 0, 0), "[::1]:5678"),
        (("::ffff:10.0.0.1", 80, 0, 0), "10.0.0.1:80"),
        (("0.0.0.0", 1), "0.0.0.0:1"),
        (("::", 1, 0, 0), "[::]:1"),
    ],
)
def test_format_sockaddr(sockaddr: tuple[object, ...], text: str) -> None:
    assert format_sockaddr(sockaddr) == text


# --- Unix -----------------------------------------------------------------------------


async def test_unix_listen_connect_echo(tmp_path: Path) -> None:
    path = tmp_path / "gw.sock"
    address = f"unix:{path}"
    listeners = await unix.listen(address)
    assert len(listeners) == 1
    listener = listeners[0]
    assert unix.listener_name(listener) == address
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    client, server = await echo_round_trip(unix, listener, address)
    try:
        assert unix.peer_name(server) == address
        assert unix.peer_name(client) == address
    finally:
        for closeable in (client, server, listener):
            await closeable.aclose()


async def test_unix_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    listeners = await unix.listen("unix:rel.sock")
    assert (tmp_path / "rel.sock").exists()
    assert unix.listener_name(listeners[0]) == "unix:rel.sock"
    client, server = await echo_round_trip(unix, listeners[0], "unix:rel.sock")
    for closeable in (client, server, *listeners):
        await closeable.aclose()


async def test_unix_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, never listening, then closed: the file stays behind
    assert stat.S_ISSOCK(path.stat().st_mode)
    with pytest.raises(ConnectionRefusedError):  # what a plain bind would trip over
        await trio.open_unix_socket(str(path))
    listeners = await unix.listen(f"unix:{path}")
    try:
        client, server = await echo_round_trip(unix, listeners[0], f"unix:{path}")
        await client.aclose()
        await server.aclose()
    finally:
        await listeners[0].aclose()


async def test_unix_live_socket_is_not_stolen(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 'live.sock'}"
    first = await unix.listen(address)
    try:
        with pytest.raises(OSError, match="address in use") as info:
            await unix.listen(address)
        assert info.value.errno == errno.EADDRINUSE
        # The liveness probe shows up on the live listener as a connection closed at once.
        with trio.fail_after(10):
            probe = await first[0].accept()
            assert await probe.receive_some() == b""
        await probe.aclose()
        # The first listener still owns the path and still answers.
        client, server = await echo_round_trip(unix, first[0], address)
        await client.aclose()
        await server.aclose()
    finally:
        await first[0].aclose()


async def test_unix_regular_file_is_not_removed(tmp_path: Path) -> None:
    path = tmp_path / "data.sock"
    path.write_text("important")
    with pytest.raises(OSError, match="not a socket") as info:
        await unix.listen(f"unix:{path}")
    assert info.value.errno == errno.EADDRINUSE
    assert path.read_text() == "important"


async def test_unix_connect_to_missing_socket_fails(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        await unix.connect(f"unix:{tmp_path / 'nobody.sock'}")


@pytest.mark.parametrize(
    ("address", "claimed"),
    [("unix:/run/gw.sock", True), ("unix:gw.sock", True), ("127.0.0.1:80", False)],
)
def test_unix_claims(address: str, claimed: bool) -> None:
    assert unix.claims(address) is claimed


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("unix:", "the path is empty"),
        ("/run/gw.sock", "expected unix:/path/to/socket"),
        ("unix:/run/dir/", "names a directory"),
        ("unix:/a\0b", "NUL"),
        ("unix:/" + "x" * 200, "the limit is"),
    ],
)
def test_unix_check_address_errors(address: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        unix.check_address(address)
    assert reason in str(info.value)


def test_unix_check_address_is_pure(tmp_path: Path) -> None:
    unix.check_address(f"unix:{tmp_path / 'nothing-here.sock'}")
    assert os.listdir(tmp_path) == []


# -- writing without waiting ----------------------------------------------------------


async def test_a_socket_stream_writes_what_the_socket_takes_without_waiting() -> None:
    from gateway.transports.nowait import nowait_sender

    a, b = trio.socket.socketpair()
    ours, theirs = trio.SocketStream(a), trio.SocketStream(b)
    send = nowait_sender(ours)
    assert send is not None
    assert send(b"hello") == 5
    assert await receive_exactly(theirs, 5) == b"hello"
    # The peer does not read: the socket fills, then takes nothing, and never blocks.
    chunk = bytes(1 << 16)
    taken = [send(chunk) for _ in range(256)]
    assert 0 < sum(taken) < 256 * len(chunk)
    assert taken[-1] == 0
    await ours.aclose()
    assert send(b"after close") == 0  # never a write to a number reused since
    await theirs.aclose()


async def test_streams_that_frame_or_do_not_reach_a_socket_have_no_nowait_sender() -> None:
    import ssl

    from gateway.transports.nowait import nowait_sender

    a, b = trio.socket.socketpair()
    plain = trio.SocketStream(a)
    tls = trio.SSLStream(plain, ssl.create_default_context(), server_hostname="x")
    assert nowait_sender(tls) is None  # bytes must go through the TLS layer
    memory, _ = trio.testing.memory_stream_pair()
    assert nowait_sender(memory) is None

    class Layer:
        """A pass-through layer that says so."""

        def nowait_sender(self) -> object:
            return nowait_sender(plain)

    assert nowait_sender(Layer()) is not None
    await plain.aclose()
    trio.SocketStream(b).socket.close()
