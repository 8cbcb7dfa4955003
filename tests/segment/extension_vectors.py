"""Byte vectors of Interchange's segment-append additions, written out by hand.

``GetStreamSegmentInfo`` (11) and ``StreamSegmentInfo`` (12) have Pravega's
layout, with Interchange's two trailing event indexes; ``LocateOffset`` (41)
and ``OffsetLocated`` (42) are Interchange's own; ``SetupAppend``,
``AppendSetup``, ``ReadSegment`` and ``SegmentRead`` gain trailing fields.
Each hex string below was written field by field from the layouts in
docs/protocols/segment-append.md (the comment under it), not produced by the
codec, so that the codec is checked against bytes it did not make.
"""

from __future__ import annotations

from protocols.segment import (
    NULL_EVENT_NUMBER,
    AppendSetup,
    Command,
    GetStreamSegmentInfo,
    LocateOffset,
    OffsetLocated,
    ReadSegment,
    SegmentRead,
    SetupAppend,
    StreamSegmentInfo,
)
from tests.segment.segment_vectors import WRITER

#: The segment every vector names: ``"a/0"`` is ``0003 612f30`` in ``writeUTF``.
SEG = "a/0"
#: Two event frames: ``"hi"`` (10 bytes) then ``"x"`` (9 bytes).
DATA = bytes.fromhex("00000000000000026869000000000000000178")
#: Their formats: raw from offset 0, envelope from offset 10.
FORMATS = bytes.fromhex("000000000000000000000000000000000a01")

HEX: dict[str, str] = {
    # [11][15] requestId=7 segment="a/0" token=""
    "get_info": "0000000b0000000f00000000000000070003612f300000",
    # [12][56] requestId=7 "a/0" exists sealed=0 deleted=0 lastModified=1700000000000
    # writeOffset=300 startOffset=100 firstEvent=2 nextEvent=9
    "info": "0000000c00000038"
    "0000000000000007"
    "0003612f30"
    "010000"
    "0000018bcfe56800"
    "000000000000012c"
    "0000000000000064"
    "0000000000000002"
    "0000000000000009",
    # [12][40] a missing segment, as a Pravega server answers it (no trailing fields)
    "info_missing_pravega": "0000000c00000028"
    "0000000000000008"
    "0003622f30"
    "000000"
    "0000000000000000"
    "0000000000000000"
    "0000000000000000",
    # [41][31] requestId=9 "a/0" targetOffset=150 token="" events=3
    "locate_events": "000000290000001f"
    "0000000000000009"
    "0003612f30"
    "0000000000000096"
    "0000"
    "0000000000000003",
    # [41][23] the same without events (-1 is left out)
    "locate": "000000290000001700000000000000090003612f3000000000000000960000",
    # [42][29] requestId=9 "a/0" offset=133 eventIndex=4
    "located": "0000002a0000001d00000000000000090003612f3000000000000000850000000000000004",
    # [1][35] requestId=1 writer "a/0" token="" payloadFormat=1
    "setup_envelopes": "0000000100000023"
    "0000000000000001"
    "00112233445566778899aabbccddeeff"
    "0003612f30"
    "0000"
    "00000001",
    # [2][41] requestId=1 "a/0" writer lastEventNumber=Long.MIN_VALUE payloadFormat=1
    "envelopes_setup": "0000000200000029"
    "0000000000000001"
    "0003612f30"
    "00112233445566778899aabbccddeeff"
    "8000000000000000"
    "00000001",
    # [9][31] "a/0" offset=0 suggestedLength=1024 token="" requestId=5 flags=1
    "read_formats": "000000090000001f"
    "0003612f30"
    "0000000000000000"
    "00000400"
    "0000"
    "0000000000000005"
    "00000001",
    # [10][68] "a/0" offset=0 atTail endOfSegment=0 data(19) requestId=5 formats(18)
    "segment_read_formats": "0000000a00000044"
    "0003612f30"
    "0000000000000000"
    "0100"
    "00000013" + DATA.hex() + "0000000000000005"
    "00000012" + FORMATS.hex(),
}

VECTORS: dict[str, bytes] = {name: bytes.fromhex(h) for name, h in HEX.items()}

COMMANDS: dict[str, Command] = {
    "get_info": GetStreamSegmentInfo(7, SEG, ""),
    "info": StreamSegmentInfo(7, SEG, True, False, False, 1_700_000_000_000, 300, 100, 2, 9),
    "info_missing_pravega": StreamSegmentInfo(8, "b/0", False, False, False, 0, 0, 0),
    "locate_events": LocateOffset(9, SEG, 150, "", 3),
    "locate": LocateOffset(9, SEG, 150),
    "located": OffsetLocated(9, SEG, 133, 4),
    "setup_envelopes": SetupAppend(1, WRITER, SEG, "", 1),
    "envelopes_setup": AppendSetup(1, SEG, WRITER, NULL_EVENT_NUMBER, 1),
    "read_formats": ReadSegment(SEG, 0, 1024, "", 5, 1),
    "segment_read_formats": SegmentRead(SEG, 0, True, False, DATA, 5, FORMATS),
}
