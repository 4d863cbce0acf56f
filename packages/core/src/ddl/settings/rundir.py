"""The run directory: everything one run leaves behind.

    <run_dir>/config.json    the merged run configuration (what was asked for)
    <run_dir>/metrics.jsonl  one JSON object per epoch, appended as training goes
    <run_dir>/results.json   the summary: resolved layout, per-epoch times, final metrics
    <run_dir>/model.pt       the trained weights (a plain state_dict; torch.load(weights_only=True))
    <run_dir>/checkpoints/   resumable training state (see ddl.worker.checkpoint)

Files are written to a temporary name and renamed, so a crash never leaves half a file.
A directory that already holds results is never reused.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ddl.contract.errors import UsageError

CONFIG = "config.json"
METRICS = "metrics.jsonl"
RESULTS = "results.json"
MODEL = "model.pt"


def name(plugin: str, strategy: str, tag: str) -> str:
    """A run directory's name: ``<plugin>-<strategy>-<tag>``, the tag a time stamp or a job id
    (the only place the pattern is written; ``ddl submit`` puts it in its scripts too)."""
    return f"{plugin}-{strategy}-{tag}"


def timestamped(root: Path, plugin: str, strategy: str) -> Path:
    """A new directory under ``root`` named after the run and the time it started."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = root / name(plugin, strategy, stamp)
    n = 1
    while candidate.exists():
        n += 1
        candidate = root / name(plugin, strategy, f"{stamp}-{n}")
    return candidate


def create(run_dir: Path, resume: str = "none") -> Path:
    """Make a fresh run directory; refuse one that already holds a run, unless the run is
    to be resumed (``--resume auto``) and has not finished."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir: {run_dir} exists and is not a directory")
    if resume == "auto" and (run_dir / CONFIG).is_file():
        if (run_dir / RESULTS).exists():
            raise UsageError(f"--resume auto: the run in {run_dir} has already finished "
                             f"({RESULTS} exists); nothing to resume")
        return run_dir  # an interrupted run: the trainer continues it
    if run_dir.is_dir() and any((run_dir / name).exists() for name in (CONFIG, RESULTS, MODEL)):
        raise UsageError(f"--run-dir: {run_dir} already holds a run; choose a new directory "
                         "(nothing there was changed)")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--run-dir: cannot create {run_dir}: {exc.strerror}") from None
    return run_dir


def write_json(path: Path, data: Any) -> None:
    """Atomically replace ``path`` with ``data`` as indented JSON."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rewrite_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Atomically replace a JSON-lines file (used when a resumed run drops the records of
    epochs it is about to repeat)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.writelines(json.dumps(r, default=str) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def versions() -> dict[str, Any]:
    """Versions of Python and the packages that shaped the numbers."""
    found: dict[str, Any] = {"python": platform.python_version()}
    for name in ("ddl", "torch", "torchvision", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
