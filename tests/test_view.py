"""Operations see the gateway through a plain-data snapshot, not its objects.

A :class:`GatewaySnapshot` taken from a running gateway survives JSON, and
the status, readiness, rates and the admin API's answers computed from it
need no gateway at all: the same data, sent by another process, gives the
same status.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import running_gateway

from gateway.config.loader import Config, ConfigError, parse
from gateway.core.destination import DestinationFigures, GroupFigures, LogFigures
from gateway.core.model import Message
from gateway.ops.admin import Admin, route
from gateway.ops.reload import Plan, ReloadRefused, reload_file
from gateway.ops.status import StatusTracker, readiness, status
from gateway.ops.tap import Tap
from gateway.ops.view import (
    BudgetView,
    DestinationView,
    Fixed,
    GatewaySnapshot,
    ListenerView,
    StoreView,
    UpstreamView,
)


def _config() -> dict[str, Any]:
    """A queue, a retained log with a named group, a topic; an upstream that never connects."""
    return {
        "gateway": {"drain_timeout": "1s"},
        "upstreams": [{"name": "far", "protocol": "ndjson", "connect": ["127.0.0.1:1"]}],
        "destinations": [
            {"name": "jobs", "kind": "queue"},
            {"name": "audit", "kind": "topic", "retain": 4096, "groups": ["readers"]},
        ],
    }


async def test_a_running_gateways_snapshot_round_trips_through_json(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with running_gateway(_config()) as gw:
        await gw.hub.publish([Message("jobs", b"a"), Message("jobs", b"bc")])
        await gw.hub.publish([Message("audit", b"x")])
        taken = gw.snapshot()
    sent = json.loads(json.dumps(taken.to_json()))
    assert GatewaySnapshot.from_json(sent) == taken
    jobs = next(d.figures for d in taken.destinations if d.name == "jobs")
    assert (jobs.kind, jobs.backlog) == ("queue", 2)
    assert [(g.name, g.backlog, g.members) for g in jobs.groups] == [("queue", 2, 0)]
    audit = next(d.figures for d in taken.destinations if d.name == "audit")
    assert audit.log is not None
    assert (audit.log.first, audit.log.next) == (0, 1)
    assert [(g.name, g.backlog) for g in audit.groups] == [("readers", 1)]
    assert [u.name for u in taken.upstreams] == ["far"]
    # The status of the snapshot sent is the status of the snapshot taken.
    assert status(GatewaySnapshot.from_json(sent)) == status(taken)


def _snapshot(**changes: Any) -> GatewaySnapshot:
    """A gateway's snapshot made by hand: no gateway, no trio."""
    taken = GatewaySnapshot(
        version="9.9.9",
        time=1000.0,
        started_at=900.0,
        draining=False,
        inflight=3,
        listeners=(ListenerView("nd", "ndjson", "jobs", ("127.0.0.1:4000",), 2, 2, bytes_in=10.0),),
        upstreams=(
            UpstreamView("far", "ndjson", ("10.0.0.1:1",), "backoff", "refused", 990.0, None, 0.0),
        ),
        destinations=(
            DestinationView(
                "jobs",
                DestinationFigures(
                    "queue",
                    received=3,
                    delivered=0,
                    acked=0,
                    backlog=3,
                    backlog_bytes=600,
                    kept=0,
                    kept_bytes=0,
                    kept_fill=0.0,
                    full=False,
                    groups=(GroupFigures("queue", 0, 3, 0, 3, 600, fill=0.5),),
                    limit_bytes=1 << 20,
                    limit_messages=1000,
                    discarded=0,
                ),
            ),
            DestinationView(
                "audit",
                DestinationFigures(
                    "log",
                    received=5,
                    delivered=5,
                    acked=0,
                    backlog=5,
                    backlog_bytes=None,
                    kept=5,
                    kept_bytes=4000,
                    kept_fill=4000 / 4096,
                    full=True,
                    groups=(GroupFigures("slow", 1, 0, 0, 5, committed=0),),
                    limit_bytes=4096,
                    log=LogFigures(0, 5, 4000, 4096, "block", blocked=1),
                ),
            ),
        ),
        budget=BudgetView(limit=100, used=100, peak=100, exhausted=True),
        store=StoreView(
            full=True, free=0, path="/data", needed=4096, error="ENOSPC", what="seg", held=1
        ),
    )
    return dataclasses.replace(taken, **changes)


def test_status_is_computed_from_a_snapshot_without_a_gateway() -> None:
    s = status(_snapshot())
    assert (s["uptime_s"], s["inflight"], s["ready"]) == (100.0, 3, False)
    assert s["listeners"] == [
        {
            "name": "nd",
            "protocol": "ndjson",
            "destination": "jobs",
            "addresses": ["127.0.0.1:4000"],
            "bound": True,
            "connections": 2,
            "max_connections": 2,
            "tls_refusals": 0,
            "last_tls_refusal": None,
            "last_tls_refusal_at": None,
        }
    ]
    jobs = next(d for d in s["destinations"] if d["name"] == "jobs")
    assert jobs["limits"] == {"bytes": 1 << 20, "messages": 1000}
    assert jobs["groups"][0] == {
        "name": "queue",
        "anonymous": False,
        "queued": 3,
        "unacked": 0,
        "held": 3,
        "held_bytes": 600,
        "members": 0,
        "full": False,
    }
    audit = next(d for d in s["destinations"] if d["name"] == "audit")
    assert audit["log"] == {
        "first": 0,
        "next": 5,
        "bytes": 4000,
        "retain": 4096,
        "overflow": "block",
        "full": True,
        "blocked": 1,
    }
    assert audit["groups"] == [
        {
            "name": "slow",
            "anonymous": False,
            "queued": 0,
            "unacked": 0,
            "behind": 5,
            "committed": 0,
            "members": 1,
            "dropped": 0,
        }
    ]
    assert (audit["received"], audit["delivered"], audit["acked"]) == (5, 5, 0)
    subjects = [h["subject"] for h in s["hints"]]
    assert subjects == [
        "memory",
        "store",
        "listener nd",
        "upstream far",
        "destination audit",
        "destination jobs",
    ]
    audit = next(h for h in s["hints"] if h["subject"] == "destination audit")
    assert "group slow has not committed 5 messages: 1 publish waits for room" in audit["text"]


def test_readiness_names_every_reason_from_the_snapshot() -> None:
    assert readiness(_snapshot(store=None)) == ["upstream far is backoff: refused"]
    unbound = dataclasses.replace(_snapshot().listeners[0], addresses=())
    reasons = readiness(_snapshot(started_at=None, draining=True, listeners=(unbound,)))
    assert reasons[:3] == [
        "the gateway has not started",
        "the gateway is draining (shutting down)",
        "listener nd is not bound",
    ]
    assert reasons[-1].startswith("the store's disk is full (/data): a write of 4096 bytes")


def test_a_tracker_given_snapshots_needs_no_view() -> None:
    now = [0.0]
    tracker = StatusTracker(window=5.0, clock=lambda: now[0])
    base = _snapshot()
    for second in range(4):
        now[0] = float(second)
        nd = dataclasses.replace(base.listeners[0], bytes_in=500.0 * second)
        tracker.sample(dataclasses.replace(base, listeners=(nd,)))
    rates = tracker.rates()
    assert rates["listeners"]["nd"]["bytes_in"] == 500.0
    assert rates["destinations"]["jobs"]["backlog"] == 0.0


class _Refusing:
    """A reload target that is no gateway: it records the configs it is asked to apply."""

    def __init__(self, path: Path | None) -> None:
        self.config_path = path
        self.applied: list[Config] = []

    def read_config(self, path: Path) -> Config:
        if "bad" in path.name:
            raise ConfigError([f"{path}: listeners: not an array"])
        return parse({}, source=str(path))

    async def reload(self, config: Config) -> Plan:
        self.applied.append(config)
        return Plan(routes_changed=True)


class _NoTaps:
    def tap(self, pattern: str, filter: Any = None) -> Tap:
        raise AssertionError("no tap expected")

    def untap(self, tap: Tap) -> None:
        raise AssertionError("no tap expected")


def test_the_admin_api_answers_from_a_snapshot_it_was_given() -> None:
    admin = Admin(view=Fixed(_snapshot()), reloader=_Refusing(None), taps=_NoTaps())
    ready = route(admin, None, "GET", "/readyz")
    assert ready.status == 503
    assert json.loads(ready.body)["reasons"][0] == "upstream far is backoff: refused"
    answer = route(admin, StatusTracker(admin.view), "GET", "/api/status")
    assert json.loads(answer.body)["destinations_total"] == 2


async def test_a_reload_goes_through_the_narrow_interface(tmp_path: Path) -> None:
    with pytest.raises(ReloadRefused, match="embedded default"):
        await reload_file(_Refusing(None))
    bad = _Refusing(tmp_path / "bad.toml")
    with pytest.raises(ReloadRefused, match="has errors; keeping the running config"):
        await reload_file(bad)
    assert bad.applied == []
    good = _Refusing(tmp_path / "good.toml")
    assert await reload_file(good) == "routes replaced"
    assert len(good.applied) == 1
