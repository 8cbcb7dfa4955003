"""``python -m interchange_ndjson``: the README's walkthrough, without ``nc``."""

from __future__ import annotations

import subprocess
import sys

import trio
from harness import host_port, running_gateway
from waits import subscribed

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
