"""TEMPLATE: the server driver, a :class:`~gateway.sdk.Session` that runs the codec.

Copy this folder to start a protocol (see ``docs/codecs.md``). The session
skeleton reads, feeds the codec, calls :meth:`ServerSession.handle` for each
event, writes what is owed once each receipt settles (in order here:
``ordered=True``), keeps the deadlines and the memory budget, and sends
:meth:`ServerSession.error_reply` before closing on a protocol error. The
driver only says what each event means for the hub.
"""

from __future__ import annotations

from gateway.sdk import (
    Message,
    Outcome,
    Receipt,
    RemoteProtocolError,
    ServerConnection,
    Session,
)

from .codec import Limits, ServerCodec
from .events import Error, Failed, Ok, Publish

__all__ = ["ServerSession"]


class ServerSession(Session):
    """One accepted connection: each ``PUB`` published, answered once it is safe."""

    codec: ServerCodec

    def __init__(self, conn: ServerConnection) -> None:
        super().__init__(
            conn.stream,
            ServerCodec(Limits(max_line=conn.options["max_line"])),
            log=conn.log,
            shutdown=conn.shutdown,
            max_answers=conn.options["window"],
            ordered=True,
        )
        self.conn = conn

    async def handle(self, event: Publish) -> None:
        conn = self.conn
        message = Message(conn.listener.destination, event.data, source=conn.source())
        await self.submit(lambda: conn.hub.publish([message]), self._answer)

    def _answer(self, receipt: Receipt) -> bytes:
        """``OK`` once the publish is safe; ``FAIL`` (the client resends) otherwise."""
        if receipt.outcome is Outcome.DELIVERED:
            return self.codec.send(Ok())
        outcome = receipt.outcome.name.lower() if receipt.outcome is not None else "unsettled"
        return self.codec.send(Failed(receipt.reason or outcome))

    def error_reply(self, error: RemoteProtocolError) -> bytes:
        return self.codec.send(Error(str(error)))
