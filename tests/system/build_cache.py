"""Where the system tests keep what a container build starts from, shared by every clone on
this machine: the provided Apptainer with its Debian base root (~2.5 min to make) and the
offline wheelhouse (every locked wheel, ~3 GB).

The cache lives outside the checkout, so a fresh clone (as CI makes one) finds it warm:
$DDL_TEST_CACHE if set, else $XDG_CACHE_HOME/ddl, else ~/.cache/ddl. Each entry's name
carries the hash of what it is made from, so a changed input gets a new entry and never
an old one:
- apptainer-KEY: KEY hashes ../shared/tools/provide-apptainer (the script decides the
  runtime and the base; requirements.lock does not enter the base);
- wheelhouse-KEY: KEY hashes requirements.lock (the versions scripts/build-wheelhouse.sh
  puts there; it also keeps its own stamp of ddl's declared dependencies).
An entry is made and read under an exclusive flock of its .lock file: several clones or
pytest-xdist workers on one machine build it once, one after the other.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

KEY_CHARS = 16  # of the sha256: enough to tell apart the inputs one machine sees


def cache_root(env: Mapping[str, str] = os.environ) -> Path:
    """Absolute: the image's `ddl.base` label and Apptainer's binds name it as it is."""
    if env.get("DDL_TEST_CACHE"):
        return Path(env["DDL_TEST_CACHE"]).expanduser().resolve()
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return (Path(xdg) / "ddl").resolve()


def file_key(path: Path) -> str:
    """The entry key of what `path` holds (its bytes only: not its name or time)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:KEY_CHARS]


def entry(root: Path, kind: str, made_from: Path) -> Path:
    """The cache entry of `kind` (apptainer, wheelhouse) made from the file `made_from`."""
    return root / f"{kind}-{file_key(made_from)}"


@contextlib.contextmanager
def held(path: Path) -> Iterator[Path]:
    """`path` with its sibling PATH.lock held exclusively (blocking) while in the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def apt_turn(env: Mapping[str, str] = os.environ) -> contextlib.AbstractContextManager[Path]:
    """Held while a fixture runs something that may call apt-get (../shared/tools' local-slurm
    and provide-apptainer on a fresh machine, the Chromium install). Two of them at once
    failed on a fresh machine: the second apt-get found the package lists locked and the
    shared tools do not wait for it ("Could not get lock /var/lib/apt/lists/lock", exit
    100). Machine-wide, as apt's own lock is."""
    return held(cache_root(env) / "apt-get")


def prune_other_wheelhouses(keep: Path) -> list[Path]:
    """Remove the wheelhouse entries of other locks (GBs each) that nobody holds now;
    returns those removed. Apptainer entries stay: a running session uses its runtime and
    base until its end, while a wheelhouse is only read at the start of a build."""
    removed = []
    for other in sorted(keep.parent.glob("wheelhouse-*")):
        if other == keep or not other.is_dir():
            continue
        with open(other.with_name(other.name + ".lock"), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # another session is copying from it
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed
