"""The built-in ``interchange.v1.Messaging`` ttrpc service: the hub for ttrpc clients.

``messaging.proto`` defines it; :func:`messaging_service` builds its
:class:`~.server.Service` for one connection, over the listener's
:class:`~gateway.core.facade.HubFacade` (the only hub API a protocol uses) and a
function that gives the connection's :class:`~gateway.core.model.Source`. Register
it per connection: ``TtrpcSession(stream, {SERVICE: messaging_service(hub,
source)})``.

What each call does (the proto says the same to its clients):

* ``Publish``: a batch (1 to ``max_batch`` messages) is one ``hub.publish``;
  the response waits for the receipt to settle and reports each message's
  outcome, reason and positions, taken from the receipt only, so nothing is
  reported delivered or stored that was not. The call is OK however the
  messages settled; its own errors are for the request as a whole.
* ``Subscribe``: at most once. Each batch of deliveries is written to the
  connection (handed to the socket, not merely queued) and then acked; the
  subscription closes when the call ends, however it ends (the deadline, the
  connection closing: ttrpc has no cancel frame), which hands back to a
  named group what was received and not yet acked.
* ``Consume``: at least once. The first message subscribes with an initial
  credit; later ones carry acks, nacks (requeue or reject), replies to calls
  and credit grants. Deliveries go out only within the credit and the window.
  Closing the subscription at the end hands every unacked delivery back to
  the group for redelivery (the hub's rule).
* ``Call``: ``hub.call`` with the call's deadline as its timeout (else
  ``call_timeout``; at most ``max_call_timeout``); the reply comes back as
  the response, a reply with a non-zero code as that status.

Errors map onto gRPC codes alike in every call:

* an undecodable or invalid request (empty batch, no destination, bad filter
  or bounds, unknown tag, a window over the limit) and a message refused for
  good (``REJECTED``): ``INVALID_ARGUMENT``;
* a destination that cannot exist (an unknown upstream, too many
  destinations; the hub's ``LookupError``): ``NOT_FOUND``;
* the gateway shutting down (the hub closed, ``shutdown`` set) and a call
  nobody answered (``FAILED``: no subscriber, settled without a reply):
  ``UNAVAILABLE``;
* a call whose reply did not come in time, and any call whose ttrpc deadline
  passed first: ``DEADLINE_EXCEEDED``.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

import trio
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError

from gateway.sdk import (
    Delivery,
    Feed,
    FeedStop,
    Filter,
    FilterError,
    HubFacade,
    Message,
    NotACall,
    Outcome,
    Position,
    Receipt,
    Reply,
    Source,
    StartAt,
    StopAt,
    Subscriber,
    Subscription,
    UnknownTag,
)

from . import messaging_pb2 as pb
from .server import CallContext, MessageStream, Service
from .status import Code, TtrpcError

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_MAX_BATCH",
    "DEFAULT_WINDOW",
    "MAX_CALL_TIMEOUT",
    "MAX_WINDOW",
    "SERVICE",
    "messaging_service",
]

#: The service's full name, as clients put it in a Request.
SERVICE = "interchange.v1.Messaging"
#: Most messages in one Publish, by default (as ndjson's batch ``pub``).
DEFAULT_MAX_BATCH = 1000
#: Deliveries unacked at once (Consume) or per batch (Subscribe) unless asked otherwise.
DEFAULT_WINDOW = 100
#: The largest window a client may ask for, by default.
MAX_WINDOW = 10_000
#: Seconds a Call waits for its reply when the ttrpc call has no deadline.
DEFAULT_CALL_TIMEOUT = 30.0
#: The longest a Call waits, whatever its deadline.
MAX_CALL_TIMEOUT = 3600.0
#: Status codes are int32: a reply's error code outside 1..2**31-1 becomes UNKNOWN.
_MAX_CODE = 2**31 - 1
_MIN_INT32 = -(2**31)

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
_OUTCOMES = {
    Outcome.DELIVERED: pb.OUTCOME_DELIVERED,
    Outcome.FAILED: pb.OUTCOME_FAILED,
    Outcome.REJECTED: pb.OUTCOME_REJECTED,
}


def messaging_service(
    hub: HubFacade,
    source: Callable[[], Source],
    *,
    destination: str = "",
    max_batch: int = DEFAULT_MAX_BATCH,
    default_window: int = DEFAULT_WINDOW,
    max_window: int = MAX_WINDOW,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    max_call_timeout: float = MAX_CALL_TIMEOUT,
    share_source: bool = True,
    shutdown: trio.Event | None = None,
) -> Service:
    """The ``interchange.v1.Messaging`` service for one connection.

    ``source()`` is called per Publish and Call for the Source its messages
    carry (the connection's peer and identity, the receive time).
    ``destination`` stands in for an empty destination (empty: such a request
    is INVALID_ARGUMENT). ``share_source``: deliveries tell where their
    message came from (protocol, listener, peer, TLS identity, time).
    ``shutdown``, when set, refuses new Publishes and Calls, ends Subscribe
    streams and lets Consume streams settle what is in flight, all with
    UNAVAILABLE, so a draining gateway is not kept waiting by long streams.
    """
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    if not 1 <= default_window <= max_window:
        raise ValueError("default_window must be at least 1 and at most max_window")
    if not 0 < call_timeout <= max_call_timeout:
        raise ValueError("call_timeout must be above 0 and at most max_call_timeout")
    messaging = _Messaging(
        hub,
        source,
        destination=destination,
        max_batch=max_batch,
        default_window=default_window,
        max_window=max_window,
        call_timeout=call_timeout,
        max_call_timeout=max_call_timeout,
        share_source=share_source,
        shutdown=shutdown,
    )
    service = Service(SERVICE)
    service.unary("Publish", messaging.publish)
    service.server_streaming("Subscribe", messaging.subscribe)
    service.bidi("Consume", messaging.consume)
    service.unary("Call", messaging.call)
    return service


# -- errors --------------------------------------------------------------------------------


def _invalid(message: str) -> TtrpcError:
    return TtrpcError(Code.INVALID_ARGUMENT, message)


def _shutting_down() -> TtrpcError:
    return TtrpcError(Code.UNAVAILABLE, "the gateway is shutting down")


def _decode(cls: Any, data: bytes) -> Any:
    """``data`` as a ``cls`` message; INVALID_ARGUMENT when it is not one."""
    try:
        return cls.FromString(data)
    except DecodeError as e:
        raise _invalid(f"undecodable {cls.__name__}: {e or 'invalid wire-format data'}") from None


class _Ending:
    """How a streaming call's tasks end it: the first to say wins, the rest are cancelled.

    Tasks record their status here instead of raising it, so that it leaves the
    nursery as itself (the server answers a bare :class:`TtrpcError` with its
    code; an exception group would be UNKNOWN).
    """

    __slots__ = ("_ended", "_scope", "error")

    def __init__(self, scope: trio.CancelScope) -> None:
        self._scope = scope
        self._ended = False
        #: The status the call ends with (None: OK).
        self.error: TtrpcError | None = None

    def end(self, error: TtrpcError | None = None) -> None:
        if not self._ended:
            self._ended = True
            self.error = error
            self._scope.cancel()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def when_done(self, feed: Feed) -> None:
        """End once the feed's pump stopped and the client settled what it was sent: OK
        at the end of a finite read, UNAVAILABLE when the gateway drains or closes."""
        if feed.done:
            self.end(None if feed.stopped is FeedStop.END else _shutting_down())

    async def stopped(self, feed: Feed, why: FeedStop) -> None:
        self.when_done(feed)


class _Messaging:
    """The handlers of one connection's service (see :func:`messaging_service`)."""

    def __init__(
        self,
        hub: HubFacade,
        source: Callable[[], Source],
        *,
        destination: str,
        max_batch: int,
        default_window: int,
        max_window: int,
        call_timeout: float,
        max_call_timeout: float,
        share_source: bool,
        shutdown: trio.Event | None,
    ) -> None:
        self.hub = hub
        self.source = source
        self.destination = destination
        self.max_batch = max_batch
        self.default_window = default_window
        self.max_window = max_window
        self.call_timeout = call_timeout
        self.max_call_timeout = max_call_timeout
        self.share_source = share_source
        self.shutdown = shutdown

    # -- Publish ----------------------------------------------------------------------------
    async def publish(self, ctx: CallContext, payload: bytes) -> bytes:
        """Publish the batch, wait for its receipt, report each message's result."""
        request = _decode(pb.PublishRequest, payload)
        n = len(request.messages)
        if not n:
            raise _invalid("a Publish needs at least one message")
        if n > self.max_batch:
            raise _invalid(f"a batch of {n} messages is over the limit of {self.max_batch}")
        self._refuse_while_draining()
        source = self.source()
        messages = [
            self._message(m, source, f"messages[{i}]") for i, m in enumerate(request.messages)
        ]
        try:
            receipt = await self.hub.publish(messages)
        except trio.ClosedResourceError:
            raise _shutting_down() from None
        await receipt.wait()
        return _published(receipt, n).SerializeToString()

    # -- Call ---------------------------------------------------------------------------------
    async def call(self, ctx: CallContext, payload: bytes) -> bytes:
        """Route the request to its destination's subscribers; answer with the first reply."""
        request = _decode(pb.CallRequest, payload)
        message = self._message(request.message, self.source(), "the request")
        self._refuse_while_draining()
        if math.isinf(ctx.deadline):
            timeout = self.call_timeout
        else:
            timeout = min(ctx.deadline - trio.current_time(), self.max_call_timeout)
            if timeout <= 0:
                raise TtrpcError(Code.DEADLINE_EXCEEDED, "context deadline exceeded")
        try:
            receipt = await self.hub.call(message, timeout)
        except trio.ClosedResourceError:
            raise _shutting_down() from None
        await receipt.wait()
        reply = receipt.reply
        if reply is None:
            raise _call_failed(receipt)
        response = pb.CallResponse(body=reply.body, headers=reply.headers)
        if reply.content_type is not None:
            response.content_type = reply.content_type
        if reply.status != 0:
            # The service's own error; what else it replied travels in the details.
            code = reply.status if 0 < reply.status <= _MAX_CODE else Code.UNKNOWN
            details: tuple[any_pb2.Any, ...] = ()
            if reply.body or reply.headers or reply.content_type is not None:
                detail = any_pb2.Any()
                detail.Pack(response)
                details = (detail,)
            raise TtrpcError(code, reply.message, details)
        return bytes(response.SerializeToString())

    # -- Subscribe ----------------------------------------------------------------------------
    async def subscribe(self, ctx: CallContext, payload: bytes, out: MessageStream) -> None:
        """Stream deliveries, acking each batch once it is in the connection's output."""
        request = _decode(pb.SubscribeRequest, payload)
        with self._open(request, credit=None) as sub:
            async with trio.open_nursery() as nursery:
                ending = _Ending(nursery.cancel_scope)
                if self.shutdown is not None:
                    nursery.start_soon(self._end_at_shutdown, ending)
                subscriber = Subscriber(nursery, ack="write")
                subscriber.add(sub, self._sender(out), flush=out.flush, ended=ending.stopped)
        ending.check()

    async def _end_at_shutdown(self, ending: _Ending) -> None:
        assert self.shutdown is not None
        await self.shutdown.wait()
        ending.end(_shutting_down())

    # -- Consume ------------------------------------------------------------------------------
    async def consume(
        self, ctx: CallContext, messages: AsyncIterator[bytes], out: MessageStream
    ) -> None:
        """Subscribe with the first message; then deliver within credit and settle by tag.

        Draining stops the pump; the stream ends once what it sent was settled.
        """
        try:
            first = await anext(messages)
        except StopAsyncIteration:
            raise _invalid("Consume needs a first ConsumeRequest that subscribes") from None
        request = _decode(pb.ConsumeRequest, first)
        if not request.HasField("subscribe"):
            raise _invalid("the first ConsumeRequest must subscribe")
        if request.acks or request.nacks or request.replies:
            raise _invalid("the first ConsumeRequest only subscribes: nothing is delivered yet")
        credit = request.credit if request.HasField("credit") else None
        with self._open(request.subscribe, credit=credit) as sub:
            async with trio.open_nursery() as nursery:
                ending = _Ending(nursery.cancel_scope)
                subscriber = Subscriber(nursery)
                feed = subscriber.add(sub, self._sender(out), ended=ending.stopped)
                if self.shutdown is not None:
                    nursery.start_soon(self._drain, subscriber)
                nursery.start_soon(self._settle_loop, messages, subscriber, feed, ending)
        ending.check()

    async def _settle_loop(
        self,
        messages: AsyncIterator[bytes],
        subscriber: Subscriber,
        feed: Feed,
        ending: _Ending,
    ) -> None:
        """Apply the client's acks, nacks, replies and grants until it half-closes."""
        try:
            async for data in messages:
                self._settle(_decode(pb.ConsumeRequest, data), subscriber, feed)
                ending.when_done(feed)
        except TtrpcError as e:
            ending.end(e)
            return
        # The client sends nothing more: what it did not ack goes back to the group.
        ending.end()

    def _settle(self, request: Any, subscriber: Subscriber, feed: Feed) -> None:
        if request.HasField("subscribe"):
            raise _invalid("a Consume stream subscribes once, with its first message")
        try:
            if request.acks:
                subscriber.ack_many(request.acks)
            for nack in request.nacks:
                if nack.requeue:
                    subscriber.nack(nack.tag)
                else:
                    reason = nack.reason or f"rejected by subscriber {self.source().peer}".rstrip()
                    subscriber.nack(
                        nack.tag, requeue=False, outcome=Outcome.REJECTED, reason=reason
                    )
            for reply in request.replies:
                if reply.code < 0:
                    raise _invalid(
                        f"reply to {reply.tag}: a code is not negative, not {reply.code}"
                    )
                subscriber.reply(reply.tag, _reply(reply))
        except (UnknownTag, NotACall) as e:
            raise _invalid(str(e)) from None
        if request.credit:
            feed.sub.grant(request.credit)

    async def _drain(self, subscriber: Subscriber) -> None:
        """At shutdown: no new deliveries; the stream ends once those in flight settled."""
        assert self.shutdown is not None
        await self.shutdown.wait()
        subscriber.drain()

    # -- shared -------------------------------------------------------------------------------
    def _refuse_while_draining(self) -> None:
        if self.shutdown is not None and self.shutdown.is_set():
            raise _shutting_down()

    def _message(self, m: Any, source: Source, what: str) -> Message:
        """A protobuf ``Message`` as the hub's, with this connection's source."""
        destination = m.destination or self.destination
        if not destination:
            raise _invalid(f"{what} has no destination")
        headers = dict(m.headers) if m.headers else _NO_HEADERS
        content_type = m.content_type if m.HasField("content_type") else None
        return Message(destination, m.body, headers, content_type, source)

    def _open(self, request: Any, *, credit: int | None) -> Subscription:
        """The hub subscription a SubscribeRequest asks for."""
        destination = request.destination or self.destination
        if not destination:
            raise _invalid("a subscription needs a destination")
        if self.shutdown is not None and self.shutdown.is_set():
            raise _shutting_down()
        window = request.window or self.default_window
        if window > self.max_window:
            raise _invalid(f"a window of {window} is over the limit of {self.max_window}")
        start: StartAt | None = None
        end: StopAt | None = None
        if request.HasField("start"):
            start = _start(request.start)
        if request.HasField("end"):
            end = _end(request.end)
        filter = _filter(request.filter) if request.filter else None
        try:
            return self.hub.subscribe(
                destination,
                request.group or None,
                credit=credit,
                max_unacked=window,
                start=start,
                end=end,
                filter=filter,
            )
        except trio.ClosedResourceError:
            raise _shutting_down() from None
        except LookupError as e:
            raise TtrpcError(Code.NOT_FOUND, f"cannot subscribe to {destination!r}: {e}") from None
        except ValueError as e:
            raise _invalid(f"cannot subscribe to {destination!r}: {e}") from None

    def _sender(self, out: MessageStream) -> Callable[[int, Delivery], Awaitable[None]]:
        """Sends each delivery on ``out`` as a Delivery message, under the peer's tag."""

        async def send(tag: int, d: Delivery) -> None:
            await out.send(self._delivery(tag, d))

        return send

    def _delivery(self, tag: int, d: Delivery) -> bytes:
        """The Delivery message for ``d`` as the client sees it (``tag``), serialized."""
        m = d.message
        out = pb.Delivery(tag=tag, redelivered=d.redelivered)
        message = out.message
        message.destination = m.destination
        message.body = m.body
        if m.headers:
            message.headers.update(m.headers)
        if m.content_type is not None:
            message.content_type = m.content_type
        if d.position is not None:
            out.position.SetInParent()
            out.position.offset = d.position.offset
            out.position.partition = d.position.partition
        if self.share_source and m.source is not None:
            _source(out.source, m.source)
        if d.reply_by is not None:
            out.call = True
            out.reply_within = max(0.0, d.reply_by - trio.current_time())
        return bytes(out.SerializeToString())


# -- conversions ---------------------------------------------------------------------------


def _published(receipt: Receipt, n: int) -> Any:
    """The PublishResponse for a settled receipt of ``n`` messages."""
    assert receipt.outcome is not None
    response = pb.PublishResponse(outcome=_OUTCOMES[receipt.outcome], reason=receipt.reason)
    if receipt.plain:  # every message delivered, nothing attached: one result shape
        response.results.extend(pb.PublishResult(outcome=pb.OUTCOME_DELIVERED) for _ in range(n))
        return response
    for r in receipt.results()[:n]:
        result = response.results.add(outcome=_OUTCOMES[r.outcome], reason=r.reason)
        for name, position in r.positions.items():
            stored = result.positions[name]
            stored.offset = position.offset
            stored.partition = position.partition
        if r.code is not None and _MIN_INT32 <= r.code <= _MAX_CODE:
            result.code = r.code
        if r.details:
            result.details.update(r.details)
    return response


def _call_failed(receipt: Receipt) -> TtrpcError:
    """The status of a call that settled without a reply."""
    reason = receipt.reason or "the call was settled without a reply"
    if receipt.outcome is Outcome.REJECTED:
        return _invalid(reason)
    if receipt.reply_by is not None and trio.current_time() >= receipt.reply_by:
        return TtrpcError(Code.DEADLINE_EXCEEDED, reason)
    return TtrpcError(Code.UNAVAILABLE, reason)


def _reply(reply: Any) -> Reply:
    """A consumer's protobuf ``Reply`` as the hub's."""
    content_type = reply.content_type if reply.HasField("content_type") else None
    headers = dict(reply.headers) if reply.headers else _NO_HEADERS
    return Reply(reply.body, headers, content_type, reply.code, reply.message)


def _position(p: Any) -> Position:
    return Position(p.offset, p.partition)


def _start(bound: Any) -> StartAt | None:
    at = bound.WhichOneof("at")
    if at == "position":
        return _position(bound.position)
    if at == "edge" and bound.edge == pb.EDGE_EARLIEST:
        return "earliest"
    if at == "edge" and bound.edge == pb.EDGE_LATEST:
        return "latest"
    if at == "edge" and bound.edge != pb.EDGE_UNSPECIFIED:
        raise _invalid(f"unknown start edge {bound.edge}")
    return None


def _end(bound: Any) -> StopAt | None:
    at = bound.WhichOneof("at")
    if at == "position":
        return _position(bound.position)
    if at == "edge" and bound.edge == pb.EDGE_LATEST:
        return "latest"
    if at == "edge" and bound.edge != pb.EDGE_UNSPECIFIED:
        raise _invalid("a read ends at EDGE_LATEST or at a position")
    return None


def _filter(text: str) -> Filter:
    """The JSON form of a filter (as ndjson's ``"filter"``), compiled."""
    try:
        return Filter.from_json(json.loads(text))
    except FilterError as e:
        raise _invalid(f"bad filter: {e}") from None
    except (ValueError, RecursionError) as e:
        raise _invalid(f"bad filter: not JSON: {e}") from None


def _source(out: Any, source: Source) -> None:
    """Fill the Source message ``out`` from the hub's ``source``."""
    out.SetInParent()
    out.protocol = source.protocol
    out.listener = source.listener
    out.peer = source.peer
    out.received_at = source.received_at
    out.upstream = source.upstream
    identity = source.identity
    if identity is not None:
        out.identity.subject = identity.subject
        out.identity.sans.extend(identity.sans)
        out.identity.fingerprint = identity.fingerprint
