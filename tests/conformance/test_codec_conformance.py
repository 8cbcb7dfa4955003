"""Every codec of every protocol, through the same conformance checks.

The checks (:mod:`gateway.protocol.conformance`, also ``gateway.sdk.conformance``
for a third party's tests) hold each codec to the shared lifecycle: golden
vectors split at every byte, input cut anywhere, the same answer after close,
sticky errors, sends refused in the wrong state, ``held_bytes`` bounded by the
codec's limits. A codec joins by registering a :class:`~gateway.sdk.CodecCase`
in one of the ``*_cases.py`` modules beside this one and listing it here.
"""

from __future__ import annotations

import lumberjack_cases
import ndjson_cases
import pytest
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
]


def test_the_registry_names_each_codec_once() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_conformance(case: CodecCase, check: Check) -> None:
    check(case)
