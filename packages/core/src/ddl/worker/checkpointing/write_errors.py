"""A write into the run directory that fails (full disk, quota, read-only file system, no
permission) as one line naming the path, instead of a traceback.

Such a failure reaches the worker in several shapes: an ``OSError`` from ddl's own writes
(metrics, results, the run directory), DCP's ``CheckpointException`` (a ``BaseException``)
holding every rank's ``OSError``, or torch.save's zip writer, which reports a short write
as ``RuntimeError: ... unexpected pos N vs M`` with no errno at all. Checkpoints are written
into a ``.partial`` directory and renamed when complete (``ddl.worker.checkpointing.checkpoint``),
so the
newest complete one is intact and the line says which it is.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from ddl.contract.errors import DdlError

FULL = {errno.ENOSPC, errno.EDQUOT}
REFUSED = {errno.EROFS, errno.EACCES, errno.EPERM}
SHORT_WRITE = ("unexpected pos", "file write failed")  # torch.save's zip writer


class WriteFailed(DdlError):
    """Every rank that saw it leaves at once; the line is printed before (see one_line)."""

    once = True


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception, what caused it, and the per-rank failures a CheckpointException holds."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):  # DCP: {rank: (exception, traceback)}
            todo += [pair[0] for pair in failures.values()
                     if isinstance(pair, tuple) and isinstance(pair[0], BaseException)]
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]


def _free(path: Path) -> str:
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.1f} MiB free there"
    except OSError:
        return "free space unknown"


def _inside(path: Path, run_dir: Path) -> bool:
    try:
        return path.resolve().is_relative_to(run_dir.resolve())
    except (OSError, ValueError):
        return False


def one_line(exc: BaseException, run_dir: Path) -> WriteFailed | None:
    """The one-line error for a failed write, or None if ``exc`` is something else."""
    from ddl.worker.checkpointing.checkpoint import latest

    why = None
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.errno in FULL | REFUSED:
            where = Path(cause.filename) if cause.filename else run_dir / "checkpoints"
            if cause.errno in REFUSED and not _inside(where, run_dir):
                continue  # e.g. a data file it may not read: not a write into the run
            why = f"cannot write {where}: {cause.strerror}"
            if cause.errno in FULL:
                why += f" ({_free(where if where.exists() else run_dir)})"
            break
        if isinstance(cause, RuntimeError) and any(m in str(cause) for m in SHORT_WRITE):
            why = f"a write into {run_dir} failed short ({_free(run_dir)}; a full disk?)"
            break
    if why is None:
        return None
    try:
        newest = latest(run_dir)
    except Exception:  # noqa: BLE001 - the line matters more than naming the checkpoint
        newest = None
    return WriteFailed(f"{why}; the newest complete checkpoint ({newest or 'none yet'}) is "
                       "intact; make room (or fix the permissions), then run the same "
                       "command with --resume auto")
