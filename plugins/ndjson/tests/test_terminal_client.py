"""``python -m interchange_ndjson``: the README's walkthrough, without ``nc``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.__main__ import format_json, format_text, main
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver
from waits import subscribed

from gateway.config.certs import init_dir

CLIENT = [sys.executable, "-m", "interchange_ndjson"]


async def test_sub_prints_and_acks_what_pub_publishes() -> None:
    config = {"listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}]}
    async with running_gateway(config) as gw:
        host, port = host_port(gw.addresses["nd"][0])
        where = ["--host", host, "--port", str(port)]
        async with trio.open_nursery() as nursery:
            sub = await nursery.start(
                lambda task_status: trio.run_process(
                    [*CLIENT, *where, "sub", "logs", "--count", "2"],
                    stdout=subprocess.PIPE,
                    task_status=task_status,
                )
            )
            # The subscriber is in before the publish (the process takes a while to start).
            await subscribed(gw, "logs", timeout=30)
            with trio.fail_after(30):
                pub = await trio.run_process(
                    [*CLIENT, *where, "pub", "logs"],
                    stdin=b'{"hello":"world"}\nsecond line\n',
                    capture_stdout=True,
                )
                # Answered only once the subscriber printed and acked each message.
                assert pub.stdout == b"delivered\ndelivered\n"
                printed = b""
                while chunk := await sub.stdout.receive_some():
                    printed += chunk
                await sub.wait()
        assert sub.returncode == 0
        assert printed == b'{"hello":"world"}\nsecond line\n'


ND = {"listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}]}


async def _sub_output(gw: Any, args: list[str], publish: Any, *, group: str | None = None) -> bytes:
    """Run ``sub`` with ``args`` until it exits (give it ``--count``), calling ``publish``
    once it subscribed; return what it printed."""
    async with trio.open_nursery() as nursery:
        sub = await nursery.start(
            lambda task_status: trio.run_process(
                [*CLIENT, *args], stdout=subprocess.PIPE, task_status=task_status
            )
        )
        await subscribed(gw, "events", group=group, timeout=30)
        with trio.fail_after(30):
            await publish()
            printed = b""
            while chunk := await sub.stdout.receive_some():
                printed += chunk
            await sub.wait()
    assert sub.returncode == 0
    return printed


async def _publish(address: str, *messages: tuple[bytes, dict[str, str]]) -> None:
    async with await NdjsonClient.connect(*host_port(address)) as client:
        for body, headers in messages:
            assert (await client.publish(body, "events", headers=headers)).status == "delivered"


async def test_sub_prints_no_blank_line_for_a_header_only_event() -> None:
    async with running_gateway(ND) as gw:
        address = gw.addresses["nd"][0]
        host, port = host_port(address)
        printed = await _sub_output(
            gw,
            ["--host", host, "--port", str(port), "sub", "events", "--count", "2"],
            lambda: _publish(address, (b"", {"kind": "tick"}), (b"text", {})),
        )
    assert printed == b"<no body>\ntext\n"


async def test_sub_with_group_filter_and_headers() -> None:
    async with running_gateway(ND) as gw:
        address = gw.addresses["nd"][0]
        host, port = host_port(address)
        args = ["--host", host, "--port", str(port), "sub", "events", "--count", "2"]
        args += ["--group", "ops", "--filter", '[["level","=","error"]]', "--headers"]
        printed = await _sub_output(
            gw,
            args,
            lambda: _publish(
                address,
                (b"", {"level": "error", "id": "1"}),
                (b"skipped", {"level": "info"}),
                (b"disk full", {"level": "error"}),
            ),
            group="ops",
        )
    assert printed.decode().splitlines() == [
        '{"level":"error","id":"1"}',
        '{"level":"error"} disk full',
    ]


async def test_sub_json_prints_one_object_per_delivery() -> None:
    async with running_gateway(ND) as gw:
        address = gw.addresses["nd"][0]
        host, port = host_port(address)
        printed = await _sub_output(
            gw,
            ["--host", host, "--port", str(port), "sub", "events", "--count", "2", "--json"],
            lambda: _publish(address, (b"", {"k": "v"}), (b"two\nlines", {})),
        )
    first, second = (json.loads(line) for line in printed.splitlines())
    assert first == {
        "dest": "events",
        "tag": 1,
        "body": "",
        "headers": {"k": "v"},
        "redelivered": False,
    }
    assert second["body"] == "two\nlines"
    assert second["tag"] == 2


def test_formats_of_a_delivery() -> None:
    binary = Deliver(7, "d", b"\xff\x00", {"h": "1"}, "application/x", True, 41)
    assert format_json(binary) == (
        '{"dest":"d","tag":7,"b64":"/wA=","headers":{"h":"1"},'
        '"content_type":"application/x","redelivered":true,"pos":41}'
    )
    assert format_text(Deliver(1, "d", b"", {})) == "<no body>"
    assert format_text(Deliver(1, "d", b"", {}), headers=True) == "{}"
    assert format_text(Deliver(1, "d", b"x", {"a": "b"}), headers=True) == '{"a":"b"} x'


def test_a_bad_filter_is_refused_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--port", "1", "sub", "events", "--filter", '[["level","~","x"]]'])
    assert exit.value.code == 2
    assert "invalid filter" in capsys.readouterr().err


def test_a_key_without_its_certificate_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--key", "me.key", "pub", "events", "x"])
    assert exit.value.code == 2
    assert "--key needs --cert" in capsys.readouterr().err


async def test_pub_and_sub_over_mtls(tmp_path: Path) -> None:
    certs = init_dir(tmp_path)
    listener = {
        "name": "secure",
        "protocol": "ndjson",
        "bind": "127.0.0.1:0",
        "tls": {
            "cert": str(certs["server_cert"]),
            "key": str(certs["server_key"]),
            "client_ca": str(certs["ca_cert"]),
            "client_auth": "required",
        },
    }
    async with running_gateway({"listeners": [listener]}) as gw:
        host, port = host_port(gw.addresses["secure"][0])
        where = ["--host", host, "--port", str(port), "--ca", str(certs["ca_cert"])]
        where += ["--cert", str(certs["client_cert"]), "--key", str(certs["client_key"])]
        where += ["--server-name", "localhost"]

        async def publish() -> None:
            pub = await trio.run_process(
                [*CLIENT, *where, "pub", "events", "secret"], capture_stdout=True
            )
            assert pub.stdout == b"delivered\n"

        printed = await _sub_output(gw, [*where, "sub", "events", "--count", "1"], publish)
        assert printed == b"secret\n"
        # Without the client certificate the gateway refuses the handshake.
        refused = await trio.run_process(
            [
                *CLIENT,
                "--host",
                host,
                "--port",
                str(port),
                "--ca",
                str(certs["ca_cert"]),
                "--server-name",
                "localhost",
                "pub",
                "events",
                "x",
            ],
            capture_stderr=True,
            check=False,
        )
        assert refused.returncode == 1
        assert b"cannot reach the gateway" in refused.stderr
