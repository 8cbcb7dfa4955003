"""The wheels install the project's own distributions, never a stranger's.

PyPI's ``interchange`` is an unrelated project, so the gateway is distributed as
``interchange-gateway`` and the bundled ndjson plugin as
``interchange-gateway-ndjson``, which depends on the former. These tests build
both wheels as a user would (``pip wheel``) and ask pip what it would install
from them into a fresh virtualenv (``--dry-run --report``): the real
dependencies come from the package index, the project's own only from the built
wheels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "plugins" / "ndjson"
CORE_NAME = "interchange-gateway"
PLUGIN_NAME = "interchange-gateway-ndjson"


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    """Run this interpreter's pip quietly, failing with its whole output."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, f"pip {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The core's and the plugin's wheels, built from this checkout."""
    out = tmp_path_factory.mktemp("wheels")
    _pip("wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(ROOT), str(PLUGIN))
    built = {_normalized(p.name.split("-")[0]): p for p in out.glob("*.whl")}
    assert set(built) == {"interchange-gateway", "interchange-gateway-ndjson"}, built
    return {CORE_NAME: built[CORE_NAME], PLUGIN_NAME: built[PLUGIN_NAME]}


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty virtualenv's interpreter, for pip to resolve into."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    return venv / "bin" / "python"


def _resolve(fresh_python: Path, wheels: dict[str, Path], names: list[str]) -> list[Any]:
    """What ``pip install`` of these wheels would install into the fresh virtualenv."""
    report = fresh_python.parent.parent / "report.json"
    wheel_dir = next(iter(wheels.values())).parent
    _pip(
        "--python",
        str(fresh_python),
        "install",
        "--dry-run",
        "--quiet",
        "--report",
        str(report),
        "--find-links",
        str(wheel_dir),
        *(str(wheels[name]) for name in names),
    )
    installs: list[Any] = json.loads(report.read_text(encoding="utf-8"))["install"]
    return installs


def _by_name(installs: list[Any]) -> dict[str, Any]:
    return {_normalized(item["metadata"]["name"]): item for item in installs}


@pytest.mark.slow
@pytest.mark.parametrize(
    "names",
    [[CORE_NAME], [PLUGIN_NAME], [CORE_NAME, PLUGIN_NAME]],
    ids=["core", "plugin", "both"],
)
def test_wheels_resolve_only_the_projects_own_distributions(
    wheels: dict[str, Path], fresh_python: Path, names: list[str]
) -> None:
    resolved = _by_name(_resolve(fresh_python, wheels, names))
    assert "interchange" not in resolved
    # The core comes from the wheel built here, the plugin's dependency included.
    core = resolved[CORE_NAME]
    assert core["download_info"]["url"] == wheels[CORE_NAME].as_uri()
    assert core["metadata"]["version"] == _project(ROOT)["version"]
    ours = {name for name in resolved if name.startswith("interchange")}
    assert ours == {CORE_NAME, *names}
    # The real dependencies do come along: the install is complete, not just ours.
    assert {"trio", "msgpack", "h11"} <= set(resolved)


@pytest.mark.slow
def test_the_plugin_depends_on_the_core_by_its_distribution_name(
    wheels: dict[str, Path], fresh_python: Path
) -> None:
    plugin = _by_name(_resolve(fresh_python, wheels, [PLUGIN_NAME]))[PLUGIN_NAME]
    assert plugin["metadata"]["requires_dist"] == [CORE_NAME]


def _project(root: Path) -> dict[str, Any]:
    """The ``[project]`` table of a pyproject.toml, with the version filled in."""
    project: dict[str, Any] = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["project"]
    if "version" not in project:
        import gateway

        project["version"] = gateway.__version__
    return project


def test_names_agree_between_pyproject_files_and_the_installed_metadata() -> None:
    import importlib.metadata

    import gateway

    assert _project(ROOT)["name"] == CORE_NAME
    assert _project(PLUGIN)["name"] == PLUGIN_NAME
    assert _project(PLUGIN)["dependencies"] == [CORE_NAME]
    assert importlib.metadata.version(CORE_NAME) == gateway.__version__
    installed = importlib.metadata.distribution(PLUGIN_NAME)
    assert {ep.group for ep in installed.entry_points} == {"interchange.protocols"}


def _sh_blocks(markdown: str) -> list[str]:
    """The one-line commands of a document's ```sh blocks."""
    blocks = markdown.split("```sh\n")[1:]
    return [line for block in blocks for line in block.split("```")[0].splitlines() if line]


def test_ci_runs_the_readmes_test_command_word_for_word() -> None:
    readme = _sh_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    test_command = next(c for c in readme if c.startswith("bash .ci/test-deps && "))
    assert test_command.endswith("&& python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert f"{test_command} || exit" in ci
    # The quick start keeps its two commands: install and run, install and test.
    quick_start = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quick start")[1]
    setups = [c for c in _sh_blocks(quick_start.split("\n## ")[0]) if "python3 -m venv" in c]
    assert len(setups) == 2
    assert setups[0].endswith("&& gateway run")
    assert setups[1] == test_command
