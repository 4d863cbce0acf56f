"""The shape of the code in packages/: no module over 400 lines, and no block of six or more
lines written twice (imports aside). Both keep the code readable and each decision in one
place (issue 17); both fail on a planted offender."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

PACKAGES = REPO / "packages"
MAX_LINES = 400
WINDOW = 6  # lines that make a repeated block


def modules(root: Path = PACKAGES) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def too_long(paths: list[Path]) -> dict[str, int]:
    sizes = {str(p): len(p.read_text().splitlines()) for p in paths}
    return {p: n for p, n in sizes.items() if n > MAX_LINES}


def _meaningful(line: str) -> str | None:
    text = line.strip()
    if not text or text.startswith("#") or text.startswith(("import ", "from ")):
        return None
    return text


def repeated_blocks(paths: list[Path]) -> list[list[tuple[str, int]]]:
    """Places where the same WINDOW meaningful lines (blank lines, comments and imports
    skipped, indentation ignored) occur more than once."""
    seen: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for path in paths:
        kept = [(n, t) for n, line in enumerate(path.read_text().splitlines(), start=1)
                if (t := _meaningful(line)) is not None]
        for k in range(len(kept) - WINDOW + 1):
            window = tuple(t for _, t in kept[k:k + WINDOW])
            if sum(map(len, window)) >= 150:  # brackets and one-word lines are not a block
                seen[window].append((str(path), kept[k][0]))
    return [places for places in seen.values() if len(places) > 1]


def test_no_module_is_over_the_limit():
    assert not too_long(modules()), f"modules over {MAX_LINES} lines: {too_long(modules())}"


def test_no_block_is_written_twice():
    found = repeated_blocks(modules())
    assert not found, f"the same {WINDOW} lines in several places: {found[:5]}"


def test_both_checks_catch_a_planted_offender(tmp_path):
    body = "\n".join(f"value_{i} = compute_something_long(argument_{i}, other_{i})"
                     for i in range(WINDOW))
    (tmp_path / "a.py").write_text(body + "\n")
    (tmp_path / "b.py").write_text("x = 1\n" + body + "\n")
    (tmp_path / "long.py").write_text("pass\n" * (MAX_LINES + 1))
    assert list(too_long(modules(tmp_path))) == [str(tmp_path / "long.py")]
    assert len(repeated_blocks(modules(tmp_path))) == 1
