"""``--data-dir PLUGIN=DIR`` for benchmarks that otherwise prepare a fresh synthetic copy of
each workload's data (the tests hand them the run's shared synthetic sets)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_data_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", action="append", default=[], metavar="PLUGIN=DIR",
                        help="use this prepared data for PLUGIN (repeatable; default: a fresh "
                        "synthetic copy of each)")


def given_data_dirs(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, Path]:
    """{plugin: directory} of the --data-dir values; a malformed one ends the run (exit 2)."""
    given = {}
    for item in items:
        plugin, sep, where = item.partition("=")
        if not sep or not plugin or not where:
            parser.error(f"--data-dir {item!r}: expected PLUGIN=DIR, e.g. mnist=data/mnist")
        given[plugin] = Path(where)
    return given
