"""Answers owed to a peer, each written once its receipt settles ("no ack before safe").

A protocol hands a message to the hub and gets a
:class:`~gateway.core.receipts.Receipt`; the peer may be answered only once that
receipt has settled. :class:`Answers` holds what is owed, bounded by ``limit``:

* **ordered** (Lumberjack windows, stream positions): answers go out in the
  order the work arrived, so a settled answer waits for every earlier one;
* **unordered** (requests with ids): each goes out as soon as it settles.

It does no I/O: the connection's writer task calls :meth:`Answers.ready` and
writes what the answer functions return. Settling runs in whichever task
settles the receipt, so the done callback only records and wakes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from gateway.core.reasons import Reason
from gateway.core.receipts import Receipt

__all__ = ["Answer", "AnswerFn", "Answers"]

#: Turns a settled receipt into the bytes that answer the peer (None: nothing to send).
#: It may raise to close the connection instead (e.g. a window that was not kept).
AnswerFn = Callable[[Receipt], bytes | None]


class Answer:
    """One thing owed to the peer: its receipt (once handed off) and how to answer it."""

    __slots__ = ("answer", "keepalive", "receipt")

    def __init__(self, answer: AnswerFn, keepalive: Callable[[], bytes] | None) -> None:
        self.answer = answer
        #: Bytes to send while this answer is the oldest one waiting (ordered only).
        self.keepalive = keepalive
        #: None until the work is handed off.
        self.receipt: Receipt | None = None

    @property
    def settled(self) -> bool:
        return self.receipt is not None and self.receipt.done()


class Answers:
    """What a connection owes its peer, in order or as it settles."""

    def __init__(self, limit: int, *, ordered: bool, wake: Callable[[], None]) -> None:
        if limit < 1:
            raise ValueError(f"an answer limit must be at least 1, not {limit}")
        self.limit = limit
        self.ordered = ordered
        self._wake = wake
        self._queue: deque[Answer] = deque()
        #: Unordered: settled answers, in settling order, not yet written.
        self._settled: list[tuple[AnswerFn, Receipt]] = []
        #: Unordered: answers handed off and not settled yet (ordered: in ``_queue``).
        self._handed: set[Answer] = set()
        self._open = 0

    def __len__(self) -> int:
        """Answers owed and not yet produced (handed off or not)."""
        return self._open

    @property
    def full(self) -> bool:
        return self._open >= self.limit

    @property
    def waiting(self) -> Answer | None:
        """Ordered: the oldest answer, while it is not settled (keepalives are for it)."""
        if self.ordered and self._queue:
            head = self._queue[0]
            if not head.settled:
                return head
        return None

    def open(self, answer: AnswerFn, keepalive: Callable[[], bytes] | None = None) -> Answer:
        """Owe one more answer; its work is about to be handed off."""
        entry = Answer(answer, keepalive)
        if self.ordered:
            self._queue.append(entry)
        self._open += 1
        return entry

    def attach(self, entry: Answer, receipt: Receipt) -> None:
        """The work was handed off: answer once ``receipt`` settles."""
        entry.receipt = receipt
        if self.ordered:
            receipt.add_done_callback(self._wake_on_settle)
        else:
            self._handed.add(entry)
            receipt.add_done_callback(lambda r: self._on_settled(entry, r))

    def cancel(self, entry: Answer) -> None:
        """The hand-off failed: nothing is owed for ``entry``."""
        if self.ordered:
            self._queue.remove(entry)
        self._open -= 1
        self._wake()

    def ready(self) -> list[tuple[AnswerFn, Receipt]]:
        """Take every answer that may be written now, in the order to write them."""
        if not self.ordered:
            out, self._settled = self._settled, []
            self._open -= len(out)
            return out
        queue = self._queue
        taken: list[tuple[AnswerFn, Receipt]] = []
        while queue and queue[0].settled:
            entry = queue.popleft()
            assert entry.receipt is not None
            taken.append((entry.answer, entry.receipt))
        self._open -= len(taken)
        return taken

    @property
    def has_ready(self) -> bool:
        if not self.ordered:
            return bool(self._settled)
        return bool(self._queue) and self._queue[0].settled

    def _wake_on_settle(self, _: Receipt) -> None:
        self._wake()

    def _on_settled(self, entry: Answer, receipt: Receipt) -> None:
        self._handed.discard(entry)
        self._settled.append((entry.answer, receipt))
        self._wake()

    def abandon(self, reason: str, code: Reason = Reason.ABANDONED) -> int:
        """The peer is gone: settle every handed-off receipt as failed with ``reason``
        (for humans) and ``code``.

        Returns how many answers were owed. Nothing should be written after
        this: the answers become ready, as failures, only so that the work's
        receipts are settled and the hub forgets them.
        """
        owed = self._open
        entries = list(self._queue if self.ordered else self._handed)
        for entry in entries:
            if entry.receipt is not None and not entry.receipt.done():
                entry.receipt.expire(reason, code)
        return owed
