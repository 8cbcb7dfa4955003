"""Failures an operator can see: in the status's hints, in the gateway's log, from
``gateway check``.

TLS refusals themselves (the log line, the subject, the metric) are in
tests/test_tls_failures.py; here, how long a refusal stays a hint.
"""

from __future__ import annotations

import pytest

from gateway.ops.status import TLS_HINT_WINDOW, status
from gateway.ops.view import BudgetView, GatewaySnapshot, ListenerView


def _taken(refusals: int, last_at: float | None) -> GatewaySnapshot:
    listener = ListenerView(
        "secure",
        "ndjson",
        "jobs",
        ("127.0.0.1:4000",),
        0,
        10,
        tls_refusals=refusals,
        last_tls_refusal="127.0.0.1:5000 (client certificate CN=rogue): unknown ca: ..."
        if refusals
        else None,
        last_tls_refusal_at=last_at,
    )
    return GatewaySnapshot(
        version="9.9.9",
        time=10_000.0,
        started_at=1.0,
        draining=False,
        inflight=0,
        listeners=(listener,),
        upstreams=(),
        destinations=(),
        budget=BudgetView(limit=100, used=0, peak=0, exhausted=False),
    )


@pytest.mark.parametrize(
    ("refusals", "ago", "shown"),
    [(0, None, False), (3, 60.0, True), (3, TLS_HINT_WINDOW + 1, False)],
    ids=["none", "recent", "stale"],
)
def test_a_tls_refusal_is_a_hint_while_it_is_recent(
    refusals: int, ago: float | None, shown: bool
) -> None:
    taken = _taken(refusals, None if ago is None else 10_000.0 - ago)
    hints = status(taken)["hints"]
    if not shown:
        assert hints == []
        return
    [hint] = hints
    assert hint == {
        "level": "warning",
        "subject": "listener secure",
        "text": "3 TLS handshakes refused since the start; the last 60s ago:"
        " 127.0.0.1:5000 (client certificate CN=rogue): unknown ca: ...",
    }
