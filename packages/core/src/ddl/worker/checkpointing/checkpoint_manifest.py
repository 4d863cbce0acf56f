"""A checkpoint's manifest: every file's relative path, size and sha256, written last.

``manifest.json`` is written into the ``.step-N.partial`` directory after every rank's files
are on disk and before the directory is renamed into place, so a checkpoint that has one was
finished by ddl. A checkpoint *verifies* when the manifest parses, every listed path is a
plain file name inside the checkpoint, every listed file exists with that size and checksum,
and no other file is present (an unlisted file would be read unverified).

What this protects against: truncation, flipped bits, a file swapped in from another
checkpoint, a half-copied directory. Not against someone who may write the checkpoint: they
can rewrite the manifest too; ``ddl.worker.checkpointing.safe_load`` makes such a checkpoint unable
to run
code all the same.

Hashing is shared among the ranks: file ``i`` of the sorted list is hashed by rank
``i % world_size`` (when saving and when verifying), so the cost per rank shrinks as ranks
are added. Measured costs are in docs/checkpoints.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
_CHUNK = 1 << 22
_MAX_MANIFEST_BYTES = 1 << 24  # a manifest lists files, it is never this large


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_names(directory: Path) -> list[str]:
    """The files a manifest of ``directory`` lists: every regular file but the manifest."""
    return sorted(p.name for p in Path(directory).iterdir()
                  if p.name != MANIFEST and p.is_file() and not p.is_symlink())


def my_share(names: list[str], rank: int, world_size: int) -> list[str]:
    return sorted(names)[rank::world_size]


def entries(directory: Path, names: list[str]) -> list[dict[str, Any]]:
    """Path, size and sha256 of each named file of ``directory``."""
    return [{"path": name, "size": (Path(directory) / name).stat().st_size,
             "sha256": sha256(Path(directory) / name)} for name in names]


def write(directory: Path, listed: list[dict[str, Any]]) -> None:
    """Write the manifest (fsynced); ``listed`` must cover every file of ``directory``."""
    body = json.dumps({"format": 1, "files": sorted(listed, key=lambda e: e["path"])},
                      indent=1).encode()
    with open(Path(directory) / MANIFEST, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())


def read(directory: Path) -> dict[str, dict[str, Any]]:
    """The manifest's entries by path; ValueError (one line) when absent or malformed."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ValueError(f"it has no {MANIFEST} (written by an older ddl, or not finished)")
    if path.stat().st_size > _MAX_MANIFEST_BYTES:
        raise ValueError(f"{MANIFEST} is {path.stat().st_size} bytes, not a manifest")
    try:
        files = json.loads(path.read_bytes())["files"]
        listed = {e["path"]: {"size": int(e["size"]), "sha256": str(e["sha256"])}
                  for e in files}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{MANIFEST} is malformed ({type(exc).__name__})") from None
    for name in listed:
        if not _plain_name(name):
            raise ValueError(f"{MANIFEST} lists {name!r}, which is not a file of the "
                             "checkpoint directory")
    return listed


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name \
        and "\0" not in name


def problem(directory: Path, rank: int = 0, world_size: int = 1) -> str | None:
    """Why ``directory`` does not verify, or None. Sizes and the file list are checked on
    every rank; checksums only of this rank's share (all of them when world_size is 1)."""
    directory = Path(directory)
    try:
        listed = read(directory)
    except ValueError as exc:
        return str(exc)
    except OSError as exc:
        return f"{MANIFEST} is unreadable ({exc.strerror})"
    present = {p.name for p in directory.iterdir()} - {MANIFEST}  # links, dirs too
    unlisted = sorted(present - set(listed))
    if unlisted:
        return f"{unlisted[0]} is not in {MANIFEST}"
    for name, want in sorted(listed.items()):
        path = directory / name
        if not path.is_file() or path.is_symlink():
            return f"{name} is missing (or not a regular file)"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{name} is {size} bytes, the manifest says {want['size']}"
    for name in my_share(list(listed), rank, world_size):
        if sha256(directory / name) != listed[name]["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None
