"""The status page in a real headless browser: Debian's chromium driven by selenium.

The gateway runs in this process; the browser loads ``/``, whose script polls
``/api/status`` every second. The test checks that the listeners render, that
a publish into a queue nobody consumes shows up as a backlog and a hint, and
saves a screenshot into pytest's ``tmp_path``. Selenium's calls block, so they
run in worker threads while the gateway serves.

chromium and chromedriver are required, not optional: without them the test
fails and says what to install (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
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
            {"name": "ingest", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "jobs"}
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
