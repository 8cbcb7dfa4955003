"""``ws://HOST:PORT/PATH?KEY=VALUE`` addresses: where to listen or connect, and the options.

The query is the gateway's own options for the connection, never sent to the
peer: ``subprotocol`` (repeatable), ``origin`` (repeatable on a listener, one
on an upstream) and ``max_message`` (bytes). Pure string work: nothing is
resolved, so ``gateway check`` can call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

__all__ = ["DEFAULT_MAX_MESSAGE", "SCHEMES", "WsAddress", "parse_ws_address"]

SCHEMES = ("ws", "wss")
#: Largest message accepted when the address does not say: 1 MiB.
DEFAULT_MAX_MESSAGE = 1 << 20
#: The largest ``max_message`` an address may ask for: 64 MiB.
MAX_MAX_MESSAGE = 64 << 20
_KEYS = ("subprotocol", "origin", "max_message")
_FORM = "ws://HOST:PORT/PATH or wss://HOST:PORT/PATH"
#: Characters RFC 6455 allows in a subprotocol name (an HTTP token).
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True, slots=True)
class WsAddress:
    """One parsed address; ``secure`` is ``wss``."""

    secure: bool
    host: str
    port: int
    path: str
    subprotocols: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    max_message: int = DEFAULT_MAX_MESSAGE

    @property
    def scheme(self) -> str:
        return "wss" if self.secure else "ws"

    @property
    def host_header(self) -> str:
        """``Host`` as a client sends it: brackets around IPv6, the port always."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_ws_address(address: str) -> WsAddress:
    """Parse ``address``; ``ValueError`` naming what is wrong with it."""
    try:
        url = urlsplit(address)
        port = url.port
    except ValueError as e:
        raise ValueError(f"websocket addresses look like {_FORM}: {e}") from None
    scheme = url.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"websocket addresses look like {_FORM}, not {address!r}")
    if url.username is not None or url.password is not None:
        raise ValueError("websocket addresses take no user name or password")
    if not url.hostname:
        raise ValueError(f"a websocket address needs a host: {_FORM}")
    if port is None:
        raise ValueError(f"a websocket address needs a port: {_FORM}")
    if url.fragment:
        raise ValueError("websocket addresses take no #fragment")
    path = url.path or "/"
    if not path.startswith("/"):
        raise ValueError(f"a websocket path starts with '/', not {path!r}")
    options = _options(url.query)
    return WsAddress(scheme == "wss", url.hostname, port, path, **options)  # type: ignore[arg-type]


def _options(query: str) -> dict[str, object]:
    """The query's options, each checked; unknown keys are refused by name."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"a websocket address query is KEY=VALUE&..., not {query!r}") from None
    subprotocols: list[str] = []
    origins: list[str] = []
    sizes: list[str] = []
    for key, value in pairs:
        if key == "subprotocol":
            subprotocols.append(_subprotocol(value))
        elif key == "origin":
            origins.append(_origin(value))
        elif key == "max_message":
            sizes.append(value)
        else:
            raise ValueError(
                f"unknown websocket address option {key!r} (known: {', '.join(_KEYS)})"
            )
    options: dict[str, object] = {"subprotocols": tuple(subprotocols), "origins": tuple(origins)}
    if len(sizes) > 1:
        raise ValueError("max_message is given more than once")
    if sizes:
        options["max_message"] = _size(sizes[0])
    return options


def _subprotocol(value: str) -> str:
    if not value or not set(value) <= _TOKEN:
        raise ValueError(
            f"subprotocol must be a token (letters, digits, .-_ and so on), not {value!r}"
        )
    return value


def _origin(value: str) -> str:
    url = urlsplit(value)
    if url.scheme.lower() not in ("http", "https") or not url.netloc or url.path or url.query:
        raise ValueError(f"origin must be SCHEME://HOST[:PORT] as browsers send it, not {value!r}")
    return value.lower()


def _size(value: str) -> int:
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_MAX_MESSAGE:
        raise ValueError(
            f"max_message must be a number of bytes 1..{MAX_MAX_MESSAGE}, not {value!r}"
        )
    return int(value)
