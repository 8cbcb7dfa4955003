"""What each role answers in the handshake, the ack extension's properties included.

:mod:`.handshake` settles which extensions both sides use; this module adds
what the extensions we implement need on top: the ack window's size and
expiry (``ack``/``batch-ack``, :mod:`.windows`) travel as extension
properties, the server answering at most its limit and the client's final
message being authoritative within that answer. An ack extension the client
*requires* is listed in the server's answer too (as required), so that the
client learns the window the server agreed to.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

from .handshake import (
    VERSION,
    Agreement,
    ExtensionSpec,
    Handshake,
    Refusal,
    client_final,
    server_answer,
    server_confirm,
)
from .windows import (
    ACK_EXTENSIONS,
    AckSettings,
    ack_spec,
    answer_ack,
    check_final_ack,
    final_ack,
)

__all__ = ["SUPPORTED", "Negotiated", "Settings", "answer", "confirm", "final", "offer"]

#: The extensions this implementation knows; any other is refused when required.
SUPPORTED: Final = frozenset({"ack", "batch-ack", "json", "dotnet", "pubsub"})


@dataclass(frozen=True, slots=True)
class Settings:
    """What one side offers: its identity, extensions, and the ack window it wants (a
    client) or allows at most (a server)."""

    identity: str = "interchange"
    required: tuple[ExtensionSpec, ...] = ()
    optional: tuple[ExtensionSpec, ...] = ()
    ack: AckSettings = field(default_factory=AckSettings)
    version: tuple[int, int] = VERSION


@dataclass(frozen=True, slots=True)
class Negotiated:
    """The outcome both codecs work with: the agreement and the ack window (None: no acks)."""

    agreement: Agreement
    ack: AckSettings | None

    def has(self, name: str) -> bool:
        return self.agreement.extension_id(name) is not None


def offer(settings: Settings) -> Handshake:
    """A client's first message: an ack extension listed without properties carries the
    window ``settings.ack`` asks for."""

    def wish(spec: ExtensionSpec) -> ExtensionSpec:
        if spec.name in ACK_EXTENSIONS and not spec.properties:
            return ack_spec(spec.name, settings.ack)
        return spec

    major, minor = settings.version
    return Handshake(
        major,
        minor,
        settings.identity,
        tuple(map(wish, settings.required)),
        tuple(map(wish, settings.optional)),
    )


def _specs(message: Handshake) -> dict[str, ExtensionSpec]:
    return {e.name: e for e in message.required + message.optional}


def answer(client_offer: Handshake, settings: Settings) -> Handshake | Refusal:
    """The server's answer to ``client_offer``: ack extensions carry the window it grants."""
    out = server_answer(
        client_offer,
        SUPPORTED,
        identity=settings.identity,
        required=settings.required,
        optional=settings.optional,
        version=settings.version,
    )
    if isinstance(out, Refusal):
        return out
    offered = _specs(client_offer)

    def grant(spec: ExtensionSpec) -> ExtensionSpec:
        if spec.name not in ACK_EXTENSIONS:
            return spec
        return answer_ack(offered.get(spec.name), settings.ack, spec.name)

    implied = tuple(
        answer_ack(e, settings.ack, e.name)
        for e in client_offer.required
        if e.name in ACK_EXTENSIONS and e.name not in out.names
    )
    return replace(
        out,
        required=implied + tuple(map(grant, out.required)),
        optional=tuple(map(grant, out.optional)),
    )


def final(
    client_offer: Handshake, server_answer_: Handshake, settings: Settings
) -> Handshake | Refusal:
    """The client's final message: ack extensions at most what the server answered."""
    out = client_final(client_offer, server_answer_, SUPPORTED, version=settings.version)
    if isinstance(out, Refusal):
        return out
    answered = _specs(server_answer_)

    def settle(spec: ExtensionSpec) -> ExtensionSpec:
        granted = answered.get(spec.name)
        if spec.name not in ACK_EXTENSIONS or granted is None:
            return spec
        return final_ack(granted, settings.ack)

    return replace(
        out, required=tuple(map(settle, out.required)), optional=tuple(map(settle, out.optional))
    )


def _window(agreement: Agreement, answered: dict[str, ExtensionSpec]) -> AckSettings | None:
    """The ack window of ``agreement``: the first ack extension listed (None: none)."""
    for spec in agreement.extensions:
        if spec.name in ACK_EXTENSIONS:
            granted = answered.get(spec.name)
            return check_final_ack(spec, granted if granted is not None else spec)
    return None


def confirm(
    client_offer: Handshake, server_answer_: Handshake, client_final_: Handshake
) -> Negotiated | Refusal:
    """The server's view of the client's final message (RemoteProtocolError for an ack
    window above what was answered)."""
    agreed = server_confirm(client_offer, server_answer_, client_final_, SUPPORTED)
    if isinstance(agreed, Refusal):
        return agreed
    return Negotiated(agreed, _window(agreed, _specs(server_answer_)))


def established(client_final_: Handshake, server_answer_: Handshake) -> Negotiated:
    """The client's view once it sent ``client_final_``."""
    agreed = Agreement(
        client_final_.major, client_final_.minor, client_final_.required + client_final_.optional
    )
    return Negotiated(agreed, _window(agreed, _specs(server_answer_)))
