"""Every example in the README and docs does what the docs say, so they cannot drift.

- **TOML**: each ```toml block that is a whole config (it has a listener or an
  upstream) passes what ``gateway check`` runs. Each ```json block parses.
- **Python**: each ```python block is at least compiled (top-level ``await``
  allowed), and most are run, each in a fresh namespace in an empty temporary
  working directory. The line right before a block may say otherwise:

  - ``<!-- fragment -->``: an excerpt (a method out of its class, a client that
    needs a server, a server that runs for ever): compiled only;
  - ``<!-- tested elsewhere: tests/PATH.py -->``: a test there runs it with
    what it needs; this test checks that the file exists and reads the doc
    (``<!-- run-by: tests/PATH.py -->`` is the same);
  - ``<!-- continues -->``: it goes on from the block before it (which runs
    too), as a client after its server: the two run as one program.

  A block without a mark must run as it is written: importing only what it
  imports, defining what it uses.

The worked example of plugins.md (a line protocol, codec included) is also run
against a gateway here, as a reader would: registered, listening, publishing
what a client sends and answering once the message is safe.
"""

from __future__ import annotations

import ast
import json
import socket
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from documented import ROOT, PythonExample, json_blocks, python_examples, toml_configs
from harness import host_port, running_gateway
from toy_line import registered

from gateway.config.certs import init_dir
from gateway.config.loader import load

CONFIGS = toml_configs()
JSON = json_blocks()
EXAMPLES = python_examples()
RUN = [e for e in EXAMPLES if e.mode == "run"]
ELSEWHERE = [e for e in EXAMPLES if e.mode == "elsewhere"]


def test_the_docs_have_config_examples() -> None:
    assert len(CONFIGS) >= 4


@pytest.mark.parametrize(("where", "text"), CONFIGS, ids=[w for w, _ in CONFIGS])
def test_config_example_is_valid(where: str, text: str, tmp_path: Path) -> None:
    tomllib.loads(text)  # a syntax error names the block in the test id
    init_dir(tmp_path / "certs")
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    load(path)  # raises ConfigError listing every problem


@pytest.mark.parametrize(("where", "text"), JSON, ids=[w for w, _ in JSON])
def test_json_example_parses(where: str, text: str) -> None:
    json.loads(text)


def test_most_python_examples_run() -> None:
    """Marks are the exception: a doc cannot stop testing its examples unnoticed."""
    assert len(EXAMPLES) >= 10
    assert len(RUN) >= 4
    assert len(RUN) + len(ELSEWHERE) > len(EXAMPLES) // 2


def compiled(example: PythonExample) -> Any:
    return compile(
        example.code, example.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.where for e in EXAMPLES])
def test_python_example_compiles(example: PythonExample) -> None:
    compiled(example)  # a SyntaxError names the block in the test id


@pytest.mark.parametrize("example", RUN, ids=[e.where for e in RUN])
def test_python_example_runs(
    example: PythonExample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code = compiled(example)
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    result = eval(code, namespace)  # a block with top-level await gives a coroutine
    if result is not None:

        async def main() -> None:
            await result

        trio.run(main)


@pytest.mark.parametrize("example", ELSEWHERE, ids=[e.where for e in ELSEWHERE])
def test_python_example_is_run_where_it_says(example: PythonExample) -> None:
    assert example.tested_by is not None
    test = ROOT / example.tested_by
    assert test.is_file(), f"{example.where} says {example.tested_by} runs it: no such file"
    doc = example.where.split("#")[0]
    assert Path(doc).name in test.read_text(encoding="utf-8"), (
        f"{example.tested_by} does not read {doc}"
    )


def worked_example() -> dict[str, Any]:
    """The namespace plugins.md's line protocol defines."""
    plugins = [e for e in RUN if e.where.startswith("docs/plugins.md")]
    (example,) = [e for e in plugins if "class LinePlugin" in e.code]
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compiled(example), namespace)
    return namespace


def unread(stream: trio.SocketStream) -> bytes:
    """What has arrived on ``stream`` and is not read yet, without waiting or reading it."""
    with socket.fromfd(stream.socket.fileno(), socket.AF_INET, socket.SOCK_STREAM) as dup:
        try:
            return dup.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return b""


async def test_the_worked_example_serves_lines() -> None:
    plugin = worked_example()["LinePlugin"]
    config = {
        "listeners": [{"name": "l", "protocol": "line", "bind": "127.0.0.1:0", "destination": "d"}],
        "destinations": [{"name": "d", "kind": "queue"}],
    }
    async with running_gateway(config, registry=registered(plugin)) as gw:
        sub = gw.hub.subscribe("d", max_unacked=10)
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["l"][0]))
        async with stream:
            await stream.send_all(b"hello\n")
            with trio.fail_after(5):
                (delivery,) = await sub.receive()
            assert delivery.message.body == b"hello"
            assert delivery.message.source is not None
            assert delivery.message.source.listener == "l"
            await trio.testing.wait_all_tasks_blocked()  # what it would write is written
            assert unread(stream) == b"", "answered before the consumer acked"
            sub.ack(delivery.tag)
            with trio.fail_after(5):
                assert await stream.receive_some() == b"ok\n"
