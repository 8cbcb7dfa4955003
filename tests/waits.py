"""Waiting in tests for something to have happened, instead of sleeping for a guess.

A fixed sleep either wastes time or, on a loaded machine, is too short, and then
the test fails for nothing. These helpers poll a public interface until the
condition holds and fail with :class:`trio.TooSlowError` once a deadline passes.

The commonest case is a subscription sent over a socket: ndjson's ``sub`` and
ttrpc's ``Subscribe`` answer nothing when they land, so :func:`subscribed` asks
the hub, through the :class:`~gateway.core.destination.Destination` interface
(its groups' members), until the subscriber is there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from gateway.core.hub import Hub
from gateway.runtime.gateway import Gateway

__all__ = ["DEADLINE", "POLL", "members", "subscribed", "until", "until_async"]

#: How long a wait may take before the test fails: generous, for a loaded machine.
DEADLINE = 10.0
#: How often a condition is looked at again.
POLL = 0.005


async def until(
    predicate: Callable[[], bool], *, timeout: float = DEADLINE, poll: float = POLL
) -> None:
    """Return once ``predicate()`` is true; raise ``trio.TooSlowError`` after ``timeout``."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(poll)


async def until_async(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float = DEADLINE, poll: float = POLL
) -> None:
    """:func:`until` for a predicate that must be awaited (an HTTP request, a thread)."""
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(poll)


def members(hub: Hub | Gateway, destination: str, group: str | None = None) -> int:
    """Subscribers of ``destination`` now, over every group (or in ``group``); 0 while
    the destination does not exist."""
    if isinstance(hub, Gateway):
        hub = hub.hub
    found = hub.destinations().get(destination)
    if found is None:
        return 0
    return sum(g.members for g in found.figures().groups if group is None or g.name == group)


async def subscribed(
    hub: Hub | Gateway,
    destination: str,
    count: int = 1,
    *,
    group: str | None = None,
    timeout: float = DEADLINE,
) -> None:
    """Wait until ``destination`` has at least ``count`` subscribers (in ``group`` if
    given): the subscriptions sent over sockets have landed in the hub."""
    await until(lambda: members(hub, destination, group) >= count, timeout=timeout)
