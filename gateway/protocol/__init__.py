"""The protocol toolkit: what every protocol's codec and driver share.

* :mod:`.events`: the vocabulary of a sans-IO codec, :data:`NEED_DATA` and
  :class:`ConnectionClosed`, beside the errors of :mod:`gateway.errors`
  (``RemoteProtocolError``, ``LocalProtocolError``);
* :mod:`.buffer`: :class:`ReceiveBuffer`, received bytes parsed by offset;
* :mod:`.answers`: :class:`Answers`, what a connection owes its peer until
  each receipt settles;
* :mod:`.session`: :class:`Session`, the driver skeleton (reader, writer,
  answers, deadlines, drain) that a protocol's trio layer subclasses.

The first three import no I/O library.
"""

from gateway.errors import LocalProtocolError, ProtocolError, RemoteProtocolError

from .answers import Answer, AnswerFn, Answers
from .buffer import ReceiveBuffer
from .events import NEED_DATA, ConnectionClosed, NeedData
from .session import Codec, Session

__all__ = [
    "NEED_DATA",
    "Answer",
    "AnswerFn",
    "Answers",
    "Codec",
    "ConnectionClosed",
    "LocalProtocolError",
    "NeedData",
    "ProtocolError",
    "ReceiveBuffer",
    "RemoteProtocolError",
    "Session",
]
