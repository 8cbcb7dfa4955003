"""Transports: how bytes reach a protocol.

Two kinds register in the ``interchange.transports`` entry-point group:

* a :class:`SocketTransport` opens listeners and outgoing connections for the
  addresses it claims (``tcp`` for ``host:port``, ``unix`` for ``unix:/path``);
* a :class:`StreamLayer` wraps an established stream (``tls``).

Protocols only ever see a ``trio.abc.Stream``.
"""

from .base import SocketTransport, StreamLayer, TlsClientSettings, TlsServerSettings

__all__ = ["SocketTransport", "StreamLayer", "TlsClientSettings", "TlsServerSettings"]
