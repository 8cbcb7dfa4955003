"""Micromessage2's ack window: the handshake settings (aliases, defaults, bad values,
negotiation), the send and receive windows (limits, cumulative acks, resends,
duplicates, rewinds, the wrap from 65535 to 1), and a random link between them."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sdk import LocalProtocolError, RemoteProtocolError
from protocols.micromessage.events import SEQUENCE
from protocols.micromessage.handshake import ExtensionSpec
from protocols.micromessage.windows import (
    MAX_COUNT,
    AckSettings,
    Received,
    ReceiveWindow,
    SendWindow,
    ack_settings,
    ack_spec,
    answer_ack,
    check_final_ack,
    final_ack,
)


def spec(name: str, *props: tuple[str, str]) -> ExtensionSpec:
    return ExtensionSpec(name, props)


# --- settings ---------------------------------------------------------------------------


def test_max_count_is_the_sequence_space_window() -> None:
    assert SEQUENCE.max_window == MAX_COUNT


@pytest.mark.parametrize(
    ("extension", "expected"),
    [
        (spec("batch-ack"), AckSettings(10, 500)),
        (spec("ack"), AckSettings(1, 500)),
        (spec("ack", ("MessagesPerAck", "10")), AckSettings(10, 500)),
        (spec("ack", ("max-count", "4")), AckSettings(4, 500)),
        (spec("batch-ack", ("max-count", "3")), AckSettings(3, 500)),
        (spec("batch-ack", ("count", "7")), AckSettings(7, 500)),
        (spec("batch-ack", ("MessagesPerAck", "12")), AckSettings(12, 500)),
        (spec("batch-ack", ("expire-ms", "250")), AckSettings(10, 250)),
        (spec("ack", ("AckExpireTime", "2000")), AckSettings(1, 2000)),
        (
            spec("batch-ack", ("max-count", "32767"), ("expire-ms", "3600000")),
            AckSettings(32767, 3600000),
        ),
        (spec("batch-ack", ("max-count", "1"), ("expire-ms", "1")), AckSettings(1, 1)),
        (spec("batch-ack", ("max-count", "010")), AckSettings(10, 500)),
        (spec("batch-ack", ("count", "5"), ("max-count", "5")), AckSettings(5, 500)),
        (spec("batch-ack", ("colour", "red"), ("MaxCount", "x")), AckSettings(10, 500)),
    ],
)
def test_ack_settings(extension: ExtensionSpec, expected: AckSettings) -> None:
    assert ack_settings(extension) == expected


def test_defaults_and_seconds() -> None:
    assert AckSettings() == AckSettings(10, 500)
    assert AckSettings(expire_ms=1500).expire == 1.5


@pytest.mark.parametrize(("count", "expire"), [(0, 500), (32768, 500), (10, 0), (10, 3_600_001)])
def test_own_settings_out_of_range(count: int, expire: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        AckSettings(count, expire)


@pytest.mark.parametrize(
    ("extension", "words"),
    [
        (spec("batch-ack", ("max-count", "ten")), ["'batch-ack'", "max-count='ten'", "decimal"]),
        (spec("ack", ("count", "-1")), ["'ack'", "count='-1'", "decimal"]),
        (spec("batch-ack", ("max-count", " 5")), ["max-count=' 5'", "decimal"]),
        (spec("batch-ack", ("max-count", "")), ["max-count=''", "decimal"]),
        (spec("batch-ack", ("max-count", "٣")), ["decimal"]),
        (spec("batch-ack", ("max-count", "0")), ["max-count='0'", "1..32767"]),
        (spec("batch-ack", ("MessagesPerAck", "32768")), ["MessagesPerAck='32768'", "1..32767"]),
        (spec("batch-ack", ("expire-ms", "0")), ["expire-ms='0'", "1..3600000"]),
        (spec("ack", ("AckExpireTime", "3600001")), ["AckExpireTime='3600001'", "1..3600000"]),
        (spec("batch-ack", ("max-count", "9" * 5000)), ["max-count='999", "...'", "1..32767"]),
        (spec("batch-ack", ("max-count", "5"), ("count", "6")), ["count='6'", "max-count=5"]),
        (spec("ack", ("expire-ms", "5"), ("AckExpireTime", "6")), ["AckExpireTime='6'"]),
        (spec("ack", ("count", "5"), ("count", "6")), ["count='6'", "contradicts count=5"]),
    ],
)
def test_bad_values(extension: ExtensionSpec, words: list[str]) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        ack_settings(extension)
    text = str(caught.value)
    for word in words:
        assert word in text
    assert len(text) < 140


def test_not_an_ack_extension() -> None:
    with pytest.raises(ValueError, match="json"):
        ack_settings(spec("json"))


def test_ack_spec_is_canonical() -> None:
    out = ack_spec("batch-ack", AckSettings(5, 250))
    assert out == spec("batch-ack", ("max-count", "5"), ("expire-ms", "250"))
    assert out.encode() == "batch-ack:max-count=5,expire-ms=250"
    assert ack_settings(ExtensionSpec.decode(out.encode())) == AckSettings(5, 250)


LIMIT = AckSettings(20, 800)


@pytest.mark.parametrize(
    ("offered", "expected"),
    [
        (None, ack_spec("batch-ack", LIMIT)),
        (spec("batch-ack"), ack_spec("batch-ack", AckSettings(10, 800))),
        (spec("ack"), ack_spec("ack", AckSettings(1, 800))),
        (spec("ack", ("MessagesPerAck", "10")), ack_spec("ack", AckSettings(10, 800))),
        (spec("batch-ack", ("max-count", "50")), ack_spec("batch-ack", AckSettings(20, 800))),
        (spec("batch-ack", ("count", "15")), ack_spec("batch-ack", AckSettings(15, 800))),
        (spec("batch-ack", ("expire-ms", "100")), ack_spec("batch-ack", AckSettings(10, 100))),
        (spec("batch-ack", ("expire-ms", "9000")), ack_spec("batch-ack", AckSettings(10, 9000))),
    ],
)
def test_answer_ack(offered: ExtensionSpec | None, expected: ExtensionSpec) -> None:
    assert answer_ack(offered, LIMIT) == expected


def test_answer_ack_offers_under_a_name() -> None:
    assert answer_ack(None, LIMIT, "ack") == ack_spec("ack", LIMIT)


def test_answer_ack_refuses_bad_offers() -> None:
    with pytest.raises(RemoteProtocolError, match="max-count='x'"):
        answer_ack(spec("batch-ack", ("max-count", "x")), LIMIT)


def test_final_ack_takes_the_lower_count_and_the_answered_expiry() -> None:
    answered = ack_spec("batch-ack", AckSettings(8, 300))
    assert final_ack(answered, AckSettings(20, 900)) == ack_spec("batch-ack", AckSettings(8, 300))
    assert final_ack(answered, AckSettings(3, 900)) == ack_spec("batch-ack", AckSettings(3, 300))
    assert final_ack(spec("ack"), AckSettings(5)) == ack_spec("ack", AckSettings(1, 500))


def test_negotiation_end_to_end() -> None:
    wish = AckSettings(30, 250)
    offered = ack_spec("batch-ack", wish)
    answered = answer_ack(offered, LIMIT)
    final = final_ack(answered, wish)
    assert check_final_ack(final, answered) == AckSettings(20, 250)


def test_check_final_ack() -> None:
    answered = ack_spec("batch-ack", AckSettings(8, 300))
    assert check_final_ack(ack_spec("batch-ack", AckSettings(8, 300)), answered) == AckSettings(
        8, 300
    )
    assert check_final_ack(ack_spec("batch-ack", AckSettings(2, 900)), answered) == AckSettings(
        2, 900
    )
    # A final that only names the extension agrees to the answer.
    assert check_final_ack(spec("batch-ack"), answered) == AckSettings(8, 300)
    assert check_final_ack(spec("ack", ("MessagesPerAck", "4")), answered) == AckSettings(4, 300)


def test_check_final_ack_refuses_a_count_above_the_answer() -> None:
    answered = ack_spec("batch-ack", AckSettings(8, 300))
    with pytest.raises(RemoteProtocolError, match=r"'batch-ack'.*max-count=9.*answered 8"):
        check_final_ack(ack_spec("batch-ack", AckSettings(9, 300)), answered)
    with pytest.raises(RemoteProtocolError, match="max-count='0'"):
        check_final_ack(spec("batch-ack", ("max-count", "0")), answered)


# --- the send window ----------------------------------------------------------------------


def wire(seq: int) -> bytes:
    return b"M" + seq.to_bytes(2, "big")


def fill(window: SendWindow, n: int, now: float = 0.0) -> list[int]:
    seqs = []
    for _ in range(n):
        seq = window.next_seq
        window.sent(seq, wire(seq), now)
        seqs.append(seq)
    return seqs


def test_send_window_stops_at_the_window() -> None:
    window = SendWindow(AckSettings(3))
    assert (window.next_seq, len(window), window.room) == (1, 0, 3)
    assert fill(window, 3) == [1, 2, 3]
    assert (window.next_seq, len(window), window.room) == (4, 3, 0)
    assert window.outstanding_bytes == 9
    with pytest.raises(LocalProtocolError, match="ack window of 3 full"):
        window.sent(4, wire(4), 0.0)
    assert window.acked(1) == 1
    window.sent(4, wire(4), 0.0)
    assert window.outstanding() == [2, 3, 4]


def test_send_window_wants_the_next_seq() -> None:
    window = SendWindow(AckSettings(3))
    with pytest.raises(LocalProtocolError, match="MESSAGE seq 2: the next one is 1"):
        window.sent(2, wire(2), 0.0)
    assert len(window) == 0


def test_cumulative_acks_and_acks_outside_ignored() -> None:
    window = SendWindow(AckSettings(10))
    fill(window, 6)
    for outside in (0, 7, 65535, 70000, -1):
        assert window.acked(outside) == 0
    assert window.acked(3) == 3
    assert window.outstanding() == [4, 5, 6]
    assert window.acked(3) == 0
    assert window.acked(2) == 0
    assert window.acked(6) == 3
    assert (window.outstanding(), window.outstanding_bytes, window.room) == ([], 0, 10)
    assert window.acked(6) == 0
    assert window.next_due is None


def test_resend_after_expiry() -> None:
    window = SendWindow(AckSettings(10, 500))
    assert window.next_due is None
    window.sent(1, wire(1), 0.1)
    window.sent(2, wire(2), 0.3)
    assert window.next_due == pytest.approx(0.6)
    assert window.due(0.5) == []
    assert window.due(0.6) == [wire(1)]
    assert window.next_due == pytest.approx(0.8)
    assert window.due(0.8) == [wire(2)]
    assert window.next_due == pytest.approx(1.1)
    # Both due at once: in seq order, though 1's clock restarted before 2's.
    assert window.due(5.0) == [wire(1), wire(2)]
    assert window.acked(1) == 1
    assert window.next_due == pytest.approx(5.5)
    assert window.due(5.5) == [wire(2)]
    assert window.acked(2) == 1
    assert window.due(100.0) == []
    assert window.next_due is None


def test_due_at_next_due_always_returns_something() -> None:
    window = SendWindow(AckSettings(10, 300))
    for i, now in enumerate((0.1, 0.2, 0.7, 1.3)):
        window.sent(i + 1, wire(i + 1), now)
    now = 1.3
    for _ in range(20):
        due_at = window.next_due
        assert due_at is not None
        now = max(now, due_at)
        assert window.due(now)


def test_resent_frames_keep_seq_order_after_a_partial_resend() -> None:
    window = SendWindow(AckSettings(10, 1000))
    window.sent(1, wire(1), 0.0)
    window.sent(2, wire(2), 0.5)
    assert window.due(1.0) == [wire(1)]
    window.sent(3, wire(3), 1.2)
    assert window.due(2.0) == [wire(1), wire(2)]
    assert window.due(2.2) == [wire(3)]
    assert window.outstanding() == [1, 2, 3]


def test_settled_frames_do_not_pile_up() -> None:
    window = SendWindow(AckSettings(4, 100))
    now = 0.0
    for _ in range(1000):
        seq = window.next_seq
        window.sent(seq, wire(seq), now)
        window.due(now + 0.1)
        if seq % 3:
            window.acked(seq)
        now += 0.05
        assert len(window._clock) <= 2 * len(window) + 1


def test_send_window_wraps() -> None:
    window = SendWindow(AckSettings(10), start=65530)
    assert fill(window, 8) == [65530, 65531, 65532, 65533, 65534, 65535, 1, 2]
    assert window.next_seq == 3
    assert window.acked(3) == 0
    assert window.acked(65534) == 5
    assert window.outstanding() == [65535, 1, 2]
    assert window.acked(1) == 2
    assert window.acked(65535) == 0
    assert window.acked(2) == 1
    assert window.due(10.0) == []


def test_send_window_start_checked() -> None:
    with pytest.raises(ValueError, match="outside"):
        SendWindow(AckSettings(), start=0)
    with pytest.raises(ValueError, match="outside"):
        ReceiveWindow(AckSettings(), start=65536)


# --- the receive window --------------------------------------------------------------------


def test_receive_new_pending_acked() -> None:
    window = ReceiveWindow(AckSettings(10))
    assert (window.received_through, window.acked_through, window.unacked) == (0, 0, 0)
    assert window.receive(1) is Received.NEW
    assert window.receive(2) is Received.NEW
    assert (window.received_through, window.acked_through, window.unacked) == (2, 0, 2)
    assert window.receive(1) is Received.PENDING
    assert window.receive(2) is Received.PENDING
    assert window.acked(1)
    assert (window.received_through, window.acked_through, window.unacked) == (2, 1, 1)
    assert window.receive(1) is Received.ACKED
    assert window.receive(2) is Received.PENDING
    assert window.acked(2)
    assert window.receive(2) is Received.ACKED
    assert window.receive(3) is Received.NEW


def test_receive_acked_cumulatively_and_not_twice() -> None:
    window = ReceiveWindow(AckSettings(10))
    for seq in (1, 2, 3):
        window.receive(seq)
    assert window.acked(2)
    assert not window.acked(2)
    assert not window.acked(1)
    assert not window.acked(4)
    assert not window.acked(0)
    assert window.acked(3)
    assert (window.acked_through, window.unacked) == (3, 0)


@pytest.mark.parametrize(
    ("seq", "text"),
    [
        (5, "MESSAGE seq 5: expected 3"),
        (0, "MESSAGE seq 0: outside 1..65535, expected 3"),
        (65536, "MESSAGE seq 65536: outside 1..65535, expected 3"),
        (-1, "outside"),
        (65535, "MESSAGE seq 65535: expected 3"),
        (40000, "expected 3"),
    ],
)
def test_receive_refuses_gaps_and_strangers(seq: int, text: str) -> None:
    window = ReceiveWindow(AckSettings(10))
    window.receive(1)
    window.receive(2)
    with pytest.raises(RemoteProtocolError, match=text):
        window.receive(seq)
    assert window.received_through == 2


def test_receive_refuses_the_first_out_of_place() -> None:
    window = ReceiveWindow(AckSettings(10))
    with pytest.raises(RemoteProtocolError, match="MESSAGE seq 2: expected 1"):
        window.receive(2)
    with pytest.raises(RemoteProtocolError, match="MESSAGE seq 65535: expected 1"):
        window.receive(65535)


def test_receive_refuses_resends_older_than_any_window() -> None:
    window = ReceiveWindow(AckSettings(3))
    for seq in range(1, 7):
        window.receive(seq)
        window.acked(seq)
    assert window.receive(6) is Received.ACKED
    assert window.receive(4) is Received.ACKED
    with pytest.raises(RemoteProtocolError, match="MESSAGE seq 3: expected 7"):
        window.receive(3)


def test_receive_window_exceeded() -> None:
    window = ReceiveWindow(AckSettings(3))
    for seq in (1, 2, 3):
        assert window.receive(seq) is Received.NEW
    with pytest.raises(RemoteProtocolError, match="MESSAGE seq 4: the ack window of 3 is full"):
        window.receive(4)
    assert window.acked(1)
    assert window.receive(4) is Received.NEW


def test_rewind_then_resend_accepted() -> None:
    window = ReceiveWindow(AckSettings(10))
    for seq in range(1, 6):
        window.receive(seq)
    assert window.acked(2)
    window.rewind(4)
    assert (window.received_through, window.acked_through, window.unacked) == (3, 2, 1)
    # 5 may be handed off anyway; it was forgotten, so its ack changes nothing.
    assert not window.acked(5)
    assert window.acked_through == 2
    # The sender may still send what it had room for; it waits for its resend.
    assert window.receive(6) is Received.PENDING
    assert window.receive(5) is Received.PENDING
    with pytest.raises(RemoteProtocolError, match="MESSAGE seq 8: expected 4"):
        window.receive(8)
    assert window.receive(7) is Received.PENDING
    assert window.receive(4) is Received.NEW
    assert window.receive(5) is Received.NEW
    assert window.receive(6) is Received.NEW
    assert window.receive(7) is Received.NEW
    assert window.acked(7)
    assert window.receive(8) is Received.NEW


def test_rewind_gap_is_bounded_by_the_window() -> None:
    window = ReceiveWindow(AckSettings(4))
    for seq in (1, 2, 3):
        window.receive(seq)
    window.rewind(2)
    assert window.receive(3) is Received.PENDING
    assert window.receive(4) is Received.PENDING
    with pytest.raises(RemoteProtocolError, match="MESSAGE seq 5: the ack window of 4 is full"):
        window.receive(5)


def test_rewind_everything_and_edges() -> None:
    window = ReceiveWindow(AckSettings(10))
    window.rewind(1)  # nothing received: nothing to forget
    window.receive(1)
    window.receive(2)
    window.rewind(1)
    assert (window.received_through, window.acked_through, window.unacked) == (0, 0, 0)
    assert window.receive(2) is Received.PENDING
    assert window.receive(1) is Received.NEW
    assert window.acked(1)
    with pytest.raises(LocalProtocolError, match="seq 1 is acked already"):
        window.rewind(1)
    window.rewind(9)  # after every kept one: nothing changes
    assert window.received_through == 1
    with pytest.raises(ValueError, match="outside"):
        window.rewind(0)


def test_receive_window_wraps() -> None:
    window = ReceiveWindow(AckSettings(4), start=65533)
    for seq in (65533, 65534, 65535, 1):
        assert window.receive(seq) is Received.NEW
    assert window.received_through == 1
    assert window.acked(65535)
    assert window.receive(65534) is Received.ACKED
    assert window.receive(1) is Received.PENDING
    assert window.receive(2) is Received.NEW
    with pytest.raises(RemoteProtocolError, match="MESSAGE seq 4: expected 3"):
        window.receive(4)
    window.rewind(1)
    assert window.received_through == 65535
    assert window.receive(2) is Received.PENDING
    assert window.receive(1) is Received.NEW
    assert not window.acked(2)
    assert window.receive(2) is Received.NEW
    assert window.acked(2)
    assert (window.acked_through, window.unacked) == (2, 0)
    assert window.receive(65535) is Received.ACKED


# --- a random link -------------------------------------------------------------------------

ACTIONS = st.sampled_from(["send", "deliver", "hand_off", "fail", "ack", "tick", "burst"])


class Link:
    """A SendWindow and a ReceiveWindow joined by two in-order streams (as TCP is)."""

    def __init__(self, settings: AckSettings, start: int) -> None:
        self.sender = SendWindow(settings, start=start)
        self.receiver = ReceiveWindow(settings, start=start)
        self.to_receiver: deque[int] = deque()
        self.to_sender: deque[int] = deque()
        self.waiting: deque[int] = deque()  # received, not handed off yet
        self.handed_off: list[int] = []
        self.sent: list[int] = []
        self.now = 0.0

    def step(self, action: str) -> None:
        getattr(self, action)()
        assert len(self.sender) <= self.sender.settings.max_count
        assert self.receiver.unacked <= self.sender.settings.max_count

    def send(self) -> None:
        if self.sender.room:
            seq = self.sender.next_seq
            self.sender.sent(seq, wire(seq), self.now)
            self.sent.append(seq)
            self.to_receiver.append(seq)

    def deliver(self) -> None:
        if self.to_receiver:
            seq = self.to_receiver.popleft()
            outcome = self.receiver.receive(seq)
            if outcome is Received.NEW:
                self.waiting.append(seq)
            elif outcome is Received.ACKED:
                self.to_sender.append(seq)

    def hand_off(self) -> None:
        if self.waiting:
            seq = self.waiting.popleft()
            self.handed_off.append(seq)
            if self.receiver.acked(seq):
                self.to_sender.append(seq)

    def fail(self) -> None:
        if self.waiting:
            self.receiver.rewind(self.waiting[0])
            self.waiting.clear()

    def ack(self) -> None:
        if self.to_sender:
            self.sender.acked(self.to_sender.popleft())

    def tick(self) -> None:
        self.now += 0.25
        for frame in self.sender.due(self.now):
            self.to_receiver.append(int.from_bytes(frame[1:], "big"))

    def burst(self) -> None:
        for _ in range(3):
            self.send()

    def drain(self) -> None:
        for _ in range(10_000):
            if not (self.to_receiver or self.to_sender or self.waiting or len(self.sender)):
                return
            for action in ("deliver", "hand_off", "ack", "tick"):
                self.step(action)
        raise AssertionError("the link never settled")


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6),
    st.sampled_from([1, 65500, 65530, 65535]),
    st.lists(ACTIONS, max_size=200),
)
def test_a_random_link_loses_nothing(max_count: int, start: int, actions: list[str]) -> None:
    link = Link(AckSettings(max_count, 500), start)
    for action in actions:
        link.step(action)
    link.drain()
    assert link.handed_off == link.sent
    assert link.sent == [SEQUENCE.after(start, i) for i in range(len(link.sent))]
    assert link.sender.outstanding_bytes == 0
