"""Segment append's codecs in the conformance suite, with the research vectors of
``tests/segment/segment_vectors.py``."""

from __future__ import annotations

import struct
from uuid import UUID

from gateway.sdk import CodecCase, Golden
from protocols.segment import (
    NULL_EVENT_NUMBER,
    Append,
    AppendSetup,
    ClientCodec,
    DataAppended,
    KeepAlive,
    Limits,
    ServerCodec,
    SetupAppend,
)
from tests.segment import extension_vectors as ext
from tests.segment.segment_vectors import COMMANDS, EV1, EV2, SEGMENT, VECTORS, WRITER

OTHER = UUID("ffeeddcc-bbaa-9988-7766-554433221100")
LIMITS = Limits(max_command=64 * 1024)


def _server() -> ServerCodec:
    """A store's codec on which the vectors' writer is set up."""
    codec = ServerCodec(LIMITS)
    codec.receive_data(VECTORS["setup_append"])
    assert codec.next_event() == COMMANDS["setup_append"]
    codec.send(AppendSetup(1, SEGMENT, WRITER, NULL_EVENT_NUMBER))
    return codec


def _client() -> ClientCodec:
    return ClientCodec(LIMITS)


def _vector(name: str) -> Golden:
    return Golden(name, VECTORS[name], [COMMANDS[name]])


def _ext(name: str) -> Golden:
    """One of Interchange's additions (``tests/segment/extension_vectors.py``)."""
    return Golden(name, ext.VECTORS[name], [ext.COMMANDS[name]])


def _envelope_client() -> ClientCodec:
    """A client whose writer asked for envelopes and waits for the answer."""
    codec = ClientCodec(LIMITS)
    codec.send(ext.COMMANDS["setup_envelopes"])
    return codec


SERVER = CodecCase(
    name="segment-server",
    make=_server,
    goldens=[
        *(_vector(name) for name in ("hello", "keepalive", "read_segment")),
        *(
            _ext(name)
            for name in ("get_info", "locate", "locate_events", "setup_envelopes", "read_formats")
        ),
        Golden(
            "single block",
            VECTORS["append_block_single"] + VECTORS["append_block_end_single"],
            [Append(WRITER, 1, EV1, 1, 1, SEGMENT)],
        ),
        Golden(
            "batched block",
            VECTORS["batched_block"] + VECTORS["batched_block_end"],
            [Append(WRITER, 1, EV1 + EV2, 2, 2, SEGMENT)],
        ),
        Golden(
            "padded block",
            VECTORS["padded_block"] + VECTORS["padded_block_end"],
            [Append(WRITER, 1, EV1, 1, 1, SEGMENT)],
        ),
    ],
    bad=[
        struct.pack(">ii", 999, 0),  # an unknown command type
        VECTORS["data_appended"],  # a server's reply, from a client
        VECTORS["append_block_end_single"],  # a block's end without its block
    ],
    refused=[
        lambda codec: codec.send(DataAppended(OTHER, 1, NULL_EVENT_NUMBER, 1, 0)),  # not set up
        lambda codec: codec.send(DataAppended(WRITER, 1, NULL_EVENT_NUMBER, 1, 0)),  # not received
        lambda codec: codec.send(AppendSetup(2, SEGMENT, OTHER, NULL_EVENT_NUMBER)),  # unasked
        lambda codec: codec.send(SetupAppend(2, OTHER, SEGMENT, "")),  # a client's command
    ],
    # (a server's replies stay allowed in ERROR: reads answered while the driver closes)
    flood=struct.pack(">ii", 3, 60_000) + WRITER.bytes + bytes(60_000),  # a block never ended
    max_held=4 * LIMITS.max_command,
)

CLIENT = CodecCase(
    name="segment-client",
    make=_client,
    goldens=[
        *(
            _vector(name)
            for name in ("hello", "keepalive", "segment_read", "wrong_host", "no_such_segment")
        ),
        *(
            _ext(name)
            for name in ("info", "info_missing_pravega", "located", "segment_read_formats")
        ),
    ],
    bad=[
        VECTORS["setup_append"],  # a client's command, from the server
        VECTORS["append_setup_new_writer"],  # answers no SetupAppend of ours
        VECTORS["data_appended"],  # for a writer not set up
    ],
    refused=[
        lambda codec: codec.send(AppendSetup(1, SEGMENT, WRITER, NULL_EVENT_NUMBER)),
        lambda codec: codec.append(WRITER, [b"x"], 1),  # not set up
    ],
    refused_after_error=[
        lambda codec: codec.send(KeepAlive()),
        lambda codec: codec.append(WRITER, [b"x"], 1),
    ],
    flood=struct.pack(">ii", 10, 60_000) + bytes(60_000),  # a SegmentRead still arriving
    max_held=4 * LIMITS.max_command,
)

#: A client whose envelope writer is answered (the AppendSetup echoing format 1).
ENVELOPE_CLIENT = CodecCase(
    name="segment-client-envelopes",
    make=_envelope_client,
    goldens=[_ext("envelopes_setup")],
    bad=[VECTORS["append_setup_new_writer"]],  # an answer for another segment
    refused=[lambda codec: codec.send(ext.COMMANDS["setup_envelopes"])],  # being set up
)

CASES = [SERVER, CLIENT, ENVELOPE_CLIENT]
