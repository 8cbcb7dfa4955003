"""Test helpers: run a real gateway in-process on loopback ports chosen by the OS, and
drive background calls and subscriptions step by step."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

from gateway.config.loader import parse
from gateway.core.destination import Delivery, Subscription
from gateway.runtime.gateway import Gateway
from gateway.runtime.registry import Registry


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


@dataclass
class Task:
    """A background call whose completion (or error) a test can look at."""

    done: bool = False
    result: Any = None
    error: BaseException | None = None
    finished: trio.Event = field(default_factory=trio.Event)

    async def wait(self) -> Any:
        """The call's result once it returned (its error, raised)."""
        await self.finished.wait()
        if self.error is not None:
            raise self.error
        return self.result


def start(nursery: trio.Nursery, fn: Callable[..., Awaitable[Any]], *args: Any) -> Task:
    task = Task()

    async def run() -> None:
        try:
            task.result = await fn(*args)
        except Exception as e:
            task.error = e
        task.done = True
        task.finished.set()

    nursery.start_soon(run)
    return task


async def settle() -> None:
    """Let every other task run until it blocks."""
    await trio.testing.wait_all_tasks_blocked()


async def receive_now(sub: Subscription, max_count: int | None = None) -> list[Delivery]:
    """What ``receive`` returns without waiting ([] when it would block)."""
    with trio.CancelScope() as scope:
        scope.cancel()
        return await sub.receive(max_count)
    return []
