"""Micromessage2's acknowledgement window and its handshake settings, sans I/O.

**Extensions.** ``batch-ack`` and ``ack`` both mean the ack window.
``batch-ack`` allows 10 unacknowledged messages unless it says otherwise;
``ack`` is ``batch-ack`` with a count of 1 unless it carries a count property
(SharpMessaging names its batch extension ``ack`` and gives the count as
``MessagesPerAck``: ``ack`` without a count is 1, with one it is that count).

**Properties.** ``max-count`` (1..32767, under half the sequence space so
serial comparison stays unambiguous; aliases ``count`` and
``MessagesPerAck``) and ``expire-ms`` (1..3 600 000, default 500; alias
``AckExpireTime``). Keys match exactly; other properties are ignored. A value
that is not a decimal integer of ASCII digits, is out of range, or is given
twice (under one key or two aliases) with different values is a
``RemoteProtocolError`` naming the extension, the key and the value (echoed
to at most 40 characters). We write only the canonical keys.

**Negotiation.** The server answers with ``max-count`` = the lower of the
client's proposal (the extension's default when it gave none) and the
server's limit, and ``expire-ms`` = the client's proposal, or the server's
own value when it gave none. The client's final message decides: it states
the lower of its wish and the answered ``max-count``, and the answered
``expire-ms``. The server refuses a final ``max-count`` above its answer; a
property the final leaves out keeps its answered value (a peer that only
echoes the name agrees to the answer).

**The window.** It binds each direction of the whole connection: a sender
has at most ``max-count`` MESSAGE frames unacknowledged. An ack of seq S
settles every outstanding frame up to S in send order, across the wrap from
65535 to 1 (cumulative); an ack of a seq that is not outstanding (0, "nothing
yet", among them) is ignored, and the caller logs it. A frame not acked
within ``expire-ms`` is sent again: the same bytes, the same seq.

**The receiver** accepts the next seq (the first is 1). A seq received and
acked already is a resend: ack it again at once and drop it (``ACKED``; a
sender never resends one more than ``max-count`` back from the newest seq it
sent, so older ones are refused). A seq received but not acked yet is
dropped silently: its ack follows its hand-off (``PENDING``). Anything else
(a gap, 0, a seq outside 1..65535, a new seq while ``max-count`` are
unacked) is a ``RemoteProtocolError`` such as "MESSAGE seq 7: expected 5".

The receiver acks a message only once it is handed off: ``acked(seq)``
acks through ``seq`` and says whether an ack is to be sent (False for a seq
acked already, cumulatively too, or not kept). ``rewind(seq)`` forgets the
messages from ``seq`` on (their publish failed): their resends are new
again, an ``acked`` for one of them changes nothing, and the seqs the sender
sends past them meanwhile (within ``max-count`` of the last ack) are
dropped until their resends come in order.
"""

from __future__ import annotations

import enum
import re
from collections import deque
from dataclasses import dataclass
from typing import Final

from gateway.sdk import LocalProtocolError, RemoteProtocolError

from .events import SEQUENCE
from .handshake import ExtensionSpec

__all__ = [
    "ACK_EXTENSIONS",
    "DEFAULT_COUNT",
    "DEFAULT_EXPIRE_MS",
    "MAX_COUNT",
    "MAX_EXPIRE_MS",
    "AckSettings",
    "ReceiveWindow",
    "Received",
    "SendWindow",
    "ack_settings",
    "ack_spec",
    "answer_ack",
    "check_final_ack",
    "final_ack",
]

#: The extension names that mean the ack window.
ACK_EXTENSIONS: Final = ("batch-ack", "ack")
#: The largest window: under half the sequence space, so serial order holds.
MAX_COUNT: Final = 32767
#: The longest resend delay: an hour.
MAX_EXPIRE_MS: Final = 3_600_000

#: ``batch-ack``'s window when it states none.
DEFAULT_COUNT: Final = 10
#: The resend delay when none is stated.
DEFAULT_EXPIRE_MS: Final = 500

_MAX_COUNT_KEY: Final = "max-count"
_EXPIRE_KEY: Final = "expire-ms"
#: Every key we read, to its canonical name.
_KEYS: Final = {
    "max-count": _MAX_COUNT_KEY,
    "count": _MAX_COUNT_KEY,
    "MessagesPerAck": _MAX_COUNT_KEY,
    "expire-ms": _EXPIRE_KEY,
    "AckExpireTime": _EXPIRE_KEY,
}
_RANGES: Final = {_MAX_COUNT_KEY: (1, MAX_COUNT), _EXPIRE_KEY: (1, MAX_EXPIRE_MS)}
_DIGITS: Final = re.compile(r"[0-9]+")
_ECHO: Final = 40


@dataclass(frozen=True, slots=True)
class AckSettings:
    """One ack window's size and resend delay (ValueError outside their ranges)."""

    max_count: int = DEFAULT_COUNT
    expire_ms: int = DEFAULT_EXPIRE_MS

    def __post_init__(self) -> None:
        if not 1 <= self.max_count <= MAX_COUNT:
            raise ValueError(f"max_count {self.max_count} is outside 1..{MAX_COUNT}")
        if not 1 <= self.expire_ms <= MAX_EXPIRE_MS:
            raise ValueError(f"expire_ms {self.expire_ms} is outside 1..{MAX_EXPIRE_MS}")

    @property
    def expire(self) -> float:
        """The resend delay in seconds."""
        return self.expire_ms / 1000


def _echo(text: str) -> str:
    return repr(text if len(text) <= _ECHO else text[: _ECHO - 3] + "...")


def _default_count(name: str) -> int:
    """``ack`` without a count is one message per ack; ``batch-ack`` is ten."""
    return 1 if name == "ack" else DEFAULT_COUNT


def _number(name: str, key: str, text: str, canonical: str) -> int:
    low, high = _RANGES[canonical]
    where = f"extension {name!r}: {key}={_echo(text)}"
    if not _DIGITS.fullmatch(text):
        raise RemoteProtocolError(f"{where} is not a decimal integer")
    # More digits than any value in range: refused before int() reads them.
    value = int(text) if len(text) <= 10 else high + 1
    if not low <= value <= high:
        raise RemoteProtocolError(f"{where} is outside {low}..{high}")
    return value


def _parse(spec: ExtensionSpec) -> dict[str, int]:
    """The canonical properties ``spec`` gives, by canonical key (aliases merged)."""
    if spec.name not in ACK_EXTENSIONS:
        raise ValueError(f"extension {spec.name!r} is not an ack extension")
    found: dict[str, tuple[str, int]] = {}
    for key, text in spec.properties:
        canonical = _KEYS.get(key)
        if canonical is None:
            continue
        value = _number(spec.name, key, text, canonical)
        earlier = found.get(canonical)
        if earlier is not None and earlier[1] != value:
            raise RemoteProtocolError(
                f"extension {spec.name!r}: {key}={_echo(text)} contradicts "
                f"{earlier[0]}={earlier[1]}"
            )
        found[canonical] = (key, value)
    return {canonical: value for canonical, (_, value) in found.items()}


def ack_settings(spec: ExtensionSpec) -> AckSettings:
    """The settings a received ``ack`` or ``batch-ack`` spec states, defaults filled in."""
    given = _parse(spec)
    return AckSettings(
        given.get(_MAX_COUNT_KEY, _default_count(spec.name)),
        given.get(_EXPIRE_KEY, DEFAULT_EXPIRE_MS),
    )


def ack_spec(name: str, settings: AckSettings) -> ExtensionSpec:
    """The spec we send: ``name`` with the canonical ``max-count`` and ``expire-ms``."""
    return ExtensionSpec(
        name,
        ((_MAX_COUNT_KEY, str(settings.max_count)), (_EXPIRE_KEY, str(settings.expire_ms))),
    )


def answer_ack(
    offered: ExtensionSpec | None, limit: AckSettings, name: str = "batch-ack"
) -> ExtensionSpec:
    """The server's answer to the client's ``offered`` spec, under the server's ``limit``.

    The answer keeps the offered name; ``offered`` None: the server offers the
    window itself, as ``name`` with its ``limit``.
    """
    if offered is None:
        return ack_spec(name, limit)
    given = _parse(offered)
    count = given.get(_MAX_COUNT_KEY, _default_count(offered.name))
    expire = given.get(_EXPIRE_KEY, limit.expire_ms)
    return ack_spec(offered.name, AckSettings(min(count, limit.max_count), expire))


def final_ack(answered: ExtensionSpec, wish: AckSettings) -> ExtensionSpec:
    """The client's final spec: the lower count of its ``wish`` and the answer, the
    answer's resend delay (the client's own proposal whenever it made one)."""
    agreed = ack_settings(answered)
    return ack_spec(
        answered.name, AckSettings(min(wish.max_count, agreed.max_count), agreed.expire_ms)
    )


def check_final_ack(final: ExtensionSpec, answered: ExtensionSpec) -> AckSettings:
    """The connection's settings from the client's ``final`` spec, checked against our
    ``answered`` one: a count above the answer is a RemoteProtocolError; a property
    the final leaves out keeps its answered value."""
    agreed = ack_settings(answered)
    given = _parse(final)
    count = given.get(_MAX_COUNT_KEY, agreed.max_count)
    if count > agreed.max_count:
        raise RemoteProtocolError(
            f"extension {final.name!r}: final max-count={count} is above the "
            f"answered {agreed.max_count}"
        )
    return AckSettings(count, given.get(_EXPIRE_KEY, agreed.expire_ms))


class Received(enum.Enum):
    """What :meth:`ReceiveWindow.receive` made of a MESSAGE's seq."""

    #: The next message: hand it off, then ack it.
    NEW = "new"
    #: Received, its ack not sent yet (or forgotten by a rewind, its resend awaited
    #: in order): drop it silently.
    PENDING = "pending"
    #: Received and acked already: the sender missed the ack; ack it again, drop it.
    ACKED = "acked"


class _Run:
    """MESSAGE frames sent together (one write), awaiting their acks.

    ``blob`` holds the frames back to back, frame ``i`` ending at ``ends[i]``;
    frames ``start:`` are outstanding; ``first`` is the seq of frame 0.
    """

    __slots__ = ("blob", "ends", "first", "sent_at", "settled", "start")

    def __init__(self, first: int, blob: bytes, ends: list[int], sent_at: float) -> None:
        self.first = first
        self.blob = blob
        self.ends = ends
        self.start = 0
        self.sent_at = sent_at
        self.settled = False

    def __len__(self) -> int:
        return len(self.ends) - self.start

    @property
    def offset(self) -> int:
        """Where the outstanding frames start in ``blob``."""
        return self.ends[self.start - 1] if self.start else 0

    @property
    def nbytes(self) -> int:
        return len(self.blob) - self.offset

    @property
    def oldest(self) -> int:
        return SEQUENCE.after(self.first, self.start)

    def wires(self) -> list[bytes]:
        """The outstanding frames, each on its own."""
        ends = self.ends
        return [self.blob[ends[i - 1] if i else 0 : ends[i]] for i in range(self.start, len(ends))]


class SendWindow:
    """The sending side of one direction: outstanding frames, acks, resends.

    Frames are kept in runs, the frames of one write together, so that a
    batch costs one object, not one per frame. Runs are kept twice: in send
    order (which is seq order, so a cumulative ack settles a prefix, the last
    run perhaps in part) and in resend-clock order (resent runs move to the
    back, so the due ones are always a prefix). Settled runs leave the clock
    queue lazily; it is compacted when they outnumber the outstanding ones.
    ``now`` values never go back (a monotonic clock, in seconds).
    """

    __slots__ = ("_bytes", "_clock", "_count", "_runs", "_stale", "next_seq", "settings")

    def __init__(self, settings: AckSettings, *, start: int = 1) -> None:
        if start not in SEQUENCE:
            raise ValueError(f"seq {start} is outside 1..{SEQUENCE.last}")
        self.settings = settings
        #: The seq the next new MESSAGE must carry.
        self.next_seq = start
        self._runs: deque[_Run] = deque()
        self._clock: deque[_Run] = deque()
        self._count = 0
        self._stale = 0
        self._bytes = 0

    def __len__(self) -> int:
        return self._count

    @property
    def room(self) -> int:
        """How many new MESSAGE frames may go out before an ack."""
        return self.settings.max_count - self._count

    @property
    def outstanding_bytes(self) -> int:
        """The bytes held for resending."""
        return self._bytes

    def outstanding(self) -> list[int]:
        """The unacked seqs, in send order."""
        after = SEQUENCE.after
        return [after(run.first, i) for run in self._runs for i in range(run.start, len(run.ends))]

    def sent(self, seq: int, wire: bytes, now: float) -> None:
        """Record a new MESSAGE frame ``wire`` carrying ``seq``, sent at ``now``."""
        if self.room <= 0:
            raise LocalProtocolError(f"ack window of {self.settings.max_count} full")
        if seq != self.next_seq:
            raise LocalProtocolError(f"MESSAGE seq {seq}: the next one is {self.next_seq}")
        self.sent_blob(wire, [len(wire)], now)

    def sent_blob(self, blob: bytes, ends: list[int], now: float) -> None:
        """:meth:`sent` for several frames at once, joined: ``blob``, frame ``i`` ending at
        ``ends[i]`` (what :func:`~.frames.encode_messages` returns)."""
        if not ends:
            return
        if len(ends) > self.room:
            raise LocalProtocolError(f"ack window of {self.settings.max_count} full")
        run = _Run(self.next_seq, blob, ends, now)
        self._runs.append(run)
        self._clock.append(run)
        self._count += len(ends)
        self._bytes += len(blob)
        self.next_seq = SEQUENCE.after(self.next_seq, len(ends))

    def acked(self, seq: int) -> int:
        """Settle every outstanding frame up to ``seq``: how many (0: not outstanding)."""
        runs = self._runs
        if seq not in SEQUENCE or not runs:
            return 0
        count = SEQUENCE.distance(runs[0].oldest, seq) + 1
        if count > self._count:
            return 0
        self._count -= count
        left = count
        while left:
            run = runs[0]
            if len(run) <= left:
                left -= len(run)
                runs.popleft()
                run.settled = True
                self._bytes -= run.nbytes
                self._stale += 1
                continue
            before = run.nbytes
            run.start += left
            self._bytes -= before - run.nbytes
            break
        self._drop_settled()
        if self._stale > len(runs):
            self._clock = deque(run for run in self._clock if not run.settled)
            self._stale = 0
        return count

    def _drop_settled(self) -> None:
        clock = self._clock
        while clock and clock[0].settled:
            clock.popleft()
            self._stale -= 1

    def due(self, now: float) -> list[bytes]:
        """The frames to send again at ``now`` (unacked for ``expire``), in seq order;
        their clocks restart at ``now``."""
        expire, clock = self.settings.expire, self._clock
        resend: list[_Run] = []
        while clock and (clock[0].settled or clock[0].sent_at + expire <= now):
            run = clock.popleft()
            if run.settled:
                self._stale -= 1
            else:
                resend.append(run)
        if not resend:
            return []
        oldest = self._runs[0].oldest
        resend.sort(key=lambda run: SEQUENCE.distance(oldest, run.oldest))
        out: list[bytes] = []
        for run in resend:
            run.sent_at = now
            clock.append(run)
            out += run.wires()
        return out

    @property
    def next_due(self) -> float | None:
        """When :meth:`due` next returns a frame (None: nothing outstanding)."""
        self._drop_settled()
        return self._clock[0].sent_at + self.settings.expire if self._clock else None


class ReceiveWindow:
    """The receiving side of one direction: which seqs are new, pending or acked.

    It counts from the last acked seq: ``unacked`` received after it, then
    ``forgotten`` more the sender sent but a rewind dropped (their resends are
    awaited in order), and remembers how many seqs before it were acked (at most
    ``max_count``: a sender's resend is never older than that).
    """

    __slots__ = ("_acked", "_forgotten", "_history", "_unacked", "settings")

    def __init__(self, settings: AckSettings, *, start: int = 1) -> None:
        if start not in SEQUENCE:
            raise ValueError(f"seq {start} is outside 1..{SEQUENCE.last}")
        self.settings = settings
        self._acked = SEQUENCE.after(start, -1)
        self._unacked = 0
        self._forgotten = 0
        self._history = 0

    @property
    def acked_through(self) -> int:
        """The last seq acked (0: none yet)."""
        return self._acked if self._history else 0

    @property
    def received_through(self) -> int:
        """The last seq received and kept (0: none yet)."""
        if not self._history and not self._unacked:
            return 0
        return SEQUENCE.after(self._acked, self._unacked)

    @property
    def unacked(self) -> int:
        """How many received messages await their ack."""
        return self._unacked

    def _was_acked(self, seq: int) -> bool:
        """``seq`` is among the last acked ones a sender may still resend."""
        back = SEQUENCE.distance(seq, self._acked)
        ahead = self._unacked + self._forgotten
        return back < self._history and back + ahead < self.settings.max_count

    def receive(self, seq: int) -> Received:
        """Classify a MESSAGE's ``seq`` (RemoteProtocolError when the peer broke the window)."""
        expected = SEQUENCE.after(self._acked, self._unacked + 1)
        if seq not in SEQUENCE:
            raise RemoteProtocolError(
                f"MESSAGE seq {seq}: outside 1..{SEQUENCE.last}, expected {expected}"
            )
        ahead = SEQUENCE.distance(self._acked, seq)
        if 1 <= ahead <= self._unacked:
            return Received.PENDING
        if ahead == self._unacked + 1:
            if self._unacked >= self.settings.max_count:
                raise RemoteProtocolError(
                    f"MESSAGE seq {seq}: the ack window of {self.settings.max_count} is full"
                )
            self._unacked += 1
            self._forgotten = max(self._forgotten - 1, 0)
            return Received.NEW
        if self._forgotten and self._unacked + 1 < ahead <= self._unacked + self._forgotten + 1:
            # A rewind's gap: the sender sent these (and may send more) before its
            # resends come; they come again in order.
            if ahead > self.settings.max_count:
                raise RemoteProtocolError(
                    f"MESSAGE seq {seq}: the ack window of {self.settings.max_count} is full"
                )
            self._forgotten = max(self._forgotten, ahead - self._unacked)
            return Received.PENDING
        if self._was_acked(seq):
            return Received.ACKED
        raise RemoteProtocolError(f"MESSAGE seq {seq}: expected {expected}")

    def receive_run(self, first: int, count: int) -> bool:
        """Take ``count`` consecutive seqs from ``first`` as NEW at once when they are
        exactly the next ones and fit the window (the caller checked that they are
        consecutive); False, and nothing changed: classify them one by one."""
        if (
            self._forgotten
            or first not in SEQUENCE
            or SEQUENCE.distance(self._acked, first) != self._unacked + 1
            or self._unacked + count > self.settings.max_count
        ):
            return False
        self._unacked += count
        return True

    def acked(self, seq: int) -> bool:
        """Ack every kept message through ``seq`` (it was handed off); False, and
        nothing changes, when ``seq`` is not received-and-unacked."""
        if seq not in SEQUENCE:
            return False
        ahead = SEQUENCE.distance(self._acked, seq)
        if not 1 <= ahead <= self._unacked:
            return False
        self._acked = seq
        self._unacked -= ahead
        self._history = min(self._history + ahead, self.settings.max_count)
        return True

    def rewind(self, seq: int) -> None:
        """Forget the messages from ``seq`` on: they were not kept, their resends are new.

        A seq after every kept one changes nothing; an acked one cannot be
        taken back (LocalProtocolError).
        """
        if seq not in SEQUENCE:
            raise ValueError(f"seq {seq} is outside 1..{SEQUENCE.last}")
        ahead = SEQUENCE.distance(self._acked, seq)
        if 1 <= ahead <= self._unacked:
            self._forgotten += self._unacked - ahead + 1
            self._unacked = ahead - 1
        elif SEQUENCE.distance(seq, self._acked) < self._history:
            raise LocalProtocolError(f"MESSAGE seq {seq} is acked already: it cannot be rewound")
