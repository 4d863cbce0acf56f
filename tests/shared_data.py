"""Synthetic datasets written once per test run, for every pytest-xdist worker.

A session fixture runs once per worker: with two workers, each wrote its own copy of the
same synthetic set, and modules that wanted Imagewoof or CIFAR-10 ran `ddl prepare` for a
copy of their own (Imagewoof: ~5 CPU s to write, ~2 s more for a fresh `ddl` process).
Here the first worker to ask writes the set into the directory all workers of this run
share (pytest's base temporary directory's parent under xdist, the pattern pytest-xdist's
documentation gives), under an exclusive file lock the others wait on; they then read the
finished copy. Without xdist the run's own base directory is used, so nothing outlives a
run and a change to a generator is never hidden by an older copy.

The sets are for tests that only read them (each loader opens its files read-only; XSum's
is loaded with keep_in_memory, so no cache files appear beside it). A test that damages
data takes a private copy (conftest.mnist_copy).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable


def _run_directory(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def written_once(tmp_path_factory, name: str, write: Callable[[Path], object]) -> Path:
    """``<run directory>/shared-<name>``, written by ``write(path)`` if no worker has yet."""
    return written_once_in(_run_directory(tmp_path_factory), name, write)


def written_once_in(where: Path, name: str, write: Callable[[Path], object]) -> Path:
    """``where/shared-<name>``, written by ``write(path)`` unless it exists.

    ``write`` fills a scratch directory that is renamed into place when it returns, so a
    worker never sees a half-written set, and one that failed leaves nothing behind (the
    next worker to ask tries again and fails the same way, with its own traceback)."""
    target = where / f"shared-{name}"
    with open(where / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not target.exists():
            scratch = where / f"shared-{name}.partial"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            try:
                write(scratch)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            scratch.rename(target)
    return target
