"""The status page in a real headless browser: Debian's chromium driven by selenium.

The gateway runs in this process; the browser loads ``/``, whose script polls
``/api/status`` every second. The test checks that the listeners render, that
a publish into a queue nobody consumes shows up as a backlog, a hint and a
trend chart above zero (while an idle listener's chart stays flat), and saves
a screenshot into pytest's ``tmp_path``. Selenium's calls block, so they
run in worker threads while the gateway serves.

chromium and chromedriver are required, not optional: without them the test
fails and says what to install (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TIMEOUT = 60.0

T = TypeVar("T")


def config() -> dict[str, Any]:
    return {
        "gateway": {"drain_timeout": "1s"},
        "admin": {"bind": "127.0.0.1:0"},
        "listeners": [
            {"name": "ingest", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "jobs"},
            {"name": "idle", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "jobs"},
        ],
        "destinations": [{"name": "jobs", "kind": "queue"}],
    }


def browser() -> Any:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the status page test needs a headless browser;"
            " install it with `apt-get install chromium chromium-driver` (Debian)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await trio.to_thread.run_sync(fn, *args)


async def until(driver: Any, check: Callable[[Any], bool], what: str, timeout: float = 10) -> None:
    """Poll ``check(driver)`` (in a thread) until it is true."""
    with trio.move_on_after(timeout):
        while not await in_thread(check, driver):
            await trio.sleep(0.1)
        return
    raise AssertionError(f"the page never showed {what}")


def text(driver: Any, css: str) -> str:
    """The text of the first element ``css`` selects, or "" if there is none.

    The page re-renders its tables on every refresh, so an element found may be
    replaced before its text is read: then it is looked up again.
    """
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(10):
        found = driver.find_elements(By.CSS_SELECTOR, css)
        try:
            return str(found[0].text) if found else ""
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} was replaced ten times in a row")


def chart(driver: Any, row: str) -> tuple[str, list[list[float]]]:
    """The text alternative of the trend chart in ``row``, and its "in" line's points.

    The points are (x, height above the chart's zero line) pairs, as drawn;
    ("", []) when the row has no chart (yet).
    """
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(10):
        found = driver.find_elements(By.CSS_SELECTOR, f"{row} td.trend svg")
        try:
            if not found:
                return "", []
            svg = found[0]
            label = str(svg.get_dom_attribute("aria-label"))
            height = float(str(svg.get_dom_attribute("viewBox")).split()[3])
            line = svg.find_element(By.CSS_SELECTOR, "polyline.in").get_dom_attribute("points")
        except StaleElementReferenceException:
            continue
        pairs = [p.split(",") for p in str(line).split()]
        return label, [[float(x), height - 1 - float(y)] for x, y in pairs]
    raise AssertionError(f"{row} was replaced ten times in a row")


def rising(driver: Any, row: str) -> bool:
    """Whether the last point of the chart in ``row`` is above zero."""
    points = chart(driver, row)[1]
    return bool(points) and points[-1][1] > 0


async def test_the_page_renders_and_follows_the_traffic(tmp_path: Path) -> None:
    driver = await in_thread(browser)
    try:
        async with running_gateway(config()) as gw:
            with trio.fail_after(TIMEOUT):
                url = f"http://{gw.admin_addresses[0]}/"
                await in_thread(driver.get, url)
                assert driver.title == "Interchange status"

                listener = '#listeners tr[data-name="ingest"]'
                await until(driver, lambda d: "ndjson" in text(d, listener), "the listener")
                assert gw.addresses["ingest"][0] in text(driver, listener)
                assert text(driver, "#ready") == "ready"
                backlog = '#destinations tr[data-name="jobs"] td.backlog'
                await until(driver, lambda d: text(d, backlog) == "0", "an empty queue")

                host, port = host_port(gw.addresses["ingest"][0])
                async with await NdjsonClient.connect(host, port) as pub:
                    await pub.publish_nowait([b"one", b"two", b"three"])
                    await until(driver, lambda d: text(d, backlog) == "3", "a backlog of 3")
                    await until(driver, lambda d: "no subscriber" in text(d, "#hints"), "the hint")
                    conns = text(driver, f"{listener} td.connections")
                    assert conns == "1 / 1024", conns

                    dest = '#destinations tr[data-name="jobs"]'
                    for row in (listener, dest):
                        await until(driver, partial(rising, row=row), f"the chart of {row} rising")
                        label, points = chart(driver, row)
                        assert points[0][1] == 0, points  # before the publish
                        said = re.match(r"msg/s in now ([\d.]+) \(range 0 to ([\d.]+)\)", label)
                        assert said, label
                        assert 0 < float(said[1]) <= float(said[2]), label
                        assert "over the last" in label, label

                    idle = '#listeners tr[data-name="idle"]'
                    await until(driver, lambda d: len(chart(d, idle)[1]) > 2, "3 points of idle")
                    label, points = chart(driver, idle)
                    assert all(y == 0 for _, y in points), points
                    flat = "msg/s in now 0 (range 0 to 0), out now 0 (range 0 to 0)"
                    assert label.startswith(flat), label

                    shot = tmp_path / "status-page.png"
                    assert await in_thread(driver.save_screenshot, str(shot))
                    print(f"status page screenshot: {shot}")
                    assert shot.stat().st_size > 1000

            errors = [
                entry
                for entry in await in_thread(driver.get_log, "browser")
                if entry["level"] == "SEVERE"
            ]
            assert not errors, errors  # no script error, no blocked resource
    finally:
        await in_thread(driver.quit)


#: Feeds the page ten minutes of snapshots, one a second, in one go (the
#: page's own refresh cannot run in between), then answers the ingest
#: listener's chart: its text alternative and the points of its "in" line.
REPLAY = """
const done = arguments[arguments.length - 1];
fetch("/api/status").then((r) => r.json()).then((s) => {
  const start = s.time + 3600;
  for (let i = 0; i < 600; i++) {
    s.time = start + i;
    s.rates.listeners.ingest = { messages_in: i % 10, messages_out: 0 };
    render(s);
  }
  const svg = document.querySelector('#listeners tr[data-name="ingest"] td.trend svg');
  done([svg.getAttribute("aria-label"), svg.querySelector("polyline.in").getAttribute("points")]);
});
"""


async def test_a_chart_keeps_the_last_five_minutes() -> None:
    driver = await in_thread(browser)
    try:
        async with running_gateway(config()) as gw:
            with trio.fail_after(TIMEOUT):
                await in_thread(driver.get, f"http://{gw.admin_addresses[0]}/")
                listener = '#listeners tr[data-name="ingest"]'
                await until(driver, lambda d: "ndjson" in text(d, listener), "the listener")
                label, points = await in_thread(driver.execute_async_script, REPLAY)
        xs = [float(p.split(",")[0]) for p in points.split()]
        assert len(xs) == 300, len(xs)  # one point a second, five minutes of them
        assert xs == sorted(xs)
        assert 0 < xs[0] < 1, xs[0]
        assert xs[-1] == 120, xs[-1]
        assert label.startswith("msg/s in now 9 (range 0 to 9), out now 0 (range 0 to 0)"), label
        assert label.endswith("over the last 5m"), label
    finally:
        await in_thread(driver.quit)
