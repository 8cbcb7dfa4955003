"""WebSocket transport for Interchange: ``ws://`` and ``wss://`` for any stream protocol.

A protocol's bytes travel in WebSocket binary messages (one ``send_all``, one
message); the opening handshake, pings and the close handshake are this
package's job, done with the sans-IO ``wsproto`` library.
"""

from interchange_websocket.address import WsAddress, parse_ws_address
from interchange_websocket.stream import WebSocketStream
from interchange_websocket.transport import WebSocketTransport

__all__ = ["WebSocketStream", "WebSocketTransport", "WsAddress", "parse_ws_address"]
