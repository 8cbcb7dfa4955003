"""Java parity: what ``java.io.DataOutputStream`` writes is what our encoder writes.

``SegmentVectors.java`` (beside this file) writes every research vector and
the error replies the research has no vector for, field by field as
Pravega's ``WireCommands`` do, then ``writeUTF`` of strings this test sends
it. It is compiled with ``javac`` into the test's temporary directory.

A missing JDK fails the test (install one: ``apt install openjdk-17-jdk-headless``)
unless ``INTERCHANGE_SKIP_JAVA=1`` is set, which skips it instead.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from segment_vectors import COMMANDS, SEGMENT, VECTORS

from protocols.segment import (
    AuthTokenCheckFailed,
    Command,
    ErrorMessage,
    GetStreamSegmentInfo,
    LocateOffset,
    OffsetLocated,
    OperationUnsupported,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    StreamSegmentInfo,
    encode,
)
from protocols.segment.mutf8 import encode_utf

SOURCE = Path(__file__).with_name("SegmentVectors.java")
#: What the Java program wrote: the commands by name, and writeUTF of each string.
JavaOutput = tuple[dict[str, bytes], list[bytes]]

#: The commands the Java program writes beyond the research vectors.
MORE: dict[str, Command] = {
    "segment_is_sealed": SegmentIsSealed(3, SEGMENT, "at Store.append", 4096),
    "segment_already_exists": SegmentAlreadyExists(4, SEGMENT, ""),
    "segment_is_truncated": SegmentIsTruncated(5, SEGMENT, 1000, "", 10),
    "operation_unsupported": OperationUnsupported(6, "createSegment", ""),
    "auth_token_check_failed": AuthTokenCheckFailed(7, "", 1),
    "error_message": ErrorMessage(8, SEGMENT, "café \x00 \U0001f600", 0),
    # Pravega's own layouts: without Interchange's trailing fields (left at their
    # defaults, so not written), the bytes are Pravega's.
    "get_stream_segment_info": GetStreamSegmentInfo(9, SEGMENT),
    "stream_segment_info": StreamSegmentInfo(
        9, SEGMENT, True, False, False, 1700000000000, 4096, 1024
    ),
    "locate_offset": LocateOffset(10, SEGMENT, 2048),
    "offset_located": OffsetLocated(10, SEGMENT, 2000),
}

#: Strings whose ``writeUTF`` bytes are compared: the edges, then random ones from
#: every plane (no lone surrogates: our encoder refuses them).
EDGES = [
    "",
    "a\x00é\U0001f600",
    SEGMENT,
    "\x00",
    "\x7f\x80\u07ff\u0800",
    "\ud7ff\ue000\uffff",
    "\U00010000\U0010ffff",
    "日本語のセグメント",
    "€" * 21845,  # 65535 bytes: the longest string
]


def random_strings(count: int) -> list[str]:
    rng = random.Random(20250302)
    ranges = [(0, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    out = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randrange(0, 40)):
            low, high = rng.choice(ranges)
            chars.append(chr(rng.randint(low, high)))
        out.append("".join(chars))
    return out


def java_tools() -> tuple[str, str]:
    javac, java = shutil.which("javac"), shutil.which("java")
    if javac and java:
        return javac, java
    if os.environ.get("INTERCHANGE_SKIP_JAVA") == "1":
        pytest.skip("no JDK (javac/java) on PATH and INTERCHANGE_SKIP_JAVA=1: Java parity skipped")
    pytest.fail(
        "the Java parity test needs a JDK: javac and java on PATH (Debian/Ubuntu:"
        " apt install openjdk-17-jdk-headless); set INTERCHANGE_SKIP_JAVA=1 to skip it"
    )


@pytest.fixture(scope="module")
def java_output(tmp_path_factory: pytest.TempPathFactory) -> JavaOutput:
    """What the Java program writes: the commands by name, and writeUTF of each string."""
    javac, java = java_tools()
    classes = tmp_path_factory.mktemp("java")
    subprocess.run(
        [javac, "-encoding", "UTF-8", "-d", str(classes), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    strings = EDGES + random_strings(200)
    stdin = "".join(s.encode("utf-16-be", "surrogatepass").hex() + "\n" for s in strings)
    run = subprocess.run(
        [java, "-cp", str(classes), "SegmentVectors"],
        input=stdin,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    commands: dict[str, bytes] = {}
    utf: list[bytes] = []
    for line in run.stdout.splitlines():
        name, _, text = line.partition(" ")
        if name == "utf":
            utf.append(bytes.fromhex(text))
        else:
            commands[name] = bytes.fromhex(text)
    assert len(utf) == len(strings)
    return commands, utf


def test_java_writes_the_research_vectors(java_output: JavaOutput) -> None:
    commands, _ = java_output
    for name, command in COMMANDS.items():
        assert commands[name] == VECTORS[name], name
        assert encode(command) == commands[name], name


def test_java_and_we_write_the_other_replies_alike(
    java_output: JavaOutput,
) -> None:
    commands, _ = java_output
    for name, command in MORE.items():
        assert encode(command) == commands[name], name


def test_write_utf_parity(java_output: JavaOutput) -> None:
    _, utf = java_output
    strings = EDGES + random_strings(200)
    for text, java in zip(strings, utf, strict=True):
        assert encode_utf(text) == java, repr(text[:20])
    assert utf[1] == VECTORS["jutf_tricky"]
