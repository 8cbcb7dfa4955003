"""The protocol toolkit: what every protocol's codec and driver share.

* :mod:`.events`: the vocabulary of a sans-IO codec, :data:`NEED_DATA` and
  :class:`ConnectionClosed`, beside the errors of :mod:`gateway.core.errors`
  (``RemoteProtocolError``, ``LocalProtocolError``);
* :mod:`.buffer`: :class:`ReceiveBuffer`, received bytes parsed by offset;
* :mod:`.answers`: :class:`Answers`, what a connection owes its peer until
  each receipt settles;
* :mod:`.session`: :class:`Session`, the driver skeleton (reader, writer,
  answers, deadlines, drain) that a protocol's trio layer subclasses.

The first two import no I/O library, and neither does importing this
package: :mod:`.answers` and :mod:`.session` (which need trio) are imported
when one of their names is first used, so a sans-IO codec can import the
vocabulary from here.
"""

from typing import TYPE_CHECKING, Any

from gateway.core.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from gateway.protocol.buffer import ReceiveBuffer
from gateway.protocol.events import NEED_DATA, ConnectionClosed, NeedData

if TYPE_CHECKING:
    from gateway.protocol.answers import Answer, AnswerFn, Answers
    from gateway.protocol.session import Codec, NotKept, Session

#: Names whose modules import trio: loaded on first use (PEP 562).
_LAZY = dict.fromkeys(("Answer", "AnswerFn", "Answers"), "answers") | dict.fromkeys(
    ("Codec", "NotKept", "Session"), "session"
)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NEED_DATA",
    "Answer",
    "AnswerFn",
    "Answers",
    "Codec",
    "ConnectionClosed",
    "LocalProtocolError",
    "NeedData",
    "NotKept",
    "ProtocolError",
    "ReceiveBuffer",
    "RemoteProtocolError",
    "Session",
]
