"""Publishing to and reading from a test gateway over ndjson, from plain (non-trio)
test code: each call runs its own ``trio.run`` while the gateway runs in its thread;
and the command line of ``gateway pipeline`` against it."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import trio
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver, End

from tests.harness import host_port


def publish(
    address: str,
    bodies: Sequence[bytes],
    destination: str = "logs",
    *,
    headers: Mapping[str, str] | None = None,
    content_type: str | None = "application/json",
) -> None:
    """Publish ``bodies`` over ndjson and wait until every one is delivered (stored)."""

    async def main() -> None:
        async with await NdjsonClient.connect(*host_port(address)) as client:
            for start in range(0, len(bodies), 500):
                ids = await client.publish_nowait(
                    list(bodies[start : start + 500]),
                    destination,
                    headers=headers,
                    content_type=content_type,
                )
                answers = await client.wait_answers(ids)
                assert {a.status for a in answers} == {"delivered"}, answers

    trio.run(main)


def read_all(address: str, destination: str, timeout: float = 30.0) -> list[Deliver]:
    """Every message a durable destination holds now, as an ndjson subscriber from
    ``earliest`` to ``latest`` receives it."""

    async def main() -> list[Deliver]:
        got: list[Deliver] = []
        with trio.fail_after(timeout):
            async with await NdjsonClient.connect(*host_port(address)) as client:
                await client.subscribe(destination, start="earliest", end="latest")
                while not isinstance(event := await client.receive(), End):
                    got.append(event)
                    await client.ack(event.tag)
        return got

    return trio.run(main)


def pipeline_command(segment_address: str, *options: str) -> list[str]:
    """``gateway pipeline`` (as ``python -m``, with this interpreter) reading the test
    gateway at ``segment_address``, with ``options``."""
    return [
        sys.executable,
        "-m",
        "gateway.pipeline.command",
        f"--address={segment_address}",
        *options,
    ]
