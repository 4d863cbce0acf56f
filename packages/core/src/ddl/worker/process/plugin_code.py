"""Where an exception passed through a plugin's own code: its file and line, for the one-line
errors (a plugin author's data set fails deep in torch's loader, far from their code)."""

from __future__ import annotations

import traceback
from importlib import metadata
from pathlib import Path
from types import TracebackType


def plugin_packages() -> frozenset[str]:
    """The top-level packages (or single modules) that the entry points of group ``ddl``
    name: the installed plugins' code, ddl's own plugins included. Read on each call: it
    is only needed when something failed."""
    return frozenset(ep.value.partition(":")[0].partition(".")[0]
                     for ep in metadata.entry_points(group="ddl"))


def plugin_location(tb: TracebackType | None) -> str:
    """`` (at my_plugin/data.py:42 in __getitem__)`` for the innermost frame of ``tb`` in a
    plugin's package, or "" when none is."""
    packages = plugin_packages()
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        top = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if top in packages:
            found = (top, frame.f_code.co_filename, lineno, frame.f_code.co_name)
    if found is None:
        return ""
    top, filename, lineno, function = found
    parts = Path(filename).parts
    # from the package's folder on (my_plugin/data.py), or a single module's file name
    starts = [i for i, part in enumerate(parts) if part in (top, f"{top}.py")]
    shown = "/".join(parts[starts[-1]:]) if starts else Path(filename).name
    return f" (at {shown}:{lineno} in {function})"
