"""Taps: passive views of the messages passing through a destination.

A subscriber is part of the flow: it holds credit, its unacked deliveries hold
the publishers' receipts, and a slow one makes every sender wait. An operator
who wants to *watch* the traffic must not be part of it. A :class:`Tap` sees
each message as the hub stores it into a destination whose name matches the
tap's pattern (after routing), never takes part in a receipt, credit or
backpressure, and when its reader cannot keep up it drops what does not fit
in its bounded queue and counts the drops. ``gateway tap`` reads one over the
admin API (:func:`render`).
"""

from __future__ import annotations

import base64
import fnmatch
import json
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol

import trio

from gateway.core.filters import Filter
from gateway.core.model import Message

__all__ = ["Tap", "TapEvent", "Tappable", "render", "stream", "tap_filter"]

#: Messages and bytes a tap keeps for its reader before it drops.
MAX_QUEUED = 10_000
MAX_QUEUED_BYTES = 16 * 1024 * 1024


class TapEvent:
    """One message seen by a tap, and where (after routing) it was stored."""

    __slots__ = ("destination", "message")

    def __init__(self, destination: str, message: Message) -> None:
        self.destination = destination
        self.message = message


class Tap:
    """A bounded, lossy, passive view of the destinations matching ``pattern``."""

    def __init__(
        self,
        pattern: str,
        filter: Filter | None = None,
        *,
        max_queued: int = MAX_QUEUED,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self.pattern = pattern
        self.filter = filter
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        #: Messages seen (matching the filter), queued or dropped.
        self.seen = 0
        #: Messages dropped because the reader did not keep up.
        self.dropped = 0
        self.closed = False
        self._glob = any(c in pattern for c in "*?[")
        self._queue: deque[TapEvent] = deque()
        self._queued_bytes = 0
        self._arrived = trio.lowlevel.ParkingLot()

    def watches(self, destination: str) -> bool:
        if self._glob:
            return fnmatch.fnmatchcase(destination, self.pattern)
        return destination == self.pattern

    def offer(self, destination: str, messages: Sequence[Message]) -> None:
        """Messages were stored into ``destination``: keep copies if there is room.

        Never waits and never fails: the publisher must not notice a tap.
        """
        if self.closed:
            return
        selected: Sequence[Message] = messages
        if self.filter is not None:
            selected = [messages[i] for i in self.filter.select(messages)]
        for message in selected:
            self.seen += 1
            size = message.size
            if (
                len(self._queue) >= self.max_queued
                or self._queued_bytes + size > self.max_queued_bytes
            ):
                self.dropped += 1
                continue
            self._queue.append(TapEvent(destination, message))
            self._queued_bytes += size
        if self._queue and self._arrived:
            self._arrived.unpark_all()

    async def receive(self, max_count: int = 1000) -> list[TapEvent]:
        """What the tap has seen since the last call (waits for at least one)."""
        while not self._queue:
            if self.closed:
                raise trio.EndOfChannel("the tap is closed")
            await self._arrived.park()
        out: list[TapEvent] = []
        while self._queue and len(out) < max_count:
            event = self._queue.popleft()
            self._queued_bytes -= event.message.size
            out.append(event)
        return out

    def close(self) -> None:
        self.closed = True
        self._queue.clear()
        self._queued_bytes = 0
        self._arrived.unpark_all()


class Tappable(Protocol):
    """Where taps are opened and closed (the hub): all the admin API's tap needs."""

    def tap(self, pattern: str, filter: Filter | None = None) -> Tap:
        """A tap on the destinations matching ``pattern``."""
        ...

    def untap(self, tap: Tap) -> None:
        """Close ``tap``; it sees nothing more."""
        ...


def render(event: TapEvent, fmt: Literal["json", "pretty"] = "json") -> str:
    """One line describing ``event``: a JSON object, or a short line for people."""
    m = event.message
    try:
        text: str | None = m.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if fmt == "pretty":
        source = m.source
        origin = f"{source.protocol}:{source.listener} {source.peer}" if source else "-"
        headers = " ".join(f"{k}={v}" for k, v in m.headers.items())
        body = text if text is not None else f"<{len(m.body)} bytes>"
        return f"{event.destination} [{origin}] {headers + ' ' if headers else ''}{body}"
    out: dict[str, Any] = {"dest": event.destination}
    if text is not None:
        out["body"] = text
    else:
        out["body_b64"] = base64.b64encode(m.body).decode("ascii")
    if m.headers:
        out["headers"] = dict(m.headers)
    if m.content_type:
        out["content_type"] = m.content_type
    if m.source is not None:
        out["source"] = {
            "protocol": m.source.protocol,
            "listener": m.source.listener,
            "peer": m.source.peer,
        }
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


async def stream(
    tap: Tap,
    write: Callable[[bytes], Awaitable[None]],
    fmt: Literal["json", "pretty"] = "json",
    *,
    report_every: float = 5.0,
) -> None:
    """Write every event ``tap`` sees as one line, until cancelled or ``write`` fails.

    Drops are reported in-band, at most every ``report_every`` seconds, as a
    line ``{"dropped": N}`` (json) or ``-- N dropped`` (pretty), so the reader
    knows its view has gaps.
    """
    reported = 0
    last_report = trio.current_time()
    while True:
        events = await tap.receive()
        lines = [render(e, fmt) for e in events]
        now = trio.current_time()
        if tap.dropped != reported and now - last_report >= report_every:
            reported, last_report = tap.dropped, now
            lines.append(
                json.dumps({"dropped": reported}) if fmt == "json" else f"-- {reported} dropped"
            )
        await write(("\n".join(lines) + "\n").encode())


def tap_filter(text: str | None) -> Filter | None:
    """The filter ``--filter`` (or ``filter=``) names: the ndjson ``sub`` JSON form."""
    if not text:
        return None
    try:
        return Filter.from_json(json.loads(text))
    except json.JSONDecodeError as e:
        raise ValueError(f"a filter is JSON, as ndjson's sub takes it: {e}") from None
