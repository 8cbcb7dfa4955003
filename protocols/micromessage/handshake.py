"""The Micromessage2 handshake: three messages, their bytes, and the negotiation, sans I/O.

The client sends its offer, the server answers, the client sends the final
list; every message has the same layout and no flags byte (integers
big-endian)::

    [major:u8][minor:u8][flags:u8][idLen:u8][identity][reqLen:u16][required][optLen:u16][optional]

A list is ``ext;ext`` (no trailing ``;`` written; one accepted), an
extension ``name`` or ``name:key=value,key=value`` with URL-encoded values.
An ERROR frame (``[0x04][len][text]``) may replace any step; its first byte
has bit ``0x04``, which a handshake's major version (1) never has.

Once agreed, extension ids are 1-based positions in the final message's
required list followed by its optional list. Majors must match; the agreed
minor is the lower of both; 1.0 and 1.1 are accepted. What one message may
hold is capped (:data:`MAX_HANDSHAKE`) and refused from its length fields.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote

from gateway.sdk import LocalProtocolError, RemoteProtocolError

from .events import Error, Flags

__all__ = [
    "MAX_HANDSHAKE",
    "VERSION",
    "Agreement",
    "ExtensionSpec",
    "Handshake",
    "Refusal",
    "agree_version",
    "client_final",
    "decode_handshake",
    "encode_handshake",
    "server_answer",
    "server_confirm",
]

#: The version we offer: the draft's 1.0 (SharpMessaging sends 1.1; the lower wins).
VERSION: Final = (1, 0)
#: The only major version; minors above it are accepted and negotiated down.
MAJOR: Final = 1
#: The most bytes one handshake message (or an ERROR frame in its place) may take.
MAX_HANDSHAKE: Final = 4096
#: Extension ids are one byte; id 0 is invalid.
MAX_EXTENSIONS: Final = 255

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_TOKEN: Final = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True, slots=True)
class ExtensionSpec:
    """One extension in a list: a name and its properties, in the order written."""

    name: str
    properties: tuple[tuple[str, str], ...] = ()

    def encode(self) -> str:
        """``name`` or ``name:k=v,...``, values URL-encoded (LocalProtocolError if malformed)."""
        _check_token(self.name, "extension name", LocalProtocolError)
        if not self.properties:
            return self.name
        parts = []
        for key, value in self.properties:
            _check_token(key, "property name", LocalProtocolError)
            parts.append(f"{key}={quote(value, safe='')}")
        return f"{self.name}:{','.join(parts)}"

    @classmethod
    def decode(cls, text: str) -> ExtensionSpec:
        """Parse ``name[:k=v,...]``, splitting at the first ``:``, then ``,``, then ``=``
        (a pair without ``=`` may use ``:``, as the draft's ``max-count:100`` does)."""
        name, colon, rest = text.partition(":")
        _check_token(name, "extension name", RemoteProtocolError)
        props: list[tuple[str, str]] = []
        for pair in rest.split(",") if colon else ():
            key, eq, value = pair.partition("=")
            if not eq:  # the draft's own example writes one as "max-count:100"
                key, eq, value = pair.partition(":")
            if not eq:
                raise RemoteProtocolError(f"extension {name!r}: property {pair!r} has no '='")
            _check_token(key, "property name", RemoteProtocolError)
            try:
                props.append((key, unquote(value, errors="strict")))
            except UnicodeDecodeError as exc:
                raise RemoteProtocolError(f"property {key!r}: bad URL encoding") from exc
        return cls(name, tuple(props))


def _check_token(text: str, what: str, error: type[Exception]) -> None:
    if not _TOKEN.fullmatch(text):
        raise error(f"{what} {text!r} must be letters, digits, '_', '.' or '-'")


@dataclass(frozen=True, slots=True)
class Handshake:
    """One handshake message: the client's offer, the server's answer or the client's final list."""

    major: int
    minor: int
    identity: str = ""
    required: tuple[ExtensionSpec, ...] = ()
    optional: tuple[ExtensionSpec, ...] = ()
    flags: int = 0

    @property
    def names(self) -> tuple[str, ...]:
        """The extension names, required then optional."""
        return tuple(e.name for e in self.required + self.optional)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The handshake failed: send an ERROR frame with ``reason`` and disconnect."""

    reason: str


@dataclass(frozen=True, slots=True)
class Agreement:
    """What both sides use: the version and the extensions, id = position + 1."""

    major: int
    minor: int
    extensions: tuple[ExtensionSpec, ...]

    def extension_id(self, name: str) -> int | None:
        """The 1-based id of extension ``name``, or None if it was not negotiated."""
        for i, ext in enumerate(self.extensions):
            if ext.name == name:
                return i + 1
        return None

    def by_id(self, ext_id: int) -> ExtensionSpec | None:
        """The extension with 1-based id ``ext_id``, or None (0 and too large ids)."""
        return self.extensions[ext_id - 1] if 1 <= ext_id <= len(self.extensions) else None


def _list_bytes(specs: tuple[ExtensionSpec, ...], what: str) -> bytes:
    raw = ";".join(s.encode() for s in specs).encode("ascii")
    if len(raw) > 0xFFFF:
        raise LocalProtocolError(f"{what} extensions are {len(raw)} bytes, at most 65535")
    return _U16.pack(len(raw)) + raw


def encode_handshake(message: Handshake) -> bytes:
    """The bytes of one handshake message (LocalProtocolError outside the protocol's ranges)."""
    if message.major != MAJOR or not 0 <= message.minor <= 255:
        raise LocalProtocolError(f"version {message.major}.{message.minor}: major must be 1")
    if not 0 <= message.flags <= 255:
        raise LocalProtocolError(f"flags {message.flags} do not fit a byte")
    try:
        ident = message.identity.encode("ascii")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"identity must be ASCII: {message.identity!r}") from exc
    if len(ident) > 255:
        raise LocalProtocolError(f"identity is {len(ident)} bytes, at most 255")
    head = bytes((message.major, message.minor, message.flags, len(ident))) + ident
    out = (
        head + _list_bytes(message.required, "required") + _list_bytes(message.optional, "optional")
    )
    if len(out) > MAX_HANDSHAKE:
        raise LocalProtocolError(f"handshake is {len(out)} bytes, at most {MAX_HANDSHAKE}")
    return out


def _over(size: int, limit: int, pos: int) -> None:
    if size > limit:
        raise RemoteProtocolError(
            f"handshake message at byte {pos} announces {size} bytes, at most {limit}"
        )


def _decode_error(data: bytes | bytearray, pos: int, limit: int) -> tuple[Error, int] | None:
    """An ERROR frame in place of a handshake step, or None until it is whole."""
    flags = data[pos]
    if flags & ~int(Flags.ERROR | Flags.LARGE_PAYLOAD) & 0xFF:  # int: ~ on a flag keeps its bits
        raise RemoteProtocolError(f"byte {pos} (0x{flags:02x}): neither a handshake nor an ERROR")
    width = 4 if flags & Flags.LARGE_PAYLOAD else 1
    if len(data) < pos + 1 + width:
        return None
    n = _U32.unpack_from(data, pos + 1)[0] if width == 4 else data[pos + 1]
    _over(1 + width + n, limit, pos)
    start = pos + 1 + width
    if len(data) < start + n:
        return None
    try:
        return Error(bytes(data[start : start + n]).decode("utf-8")), start + n
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"byte {start}: ERROR text is not UTF-8") from exc


def _decode_list(raw: bytes, at: int) -> tuple[ExtensionSpec, ...]:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"byte {at}: extension list is not ASCII") from exc
    if text.endswith(";"):  # the draft's examples write one; the implementation does not
        text = text[:-1]
    return tuple(ExtensionSpec.decode(item) for item in text.split(";")) if text else ()


def _field(data: bytes | bytearray, p: int, limit: int, pos: int) -> tuple[bytes, int] | None:
    """A u16-length-prefixed field at ``p``: its bytes and the offset after it."""
    if len(data) < p + 2:
        return None
    n = _U16.unpack_from(data, p)[0]
    _over(p + 2 + n - pos, limit, pos)
    if len(data) < p + 2 + n:
        return None
    return bytes(data[p + 2 : p + 2 + n]), p + 2 + n


def decode_handshake(
    data: bytes | bytearray, pos: int = 0, *, limit: int = MAX_HANDSHAKE
) -> tuple[Handshake | Error, int] | None:
    """The handshake message (or ERROR frame) at ``data[pos:]`` and the offset after it.

    None until it is whole. RemoteProtocolError for malformed input or one
    announcing more than ``limit`` bytes, raised as soon as its length
    fields show it. The version is not judged here: see :func:`agree_version`.
    """
    if len(data) <= pos:
        return None
    if data[pos] & Flags.ERROR:
        return _decode_error(data, pos, limit)
    if len(data) < pos + 4:
        return None
    major, minor, flags, id_len = data[pos : pos + 4]
    _over(4 + id_len + 4, limit, pos)
    p = pos + 4 + id_len
    if len(data) < p:
        return None
    try:
        identity = bytes(data[pos + 4 : p]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"byte {pos + 4}: identity is not ASCII") from exc
    req = _field(data, p, limit, pos)
    if req is None:
        return None
    opt = _field(data, req[1], limit, pos)
    if opt is None:
        return None
    required, optional = _decode_list(req[0], p + 2), _decode_list(opt[0], req[1] + 2)
    return Handshake(major, minor, identity, required, optional, flags), opt[1]


def agree_version(ours: tuple[int, int], theirs: tuple[int, int]) -> tuple[int, int] | Refusal:
    """The version both use: majors must match, the minor is the lower one."""
    if ours[0] != theirs[0]:
        return Refusal(f"version {theirs[0]}.{theirs[1]} is not supported: major must be {ours[0]}")
    return ours[0], min(ours[1], theirs[1])


def _dedupe(specs: Iterable[ExtensionSpec], taken: Collection[str]) -> tuple[ExtensionSpec, ...]:
    """``specs`` without names in ``taken`` or listed earlier, in order."""
    seen = set(taken)
    out = []
    for spec in specs:
        if spec.name not in seen:
            seen.add(spec.name)
            out.append(spec)
    return tuple(out)


def server_answer(
    offer: Handshake,
    supported: Collection[str],
    *,
    identity: str = "",
    required: tuple[ExtensionSpec, ...] = (),
    optional: tuple[ExtensionSpec, ...] = (),
    version: tuple[int, int] = VERSION,
) -> Handshake | Refusal:
    """The server's answer to the client's ``offer``, or why it refuses.

    Refuses another major and any client-required extension not in
    ``supported``. The answer carries the server's version, its own required
    extensions (the client judges them) and, as optional, the client's
    optional ones it supports followed by its own optional ones.
    """
    agreed = agree_version(version, (offer.major, offer.minor))
    if isinstance(agreed, Refusal):
        return agreed
    missing = [e.name for e in offer.required if e.name not in supported]
    if missing:
        return Refusal(f"server does not support the required extensions: {';'.join(missing)}")
    own = _dedupe(required, offer.names[: len(offer.required)])
    mine = (e for e in offer.optional if e.name in supported)
    chosen = _dedupe(
        (*mine, *optional), {*offer.names[: len(offer.required)], *(e.name for e in own)}
    )
    return Handshake(version[0], version[1], identity, own, chosen)


def client_final(
    offer: Handshake,
    answer: Handshake,
    supported: Collection[str],
    *,
    version: tuple[int, int] = VERSION,
) -> Handshake | Refusal:
    """The client's final message after the server's ``answer``, or why it refuses.

    Refuses another major and any server-required extension not in
    ``supported``. Required: the offer's required ones, then the server's
    not listed yet; optional: the answer's optional ones we support. The
    final message carries the agreed version; its order fixes the ids.
    """
    agreed = agree_version(version, (answer.major, answer.minor))
    if isinstance(agreed, Refusal):
        return agreed
    missing = [e.name for e in answer.required if e.name not in supported]
    if missing:
        return Refusal(f"client does not support the required extensions: {';'.join(missing)}")
    required = _dedupe((*offer.required, *answer.required), ())
    optional = _dedupe(
        (e for e in answer.optional if e.name in supported), [e.name for e in required]
    )
    if len(required) + len(optional) > MAX_EXTENSIONS:
        return Refusal(f"over {MAX_EXTENSIONS} extensions negotiated")
    return Handshake(agreed[0], agreed[1], offer.identity, required, optional, offer.flags)


def server_confirm(
    offer: Handshake,
    answer: Handshake,
    final: Handshake,
    supported: Collection[str],
) -> Agreement | Refusal:
    """The agreement from the client's ``final`` message, or why the server refuses it.

    The final version must be the agreed one; every extension must be one
    the server supports and was offered by either side, at most once; the
    client's and the server's required ones must all be present.
    """
    agreed = agree_version((answer.major, answer.minor), (offer.major, offer.minor))
    if agreed != (final.major, final.minor):
        return Refusal(f"final version {final.major}.{final.minor} is not the agreed one")
    names = final.names
    if len(set(names)) != len(names):
        return Refusal("an extension is listed twice in the final handshake")
    if len(names) > MAX_EXTENSIONS:
        return Refusal(f"over {MAX_EXTENSIONS} extensions negotiated")
    known = set(offer.names) | set(answer.names)
    unknown = [n for n in names if n not in known or n not in supported]
    if unknown:
        return Refusal(f"extensions not offered or not supported: {';'.join(unknown)}")
    needed = [e.name for e in offer.required + answer.required if e.name not in names]
    if needed:
        return Refusal(f"required extensions missing from the final handshake: {';'.join(needed)}")
    return Agreement(final.major, final.minor, final.required + final.optional)
