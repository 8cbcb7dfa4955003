"""Micromessage2 (MicroMsg2), in both roles: the protocol of SharpMessaging.

Built in layers, each sans I/O:

* :mod:`.events`: the frames as frozen dataclasses, the flag bits and limits;
* :mod:`.frames`: a frame to bytes and an incremental decoder back (the
  frame layer, which starts after the handshake);
* :mod:`.handshake` and :mod:`.negotiation`: the handshake messages and what
  each role answers; :mod:`.windows`: the ack windows and their settings;
* :mod:`.commands`: the ``subscribe``/``unsubscribe`` COMMAND frames;
  :mod:`.filters`: their filter expressions; :mod:`.properties`: typed
  MESSAGE properties as header text and back;
* :mod:`.codec`: the two codecs (handshake phases, MESSAGE batches, acks).

The handshake, extension negotiation, acks and pub/sub belong to the codec,
which is built on these. With I/O (trio): :mod:`.peer`, :mod:`.server` and
:mod:`.client` are the gateway's drivers, :mod:`.plugin` the gateway plugin,
and :mod:`.api` the client library for Python programs, exported here:
:class:`Client`, :class:`Received`, :class:`ServerError`, :class:`ConnectionLost`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import Client, ConnectionLost, Received, ServerError

__all__ = ["Client", "ConnectionLost", "Received", "ServerError"]


def __getattr__(name: str) -> Any:
    """The client library's names, imported on first use: the sans-IO modules of this
    package (the codec) must import without trio."""
    if name in __all__:
        return getattr(importlib.import_module(".api", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
