"""CIFAR-10 on disk, in exactly the layout `torchvision.datasets.CIFAR10(root=data_dir)` reads.

The official "python version" (https://www.cs.toronto.edu/~kriz/cifar.html) unpacks to
``<root>/cifar-10-batches-py/`` holding ``data_batch_1`` .. ``data_batch_5`` (10000 images
each), ``test_batch`` and ``batches.meta``. Each batch is a Python 2 pickle (protocol 2) of a
dict: ``data`` a uint8 numpy array [N, 3072] (per row the 1024 red, then green, then blue
values of a 32x32 image, row-major), ``labels`` a list of N ints 0..9, ``batch_label`` and
``filenames``; ``batches.meta`` holds ``label_names``. Python 2 strings are why readers pass
an encoding: torchvision uses ``encoding="latin1"`` (keys become ``'data'``), the CIFAR page's
snippet ``encoding="bytes"`` (keys ``b'data'``).

torchvision checks the md5 of every batch file each time a CIFAR10 object is built
(``_check_integrity``) and raises ``RuntimeError("Dataset not found or corrupted...")`` on a
mismatch; there is no switch to turn that off. Generated data cannot have the official md5s,
so a synthetic set carries its own md5 manifest (``synthetic.md5``, md5sum format, next to the
``SYNTHETIC.txt`` marker) and :mod:`ddl_cifar.dataset` reads it with a subclass of CIFAR10 that
checks those sums instead: synthetic files keep exactly the integrity check real ones get,
and real data is always read by torchvision's own class against the official sums.

Two things live here, without importing torch (the workload's ``data_module``):
  * `check_files` - the same md5 checks up front, so a job fails in well under a second with
    one line naming the file instead of torchvision's generic RuntimeError in every rank;
  * `download` - the real data via torchvision (official tarball, md5-checked), login nodes.
The learnable generated set of 10 shape classes is :mod:`ddl_cifar.synthetic`.

Both writers build the new directory in a temporary sibling and rename it into place
(`ddl.contract.datafiles`), so an interrupted run never leaves half a data set behind.
"""

from __future__ import annotations

import functools
import pickle
import shutil
from pathlib import Path

from ddl.contract import datafiles
from ddl.contract.errors import DataError, DataMissing, DdlError

BASE_FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
ALL_FILES = (*TRAIN_FILES, TEST_FILE, META_FILE)

# The md5 sums torchvision's CIFAR10 checks (torchvision/datasets/cifar.py; a unit test keeps
# this copy equal to the installed torchvision's). Kept here so checking needs no torch.
OFFICIAL_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}
TARBALL_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TARBALL_MD5 = "c58f30108f718f92721af3b95e74349a"

MARKER = datafiles.MARKER
MANIFEST = "synthetic.md5"
SIDE = 32
REAL_LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                    "ship", "truck"]
SYNTHETIC_LABEL_NAMES = ["disk", "square", "triangle", "ring", "plus", "horizontal-stripes",
                         "vertical-stripes", "checkerboard", "frame", "star"]

# Per-socket-operation timeout while downloading; without it a firewall that drops packets
# makes urllib wait for minutes.
_DOWNLOAD_TIMEOUT_S = 20.0


def cifar_dir(data_dir: Path) -> Path:
    """The directory torchvision's CIFAR10 reads under `data_dir`."""
    return Path(data_dir) / BASE_FOLDER


def fix_hint(data_dir: Path) -> str:
    return datafiles.prepare_hint("cifar", data_dir)


def is_synthetic(data_dir: Path) -> bool:
    return datafiles.is_synthetic(cifar_dir(data_dir))


def read_manifest(data_dir: Path) -> dict[str, str]:
    """The md5 sums a synthetic set was written with (DataError if unusable)."""
    path = cifar_dir(data_dir) / MANIFEST
    try:
        text = path.read_bytes().decode("ascii")  # md5sum lines: hex digits and file names
    except OSError as e:
        raise DataError(f"cannot read {path} (the synthetic set's md5 list): "
                        f"{e.strerror or e}; {fix_hint(data_dir)}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"corrupt file {path}: byte {e.object[e.start]:#04x} at offset "
                        f"{e.start} is not text (an md5 list holds ASCII lines); "
                        f"{fix_hint(data_dir)}") from None
    sums = datafiles.parse_md5_manifest(text)
    missing = [name for name in ALL_FILES if name not in sums]
    if missing:
        raise DataError(f"corrupt file {path}: no md5 for {missing[0]}; {fix_hint(data_dir)}")
    return sums


def expected_md5(data_dir: Path) -> dict[str, str]:
    return read_manifest(data_dir) if is_synthetic(data_dir) else dict(OFFICIAL_MD5)


# ---------------------------------------------------------------------------
# Reading batches: a pickle that can build only what the format holds
# ---------------------------------------------------------------------------
#
# A pickle may name any importable function and call it while it loads (os.system, open).
# torchvision reads CIFAR batches with a plain pickle.load, and for a synthetic set the md5
# list sits beside the data, so whoever can write the data directory could run code in
# every rank. The official files (and ddl's synthetic ones) hold a dict of str/bytes keys,
# lists of ints and of str/bytes, ints, and numpy arrays, which pickle rebuilds through three
# globals: numpy's array reconstructor (under its classic name numpy.core.multiarray, or
# numpy._core.multiarray as numpy 2 writes it), numpy.ndarray and numpy.dtype; a batch
# re-pickled by Python 3 at protocol 2 also spells its bytes as _codecs.encode(text,
# "latin1"). Nothing else is admitted, and the result must have the format's shape.

ALLOWED_CONTENT = "dict, list, str, bytes, int and numpy arrays"


@functools.cache
def _globals() -> dict[tuple[str, str], object]:
    import _codecs

    import numpy as np

    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's own, under either name
    return {("_codecs", "encode"): _codecs.encode,
            ("numpy.core.multiarray", "_reconstruct"): reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): reconstruct,
            ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}


class _Refused(Exception):
    """A global the format does not hold (nothing was called)."""


class BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR-10 batch, refusing every global but numpy's array pieces."""

    def find_class(self, module: str, name: str):
        found = _globals().get((module, name))
        if found is None:
            raise _Refused(f"{module}.{name}"[:80])
        return found


def _unpickle(path: Path, data_dir: Path) -> dict:
    try:
        with open(path, "rb") as f:
            entry = BatchUnpickler(f, encoding="latin1").load()  # torchvision's encoding
    except _Refused as e:
        raise DataError(f"corrupt file {path}: its pickle asks for {e}, which a CIFAR-10 "
                        f"batch does not hold (nothing was run); allowed: {ALLOWED_CONTENT}; "
                        f"{fix_hint(data_dir)}") from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}; {fix_hint(data_dir)}") \
            from None
    except Exception as e:  # UnpicklingError, EOFError, a bad array state, ...
        raise DataError(f"corrupt file {path}: not a CIFAR-10 batch "
                        f"({type(e).__name__}: {str(e)[:80]}); {fix_hint(data_dir)}") from None
    if not isinstance(entry, dict):
        raise DataError(f"corrupt file {path}: holds a {type(entry).__name__}, not the dict "
                        f"of a CIFAR-10 batch; {fix_hint(data_dir)}")
    return entry


def load_batch(path: Path, data_dir: Path) -> tuple:
    """(rows, labels) of one batch file: uint8 [N, 3072] and N ints 0..9 (DataError, one
    line naming the file, for anything else)."""
    import numpy as np

    entry = _unpickle(path, data_dir)
    rows, labels = entry.get("data"), entry.get("labels")
    if not (isinstance(rows, np.ndarray) and rows.dtype == np.uint8 and rows.ndim == 2
            and rows.shape[1] == 3 * SIDE * SIDE):
        raise DataError(f"corrupt file {path}: 'data' is not a uint8 array of "
                        f"{3 * SIDE * SIDE} columns; {fix_hint(data_dir)}")
    if not (isinstance(labels, list) and len(labels) == len(rows)
            and all(type(v) is int and 0 <= v < 10 for v in labels)):
        raise DataError(f"corrupt file {path}: 'labels' is not a list of {len(rows)} "
                        f"ints 0..9; {fix_hint(data_dir)}")
    return rows, labels


def load_label_names(path: Path, data_dir: Path) -> list[str]:
    """``label_names`` of batches.meta: ten names."""
    names = _unpickle(path, data_dir).get("label_names")
    if not (isinstance(names, list) and len(names) == 10
            and all(isinstance(n, str) for n in names)):
        raise DataError(f"corrupt file {path}: 'label_names' is not a list of 10 names; "
                        f"{fix_hint(data_dir)}")
    return names


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def check_files(data_dir: Path) -> None:
    """Validate the CIFAR-10 files under `data_dir` as torchvision will, without torch.

    Raises DataMissing if there is no CIFAR-10 directory at all and DataError (one line
    naming the file) if a file is missing or its md5 differs from the official sum (or, for
    a synthetic set, from its manifest). The md5 pass over the real set (~180 MB) takes
    about half a second.
    """
    data_dir = Path(data_dir)
    base = cifar_dir(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"data directory {data_dir} does not exist; {fix_hint(data_dir)}")
    if not base.is_dir():
        raise DataMissing(f"no CIFAR-10 data in {data_dir} (expected {base}/); "
                          f"{fix_hint(data_dir)}")
    sums = expected_md5(data_dir)
    source = "its synthetic.md5 entry" if is_synthetic(data_dir) else "the official md5"
    for name in ALL_FILES:
        path = base / name
        if not path.is_file():
            raise DataError(f"missing file {path} (the CIFAR-10 data is incomplete); "
                            f"{fix_hint(data_dir)}")
        try:
            found = datafiles.md5_of(path)
        except OSError as e:
            raise DataError(f"cannot read {path}: {e.strerror or e}; {fix_hint(data_dir)}") \
                from None
        if found != sums[name]:
            raise DataError(f"corrupt file {path}: md5 {found} differs from {source} "
                            f"{sums[name]}; {fix_hint(data_dir)}")


# ---------------------------------------------------------------------------
# Real download
# ---------------------------------------------------------------------------

def download(data_dir: Path) -> Path:
    """Download the real CIFAR-10 with torchvision; return the cifar-10-batches-py dir.

    torchvision fetches the official tarball, checks its md5 (c58f3010...), extracts it and
    checks every batch file's md5. Safe to re-run: valid real data is left alone, and the
    tarball is kept in ``<data_dir>/.cifar-10-download/`` until the data is installed, so a
    run interrupted after the 163 MB download does not fetch it again (torchvision skips a
    present file whose md5 is right). A failed download leaves a previous (e.g. synthetic)
    set intact; a successful one replaces it. Network failures become one-line DdlErrors.
    """
    data_dir = Path(data_dir)
    target = cifar_dir(data_dir)
    if target.is_dir() and not is_synthetic(data_dir):
        try:
            check_files(data_dir)
        except DataError:
            pass
        else:
            print(f"CIFAR-10 already present in {target}; skipping download")
            return target
    datafiles.make_data_dir(data_dir)

    from http.client import HTTPException

    # slow import, only needed here; the archive alone: CIFAR10(download=True) would also
    # unpickle the batches with a plain pickle.load (they are read by load_batch instead)
    from torchvision.datasets.utils import download_and_extract_archive

    # A fixed name, not a scratch directory: the tarball in it survives an interrupted run.
    staging = data_dir / ".cifar-10-download"
    done = False
    try:
        if (staging / BASE_FOLDER).exists():  # a half-extracted earlier attempt
            shutil.rmtree(staging / BASE_FOLDER)
        with datafiles.quiet_download(_DOWNLOAD_TIMEOUT_S):
            download_and_extract_archive(TARBALL_URL, str(staging),
                                         filename="cifar-10-python.tar.gz", md5=TARBALL_MD5)
        check_files(staging)
        datafiles.install(cifar_dir(staging), target)
        done = True
    except DataError as e:  # without the hint: it would name the staging directory
        raise DdlError(f"downloaded CIFAR-10 failed validation: {datafiles.without_hint(e)}") \
            from None
    except (OSError, RuntimeError, HTTPException, EOFError) as e:  # RuntimeError: bad md5
        raise datafiles.download_failure(e, data_dir, dataset="CIFAR-10", source=TARBALL_URL,
                                         plugin="cifar") from None
    finally:
        tarball = staging / "cifar-10-python.tar.gz"
        if done or not tarball.exists():
            shutil.rmtree(staging, ignore_errors=True)
    print(f"CIFAR-10: {len(TRAIN_FILES)} training batches and {TEST_FILE} in {target}")
    return target

