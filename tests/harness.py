"""Test helpers: run a real gateway in-process on loopback ports chosen by the OS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gateway.config import parse
from gateway.registry import Registry
from gateway.runtime import Gateway


@asynccontextmanager
async def running_gateway(
    data: dict[str, Any], *, base_dir: Path | None = None, registry: Registry | None = None
) -> AsyncIterator[Gateway]:
    """Start a gateway from a config dict; shut it down (draining) on exit."""
    config = parse(data, source="<test>", base_dir=base_dir, registry=registry)
    gateway = Gateway(config, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        try:
            yield gateway
        finally:
            gateway.shutdown()


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
