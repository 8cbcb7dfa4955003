"""Plugin-declared config keys: what a protocol adds to its listeners and upstreams.

A protocol declares ``listener_options`` and ``upstream_options`` as a mapping
of key → :class:`Option`; ``gateway check`` validates, converts and defaults
them beside the core keys, and they reach the protocol as ``conn.options`` /
``ctx.options``.

Besides scalars, an option may be a ``table`` (a dict of typed ``fields``), an
array of such tables (``tables``, written ``[[listeners.<key>]]``), or an
``upstream``: the name of a configured upstream of the same protocol. Tables
nest, and every error names the full key path
(``listeners[0].services[1].match``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

__all__ = ["REQUIRED", "Option", "OptionKind"]

OptionKind = Literal[
    "str",
    "int",
    "float",
    "bool",
    "duration",
    "size",
    "str_list",
    "table",
    "tables",
    "upstream",
]

KINDS: Final[tuple[str, ...]] = get_args(OptionKind)
#: Kinds whose value is one or more tables with their own ``fields``.
TABLE_KINDS: Final = frozenset({"table", "tables"})
#: Kinds that ``minimum`` and ``maximum`` apply to.
NUMERIC_KINDS: Final = frozenset({"int", "float", "duration", "size"})


class _Required:
    """The type of :data:`REQUIRED`; there is one instance."""

    _instance: _Required | None = None

    def __new__(cls) -> _Required:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "REQUIRED"

    def __reduce__(self) -> str:
        return "REQUIRED"


#: As an option's ``default``: the key must be written ("is required" otherwise).
REQUIRED: Final = _Required()


@dataclass(frozen=True, slots=True)
class Option:
    """A protocol-specific config key of a listener or an upstream (or of a table in one).

    A malformed declaration raises ``TypeError``/``ValueError`` when it is
    constructed, so a plugin author sees it when the plugin is imported.
    """

    kind: OptionKind
    #: The value when the key is absent; :data:`REQUIRED`: the key must be written.
    default: Any
    help: str
    #: For ``int``/``float``/``size``/``duration``: the smallest value accepted.
    minimum: float | None = None
    #: For ``int``/``float``/``size``/``duration``: the largest value accepted.
    maximum: float | None = None
    #: For ``str``: the only values accepted.
    choices: tuple[str, ...] = ()
    #: For ``table``/``tables``: the keys of the table (of each entry), which may nest.
    fields: Mapping[str, Option] = field(default_factory=dict)
    #: Extra validation of the converted value (for ``tables`` the whole list,
    #: for ``table`` the dict): raise ``ValueError`` with a reason for the user
    #: (what it returns is ignored).
    check: Callable[[Any], object] | None = None

    def __post_init__(self) -> None:
        kind = self.kind
        if kind not in KINDS:
            raise ValueError(f"unknown option kind {kind!r} (kinds are {', '.join(KINDS)})")
        if not isinstance(self.fields, Mapping):
            raise TypeError(f"fields must be a mapping of key to Option, got {self.fields!r}")
        if kind in TABLE_KINDS:
            if not self.fields:
                raise ValueError(f"a {kind!r} option needs fields (the keys of its tables)")
            for name, opt in self.fields.items():
                if not isinstance(name, str) or not name:
                    raise TypeError(f"field names must be non-empty strings, got {name!r}")
                if not isinstance(opt, Option):
                    raise TypeError(f"field {name!r} must be an Option, got {opt!r}")
        elif self.fields:
            raise ValueError(f"fields apply to 'table' and 'tables' options, not {kind!r}")
        if not isinstance(self.choices, tuple):
            raise TypeError(f"choices must be a tuple of strings, got {self.choices!r}")
        if self.choices:
            if kind != "str":
                raise ValueError(f"choices apply to 'str' options, not {kind!r}")
            if not all(isinstance(c, str) for c in self.choices):
                raise TypeError(f"choices must be strings, got {self.choices!r}")
        for bound in ("minimum", "maximum"):
            value = getattr(self, bound)
            if value is None:
                continue
            if kind not in NUMERIC_KINDS:
                raise ValueError(
                    f"{bound} applies to int, float, duration and size options, not {kind!r}"
                )
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{bound} must be a number, got {value!r}")
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum:g} is above maximum {self.maximum:g}")
        if self.check is not None and not callable(self.check):
            raise TypeError(f"check must be callable, got {self.check!r}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED
