"""Why a publish was not delivered, as a code chosen where the failure happens.

A receipt that settles ``FAILED`` or ``REJECTED`` carries a :class:`Reason`
(``receipt.reason_code``, and each message's ``Result.reason_code``) beside its
text (``reason``), which is for humans and may be reworded at will. Whatever
needs to tell failures apart (the metrics, a protocol mapping failures to its
own error codes) reads the code, never the text.

Each code has a metric label (:attr:`Reason.label`), the ``reason`` label of
``interchange_publishes_total``. Labels are fewer than codes: the three ways a
name can fail to have a destination share ``no_destination``, and so on, so
that the set of series stays small and stable while codes stay precise.

Each code, its label, and where it is chosen:

* ``TOO_LARGE`` (``too_large``): a destination's ``check``, the message is
  larger than its buffer;
* ``WRONG_SIZE`` (``wrong_size``): a destination's ``check``, the body is not
  one fixed-size element;
* ``TOO_MANY_DESTINATIONS``, ``NO_UPSTREAM``, ``TAKES_NO_CALLS``,
  ``UNAVAILABLE`` (``no_destination``): the hub, when ``max_destinations`` is
  reached, for ``upstream:NAME`` of no configured upstream, for a call routed
  to a log, and when the provider that claims the name cannot open it (a
  durable destination while no store is open);
* ``CLOSED`` (``buffer_closed``): the hub, when it or a target closed under the
  publish (shutdown);
* ``EXPIRED`` (``expired``): the hub's timer, a call's deadline passed;
* ``NO_SUBSCRIBER``, ``NO_REPLY`` (``no_reply``): the receipt, for a call that
  no group took, and for one whose copies all settled without a reply;
* ``ABANDONED`` (``abandoned``): the protocol session, its sender left (or hung
  up) before the publish settled;
* ``REFUSED_BY_TARGET`` (``refused_by_target``): a target, a subscriber's nack
  without requeue (the default of a leg settled failed or rejected without a
  code);
* ``OTHER`` (``other``): a receipt made already settled by code that gave no code.

A full disk or a full log is not a failure: the publisher waits (see
docs/architecture.md, "Logs"), so neither has a code.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PUBLISH_REASONS", "Reason", "Refusal"]


class Reason(enum.Enum):
    """Why a publish (or one message of it) was not delivered; ``value`` is the code
    as text, for logs and protocols, and :attr:`label` its metric label."""

    TOO_LARGE = "too_large"
    WRONG_SIZE = "wrong_size"
    TOO_MANY_DESTINATIONS = "too_many_destinations"
    NO_UPSTREAM = "no_upstream"
    TAKES_NO_CALLS = "takes_no_calls"
    UNAVAILABLE = "unavailable"
    CLOSED = "closed"
    EXPIRED = "expired"
    NO_SUBSCRIBER = "no_subscriber"
    NO_REPLY = "no_reply"
    ABANDONED = "abandoned"
    REFUSED_BY_TARGET = "refused_by_target"
    OTHER = "other"

    @property
    def label(self) -> str:
        """The ``reason`` label of ``interchange_publishes_total`` for this code."""
        return _LABELS[self]


_LABELS: dict[Reason, str] = {
    Reason.TOO_LARGE: "too_large",
    Reason.WRONG_SIZE: "wrong_size",
    Reason.TOO_MANY_DESTINATIONS: "no_destination",
    Reason.NO_UPSTREAM: "no_destination",
    Reason.TAKES_NO_CALLS: "no_destination",
    Reason.UNAVAILABLE: "no_destination",
    Reason.CLOSED: "buffer_closed",
    Reason.EXPIRED: "expired",
    Reason.NO_SUBSCRIBER: "no_reply",
    Reason.NO_REPLY: "no_reply",
    Reason.ABANDONED: "abandoned",
    Reason.REFUSED_BY_TARGET: "refused_by_target",
    Reason.OTHER: "other",
}

#: Every metric label a code maps to, in a fixed order (the bounded set of the
#: ``reason`` label).
PUBLISH_REASONS: tuple[str, ...] = tuple(dict.fromkeys(_LABELS.values()))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a destination can never take a message (``Destination.check``): the code,
    and the text for humans (``str()`` of a refusal is its text)."""

    code: Reason
    text: str

    def __str__(self) -> str:
        return self.text
