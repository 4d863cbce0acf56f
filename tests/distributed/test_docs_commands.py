"""The commands the docs mark runnable on a CPU run as written and succeed.

A page marks a fenced shell block with the comment `<!-- runnable-on-cpu -->` on the line
before it (Markdown keeps the comment; the rendered page hides it). Blocks run in page
order, each block as one `bash -e` script, in a fresh directory where `./ddl` is this venv's
ddl (the repository's `./ddl` wrapper would create or check .venv first; the tests already
run inside it). Several ranks train over gloo, hence the distributed marker.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.distributed

# Pages whose marked blocks run here. A sequential page's blocks build on each other and run
# in one test; a step page's blocks need only its first (the data) and each is a test.
SEQUENTIAL_PAGES = ["docs/getting-started.md"]
STEP_PAGES = ["docs/tutorial.md"]
MARKER = "<!-- runnable-on-cpu -->"
BLOCK = re.compile(re.escape(MARKER) + r"\n```(?:sh|bash|console)\n(.*?)\n```", re.S)


def runnable_blocks(text: str) -> list[str]:
    blocks = BLOCK.findall(text)
    assert len(blocks) == text.count(MARKER) - text.count(f"`{MARKER}`"), \
        f"a {MARKER} comment is not directly above a ```sh block"
    return blocks


def test_marker_extraction():
    page = f"intro `{MARKER}`\n{MARKER}\n```sh\na\nb\n```\n\n```sh\nnot marked\n```\n"
    assert runnable_blocks(page) == ["a\nb"]
    with pytest.raises(AssertionError, match="not directly above"):
        runnable_blocks(f"{MARKER}\n\n```sh\nx\n```\n")


def _ddl_wrapper(directory: Path) -> None:
    ddl = directory / "ddl"
    ddl.write_text(f'#!/bin/sh\nexec "{Path(sys.executable).with_name("ddl")}" "$@"\n')
    ddl.chmod(0o755)


def _run_block(page: str, block: str, cwd: Path) -> None:
    proc = subprocess.run(["bash", "-e", "-c", block], cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{page}:\n{block}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"


@pytest.mark.parametrize("page", SEQUENTIAL_PAGES)
def test_marked_commands_run(page, tmp_path):
    blocks = runnable_blocks((REPO / page).read_text())
    assert blocks, f"{page} marks no runnable block"
    _ddl_wrapper(tmp_path)
    for block in blocks:
        _run_block(page, block, tmp_path)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Per page of STEP_PAGES, a directory where its first block (the data) has run."""
    made: dict[str, Path] = {}

    def directory(page: str) -> Path:
        if page not in made:
            made[page] = tmp_path_factory.mktemp("page")
            _ddl_wrapper(made[page])
            _run_block(page, runnable_blocks((REPO / page).read_text())[0], made[page])
        return made[page]

    return directory


def _steps() -> list:
    return [pytest.param(page, index, id=f"{page}:{index}")
            for page in STEP_PAGES
            for index in range(1, len(runnable_blocks((REPO / page).read_text())))]


@pytest.mark.parametrize(("page", "index"), _steps())
def test_marked_step_runs(page, index, prepared):
    """One step of a page whose steps need only its first block: separate tests, so the
    tutorial's ten runs spread over the test workers instead of one 2-minute test."""
    directory = prepared(page)
    _run_block(page, runnable_blocks((REPO / page).read_text())[index], directory)
