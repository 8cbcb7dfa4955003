"""Reload without a restart: kept listeners keep their connections, removed ones drain,
added ones start, a bad config changes nothing, rotated certificates take effect."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port
from interchange_ndjson.client import NdjsonClient
from waits import subscribed, until

from gateway.config.certs import init_dir
from gateway.config.loader import load
from gateway.ops.reload import ReloadRefused, reload_file
from gateway.runtime.gateway import Gateway


def listener(name: str, **extra: Any) -> str:
    lines = [f'[[listeners]]\nname = "{name}"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"']
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def write(path: Path, *parts: str) -> Path:
    path.write_text('[gateway]\ndrain_timeout = "2s"\n' + "".join(parts))
    return path


async def start(nursery: trio.Nursery, path: Path) -> Gateway:
    gateway = Gateway(load(path))
    await nursery.start(gateway.run)
    return gateway


async def client(gw: Gateway, name: str) -> NdjsonClient:
    return await NdjsonClient.connect(*host_port(gw.addresses[name][0]))


async def test_a_reload_while_the_listeners_start_is_refused_and_harms_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin endpoint (or a worker's control channel) may ask for a reload
    before every listener has started: it is refused, and the start goes on."""
    import gateway.runtime.gateway as runtime

    path = write(tmp_path / "gw.toml", listener("first"), listener("second"))
    gate = trio.Event()
    starting = trio.Event()
    serve = runtime.serve_listener

    async def slow(*args: Any, **kwargs: Any) -> None:
        starting.set()
        await gate.wait()
        await serve(*args, **kwargs)

    monkeypatch.setattr(runtime, "serve_listener", slow)
    async with trio.open_nursery() as nursery:
        gw = Gateway(load(path))
        nursery.start_soon(gw.run)
        await starting.wait()
        with pytest.raises(ReloadRefused, match="still starting"):
            await gw.reload(load(path))
        gate.set()
        await until(lambda: gw.serving_since is not None)
        assert set(gw.addresses) == {"first", "second"}
        await gw.reload(load(path))
        gw.shutdown()


async def test_a_reload_under_traffic_keeps_unchanged_listeners_and_loses_nothing(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "gw.toml", listener("keep"), listener("old"))
    async with trio.open_nursery() as nursery:
        gw = await start(nursery, path)
        sub = await client(gw, "keep")
        await sub.subscribe("logs", window=1000)
        await subscribed(gw, "logs")
        pub = await client(gw, "keep")
        leaving = await client(gw, "old")
        acked: list[str] = []
        sent = 0

        async def consume() -> None:
            while True:
                delivery = await sub.receive()
                await sub.ack(delivery.tag)  # type: ignore[union-attr]

        async def publish() -> None:
            nonlocal sent
            for _ in range(200):
                answer = await pub.publish(b"x", "logs")
                sent += 1
                acked.append(answer.status)
                await trio.sleep(0.005)  # paced, so that the traffic spans the reload

        nursery.start_soon(consume)
        async with trio.open_nursery() as traffic:
            traffic.start_soon(publish)
            await until(lambda: sent >= 50)  # under way
            write(path, listener("keep"), listener("new"))
            assert "removed listeners old" in await reload_file(gw)
        assert acked == ["delivered"] * 200  # the publisher's connection never dropped
        assert set(gw.addresses) == {"keep", "new"}
        fresh = await client(gw, "new")
        assert (await fresh.publish(b"y", "logs")).status == "delivered"
        with trio.fail_after(5):  # the removed listener's connection drained and closed
            while await leaving.stream.receive_some():
                pass
        gw.shutdown()
        nursery.cancel_scope.cancel()


async def test_a_bad_config_is_refused_and_the_running_one_stays(tmp_path: Path) -> None:
    path = write(tmp_path / "gw.toml", listener("nd"))
    async with trio.open_nursery() as nursery:
        gw = await start(nursery, path)
        before = gw.addresses
        path.write_text(path.read_text() + "bogus_key = 1\n")
        with pytest.raises(ReloadRefused, match="bogus_key"):
            await reload_file(gw)
        path.write_text(
            '[gateway]\nbuffer_bytes = "1MiB"\n' + listener("nd")
        )  # valid, but needs a restart
        with pytest.raises(ReloadRefused, match="needs a restart"):
            await reload_file(gw)
        assert gw.addresses == before
        c = await client(gw, "nd")
        assert (await c.publish(b"still here", "logs")).status == "delivered"
        gw.shutdown()


async def test_the_store_settings_and_durability_need_a_restart(tmp_path: Path) -> None:
    durable = '[[destinations]]\nname = "logs"\nstore = "embedded"\n'
    path = write(tmp_path / "gw.toml", listener("nd") + durable)
    async with trio.open_nursery() as nursery:
        gw = await start(nursery, path)
        assert gw.store is not None
        path.write_text('[store]\nfsync = "always"\n' + listener("nd") + durable)
        with pytest.raises(ReloadRefused, match=r"\[store\]"):
            await reload_file(gw)
        path.write_text(listener("nd"))  # no durable destination left: the store would close
        with pytest.raises(ReloadRefused, match="durable"):
            await reload_file(gw)
        c = await client(gw, "nd")
        assert (await c.publish(b"kept", "logs")).status == "delivered"
        assert gw.store.stats()["events"] == 1
        gw.shutdown()


def _tls_listener(certs: dict[str, Path]) -> str:
    return listener("tls") + (
        f'[listeners.tls]\ncert = "{certs["server_cert"]}"\nkey = "{certs["server_key"]}"\n'
    )


async def _tls_client(gw: Gateway, ca: Path) -> trio.SSLStream[trio.SocketStream]:
    context = ssl.create_default_context(cafile=str(ca))
    tcp = await trio.open_tcp_stream(*host_port(gw.addresses["tls"][0]))
    stream = trio.SSLStream(tcp, context, server_hostname="localhost")
    await stream.do_handshake()
    return stream


async def _ping(stream: trio.abc.Stream) -> bytes:
    await stream.send_all(b'{"op":"ping"}\n')
    with trio.fail_after(5):
        return bytes(await stream.receive_some(100))


async def test_rotated_certificates_take_effect_for_new_connections(tmp_path: Path) -> None:
    certs = init_dir(tmp_path / "certs")
    old_ca = tmp_path / "old-ca.pem"
    old_ca.write_bytes(certs["ca_cert"].read_bytes())
    path = write(tmp_path / "gw.toml", _tls_listener(certs))
    async with trio.open_nursery() as nursery:
        gw = await start(nursery, path)
        before = await _tls_client(gw, old_ca)
        init_dir(tmp_path / "certs", force=True)  # a new CA and server certificate, same paths
        await reload_file(gw)
        after = await _tls_client(gw, certs["ca_cert"])  # the new chain is served
        assert b"pong" in await _ping(after)
        assert b"pong" in await _ping(before)  # the connection made before rotation stays
        with pytest.raises(trio.BrokenResourceError):
            await _tls_client(gw, old_ca)  # and the old certificate is no longer served
        gw.shutdown()


def test_sighup_and_gateway_reload_apply_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "gw.toml", listener("a"), '[admin]\nbind = "127.0.0.1:0"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", str(path)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        lines: list[str] = []

        def wait_for(text: str) -> str:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                line = proc.stderr.readline()  # type: ignore[union-attr]
                lines.append(line)
                if text in line:
                    return line
            raise AssertionError(f"no {text!r} in:\n{''.join(lines)}")

        admin = wait_for("admin:").split()[-1]
        wait_for("serving:")
        write(path, listener("a"), listener("b"), '[admin]\nbind = "127.0.0.1:0"\n')
        proc.send_signal(signal.SIGHUP)
        assert "added listeners b" in wait_for("reloaded")
        path.write_text(path.read_text() + "bogus = 1\n")
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "reload", "--url", f"http://{admin}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 1
        assert "bogus" in result.stderr
        assert proc.poll() is None  # still running on the config it had
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
