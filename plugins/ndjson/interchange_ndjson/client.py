"""A small async ndjson client on trio: publish with acks, subscribe, ack.

For scripts, tests and the benchmark. One task may publish and one may
receive at a time; answers to publishes are matched by id. The codec refuses
(``LocalProtocolError``, nothing sent) what its state does not allow: acking
a tag that was not delivered or is settled, replying to a delivery that is not
a call, ``credit``/``unsub`` without a subscription, subscribing twice.
"""

from __future__ import annotations

import itertools
import ssl
from collections import deque
from collections.abc import Mapping

import trio

from gateway.sdk import Filter, LocalProtocolError, RemoteProtocolError, start_tls

from .codec import NEED_DATA, ClientCodec
from .events import (
    Ack,
    Call,
    ConnectionClosed,
    Credit,
    Deliver,
    End,
    Error,
    Event,
    Nack,
    Publish,
    Published,
    PublishMany,
    Replied,
    ReplyTo,
    Subscribe,
    Unsubscribe,
)

__all__ = ["NdjsonClient"]

RECEIVE_SIZE = 65536


class NdjsonClient:
    """A client connection; use ``async with await NdjsonClient.connect(...)``."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = ClientCodec()
        self._ids = itertools.count(1)
        self._answers: dict[int, Published | Replied] = {}
        self._deliveries: deque[Deliver | End] = deque()
        self._changed = trio.lowlevel.ParkingLot()
        self._reading = False
        self._closed: BaseException | None = None
        self._send_lock = trio.Lock()

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> NdjsonClient:
        """Connect to ``host:port``; over TLS with ``ssl_context``, verifying the
        server as ``server_hostname`` (default: ``host``)."""
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if ssl_context is not None:
            stream = await start_tls(stream, ssl_context, server_hostname or host)
        return cls(stream)

    async def __aenter__(self) -> NdjsonClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def _send(self, *events: Event) -> None:
        """Send ``events`` in order, encoded under the lock so the codec's state follows
        the wire. If the codec refuses one, those before it are still sent."""
        async with self._send_lock:
            out = bytearray()
            refused = None
            for event in events:
                try:
                    out += self.codec.send(event)
                except LocalProtocolError as e:
                    refused = e
                    break
            if out:
                await self.stream.send_all(out)
            if refused is not None:
                raise refused

    # -- publishing -------------------------------------------------------------
    async def publish(
        self,
        body: bytes,
        destination: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> Published:
        """Publish one message and wait for the gateway's answer."""
        ids = await self.publish_nowait(
            [body], destination, headers=headers, content_type=content_type
        )
        return (await self.wait_answers(ids))[0]

    async def publish_nowait(
        self,
        bodies: list[bytes],
        destination: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> list[int]:
        """Send publishes without waiting for answers; return their ids."""
        ids = [next(self._ids) for _ in bodies]
        fields = (destination, dict(headers or {}), content_type)
        await self._send(*(Publish(b, *fields, i) for b, i in zip(bodies, ids, strict=True)))
        return ids

    async def wait_answers(self, ids: list[int]) -> list[Published]:
        """Wait until every publish in ``ids`` has been answered; return the answers."""
        answers = await self._wait(ids)
        assert all(isinstance(a, Published) for a in answers)
        return answers  # type: ignore[return-value]

    async def _wait(self, ids: list[int]) -> list[Published | Replied]:
        while not all(i in self._answers for i in ids):
            await self._pump()
        return [self._answers.pop(i) for i in ids]

    async def publish_many(self, messages: list[Publish]) -> Published:
        """Publish ``messages`` as one batch; the answer has each one's result."""
        ident = next(self._ids)
        await self._send(PublishMany(tuple(messages), ident))
        (answer,) = await self.wait_answers([ident])
        return answer

    async def call(
        self,
        body: bytes,
        destination: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        timeout: float = 30.0,
    ) -> Replied | Published:
        """Call the service subscribed to ``destination``: its reply, or the ``ack``
        that says why there was none."""
        ident = next(self._ids)
        await self._send(Call(body, destination, dict(headers or {}), content_type, ident, timeout))
        (answer,) = await self._wait([ident])
        return answer

    async def reply(
        self,
        tag: int,
        body: bytes = b"",
        *,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        code: int = 0,
        error: str = "",
    ) -> None:
        """Answer the call delivered as ``tag``."""
        await self._send(ReplyTo(tag, body, dict(headers or {}), content_type, code, error))

    # -- subscribing ------------------------------------------------------------
    async def subscribe(
        self,
        destination: str,
        group: str | None = None,
        *,
        credit: int | None = None,
        window: int = 100,
        filter: Filter | None = None,
        start: str | int | None = None,
        end: str | int | None = None,
    ) -> None:
        await self._send(Subscribe(destination, group, credit, window, filter, start, end))

    async def unsubscribe(self, destination: str) -> None:
        await self._send(Unsubscribe(destination))

    async def grant(self, destination: str, n: int) -> None:
        await self._send(Credit(destination, n))

    async def receive(self) -> Deliver | End:
        """The next delivery to any subscription of this connection, or the
        :class:`End` of a finite one."""
        while not self._deliveries:
            await self._pump()
        return self._deliveries.popleft()

    async def ack(self, *tags: int) -> None:
        await self._send(*(Ack(t) for t in tags))

    async def nack(self, tag: int, *, requeue: bool = True) -> None:
        await self._send(Nack(tag, requeue))

    # -- reading ----------------------------------------------------------------
    async def _pump(self) -> None:
        """Read once (or wait for the task that is reading) and sort what arrived."""
        if self._closed is not None:
            raise self._closed
        if self._reading:
            await self._changed.park()
            return
        self._reading = True
        try:
            self.codec.receive_data(await self.stream.receive_some(RECEIVE_SIZE))
            while (event := self.codec.next_event()) is not NEED_DATA:
                self._sort(event)
                if isinstance(event, ConnectionClosed):  # (then every time)
                    break
        except RemoteProtocolError as e:  # a line the codec refused
            self._closed = e
        finally:
            self._reading = False
            self._changed.unpark_all()
        if self._closed is not None and not self._deliveries:
            raise self._closed

    def _sort(self, event: object) -> None:
        if isinstance(event, Published | Replied):
            self._answers[event.id] = event  # type: ignore[index]
        elif isinstance(event, Deliver | End):
            self._deliveries.append(event)
        elif isinstance(event, Error):
            self._closed = RemoteProtocolError(event.message)
        elif isinstance(event, ConnectionClosed):
            self._closed = self._closed or trio.BrokenResourceError(
                "the gateway closed the connection"
            )
