"""Every codec of every protocol, through the same conformance checks.

The checks (:mod:`gateway.protocol.conformance`, also ``gateway.sdk.conformance``
for a third party's tests) hold each codec to the shared lifecycle: golden
vectors split at every byte, input cut anywhere, the same answer after close,
sticky errors, sends refused in the wrong state, ``held_bytes`` bounded by the
codec's limits. A codec joins by registering a :class:`~gateway.sdk.CodecCase`
in one of the ``*_cases.py`` modules beside this one and listing it here.
"""

from __future__ import annotations

import subprocess
import sys

import lumberjack_cases
import micromessage_cases
import ndjson_cases
import pytest
import reactive_cases
import segment_cases
import template_cases
import ttrpc_cases

from gateway.protocol.conformance import CHECKS, Check, CodecCase

#: The registry: every codec case the suite runs.
CASES: list[CodecCase] = [
    *lumberjack_cases.CASES,
    *segment_cases.CASES,
    *ttrpc_cases.CASES,
    *ndjson_cases.CASES,
    *template_cases.CASES,
    *micromessage_cases.CASES,
    *reactive_cases.CASES,
]


def test_the_registry_names_each_codec_once() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))


#: Every protocol's codec module, and the suite itself: none may import an I/O library.
CODEC_MODULES = [
    "protocols.lumberjack.codec",
    "protocols.segment.codec",
    "protocols.ttrpc.codec",
    "interchange_ndjson.codec",
    "protocols._template.codec",
    "protocols.micromessage.codec",
    "protocols.reactive.codec",
    "gateway.protocol.conformance",
]


@pytest.mark.parametrize("module", CODEC_MODULES)
def test_a_codec_imports_no_io_library(module: str) -> None:
    code = (
        f"import sys, {module}; print(sorted({{'trio', 'socket', 'asyncio'}} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_conformance(case: CodecCase, check: Check) -> None:
    check(case)
