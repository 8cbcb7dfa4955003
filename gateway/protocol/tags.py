"""Peer tags: the numbers a peer settles deliveries by, and the table back to the hub's.

A hub subscription numbers its deliveries itself (``Delivery.tag``), one
sequence per subscription. A peer sees one sequence per connection or per
stream, often in a space of its protocol's own: Micromessage2 numbers
messages 1 to 65535 and wraps to 1, and acks "everything up to N". This
module is the pure part of the subscriber toolkit (no I/O, no trio):

* :class:`SerialSpace`: sequence numbers that may wrap, compared with serial
  number arithmetic (RFC 1982, over any size of space rather than a power of
  two);
* :class:`TagTable`: each peer tag handed out → the delivery it stands for
  (its owner, usually the :class:`~gateway.protocol.subscriber.Feed`, and the
  hub's tag), in the order they were handed out, for settling one tag or
  every tag up to one (cumulative acks).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["UNBOUNDED", "NotACall", "SerialSpace", "TagTable", "UnknownTag"]

Owner = TypeVar("Owner")


class UnknownTag(LookupError):
    """The peer settled a tag that is not outstanding: never handed out, already
    settled, or forgotten with its subscription."""

    def __init__(self, tag: int, why: str = "unknown or already settled") -> None:
        super().__init__(f"{why} delivery tag {tag}")
        self.tag = tag


class NotACall(ValueError):
    """The peer replied to a delivery that asked for no reply (it must ack it)."""

    def __init__(self, tag: int) -> None:
        super().__init__(f"delivery {tag} is not a call: ack it instead")
        self.tag = tag


@dataclass(frozen=True, slots=True)
class SerialSpace:
    """The sequence numbers ``first`` … ``first + size - 1``, after the last of which
    the first comes again; ``size=None``: integers from ``first`` up, never wrapping.

    Order is serial number arithmetic (RFC 1982): ``a`` precedes ``b`` when ``b``
    is less than half the space ahead of ``a``. Exactly half the space apart,
    neither precedes the other (RFC 1982 leaves it undefined), so a window of
    numbers that are compared must stay under half the space
    (:attr:`max_window`).
    """

    first: int = 1
    size: int | None = None

    def __post_init__(self) -> None:
        if self.size is not None and self.size < 2:
            raise ValueError(f"a sequence space needs at least 2 numbers, not {self.size}")

    @property
    def last(self) -> int | None:
        """The number after which ``first`` comes again (None: no wrap)."""
        return None if self.size is None else self.first + self.size - 1

    @property
    def max_window(self) -> int | None:
        """The most numbers outstanding at once that still compare without ambiguity
        (under half the space; None: any)."""
        return None if self.size is None else (self.size - 1) // 2

    def __contains__(self, n: object) -> bool:
        if not isinstance(n, int) or n < self.first:
            return False
        return self.size is None or n < self.first + self.size

    def after(self, n: int, k: int = 1) -> int:
        """The number ``k`` steps after ``n`` (wrapping)."""
        if self.size is None:
            return n + k
        return self.first + (n - self.first + k) % self.size

    def distance(self, a: int, b: int) -> int:
        """How many steps forward from ``a`` reach ``b`` (0 … size - 1 when it wraps)."""
        if self.size is None:
            return b - a
        return (b - a) % self.size

    def precedes(self, a: int, b: int) -> bool:
        """``a < b`` in serial order."""
        d = self.distance(a, b)
        return d > 0 and (self.size is None or 2 * d < self.size)

    def precedes_or_equals(self, a: int, b: int) -> bool:
        """``a <= b`` in serial order."""
        return a == b or self.precedes(a, b)


#: Integers from 1 up, as ndjson and ttrpc number deliveries.
UNBOUNDED = SerialSpace()


class TagTable(Generic[Owner]):
    """Outstanding peer tags, in the order handed out, each with its owner, the hub's
    tag and whether it is a call.

    Tags come from ``space`` in order, so the table's order is serial order: a
    cumulative ack settles a prefix of it. The table only keeps books: settling
    at the hub is its caller's.
    """

    __slots__ = ("_entries", "_newest", "_next", "_wraps", "space")

    def __init__(self, space: SerialSpace = UNBOUNDED, start: int | None = None) -> None:
        if start is not None and start not in space:
            raise ValueError(f"tag {start} is outside the sequence space")
        self.space = space
        self._wraps = space.size is not None
        self._entries: dict[int, tuple[Owner, int, bool]] = {}
        #: The next tag handed out (``start``: where a peer's numbering begins, when it
        #: is agreed on rather than the space's first).
        self._next = space.first if start is None else start
        #: The last tag handed out (None: none yet).
        self._newest: int | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tag: object) -> bool:
        return tag in self._entries

    def add(self, owner: Owner, hub_tag: int, call: bool = False) -> int:
        """Hand out the next peer tag for the delivery ``hub_tag`` of ``owner``."""
        tag = self._next
        entries = self._entries
        if self._wraps:
            if tag in entries:  # a window larger than the space allows
                raise OverflowError(f"peer tag {tag} is still outstanding: the window is too large")
            self._next = self.space.after(tag)
        else:
            self._next = tag + 1
        entries[tag] = (owner, hub_tag, call)
        self._newest = tag
        return tag

    def add_many(self, owner: Owner, hub_tags: list[int], calls: list[bool]) -> list[int]:
        """:meth:`add` for each of ``hub_tags`` (with its ``calls`` flag), at once."""
        n = len(hub_tags)
        if not n:
            return []
        first = self._next
        space = self.space
        entries = self._entries
        if self._wraps:
            base, size = space.first, space.size
            assert size is not None
            tags = [base + (first - base + i) % size for i in range(n)]
            if not entries.keys().isdisjoint(tags):  # a window larger than the space allows
                raise OverflowError("a peer tag is still outstanding: the window is too large")
        else:
            tags = list(range(first, first + n))
        entries.update(zip(tags, zip([owner] * n, hub_tags, calls, strict=True), strict=True))
        self._newest = tags[-1]
        self._next = space.after(tags[-1])
        return tags

    def pop(self, tag: int, *, call: bool = False) -> tuple[Owner, int]:
        """Forget ``tag`` (settled by the peer): its owner and hub tag.

        ``call``: the peer replies, so the delivery must be a call
        (:class:`NotACall` otherwise, and the tag stays outstanding).
        """
        entry = self._entries.get(tag)
        if entry is None:
            raise UnknownTag(tag)
        if call and not entry[2]:
            raise NotACall(tag)
        del self._entries[tag]
        return entry[0], entry[1]

    def pop_through(self, tag: int) -> list[tuple[Owner, int]]:
        """Forget every outstanding tag up to ``tag`` (serial order, inclusive):
        a cumulative ack. Tags settled before are passed over; a ``tag`` that was
        never handed out (ahead of the newest) is :class:`UnknownTag`."""
        newest = self._newest
        space = self.space
        if newest is None or space.precedes(newest, tag):
            raise UnknownTag(tag, "never handed out")
        entries = self._entries
        size = space.size
        through: list[int] = []
        for t in entries:  # oldest first; serial order inlined (this runs per tag)
            if size is None:
                if t > tag:
                    break
            elif t != tag and not 0 < (tag - t) % size < size - (tag - t) % size:
                break
            through.append(t)
        pop = entries.pop
        return [pop(t)[:2] for t in through]

    def drop(self, owner: Owner) -> int:
        """Forget every tag of ``owner`` (its subscription closed); how many there were."""
        entries = self._entries
        gone = [t for t, entry in entries.items() if entry[0] is owner]
        for t in gone:
            del entries[t]
        return len(gone)

    def __iter__(self) -> Iterator[int]:
        """The outstanding peer tags, oldest first."""
        return iter(self._entries)
