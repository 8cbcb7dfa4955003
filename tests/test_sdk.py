"""gateway.sdk, the one import surface of protocols and plugins."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gateway.sdk as sdk


def test_every_public_name_is_in_the_table_and_the_other_way_round() -> None:
    assert sorted(sdk.__all__) == sorted(sdk._WHERE)
    assert len(set(sdk.__all__)) == len(sdk.__all__)


@pytest.mark.parametrize("name", sdk.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(sdk, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        sdk.Nothing  # noqa: B018


def test_a_codec_s_vocabulary_imports_no_io_library() -> None:
    """A sans-IO codec imports its names from the SDK and stays free of trio."""
    code = (
        "import sys\n"
        "from gateway.sdk import NEED_DATA, ConnectionClosed, Lifecycle, ReceiveBuffer\n"
        "from gateway.sdk import LocalProtocolError, RemoteProtocolError, WrongState\n"
        "print(sorted({'trio', 'socket', 'asyncio'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
