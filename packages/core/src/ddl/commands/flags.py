"""Parsed ``ddl train`` flags, as a dict for the run configuration and back as ``--key=value``
arguments for a ``ddl train`` that starts elsewhere (a batch job, a point of ``ddl scale``)."""

from __future__ import annotations

import argparse
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ddl.commands.parser import SUBMIT_ONLY
from ddl.contract.errors import UsageError
from ddl.settings.plan import absolute


def train_flags(ns: argparse.Namespace) -> dict[str, Any]:
    skip = ("command", "config", "synthetic", *SUBMIT_ONLY)
    flags = {k: v for k, v in vars(ns).items() if k not in skip}
    if "strategy_options" in flags:
        flags["strategy_options"] = dict(flags["strategy_options"])
    return flags


def train_arguments(flags: dict[str, Any], leave_out: Collection[str] = ()) -> list[str]:
    """Parsed train flags written back as ``--key=value`` for a ``ddl train`` that starts
    elsewhere (a batch job, a point of ``ddl scale``): paths are made absolute because
    that run may start in another directory."""
    args = []
    for key, value in flags.items():
        if key in leave_out:
            continue
        if key == "strategy_options":  # a dict, or the (key, value) pairs argparse made
            args += [f"--strategy-option={k}={v}" for k, v in dict(value).items()]
            continue
        if isinstance(value, bool):  # --flag / --no-flag (argparse's BooleanOptionalAction)
            args.append(f"--{'' if value else 'no-'}{key.replace('_', '-')}")
            continue
        if key == "mesh":
            value = ",".join(f"{k}={v}" for k, v in value.items())
        if isinstance(value, Path):
            value = absolute(value, f"--{key.replace('_', '-')}")
        args.append(f"--{key.replace('_', '-')}={value}")
    return args


def check_whole(flag: str, value: int | None, upper: int, what: str = "") -> None:
    """A count flag of a command that loops over it (``ddl plan``, ``ddl layout``): from 1
    to ``upper``, the bound ``ddl train`` puts on the same value (ddl.settings.config), so
    ``--nproc 99999999999999999999`` is one line instead of a loop that never ends."""
    if value is None or 1 <= value <= upper:
        return
    text = str(value)
    shown = text if len(text) <= 20 else f"{text[:12]}... ({len(text)} digits)"
    if value < 1:
        raise UsageError(f"{flag}: {shown}; allowed: a whole number >= 1")
    raise UsageError(f"{flag}: {shown}; allowed: 1 to {upper}{what}")
