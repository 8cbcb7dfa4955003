"""Transports: how bytes reach a protocol.

Two kinds register in the ``interchange.transports`` entry-point group:

* a :class:`Transport` opens listeners and outgoing connections for the
  addresses it claims (``tcp`` for ``host:port``, ``unix`` for ``unix:/path``,
  a plugin for its URL schemes such as ``ws://``), with an optional
  handshake of its own on each connection;
* a :class:`StreamLayer` wraps an established stream, found by its role
  (``tls``).

Protocols only ever see a ``trio.abc.Stream``.
"""

from gateway.transports.base import (
    SocketTransport,
    StreamLayer,
    TlsClientSettings,
    TlsServerSettings,
    Transport,
    address_host,
    address_scheme,
)

__all__ = [
    "SocketTransport",
    "StreamLayer",
    "TlsClientSettings",
    "TlsServerSettings",
    "Transport",
    "address_host",
    "address_scheme",
]
