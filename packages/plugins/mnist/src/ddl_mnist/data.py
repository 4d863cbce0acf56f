"""MNIST on disk, in exactly the layout `torchvision.datasets.MNIST(root=data_dir)` reads.

torchvision looks for the four uncompressed idx files in `<root>/MNIST/raw/` and checks
only that they exist (the md5 sums are checked on the downloaded .gz files, never on
the extracted ones). So a generated stand-in written in the same format is read
transparently, which is what lets compute nodes without internet run the workload.

Two things live here (the workload's ``data_module``):
  * `check_files` - validates the files without torch, so a job fails in milliseconds
    with one clear line instead of an assertion deep inside torchvision.
  * `download` - the real data via torchvision, for login nodes.
The learnable generated digit set for machines that cannot reach the MNIST mirrors is
:mod:`ddl_mnist.synthetic`.

Both writers build the new `MNIST/` directory in a temporary sibling and rename it into
place (`ddl.contract.datafiles`), so an interrupted run never leaves half a data set behind.

Only the standard library, numpy and PIL are imported at module level: importing torch
costs seconds and most callers (validation, the CLI) never need it.
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import numpy as np

from ddl.contract import datafiles
from ddl.contract.errors import DataError, DataMissing, DdlError

# split -> (images file, labels file); the names torchvision's MNIST._load_data builds.
RAW_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

MARKER = datafiles.MARKER
SIDE = 28  # MNIST images are 28x28

# idx magic numbers: 0x00, 0x00, dtype code (0x08 = uint8), number of dimensions.
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801

# Per-socket-operation timeout while downloading. Without it, a firewall that silently
# drops packets makes each of torchvision's mirror attempts hang for minutes.
_DOWNLOAD_TIMEOUT_S = 20.0


def mnist_dir(data_dir: Path) -> Path:
    """The directory torchvision's MNIST class owns under `data_dir`."""
    return Path(data_dir) / "MNIST"


def _raw_dir(data_dir: Path) -> Path:
    return mnist_dir(data_dir) / "raw"


def _fix_hint(data_dir: Path) -> str:
    return datafiles.prepare_hint("mnist", data_dir)


def is_synthetic(data_dir: Path) -> bool:
    """True if the MNIST directory under `data_dir` holds a generated stand-in."""
    return datafiles.is_synthetic(mnist_dir(data_dir))


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def _read_header(path: Path, magic: int, ndim: int, data_dir: Path) -> tuple[list[int], int]:
    """Return (dims, file size) of an idx file, or raise DataError naming what is wrong."""

    def corrupt(what: str) -> DataError:
        return DataError(f"corrupt file {path}: {what}; {_fix_hint(data_dir)}")

    header_len = 4 * (ndim + 1)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(header_len)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}; {_fix_hint(data_dir)}") from None
    if len(head) < 4:
        raise corrupt(f"only {size} bytes, too short for an idx header")
    (found,) = struct.unpack(">I", head[:4])
    if found != magic:
        kind = "uint8 3-D images" if magic == IMAGES_MAGIC else "uint8 1-D labels"
        raise corrupt(f"magic number 0x{found:08x}, expected 0x{magic:08x} (idx {kind})")
    if len(head) < header_len:
        raise corrupt(f"only {size} bytes, too short for an idx header")
    dims = list(struct.unpack(f">{ndim}I", head[4:]))
    expected = header_len + math.prod(dims)
    if size != expected:
        shape = "x".join(str(d) for d in dims)
        raise corrupt(
            f"{size} bytes, but its header ({shape}) says {expected} bytes"
            + (" (truncated?)" if size < expected else "")
        )
    return dims, size


def check_files(data_dir: Path) -> None:
    """Validate the MNIST raw files under `data_dir` without importing torch.

    Raises DataMissing if there is no MNIST folder at all, else DataError with one line
    naming the file and the problem. Labels are read in full (60 kB); images only have
    their header and size checked, which catches truncation, the common failure of
    interrupted copies.
    """
    data_dir = Path(data_dir)
    if not mnist_dir(data_dir).exists():
        raise DataMissing(
            f"no MNIST data in {data_dir} (expected {mnist_dir(data_dir)}/raw); run "
            f"`ddl prepare --plugin mnist --data-dir {data_dir}` on a login node (or add "
            "--synthetic for generated data)")
    if not data_dir.exists():
        raise DataError(f"data directory {data_dir} does not exist; {_fix_hint(data_dir)}")
    if not data_dir.is_dir():
        raise DataError(f"data directory {data_dir} is not a directory; {_fix_hint(data_dir)}")
    raw = _raw_dir(data_dir)
    paths = [raw / name for pair in RAW_FILES.values() for name in pair]
    present = [p.is_file() for p in paths]
    if not any(present):
        raise DataError(
            f"{data_dir} holds no MNIST data (expected {raw}/{RAW_FILES['train'][0]} and "
            f"the other idx files); {_fix_hint(data_dir)}"
        )
    for path, ok in zip(paths, present):
        if not ok:
            raise DataError(
                f"missing file {path} (the MNIST data is incomplete); {_fix_hint(data_dir)}"
            )

    for split, (images_name, labels_name) in RAW_FILES.items():
        images_path, labels_path = raw / images_name, raw / labels_name
        (n_images, rows, cols), _ = _read_header(images_path, IMAGES_MAGIC, 3, data_dir)
        if (rows, cols) != (SIDE, SIDE):
            raise DataError(
                f"corrupt file {images_path}: images are {rows}x{cols}, expected {SIDE}x{SIDE}; "
                f"{_fix_hint(data_dir)}"
            )
        if n_images == 0:
            raise DataError(
                f"corrupt file {images_path}: it holds no images; {_fix_hint(data_dir)}"
            )
        (n_labels,), _ = _read_header(labels_path, LABELS_MAGIC, 1, data_dir)
        labels = np.fromfile(labels_path, dtype=np.uint8, offset=8)
        bad = np.flatnonzero(labels > 9)
        if bad.size:
            raise DataError(
                f"corrupt file {labels_path}: label {int(labels[bad[0]])} at index {int(bad[0])} "
                f"is outside 0..9; {_fix_hint(data_dir)}"
            )
        if n_labels != n_images:
            raise DataError(
                f"corrupt file {labels_path}: {n_labels} labels but {images_path.name} has "
                f"{n_images} images; {_fix_hint(data_dir)}"
            )


def _count_images(data_dir: Path, split: str) -> int:
    with open(_raw_dir(data_dir) / RAW_FILES[split][0], "rb") as f:
        return struct.unpack(">4I", f.read(16))[1]


# ---------------------------------------------------------------------------
# Real download
# ---------------------------------------------------------------------------

def _short_reason(exc: BaseException) -> str:
    """One short phrase for why the download failed, e.g. 'Name or service not known'."""
    # torchvision folds every mirror's error into one multi-line RuntimeError:
    # "Error downloading X:\nTried <mirror>, got:\n<error>\nTried ..."
    reasons = re.findall(r"got:\n(.*)", str(exc))
    if not reasons:
        return datafiles.short_reason(exc)
    reasons = [re.sub(r"^<urlopen error (.*)>$", r"\1", r) for r in reasons]
    return datafiles.first_line("; ".join(dict.fromkeys(reasons)))


def download(data_dir: Path) -> Path:
    """Download the real MNIST via torchvision (its mirrors and md5 checks); return the MNIST dir.

    Safe to re-run: valid real data is left alone. The download goes into a temporary
    sibling and is moved into place only when complete, so a failed download leaves a
    previous (e.g. synthetic) set intact, and a successful one replaces it. Network
    failures become a single-line DdlError.
    """
    data_dir = Path(data_dir)
    target = mnist_dir(data_dir)
    if not is_synthetic(data_dir):
        try:
            check_files(data_dir)
        except DataError:
            pass
        else:
            print(f"MNIST already present in {target}; skipping download")
            return target
    datafiles.make_data_dir(data_dir)

    from http.client import HTTPException

    from torchvision.datasets import MNIST  # slow import, only needed here

    try:
        with datafiles.scratch_dir(target, "download") as tmp:
            with datafiles.quiet_download(_DOWNLOAD_TIMEOUT_S):
                for train in (True, False):
                    MNIST(root=tmp, train=train, download=True)
            check_files(tmp)
            datafiles.install(mnist_dir(tmp), target)
    except DataError as e:  # without the hint: it would name the scratch directory
        raise DdlError(f"downloaded MNIST failed validation: {datafiles.without_hint(e)}") \
            from None
    except (OSError, RuntimeError, HTTPException, EOFError) as e:  # RuntimeError: no mirror
        raise datafiles.download_failure(e, data_dir, dataset="MNIST", source="the MNIST mirrors",
                                         plugin="mnist", reason=_short_reason) from None

    for split in RAW_FILES:
        print(f"MNIST {split}: {_count_images(data_dir, split)} images in {_raw_dir(data_dir)}")
    return target

