"""A real small file system for disk-full tests: a tmpfs of a few kilobytes, mounted for
the test (CI runs as root; where mounting is not allowed the test says why it skips)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); a real full disk "
                    "needs one")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
