"""The segment-append byte vectors of research/drafts.md §A.4 and its Appendix, literally.

Each is the hex the research's generator printed (and a Java
``DataOutputStream`` rebuild confirmed), paired with the command it encodes.
The hex is written out here, not computed, so that the codec is checked
against bytes it did not produce.
"""

from __future__ import annotations

from uuid import UUID

from protocols.segment import (
    NULL_EVENT_NUMBER,
    AppendBlock,
    AppendBlockEnd,
    AppendSetup,
    Command,
    DataAppended,
    Event,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    NoSuchSegment,
    ReadSegment,
    SegmentRead,
    SetupAppend,
    WrongHost,
)

WRITER = UUID("00112233-4455-6677-8899-aabbccddeeff")
SEGMENT = "scope/stream/0.#epoch.0"
EV1 = bytes.fromhex("000000000000000568656c6c6f")  # Event("hello")
EV2 = bytes.fromhex("0000000000000014303132333435363738396162636465666768696a")  # 20 bytes

HEX: dict[str, str] = {
    "hello": "ffffff81000000080000001100000005",
    "keepalive": "0000006400000000",
    "setup_append": (
        "0000000100000033000000000000000100112233445566778899aabbccddeeff00177363"
        "6f70652f73747265616d2f302e2365706f63682e300000"
    ),
    "append_setup_new_writer": (
        "00000002000000390000000000000001001773636f70652f73747265616d2f302e236570"
        "6f63682e3000112233445566778899aabbccddeeff8000000000000000"
    ),
    "event_hello": "000000000000000568656c6c6f",
    "append_block_single": (
        "000000030000001d00112233445566778899aabbccddeeff000000000000000568656c6c6f"
    ),
    "append_block_end_single": (
        "000000040000002c00112233445566778899aabbccddeeff0000000d0000000000000001"
        "00000000000000010000000000000001"
    ),
    "batched_block": (
        "000000030000003800112233445566778899aabbccddeeff000000000000000568656c6c"
        "6ffffffffe0000001300000000000000143031323334353637383961"
    ),
    "batched_block_end": (
        "000000040000003500112233445566778899aabbccddeeff0000000d0000000962636465"
        "666768696a0000000200000000000000020000000000000001"
    ),
    "padded_block": (
        "000000030000003800112233445566778899aabbccddeeff000000000000000568656c6c"
        "6fffffffff0000001300000000000000000000000000000000000000"
    ),
    "padded_block_end": (
        "000000040000002c00112233445566778899aabbccddeeff0000000d0000000000000001"
        "00000000000000010000000000000001"
    ),
    "data_appended": (
        "000000070000003000112233445566778899aabbccddeeff000000000000000280000000"
        "0000000000000000000000010000000000000029"
    ),
    "read_segment": (
        "000000090000002f001773636f70652f73747265616d2f302e2365706f63682e30000000"
        "00000000000000040000000000000000000002"
    ),
    "segment_read": (
        "0000000a00000058001773636f70652f73747265616d2f302e2365706f63682e30000000"
        "0000000000010000000029000000000000000568656c6c6f000000000000001430313233"
        "3435363738396162636465666768696a0000000000000002"
    ),
    "wrong_host": (
        "00000032000000330000000000000001001773636f70652f73747265616d2f302e236570"
        "6f63682e30000e31302e302e302e323a31323334350000"
    ),
    "no_such_segment": (
        "000000350000002b0000000000000001001773636f70652f73747265616d2f302e236570"
        "6f63682e300000ffffffffffffffff"
    ),
    "invalid_event_number": (
        "000000370000002200112233445566778899aabbccddeeff000000000000000100000000000000000007"
    ),
    "jutf_tricky": "000b61c080c3a9eda0bdedb880",
}
#: The Appendix lengths, in bytes.
LENGTHS: dict[str, int] = {
    "hello": 16,
    "keepalive": 8,
    "setup_append": 59,
    "append_setup_new_writer": 65,
    "event_hello": 13,
    "append_block_single": 37,
    "append_block_end_single": 52,
    "batched_block": 64,
    "batched_block_end": 61,
    "padded_block": 64,
    "padded_block_end": 52,
    "data_appended": 56,
    "read_segment": 55,
    "segment_read": 96,
    "wrong_host": 59,
    "no_such_segment": 51,
    "invalid_event_number": 42,
    "jutf_tricky": 13,
}
VECTORS: dict[str, bytes] = {name: bytes.fromhex(text) for name, text in HEX.items()}

#: The command each vector encodes (all but the modified UTF-8 string).
COMMANDS: dict[str, Command] = {
    "hello": Hello(17, 5),
    "keepalive": KeepAlive(),
    "setup_append": SetupAppend(1, WRITER, SEGMENT, ""),
    "append_setup_new_writer": AppendSetup(1, SEGMENT, WRITER, NULL_EVENT_NUMBER),
    "event_hello": Event(b"hello"),
    "append_block_single": AppendBlock(WRITER, EV1),
    "append_block_end_single": AppendBlockEnd(WRITER, 13, b"", 1, 1, 1),
    "batched_block": AppendBlock(WRITER, EV1 + bytes.fromhex("fffffffe00000013") + EV2[:19]),
    "batched_block_end": AppendBlockEnd(WRITER, 13, b"bcdefghij", 2, 2, 1),
    "padded_block": AppendBlock(WRITER, EV1 + bytes.fromhex("ffffffff00000013") + bytes(19)),
    "padded_block_end": AppendBlockEnd(WRITER, 13, b"", 1, 1, 1),
    "data_appended": DataAppended(WRITER, 2, NULL_EVENT_NUMBER, 1, 41),
    "read_segment": ReadSegment(SEGMENT, 0, 1024, "", 2),
    "segment_read": SegmentRead(SEGMENT, 0, True, False, EV1 + EV2, 2),
    "wrong_host": WrongHost(1, SEGMENT, "10.0.0.2:12345", ""),
    "no_such_segment": NoSuchSegment(1, SEGMENT, "", -1),
    "invalid_event_number": InvalidEventNumber(WRITER, 1, "", 7),
}
