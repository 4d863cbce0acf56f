"""The commands the docs mark runnable on a CPU run as written and succeed.

A page marks a fenced shell block with the comment `<!-- runnable-on-cpu -->` on the line
before it (Markdown keeps the comment; the rendered page hides it). Blocks run in page
order, each line as one `bash -e` script, in a fresh directory where `./ddl` is this venv's
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

PAGES = ["docs/getting-started.md", "docs/tutorial.md"]  # pages whose marked blocks run here
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


@pytest.mark.parametrize("page", PAGES)
def test_marked_commands_run(page, tmp_path):
    blocks = runnable_blocks((REPO / page).read_text())
    assert blocks, f"{page} marks no runnable block"
    ddl = tmp_path / "ddl"
    ddl.write_text(f'#!/bin/sh\nexec "{Path(sys.executable).with_name("ddl")}" "$@"\n')
    ddl.chmod(0o755)
    for block in blocks:
        proc = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"{page}:\n{block}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
