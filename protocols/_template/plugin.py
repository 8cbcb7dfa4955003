"""TEMPLATE: the protocol plugin, what the gateway finds through an entry point.

Copy this folder to start a protocol (see ``docs/codecs.md``), then declare
the plugin in your package's ``pyproject.toml``::

    [project.entry-points."interchange.protocols"]
    myproto = "myproto.plugin:MyProtoPlugin"

The template itself is not declared: tests register it in a registry of
their own, so it is never a protocol a configuration can name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from gateway.sdk import Option, ProtocolPlugin, ServerConnection

from .codec import Limits
from .server import ServerSession

__all__ = ["TemplatePlugin"]


class TemplatePlugin(ProtocolPlugin):
    """``PUB <bytes>`` lines published to the listener's destination, each answered
    ``OK`` once safe."""

    name = "template"
    roles = frozenset({"server"})
    summary = "TEMPLATE: a line protocol to copy, not for use"
    listener_options: ClassVar[Mapping[str, Option]] = {
        "max_line": Option("size", Limits().max_line, "longest line, in bytes", minimum=1),
        "window": Option("int", 100, "publishes read and not yet answered", minimum=1),
    }

    async def serve(self, conn: ServerConnection) -> None:
        await ServerSession(conn).serve()
