"""The run directory: everything one run leaves behind.

    <run_dir>/config.json    the merged run configuration (what was asked for)
    <run_dir>/metrics.jsonl  one JSON object per epoch, appended as training goes
    <run_dir>/results.json   the summary: resolved layout, per-epoch times, final metrics
    <run_dir>/model.pt       the trained weights (a plain state_dict; torch.load(weights_only=True))
    <run_dir>/checkpoints/   resumable training state (see ddl.worker.checkpointing.checkpoint)
    <run_dir>/live/rank-<r>.json  each rank's live state for ``ddl watch``, replaced at most
                             every 2 s while it trains (ddl.worker.observe.live: epoch, step, recent
                             samples/s, loss, CPU/GPU use, memory, time), and once more at
                             the end with ``state`` finished, stopped or failed
    <run_dir>/tensorboard/   TensorBoard event files of rank 0 (per logged step the loss; per
                             epoch the metrics, samples/s, data-wait share, lr), when the
                             ``tensorboard`` package is installed
                             (ddl.worker.observe.tensorboard_events)

Files are written to a temporary name and renamed, so a crash never leaves half a file (also
the appends to metrics.jsonl); they get the usual permissions (0666 less the umask). A
directory that already holds results is never reused, and one run at a time runs in it
(``.lock``).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from ddl.contract.errors import DdlError, UsageError

CONFIG = "config.json"
METRICS = "metrics.jsonl"
RESULTS = "results.json"
MODEL = "model.pt"
LIVE = "live"  # live/rank-<r>.json: ddl.worker.observe.live writes, ddl watch reads
TENSORBOARD = "tensorboard"
#: Errors of a write the file system refused: full, over quota, read-only, not permitted.
WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
LOCK = ".lock"  # held (flock) by the process that runs in the directory

NAME_MAX = 255  # bytes in one file name (Linux)
PATH_MAX = 4096  # bytes in a path, its closing NUL included (Linux)
HOST_NAME_MAX = 64  # bytes in a host name (Linux); TensorBoard puts it in its file names
#: The longest paths ddl writes below a run directory, each at its widest (the others are
#: shorter: live/.rank-<r>.json.tmp, logs/rank<r>-traceback.txt, .results.json.XXXXXXXX.tmp).
#: tests/distributed/test_rundir_room.py records every path a real run (checkpoints,
#: TensorBoard, live state, profile, resume) writes there, and checks they fit.
WIDEST_BELOW = (
    # SummaryWriter's file: events.out.tfevents.<10-digit time>.<host>.<pid>.<writer n>
    f"{TENSORBOARD}/events.out.tfevents.{'9' * 10}.{'h' * HOST_NAME_MAX}.{'9' * 7}.{'9' * 3}",
    # a rank's DCP shard (a million ranks) in a checkpoint not yet complete
    "checkpoints/.step-99999999.partial/__999999_99.distcp",
)
#: Room a run directory's path leaves under PATH_MAX for them (and the '/' before them).
ROOM_BELOW = max(len(path.encode()) for path in WIDEST_BELOW) + 1


def name(plugin: str, strategy: str, tag: str) -> str:
    """A run directory's name: ``<plugin>-<strategy>-<tag>``, the tag a time stamp or a job id
    (the only place the pattern is written; ``ddl submit`` puts it in its scripts too)."""
    return f"{plugin}-{strategy}-{tag}"


def live_file(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its live state (``ddl watch``)."""
    return run_dir / LIVE / f"rank-{rank}.json"


def timestamped(root: Path, plugin: str, strategy: str) -> Path:
    """A new directory under ``root`` named after the run and the time it started."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = root / name(plugin, strategy, stamp)
    n = 1
    while candidate.exists():
        n += 1
        candidate = root / name(plugin, strategy, f"{stamp}-{n}")
    return candidate


def check_length(run_dir: Path | str, flag: str = "--run-dir") -> None:
    """A run directory whose files would not fit Linux's limits is refused in one line
    before anything is written: a name over NAME_MAX, or a path that leaves less than
    ROOM_BELOW under PATH_MAX (else the first checkpoint fails mid-run, with a traceback)."""
    text = str(run_dir)
    short = text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}"
    longest = max(Path(text).parts, key=lambda part: len(part.encode()), default="")
    if len(longest.encode()) > NAME_MAX:
        raise UsageError(f"{flag}: {short} has a name of {len(longest.encode())} bytes "
                         f"({longest[:20]}...); allowed: at most {NAME_MAX} bytes a name "
                         "(the file system's limit)")
    allowed = PATH_MAX - 1 - ROOM_BELOW
    if len(text.encode()) > allowed:
        raise UsageError(f"{flag}: {short} is {len(text.encode())} bytes long; allowed: at "
                         f"most {allowed} bytes (Linux's limit of {PATH_MAX} for a path, less "
                         "room for the files ddl writes below a run directory)")


def create(run_dir: Path, resume: str = "none") -> Path:
    """Make a fresh run directory and lock it for this run; refuse one that already holds a
    run, unless the run is to be resumed (``--resume auto``) and has not finished. A
    directory whose run never trained (e.g. its workers refused the batch size) is reused."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir: {run_dir} exists and is not a directory")
    if run_dir.is_dir():
        if resume == "auto" and (run_dir / CONFIG).is_file():
            if (run_dir / RESULTS).exists():
                raise UsageError(f"--resume auto: the run in {run_dir} has already finished "
                                 f"({RESULTS} exists); nothing to resume")
            _checkpoints_usable(run_dir)
            lock(run_dir)
            _writable(run_dir)
            return run_dir  # an interrupted run: the trainer continues it
        if any((run_dir / name).exists() for name in (RESULTS, MODEL)) or _trained(run_dir):
            raise UsageError(f"--run-dir: {run_dir} already holds a run; choose a new "
                             "directory (nothing there was changed)")
    _checkpoints_usable(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--run-dir: cannot create {run_dir}: {exc.strerror}") from None
    lock(run_dir)
    _writable(run_dir)
    return run_dir


def _checkpoints_usable(run_dir: Path) -> None:
    """``checkpoints/`` must be a directory and ``checkpoints/latest`` a file (or absent):
    either the other way round was found only at the first checkpoint, after training ran,
    as a raw errno line. Refused before anything starts; nothing there is changed."""
    checkpoints = run_dir / "checkpoints"  # ddl.worker.checkpointing.checkpoint.DIR (no torch here)
    if checkpoints.exists() and not checkpoints.is_dir():
        raise UsageError(f"--run-dir: {checkpoints} is not a directory, and the run keeps "
                         "its checkpoints there; allowed: a run directory whose "
                         "'checkpoints' is a directory or absent (move that file away)")
    latest = checkpoints / "latest"  # ddl.worker.checkpointing.checkpoint.LATEST
    if latest.exists() and not latest.is_file():
        raise UsageError(f"--run-dir: {latest} is not a file, and each checkpoint writes "
                         "the newest one's name there; allowed: a file or nothing at that "
                         "path (move it away)")


def _writable(run_dir: Path) -> None:
    """Create and remove a file in ``run_dir``: a directory made read-only whose ``.lock``
    is still writable (``chmod a-w`` on a run to resume) is refused here, as bad input,
    not by the first file the run writes (exit 1)."""
    try:
        fd, probe = tempfile.mkstemp(dir=run_dir, prefix=".probe-")
    except OSError as exc:
        raise _unwritable(run_dir, exc) from None
    os.close(fd)
    os.unlink(probe)


def _unwritable(run_dir: Path, exc: OSError) -> UsageError:
    return UsageError(f"--run-dir: cannot write in {run_dir}: {exc.strerror}; give a "
                      "writable directory")


def _trained(run_dir: Path) -> bool:
    """Whether a run in ``run_dir`` got as far as a metrics record or a checkpoint."""
    checkpoints = run_dir / "checkpoints"
    return (run_dir / METRICS).exists() or (checkpoints.is_dir() and any(checkpoints.iterdir()))


_held: list[tuple[Path, int]] = []  # the run directory this process runs in, and its lock


def lock(run_dir: Path) -> None:
    """Hold ``RUN_DIR/.lock`` (flock) until this process ends or locks another run directory:
    two runs writing one directory would interleave their checkpoints. A second run fails
    in one line naming the holder. The lock dies with its process (kill -9 included). A file
    system without flock (e.g. Lustre mounted without ``flock``) runs unlocked."""
    import fcntl
    import socket

    for _, fd in _held:  # one run at a time per process (a finished in-process run's lock)
        os.close(fd)
    _held.clear()
    path = run_dir / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:  # a read-only directory (or file system), no permission
        raise _unwritable(run_dir, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise UsageError(f"--run-dir: {run_dir} is in use by a run still going ({holder}); "
                         "wait for it to end, or stop it (kill -TERM that pid), then run this "
                         "again") from None
    except OSError:  # no flock on this file system: nothing to hold
        os.close(fd)
        return
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _held.append((run_dir, fd))


def write_json(path: Path, data: Any) -> None:
    """Atomically replace ``path`` with ``data`` as indented JSON."""
    _replace(path, json.dumps(data, indent=2, default=str) + "\n")


def _replace(path: Path, text: str) -> None:
    """Write ``text`` aside, then rename it over ``path``: readers and crashes see the old
    file or the new one, never half of one. A full disk or a refused write is one line
    naming the file (the old one is left as it was)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide results from the group
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in WRITE_FAILURES:
            raise DdlError(f"cannot write {path}: {exc.strerror}{_free(path.parent, exc)}; "
                           f"it was left as it was") from None
        raise


def _free(directory: Path, exc: OSError) -> str:
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return ""
    try:
        return f" ({shutil.disk_usage(directory).free / 2**20:.1f} MiB free there)"
    except OSError:
        return ""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_jsonl(path: Path, say: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The records of a JSON-lines file. A torn last line (left by an older ddl's in-place
    append cut short by a kill or a full disk) is dropped, and ``say`` tells it; damage
    elsewhere is a one-line error."""
    if not path.is_file():
        return []
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif number == len(lines):
            if say is not None:
                say(f"ddl: {path}: dropped a torn last line (an interrupted write): "
                    f"{line[:60]!r}")
        else:
            raise UsageError(f"{path}: line {number} is not a JSON object; repair or remove "
                             "that line (one record per epoch)")
    return records


def rewrite_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Atomically replace a JSON-lines file (used when a resumed run drops the records of
    epochs it is about to repeat)."""
    _replace(path, "".join(json.dumps(r, default=str) + "\n" for r in records))


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Add one record by write-and-rename (the file holds one small line per epoch, so the
    copy is cheap): a kill or a full disk leaves the file as it was, never a torn line."""
    before = path.read_text() if path.is_file() else ""
    if before and not before.endswith("\n"):
        before += "\n"
    _replace(path, before + json.dumps(record, default=str) + "\n")


def versions() -> dict[str, Any]:
    """Versions of Python and the packages that shaped the numbers."""
    found: dict[str, Any] = {"python": platform.python_version()}
    for name in ("ddl", "torch", "torchvision", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
