"""Helpers for a workload's data directory: build it safely, check it, report failures in a line.

Every workload plugin writes its data the same way, and third-party plugins may use these too:

* a new data set (generated or downloaded) is built in a hidden scratch directory beside its
  final place and renamed into place only when complete, so an interrupted ``ddl prepare``
  never leaves half a data set where a training job would read it;
* generated stand-ins carry a marker file, and a generator refuses to overwrite anything
  without it (real data is expensive to fetch again);
* problems become one line (:class:`~ddl.contract.errors.DataError`, exit code 2, for a bad data
  directory; :class:`~ddl.contract.errors.DdlError`, exit code 1, for a failed download), naming what
  was wrong and the ``ddl prepare`` command that fixes it.

Standard library only: validation and the CLI import this without paying for torch.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ddl.contract.errors import DataError, DdlError

#: The file that marks a directory as a generated stand-in (its text says what it is).
MARKER = "SYNTHETIC.txt"

# The errors of an OSError that are this machine's fault (disk full, no permission), not
# the network's; they get "could not write" instead of "could not download".
FILESYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT,
                               errno.EPERM})

_HINT_START = "; run `ddl prepare"


# ---------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------


def prepare_hint(plugin: str, data_dir: Path) -> str:
    """The fix that ends a data error's line: the command that writes the data."""
    return (f"run `ddl prepare --plugin {plugin} --data-dir {data_dir}` on a login node "
            "(or add --synthetic for generated data)")


def without_hint(error: BaseException) -> str:
    """A data error's message without its fix hint: for errors found in a scratch directory,
    whose path the hint would name instead of the user's."""
    return str(error).split(_HINT_START)[0]


def first_line(text: str, limit: int = 160) -> str:
    """The first non-empty line of ``text``, clipped to ``limit`` characters ('' if none)."""
    text = text.strip()
    line = text.splitlines()[0].rstrip() if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def short_reason(exc: BaseException) -> str:
    """One short phrase for why a download failed, e.g. 'Name or service not known'."""
    from urllib.error import HTTPError, URLError

    if isinstance(exc, HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, URLError):
        return str(exc.reason)
    return first_line(str(exc)) or type(exc).__name__


def is_filesystem_error(exc: BaseException) -> bool:
    """True for an OSError of the local disk; a URLError carries an errno too but has a
    ``reason`` (the network's)."""
    return (isinstance(exc, OSError) and exc.errno in FILESYSTEM_ERRNOS
            and not hasattr(exc, "reason"))


def unreachable(dataset: str, source: str, reason: str, plugin: str,
                data_dir: Path) -> DdlError:
    """The one-line error for a server this machine cannot use, with the way out."""
    return DdlError(f"could not download {dataset} from {source} ({reason}); run `ddl prepare "
                    f"--plugin {plugin} --data-dir {data_dir}` on a login node with internet "
                    "access, or add --synthetic for generated data")


def download_failure(exc: BaseException, data_dir: Path, *, dataset: str, source: str,
                     plugin: str, reason: Callable[[BaseException], str] = short_reason
                     ) -> DdlError:
    """The one-line error for a failed download: a full or read-only disk is named as such,
    anything else means the server is out of reach (see :func:`unreachable`)."""
    if is_filesystem_error(exc):
        return DdlError(f"could not write {dataset} to {data_dir}: {exc.strerror or exc}")
    return unreachable(dataset, source, reason(exc), plugin, data_dir)


@contextlib.contextmanager
def quiet_download(timeout_s: float) -> Iterator[None]:
    """Run a library's downloader with a socket timeout and without its output.

    Without the timeout a firewall that silently drops packets makes every attempt hang
    for minutes; the output (URLs, progress bars) would bury ddl's one line.
    """
    chatter = io.StringIO()
    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout_s)
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            yield
    finally:
        socket.setdefaulttimeout(old_timeout)


# ---------------------------------------------------------------------------
# The data directory
# ---------------------------------------------------------------------------


def make_data_dir(data_dir: Path) -> None:
    """Create ``data_dir`` (and parents); DataError in one line if it cannot be written."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create data directory {data_dir}: {e.strerror or e}") from None
    if not os.access(data_dir, os.W_OK):
        raise DataError(f"data directory {data_dir} is not writable")


def holds_files(path: Path) -> bool:
    """True if ``path`` has a file (or link) anywhere below it; empty folders do not count."""
    return path.exists() and any(p.is_file() or p.is_symlink() for p in path.rglob("*"))


def is_synthetic(target: Path) -> bool:
    """True if ``target`` holds a generated stand-in (it has the :data:`MARKER` file)."""
    return (target / MARKER).is_file()


def protect_real_data(target: Path, dataset: str) -> None:
    """DataError unless ``target`` is absent, empty or a generated set: a generator may
    replace its own output, never data someone downloaded or copied there."""
    if holds_files(target) and not is_synthetic(target):
        raise DataError(f"{target} already holds files that are not a synthetic set (real "
                        f"{dataset} data?); refusing to overwrite them (remove {target} "
                        "yourself if you really want generated data)")


def md5_of(path: Path) -> str:
    """The md5 hex digest of a file, read in 1 MiB pieces."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def md5_manifest(blobs: dict[str, bytes]) -> str:
    """md5sum's format for named contents (``md5sum -c`` checks the written files)."""
    return "".join(f"{hashlib.md5(blob, usedforsecurity=False).hexdigest()}  {name}\n"
                   for name, blob in blobs.items())


def parse_md5_manifest(text: str) -> dict[str, str]:
    """name -> md5 from md5sum output (text or binary mode); other lines are ignored."""
    sums = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([0-9a-f]{32}) [ *](\S+)", line.strip())
        if match:
            sums[match.group(2)] = match.group(1)
    return sums


# ---------------------------------------------------------------------------
# Replacing a directory as a whole
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_dir(beside: Path, purpose: str) -> Iterator[Path]:
    """A new hidden directory ``.<name>-<purpose>-*`` next to ``beside``, removed on exit.

    On the same file system as the target, so that :func:`install` is a rename, not a copy.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f".{beside.name}-{purpose}-", dir=beside.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def replacing(target: Path, purpose: str = "new") -> Iterator[Path]:
    """Yield an empty directory to fill; when the block completes it becomes ``target``.

    If the block raises (or the process dies), ``target`` is left as it was: the partial
    directory lives in a scratch directory beside it, which is removed on the way out (or,
    after a kill, stays behind as a hidden ``.<name>-<purpose>-*`` folder).
    """
    with scratch_dir(target, purpose) as tmp:
        new = tmp / target.name
        new.mkdir()
        yield new
        install(new, target)


@contextlib.contextmanager
def new_synthetic_set(target: Path, dataset: str) -> Iterator[Path]:
    """:func:`replacing` for a generator: refuses real data in ``target`` first and creates
    the data directory. The caller writes the :data:`MARKER` file into the yielded directory."""
    protect_real_data(target, dataset)
    make_data_dir(target.parent)
    with replacing(target, "synthetic") as new:
        yield new


def install(new: Path, target: Path) -> None:
    """Rename the complete directory ``new`` to ``target``, replacing any old one.

    The files are flushed to disk first, so that after a crash the name never points at
    data still in the page cache. The old directory is moved aside and deleted only after
    the new one is in place: at every moment there is one complete set (or, if killed
    between the two renames, none, and the previous one in ``.<name>-old-*``).
    """
    fsync_tree(new)
    if not target.exists():
        os.rename(new, target)
    else:
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
        old = aside / target.name
        try:
            os.rename(target, old)
        except BaseException:
            aside.rmdir()
            raise
        try:
            os.rename(new, target)
        except BaseException:
            os.rename(old, target)  # put the old set back; only then is `aside` empty
            aside.rmdir()
            raise
        shutil.rmtree(aside, ignore_errors=True)
    _fsync_dir(target.parent)  # makes the rename itself durable


def fsync_tree(root: Path) -> None:
    """Flush every file below ``root`` to disk."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Some file systems (and all of Windows) cannot fsync a directory; the rename has
    # happened either way, only its durability after a power cut is at stake.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
