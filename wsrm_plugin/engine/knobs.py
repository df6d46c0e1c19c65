"""A settings dataclass whose fields declare what they accept and mean, once, next to their default.

:class:`~wsrm_plugin.engine.policy.RMPolicy` has some fifty knobs.  Checked
field by field in ``__post_init__`` they made one function of fifty branches,
and the policy page's table repeated every default and meaning by hand: a new
knob needed three edits that nothing tied together.  Here each field is
``name: type = knob(default, Check, "what it does", cxf=..., wcf=...)``: the
check is a small value object (a range of seconds, a count, a choice, ...)
whose error message says what would be accepted, :func:`check_fields` runs them
all, and :func:`markdown_table` renders the page's table from the same
declarations (``tests/docs/test_policy_table.py`` holds the page to it).
Rules between fields stay explicit in the class, where a reader looks for them.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Check", "Choice", "Count", "ExceptionTypes", "Flag", "Hook", "Knob", "Named", "Number", "Seconds",
           "Converted",
           "check_fields", "default_text", "knob", "knobs", "markdown_table"]

_KEY = "wsrm_knob"

#: Checks a value given for field ``name``; returns it (or its normalized form, a name
#: turned into its object) or raises ``ValueError``/``TypeError`` naming the field.
Check = Callable[[str, Any], Any]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _or_none(none: str | None) -> str:
    return f" or None ({none})" if none else ""


@dataclass(frozen=True)
class Seconds:
    """A duration: a number of seconds above ``minimum`` (or at it, ``inclusive``), or None
    where ``none`` says what None means."""

    minimum: float = 0.0
    inclusive: bool = False
    none: str | None = None
    #: What the minimum itself means, when it is allowed (``"acknowledge at once"``).
    at_minimum: str | None = None

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.none:
            return value
        if not _is_number(value) or not (value >= self.minimum if self.inclusive else value > self.minimum):
            raise ValueError(f"{name} must be {self.range()} seconds{_or_none(self.none)}, not {value!r}")
        return value

    def range(self) -> str:
        floor = f"{'>=' if self.inclusive else '>'} {self.minimum:g}"
        return f"{floor} ({self.minimum:g}: {self.at_minimum})" if self.at_minimum else floor


@dataclass(frozen=True)
class Count:
    """A whole number at least ``minimum`` (a bool is not a count), or None where ``none``
    says what None means."""

    minimum: int = 1
    none: str | None = None

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.none:
            return value
        if not isinstance(value, int) or isinstance(value, bool) or value < self.minimum:
            raise ValueError(f"{name} must be an int >= {self.minimum}{_or_none(self.none)}, not {value!r}")
        return value


@dataclass(frozen=True)
class Number:
    """A plain number at least ``minimum`` (a factor, not a time)."""

    minimum: float

    def __call__(self, name: str, value: Any) -> Any:
        if not _is_number(value) or not value >= self.minimum:
            raise ValueError(f"{name} must be a number >= {self.minimum:g}, not {value!r}")
        return value


@dataclass(frozen=True)
class Choice:
    """One of a few strings."""

    values: tuple[str, ...]

    def __call__(self, name: str, value: Any) -> Any:
        if value not in self.values:
            raise ValueError(f"{name} must be one of {list(self.values)}, not {value!r}")
        return value


@dataclass(frozen=True)
class Flag:
    """True or False, or None where ``none`` says what None means."""

    none: str | None = None

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.none:
            return value
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False{_or_none(self.none)}, not {value!r}")
        return value


@dataclass(frozen=True)
class Named:
    """One of a few objects, given as itself or by name (``"1.1"`` for ``RM11``); None where
    ``none`` says what None means."""

    by_name: Mapping[str, Any]
    none: str | None = None

    def __call__(self, name: str, value: Any) -> Any:
        if value is None and self.none:
            return value
        if isinstance(value, str):
            try:
                return self.by_name[value]
            except KeyError:
                raise ValueError(f"{name} {value!r} is not one of {sorted(self.by_name)}") from None
        if value not in self.by_name.values():
            raise ValueError(f"{name} must be one of {sorted(self.by_name)}{_or_none(self.none)}, not {value!r}")
        return value


@dataclass(frozen=True)
class ExceptionTypes:
    """A tuple of exception classes (a single class is taken as a tuple of one)."""

    def __call__(self, name: str, value: Any) -> Any:
        if isinstance(value, type):
            value = (value,)
        if not isinstance(value, tuple) or not all(isinstance(t, type) and issubclass(t, BaseException)
                                                   for t in value):
            raise ValueError(f"{name} must be a tuple of exception classes, not {value!r}")
        return value


@dataclass(frozen=True)
class Hook:
    """A callable, or None where ``none`` says what None means."""

    none: str

    def __call__(self, name: str, value: Any) -> Any:
        if value is not None and not callable(value):
            raise ValueError(f"{name} must be a callable or None ({self.none}), not {value!r}")
        return value


@dataclass(frozen=True)
class Converted:
    """Whatever ``convert`` accepts (an enum by value, a type's own check); its errors stand."""

    convert: Callable[[Any], Any]

    def __call__(self, name: str, value: Any) -> Any:
        return self.convert(value)


@dataclass(frozen=True)
class Knob:
    """One field's declaration: its check, and its row of the policy page."""

    check: Check
    #: What the knob does, in the page's words (the ``#:`` comment above the field says why).
    what: str
    #: The equivalents in Apache CXF (``wsrm-mgr``/``RMAssertion``) and WCF (``<reliableSession>``,
    #: MSMQ bindings); a dash where the product has none.
    cxf: str = "—"
    wcf: str = "—"
    #: The WS-RM policy assertion element a client reads this knob from, if any.
    wsdl: str = ""
    #: How the page writes the default, when its repr is not what a user would type.
    shown: str | None = None


def knob(default: Any, check: Check, what: str, *, cxf: str = "—", wcf: str = "—", wsdl: str = "",
         shown: str | None = None) -> Any:
    """A dataclass field with ``default``, declared by :class:`Knob` (see the module's docstring)."""
    return dataclasses.field(default=default, metadata={_KEY: Knob(check, what, cxf, wcf, wsdl, shown)})


def knobs(cls: type) -> dict[str, tuple[dataclasses.Field, Knob]]:
    """Every declared field of ``cls``, in declaration order."""
    return {f.name: (f, f.metadata[_KEY]) for f in dataclasses.fields(cls) if _KEY in f.metadata}


def check_fields(instance: Any) -> None:
    """Run every field's check on a frozen dataclass instance, keeping the normalized values.

    A field without a declaration is refused here, so that no knob escapes its check.
    """
    declared = knobs(type(instance))
    for field in dataclasses.fields(instance):
        if field.name not in declared:
            raise TypeError(f"{type(instance).__name__}.{field.name} has no knob(...) declaration")
        value = getattr(instance, field.name)
        checked = declared[field.name][1].check(field.name, value)
        if checked is not value:
            object.__setattr__(instance, field.name, checked)


def default_text(field: dataclasses.Field, declaration: Knob) -> str:
    """The default as a user would write it: ``64 * 1024 * 1024``, ``10_000``, ``"hold"``."""
    value = field.default
    if declaration.shown is not None:
        return declaration.shown
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 * 1024 and not value % (1024 * 1024):
        return f"{value // (1024 * 1024)} * 1024 * 1024"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"{value:_}"
    return repr(value)


def markdown_table(cls: type) -> str:
    """The policy page's knobs table (Markdown), one row per declared field of ``cls``."""
    lines = ["| knob | default | what it does | WSDL | CXF | WCF |", "| --- | --- | --- | --- | --- | --- |"]
    for name, (field, declaration) in knobs(cls).items():
        cells = [f"`{name}`", f"`{default_text(field, declaration)}`".replace("|", "\\|"), declaration.what,
                 declaration.wsdl, declaration.cxf, declaration.wcf]
        lines.append(re.sub(r" +\|", " |", "| " + " | ".join(cells) + " |"))
    return "\n".join(lines) + "\n"
