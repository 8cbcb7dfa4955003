"""TEMPLATE: the protocol folder the next protocol's author copies.

A tiny working line protocol (``PUB <bytes>`` answered ``OK`` once safe),
laid out as every protocol of the gateway is (see ``docs/codecs.md``):

* :mod:`.events`: the events, one frozen dataclass per kind of frame;
* :mod:`.frames`: one frame's bytes, to an event and back;
* :mod:`.codec`: the codecs, :class:`ServerCodec` and :class:`ClientCodec`,
  on the toolkit's lifecycle, sans I/O;
* :mod:`.server`: the server driver, a ``Session`` subclass;
* :mod:`.plugin`: the ``ProtocolPlugin`` the gateway finds.

Its tests show how to join the codec conformance suite
(``tests/conformance/``) and how to run the plugin in a gateway
(``tests/template/``).
"""

from gateway.sdk import NEED_DATA, CodecState, ConnectionClosed

from .codec import ClientCodec, Limits, ServerCodec
from .events import Error, Event, Failed, Ok, Publish

__all__ = [
    "NEED_DATA",
    "ClientCodec",
    "CodecState",
    "ConnectionClosed",
    "Error",
    "Event",
    "Failed",
    "Limits",
    "Ok",
    "Publish",
    "ServerCodec",
]
