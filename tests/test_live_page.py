"""The live page (``GET /live`` on the admin endpoint) in a real headless browser.

Debian's chromium, driven by selenium, loads the page from a gateway running
in this process; the page opens a WebSocket to the gateway's reactive
listener bound on ``ws://``, subscribes and shows what is published (through
an ndjson listener) as it arrives. The tests check that messages show up,
old and live, that the page asks for them in windows and gets none beyond
what it asked for (paused, it gets only what it had asked for), that
packed and split elements come out whole, that onComplete, onError, the
gateway's goodbye and a refused origin are shown, and, against a publisher
written here with the project's codec, that the page answers pings and
refuses elements beyond its demand.

Real sockets and a real browser need the real clock: every wait is a poll
guarded by a timeout, and "nothing more arrives" is checked over :data:`QUIET`.
chromium and chromedriver are required, not optional: without them the tests
fail and say what to install.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from interchange_websocket.transport import WebSocketTransport

from gateway.runtime.gateway import Gateway
from gateway.sdk import NEED_DATA
from protocols.reactive import (
    Connection,
    GoodbyeReceived,
    Hello,
    Ping,
    Ponged,
    Role,
    Subscribed,
    SubscribeRequested,
)
from protocols.reactive.messages import OnNext, encode

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TIMEOUT = 60.0  # seconds a whole test may take
WAIT = 10.0  # seconds the page may take to show one expected thing
QUIET = 0.5  # seconds in which an unexpected element would have arrived
WINDOW = 4

T = TypeVar("T")


def free_port() -> int:
    """A port free now, for the admin endpoint: the listener's origin must name it up front."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(admin_port: int, origin: str | None = None, **live: Any) -> dict[str, Any]:
    """An admin endpoint, an ndjson listener to publish with, and a reactive one on ws://."""
    origin = origin or f"http://127.0.0.1:{admin_port}"
    return {
        "gateway": {"drain_timeout": "1s"},
        "admin": {"bind": f"127.0.0.1:{admin_port}"},
        "listeners": [
            {"name": "ingest", "protocol": "ndjson", "bind": "127.0.0.1:0"},
            {
                "name": "live",
                "protocol": "reactive",
                "bind": f"ws://127.0.0.1:0/rs?origin={origin}",
                "destination": "logs",
                "publishers": ["logs", "fixed"],
                **live,
            },
        ],
        "destinations": [
            {"name": "logs", "retain": "1MiB"},
            {"name": "secret", "retain": "1MiB"},
            {"name": "fixed", "retain": "1MiB", "element_size": 4},
        ],
    }


def browser() -> Any:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the live page test needs a headless browser;"
            " install it with `apt-get install chromium chromium-driver` (Debian)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    driver = await in_thread(browser)
    try:
        yield driver
    finally:
        await in_thread(driver.quit)


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Selenium's calls block: they run in a worker thread while the gateway serves."""
    return await trio.to_thread.run_sync(fn, *args)


async def until(driver: Any, check: Callable[[Any], bool], what: str) -> None:
    """Poll ``check(driver)`` (in a thread) until it is true."""
    with trio.move_on_after(WAIT):
        while not await in_thread(check, driver):
            await trio.sleep(0.1)
        return
    raise AssertionError(f"the page never showed {what}: {page(driver)}")


def texts(driver: Any, css: str) -> list[str]:
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), (e) => e.textContent);",
            css,
        )
    )


def page(driver: Any) -> dict[str, Any]:
    """What the page shows: its state, counters, signals and messages."""
    counters = ("received", "requested", "requests", "outstanding", "pings")
    return {
        "state": texts(driver, "#state")[0],
        **{k: int(texts(driver, f"#{k}")[0]) for k in counters},
        "signals": texts(driver, "#signals li"),
        "messages": texts(driver, "#messages li"),
    }


def live_url(gw: Gateway, publisher: str, ws: str | None = None) -> str:
    query = {"ws": ws or gw.addresses["live"][0], "publisher": publisher, "window": WINDOW}
    return f"http://{gw.admin_addresses[0]}/live?{urllib.parse.urlencode(query)}"


async def publish(gw: Gateway, *bodies: bytes, destination: str = "logs") -> None:
    """Publish through the ndjson listener and wait until the gateway has them."""
    async with await NdjsonClient.connect(*host_port(gw.addresses["ingest"][0])) as pub:
        await pub.wait_answers(await pub.publish_nowait(list(bodies), destination))


def bodies(start: int, stop: int) -> list[bytes]:
    return [b"message %d" % i for i in range(start, stop)]


def received(n: int) -> Callable[[Any], bool]:
    return lambda d: page(d)["received"] == n


def severe(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in log if entry["level"] == "SEVERE"]


async def click(driver: Any, css: str) -> None:
    from selenium.webdriver.common.by import By

    await in_thread(lambda: driver.find_element(By.CSS_SELECTOR, css).click())


async def test_messages_arrive_old_and_live_within_the_pages_demand() -> None:
    admin = free_port()
    async with chromium() as driver, running_gateway(config(admin)) as gw:
        with trio.fail_after(TIMEOUT):
            await publish(gw, *bodies(0, 6))
            await in_thread(driver.get, live_url(gw, "logs?from=earliest"))
            assert driver.title == "Interchange live"
            await until(driver, received(6), "the 6 messages published before")
            shown = page(driver)
            assert shown["messages"] == [b.decode() for b in bodies(0, 6)]
            assert shown["state"] == "subscribed"
            assert shown["requests"] >= 2  # one window was not enough
            assert shown["requested"] - shown["received"] == shown["outstanding"]
            assert 0 < shown["outstanding"] <= WINDOW

            await publish(gw, *bodies(6, 16))
            await until(driver, received(16), "the 10 messages published since")
            assert page(driver)["messages"] == [b.decode() for b in bodies(0, 16)]

            await click(driver, "#pause")
            paused = page(driver)
            assert paused["state"] == "paused"
            ahead = paused["outstanding"]  # asked for before the pause
            assert 0 < ahead <= WINDOW
            await publish(gw, *bodies(16, 28))
            await until(driver, received(16 + ahead), "what it had asked for")
            await trio.sleep(QUIET)
            assert page(driver)["received"] == 16 + ahead, "the gateway sent beyond the demand"

            await click(driver, "#pause")  # resume
            await until(driver, received(28), "the rest once resumed")
            done = page(driver)
            assert done["messages"] == [b.decode() for b in bodies(0, 28)]
            assert done["requested"] - done["received"] == done["outstanding"] <= WINDOW

            await click(driver, "#stop")
            await until(driver, lambda d: page(d)["state"] == "closed", "the close")
            signals = page(driver)["signals"]
            assert "cancelled" in signals
            assert signals[-1].startswith("closed ("), signals  # not "closed without a goodbye"
            assert not severe(await in_thread(driver.get_log, "browser"))


async def test_packed_and_split_elements_come_out_whole() -> None:
    admin = free_port()
    big = b"x" * 3000  # above part_size: sent in parts
    async with chromium() as driver, running_gateway(config(admin, part_size="1KiB")) as gw:
        with trio.fail_after(TIMEOUT):
            await publish(gw, b"small", big, b"tail")
            await in_thread(driver.get, live_url(gw, "logs?from=earliest"))
            await until(driver, received(3), "the split element")
            assert page(driver)["messages"] == ["small", big.decode(), "tail"]

            fixed = [b"%04d" % i for i in range(10)]
            await publish(gw, *fixed, destination="fixed")
            await in_thread(driver.get, live_url(gw, "fixed?from=earliest"))
            await until(driver, received(10), "the packed elements")
            shown = page(driver)
            assert shown["messages"] == [b.decode() for b in fixed]
            assert "subscribed to fixed?from=earliest (elements of 4 bytes)" in shown["signals"]
            assert not severe(await in_thread(driver.get_log, "browser"))


async def test_the_page_shows_how_a_stream_ends() -> None:
    admin = free_port()
    async with chromium() as driver, running_gateway(config(admin)) as gw:
        with trio.fail_after(TIMEOUT):
            await publish(gw, *bodies(0, 5))
            await in_thread(driver.get, live_url(gw, "logs?from=earliest&to=3"))
            await until(driver, lambda d: page(d)["state"] == "closed", "the end of a finite read")
            shown = page(driver)
            assert shown["messages"] == [b.decode() for b in bodies(0, 3)]
            assert "onComplete" in shown["signals"]
            assert shown["signals"][-1].startswith("closed ("), shown

            await in_thread(driver.get, live_url(gw, "secret"))
            await until(driver, lambda d: page(d)["state"] == "closed", "the refusal")
            [refusal] = [s for s in page(driver)["signals"] if s.startswith("onError: ")]
            assert "not exposed" in refusal

            await in_thread(driver.get, live_url(gw, "logs"))
            await until(driver, lambda d: page(d)["state"] == "subscribed", "the subscription")
            gw.shutdown()
            await until(driver, lambda d: page(d)["state"] == "closed", "the gateway leaving")
            goodbye = [s for s in page(driver)["signals"] if s.startswith("goodbye: ")]
            assert goodbye == ["goodbye: going-away: the gateway is shutting down"]
            assert not severe(await in_thread(driver.get_log, "browser"))


async def test_a_listener_refusing_the_pages_origin_is_explained() -> None:
    admin = free_port()
    elsewhere = config(admin, origin="https://app.example")
    async with chromium() as driver, running_gateway(elsewhere) as gw:
        with trio.fail_after(TIMEOUT):
            await in_thread(driver.get, live_url(gw, "logs"))
            await until(driver, lambda d: page(d)["state"] == "closed", "the failed connection")
            [said] = page(driver)["signals"]
            assert said.startswith("could not connect to ws://127.0.0.1:")
            assert f"?origin=http://127.0.0.1:{admin}" in said


async def serve_one(listener: trio.abc.Listener[Any], address: str, peer: Connection) -> Any:
    """Accept one WebSocket connection; the stream, after the hello exchange."""
    stream = await WebSocketTransport().accepted(await listener.accept(), address)
    await stream.send_all(peer.hello())
    assert isinstance(await event(stream, peer), Hello)
    return stream


async def event(stream: Any, peer: Connection) -> Any:
    with trio.fail_after(WAIT):
        while (found := peer.next_event()) is NEED_DATA:
            peer.receive_data(await stream.receive_some(65536))
        return found


async def test_the_page_answers_pings_and_refuses_elements_beyond_its_demand() -> None:
    """A publisher written here: it pings, then sends one element more than requested."""
    admin = free_port()
    transport = WebSocketTransport()
    address = "ws://127.0.0.1:0/fake"
    [listener] = await transport.listen(address)
    fake = transport.listener_name(listener)
    async with chromium() as driver, running_gateway(config(admin)) as gw, listener:
        with trio.fail_after(TIMEOUT):
            await in_thread(driver.get, live_url(gw, "anything", ws=fake))
            peer = Connection(Role.SERVER)
            stream = await serve_one(listener, address, peer)
            assert await event(stream, peer) == SubscribeRequested(1, "anything", WINDOW)
            await stream.send_all(peer.send(Ping(b"still there?")))
            assert await event(stream, peer) == Ponged(b"still there?")
            await until(driver, lambda d: page(d)["pings"] == 1, "the ping answered")

            await stream.send_all(peer.send(Subscribed(1, 0)))
            await until(driver, lambda d: page(d)["state"] == "subscribed", "the subscription")
            await click(driver, "#pause")  # it asks for nothing more: WINDOW is all it may get
            # The codec refuses to over-deliver; the raw encoder does not.
            extra = b"".join(encode(OnNext(1, b"%d" % i)) for i in range(WINDOW + 1))
            await stream.send_all(extra)
            said = await event(stream, peer)
            assert isinstance(said, GoodbyeReceived)
            assert said.reason == "protocol-error: more elements than requested"
            await stream.aclose()
            await until(driver, lambda d: page(d)["state"] == "closed", "the close")
            shown = page(driver)
            assert "protocol error: more elements than requested" in shown["signals"]
            assert shown["received"] == WINDOW  # the one beyond the demand is not shown
            assert shown["requests"] == 1
