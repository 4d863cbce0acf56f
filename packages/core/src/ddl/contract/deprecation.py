"""Public names that moved or went keep working for one minor version, with a warning that
names what replaces them (the policy: docs/plugin-authors.md, "The contract's version").

The modules left at the old paths (``ddl/specs.py`` and the like) are a docstring and one
call of :func:`moved_module`; their names are fetched from the new home on first use, so an
old import costs what the new one does (``ddl.batchnorm`` imports torch only when a name of
it is used).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any

#: The contract version whose release removes the 1.x module paths (ddl.specs, ...).
OLD_PATHS_GO_IN = "2.1"


class ContractDeprecationWarning(DeprecationWarning):
    """A plugin used a name of the contract that moved or goes; ``ddl plugins`` lists the
    plugins that did while loading."""


def warn(old: str, instead: str, goes_in: str = OLD_PATHS_GO_IN, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated; ``instead`` says what to write. ``stacklevel``
    counts from the caller of this function (3: the code that called the deprecated name)."""
    warnings.warn(f"{old} is deprecated and goes in ddl contract {goes_in}; {instead}",
                  ContractDeprecationWarning, stacklevel=stacklevel)


def moved_module(old: str, new: str, names: Iterable[str], gone: dict[str, str] | None = None
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module left at ``old``: each of ``names`` comes
    from ``new``, with a warning naming the import to use (``ddl.contract`` for the names
    it exports). ``gone``: names removed with no drop-in replacement -> what to do instead,
    said by their AttributeError."""
    names, gone = frozenset(names), gone or {}

    def __getattr__(name: str) -> Any:
        if name in gone:
            raise AttributeError(f"{old}.{name} was removed in ddl contract 2.0; {gone[name]}")
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        import ddl.contract

        home = "ddl.contract" if name in ddl.contract.__all__ else new
        warn(f"{old}.{name}", f"use `from {home} import {name}`")
        return getattr(importlib.import_module(new), name)

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
