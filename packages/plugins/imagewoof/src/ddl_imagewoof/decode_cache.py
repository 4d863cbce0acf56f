"""The Imagewoof JPEGs decoded once into a uint8 array file, so training never waits on JPEG
decoding (measured on an H100 before: 47 % of the course's epoch spent waiting for data).

One cache per split folder and canvas size R, a directory
``<cache_dir>/<split>-<R>px-<key>/`` holding

  * ``images.npy`` - uint8 ``[N, R, R, 3]``, image i of ImageFolder's sorted order, resized
    (aspect ratio ignored) to R x R, memory-mapped when read;
  * ``dims.npy``   - int32 ``[N, 2]``, each image's original (height, width): crops are
    drawn in the original's coordinates and mapped onto the canvas
    (:mod:`ddl_imagewoof.crops`), so the squashing changes resolution, not geometry;
  * ``meta.json``  - the key, the count and the size, checked before the arrays are trusted.

The key hashes R, the format version and every source file's relative name, size and
modification time: a changed, added or removed JPEG (a new download, a regenerated
synthetic set) gives a new key and a new cache; caches of other keys for the same split and
size are deleted when the new one is in place.

A build writes into a temporary sibling and renames it into place, so a killed build never
leaves a cache that looks complete. Ranks racing to build take an ``flock`` on a lock file
beside it: the first decodes (with a thread per core - PIL releases the GIL while it decodes
and resizes), the others wait on the lock and then open what it wrote. Where the file system
has no working flock every rank builds its own temporary copy and the first rename wins,
which is slower but still safe. No torch here: numpy and PIL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = 1  # bump when the layout or the resizing changes: old caches stop matching
MAX_THREADS = 16


@dataclass(frozen=True)
class Decoded:
    """An opened cache: ``images`` (memory-mapped, read-only) and ``dims``."""

    path: Path
    images: np.ndarray
    dims: np.ndarray


def source_key(files: list[Path], top: Path, size: int) -> str:
    """Hex digest of the canvas size and every file's name (relative to ``top``), size and
    mtime: what decides whether a cache still shows these files."""
    digest = hashlib.sha256(f"imagewoof-decode-cache {FORMAT} {size}\n".encode())
    for path in files:
        st = path.stat()
        digest.update(f"{path.relative_to(top)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def decode(path: Path, size: int) -> tuple[np.ndarray, tuple[int, int]]:
    """One JPEG as a uint8 ``[size, size, 3]`` RGB array, and its original (height, width).

    PIL's ``draft`` lets the JPEG decoder scale down by a power of two while it decodes,
    never below the canvas; the resize is PIL's antialiased bilinear filter, the one
    torchvision's transforms use on PIL images."""
    from PIL import Image

    with Image.open(path) as im:
        width, height = im.size
        im.draft("RGB", (size, size))
        rgb = im.convert("RGB").resize((size, size), Image.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8), (height, width)


def _valid(path: Path, key: str, n: int, size: int) -> bool:
    """Whether ``path`` holds a complete cache for ``key``: meta matches, and both arrays
    have the expected header and exactly the bytes their header promises (a truncated or
    overwritten file fails here instead of feeding garbage to training)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        if meta != {"key": key, "count": n, "size": size, "format": FORMAT}:
            return False
        for name, shape, dtype in (("images.npy", (n, size, size, 3), np.uint8),
                                   ("dims.npy", (n, 2), np.int32)):
            array = np.load(path / name, mmap_mode="r")
            if array.shape != shape or array.dtype != dtype:
                return False
            if (path / name).stat().st_size != array.offset + array.nbytes:
                return False
    except (OSError, ValueError, TypeError, json.JSONDecodeError):
        return False
    return True


def _open(path: Path) -> Decoded:
    return Decoded(path, np.load(path / "images.npy", mmap_mode="r"),
                   np.load(path / "dims.npy"))


def _threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def _build(tmp: Path, files: list[Path], size: int, key: str) -> None:
    tmp.mkdir(parents=True)
    images = np.lib.format.open_memmap(tmp / "images.npy", mode="w+", dtype=np.uint8,
                                       shape=(len(files), size, size, 3))
    dims = np.zeros((len(files), 2), dtype=np.int32)

    def one(i: int) -> None:
        images[i], dims[i] = decode(files[i], size)

    with ThreadPoolExecutor(_threads()) as pool:
        list(pool.map(one, range(len(files))))  # list(): re-raises a worker's error
    images.flush()
    del images
    np.save(tmp / "dims.npy", dims)
    for name in ("images.npy", "dims.npy"):
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())
    (tmp / "meta.json").write_text(json.dumps({"key": key, "count": len(files), "size": size,
                                               "format": FORMAT}))


@contextlib.contextmanager
def _locked(lock: Path):
    """An exclusive flock on ``lock``; yields whether it is held (False where the file
    system refuses flock: callers must then be safe without it)."""
    import fcntl

    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def open_or_build(files: list[Path], top: Path, split: str, size: int,
                  cache_dir: Path) -> Decoded:
    """The cache of ``files`` (ImageFolder's order, under ``top``) at canvas ``size`` in
    ``cache_dir``, built first if it is missing, stale or damaged. OSError if
    ``cache_dir`` cannot be written."""
    key = source_key(files, top, size)
    stem = f"{split}-{size}px-"
    final = cache_dir / f"{stem}{key}"
    if _valid(final, key, len(files), size):
        return _open(final)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / f".{stem}lock") as exclusive:
        if _valid(final, key, len(files), size):  # another rank built it while we waited
            return _open(final)
        if exclusive:  # nobody else is building: leftovers of killed builds can go
            for old in cache_dir.glob(f".{stem}*.tmp"):
                shutil.rmtree(old, ignore_errors=True)
        tmp = cache_dir / f".{final.name}.{os.getpid()}.tmp"
        try:
            _build(tmp, files, size, key)
            if final.exists():  # damaged (it failed the check above): replace it
                shutil.rmtree(final)
            try:
                tmp.rename(final)
            except OSError:
                if not _valid(final, key, len(files), size):  # not a lost race: a failure
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if exclusive:  # caches of older versions of these files
            for old in cache_dir.glob(f"{stem}*"):
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
    return _open(final)
