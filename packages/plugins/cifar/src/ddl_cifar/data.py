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

Three things live here, without importing torch:
  * `check_files` - the same md5 checks up front, so a job fails in well under a second with
    one line naming the file instead of torchvision's generic RuntimeError in every rank;
  * `write_synthetic` - a learnable generated set of 10 shape classes (see `_render`);
  * `download` - the real data via torchvision (official tarball, md5-checked), login nodes.

Both writers build the new directory in a temporary sibling and rename it into place
(`ddl.contract.datafiles`), so an interrupted run never leaves half a data set behind.
"""

from __future__ import annotations

import io
import math
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

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
        text = path.read_text()
    except OSError as e:
        raise DataError(f"cannot read {path} (the synthetic set's md5 list): "
                        f"{e.strerror or e}; {fix_hint(data_dir)}") from None
    sums = datafiles.parse_md5_manifest(text)
    missing = [name for name in ALL_FILES if name not in sums]
    if missing:
        raise DataError(f"corrupt file {path}: no md5 for {missing[0]}; {fix_hint(data_dir)}")
    return sums


def expected_md5(data_dir: Path) -> dict[str, str]:
    return read_manifest(data_dir) if is_synthetic(data_dir) else dict(OFFICIAL_MD5)


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
# Writing batches in the official pickle format
# ---------------------------------------------------------------------------


class _Py2Pickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table is open
    """Protocol-2 pickles as Python 2's cPickle wrote the official files.

    Python 3 pickles ``bytes`` as ``_codecs.encode(...)`` calls, which load as bytes under
    any encoding; Python 2 ``str`` (SHORT_BINSTRING/BINSTRING) load as ``str`` under
    ``encoding="latin1"`` (torchvision) and as bytes under ``encoding="bytes"`` (the CIFAR
    page). Writing keys, names and the array buffer as BINSTRING makes both readers see what
    they see in the official files. numpy's array reconstructor is written under its classic
    name ``numpy.core.multiarray``, as in the official files (numpy 2 calls it numpy._core).
    """

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str

    def save_global(self, obj, name=None):
        if getattr(obj, "__name__", None) == "_reconstruct" and "numpy" in (obj.__module__ or ""):
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)


def _py2_pickle(obj) -> bytes:
    buffer = io.BytesIO()
    _Py2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


def _batch_blob(images: np.ndarray, labels: np.ndarray, label: str, names: list[str]) -> bytes:
    """One batch file: images [N, 32, 32, 3] uint8 (HWC) -> rows of R, G, B planes."""
    rows = np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), 3 * SIDE * SIDE))
    return _py2_pickle({
        b"batch_label": label.encode(),
        b"labels": [int(v) for v in labels],
        b"data": rows,
        b"filenames": [n.encode() for n in names],
    })


def _meta_blob(per_batch: int, label_names: list[str]) -> bytes:
    return _py2_pickle({b"num_cases_per_batch": per_batch,
                        b"label_names": [n.encode() for n in label_names],
                        b"num_vis": 3 * SIDE * SIDE})


# ---------------------------------------------------------------------------
# Synthetic images: ten shape classes in random colours
# ---------------------------------------------------------------------------
#
# A class is a shape; everything else is random and independent of the class: foreground
# and background colours (so the mean colour of an image says nothing about its class),
# a background gradient, position, size, aspect, a small rotation, blur-free antialiasing
# and pixel noise. Rotation stays within +-15 degrees so that the stripe classes (horizontal
# vs vertical) and square vs frame-less shapes stay distinct. A CNN has to find edges and
# their arrangement, as on real CIFAR-10; a linear model on the mean colour stays at chance.

_SCALE = 4  # draw at 4x, then box-downsample: cheap antialiasing
_ROTATE = 15.0
_SIZE_RANGE = (0.6, 0.95)  # shape extent relative to the image side
_ASPECT_RANGE = (0.8, 1.25)
_NOISE_RANGE = (0.0, 8.0)  # per-image Gaussian noise sigma (0..255 scale)


def _polygon(points, cx, cy, rx, ry, angle):
    """Unit-box points (-1..1) -> rotated, scaled canvas coordinates."""
    cos, sin = math.cos(angle), math.sin(angle)
    return [(cx + (x * rx) * cos - (y * ry) * sin, cy + (x * rx) * sin + (y * ry) * cos)
            for x, y in points]


def _rect(x0, y0, x1, y1):
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _shape_polygons(label: int, rng: np.random.Generator) -> tuple[list, list]:
    """(filled polygons, holes) in the unit box for a class; holes are drawn in background."""
    if label == 0:  # disk
        circle = [(math.cos(t), math.sin(t)) for t in np.linspace(0, 2 * math.pi, 48, False)]
        return [circle], []
    if label == 1:  # square
        return [_rect(-0.8, -0.8, 0.8, 0.8)], []
    if label == 2:  # triangle, pointing up
        return [[(0.0, -0.95), (0.95, 0.8), (-0.95, 0.8)]], []
    if label == 3:  # ring
        inner = rng.uniform(0.45, 0.65)
        circle = [(math.cos(t), math.sin(t)) for t in np.linspace(0, 2 * math.pi, 48, False)]
        return [circle], [[(inner * x, inner * y) for x, y in circle]]
    if label == 4:  # plus
        w = rng.uniform(0.22, 0.34)
        return [_rect(-w, -1, w, 1), _rect(-1, -w, 1, w)], []
    if label in (5, 6):  # three or four stripes, horizontal or vertical
        n = int(rng.integers(3, 5))
        edges = np.linspace(-1, 1, 2 * n)
        bars = [_rect(-1, edges[2 * i], 1, edges[2 * i + 1]) for i in range(n)]
        if label == 6:
            bars = [[(y, x) for x, y in bar] for bar in bars]
        return bars, []
    if label == 7:  # checkerboard, 3x3 or 4x4 cells
        n = int(rng.integers(3, 5))
        edges = np.linspace(-1, 1, n + 1)
        return [_rect(edges[i], edges[j], edges[i + 1], edges[j + 1])
                for i in range(n) for j in range(n) if (i + j) % 2 == 0], []
    if label == 8:  # square frame
        w = rng.uniform(0.5, 0.65)
        return [_rect(-0.9, -0.9, 0.9, 0.9)], [_rect(-w, -w, w, w)]
    # 9: five-pointed star
    inner = rng.uniform(0.38, 0.5)
    pts = []
    for k in range(10):
        r = 1.0 if k % 2 == 0 else inner
        t = -math.pi / 2 + k * math.pi / 5
        pts.append((r * math.cos(t), r * math.sin(t)))
    return [pts], []


def _random_colour(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 255, size=3)


def _render(label: int, rng: np.random.Generator) -> np.ndarray:
    """One 32x32x3 float image (0..255) of class `label`."""
    big = SIDE * _SCALE
    bg = _random_colour(rng)
    fg = _random_colour(rng)
    while np.linalg.norm(fg - bg) < 90:  # keep the shape visible
        fg = _random_colour(rng)
    # background: a linear gradient from bg towards a second colour
    bg2 = np.clip(bg + rng.normal(0, 40, size=3), 0, 255)
    direction = rng.normal(size=2)
    direction /= np.linalg.norm(direction)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE] / (SIDE - 1) - 0.5
    t = np.clip(0.5 + xx * direction[0] + yy * direction[1], 0, 1)[..., None]
    background = bg * (1 - t) + bg2 * t

    size = rng.uniform(*_SIZE_RANGE) * big / 2
    aspect = rng.uniform(*_ASPECT_RANGE)
    rx, ry = size * math.sqrt(aspect), size / math.sqrt(aspect)
    margin = max(rx, ry)
    cx = rng.uniform(margin, big - margin) if big > 2 * margin else big / 2
    cy = rng.uniform(margin, big - margin) if big > 2 * margin else big / 2
    angle = math.radians(rng.uniform(-_ROTATE, _ROTATE))

    mask = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(mask)
    filled, holes = _shape_polygons(label, rng)
    for poly in filled:
        draw.polygon(_polygon(poly, cx, cy, rx, ry, angle), fill=255)
    for poly in holes:
        draw.polygon(_polygon(poly, cx, cy, rx, ry, angle), fill=0)
    alpha = np.asarray(mask.resize((SIDE, SIDE), Image.BOX), dtype=np.float32)[..., None] / 255
    return background * (1 - alpha) + fg * alpha


def generate(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n balanced, shuffled images [n, 32, 32, 3] uint8 and their labels."""
    labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)
    images = np.empty((n, SIDE, SIDE, 3), dtype=np.float32)
    for i, label in enumerate(labels):
        images[i] = _render(int(label), rng)
    sigma = rng.uniform(*_NOISE_RANGE, size=(n, 1, 1, 1)).astype(np.float32)
    images += rng.standard_normal(images.shape, dtype=np.float32) * sigma
    return np.clip(np.rint(images), 0, 255).astype(np.uint8), labels


def _synthetic_note(data_dir: Path, seed: int, train_size: int, test_size: int) -> str:
    classes = "\n".join(f"  {i}: {name}" for i, name in enumerate(SYNTHETIC_LABEL_NAMES))
    return (
        "This is NOT the real CIFAR-10 data set.\n"
        "\n"
        "These files are a generated stand-in written in CIFAR-10's python format\n"
        "(cifar-10-batches-py: pickled batches, as torchvision.datasets.CIFAR10 reads them),\n"
        "for machines that cannot download the real data. Each class is a shape drawn in\n"
        "random colours on a random gradient, at a random position, size, aspect and small\n"
        "rotation, with pixel noise. Accuracy on this set says nothing about accuracy on\n"
        "real CIFAR-10. The md5 sums of the files are in synthetic.md5 (md5sum -c works).\n"
        "\n"
        f"classes:\n{classes}\n"
        "\n"
        "generator:   ddl_cifar.data.write_synthetic\n"
        f"seed:        {seed}\n"
        f"train size:  {train_size} (in data_batch_1..5)\n"
        f"test size:   {test_size}\n"
        "\n"
        "To replace it with the real data, run on a machine with internet access:\n"
        f"  ddl prepare --plugin cifar --data-dir {data_dir}\n"
    )


def write_synthetic(data_dir: Path, train_size: int = 5000, test_size: int = 1000,
                    seed: int = 0) -> Path:
    """Write a learnable generated set in CIFAR-10's format; return the cifar-10-batches-py dir.

    The training images are split over the five data_batch files like the real set's 50000.
    Deterministic for a given seed; train and test use separate random streams. Replaces an
    earlier synthetic set but refuses (DataError) to touch a directory holding anything
    else, real data above all.
    """
    data_dir = Path(data_dir)
    if train_size < len(TRAIN_FILES) or test_size < 1:
        raise DataError(f"synthetic CIFAR-10 sizes must be at least 5 training and 1 test "
                        f"image (got train {train_size}, test {test_size})")
    target = cifar_dir(data_dir)
    with datafiles.new_synthetic_set(target, "CIFAR-10") as new:
        blobs: dict[str, bytes] = {}
        images, labels = generate(train_size, np.random.default_rng([seed, 0]))
        bounds = np.linspace(0, train_size, len(TRAIN_FILES) + 1).astype(int)
        for i, name in enumerate(TRAIN_FILES):
            lo, hi = bounds[i], bounds[i + 1]
            blobs[name] = _batch_blob(images[lo:hi], labels[lo:hi],
                                      f"training batch {i + 1} of {len(TRAIN_FILES)}",
                                      [f"synthetic_{k:06d}.png" for k in range(lo, hi)])
        images, labels = generate(test_size, np.random.default_rng([seed, 1]))
        blobs[TEST_FILE] = _batch_blob(images, labels, "testing batch 1 of 1",
                                       [f"synthetic_test_{k:06d}.png" for k in range(test_size)])
        blobs[META_FILE] = _meta_blob(int(bounds[1] - bounds[0]), SYNTHETIC_LABEL_NAMES)
        for name, blob in blobs.items():
            (new / name).write_bytes(blob)
        (new / MANIFEST).write_text(datafiles.md5_manifest({n: blobs[n] for n in ALL_FILES}))
        (new / MARKER).write_text(_synthetic_note(data_dir, seed, train_size, test_size))
    return target


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

    from torchvision.datasets import CIFAR10  # slow import, only needed here

    # A fixed name, not a scratch directory: the tarball in it survives an interrupted run.
    staging = data_dir / ".cifar-10-download"
    done = False
    try:
        if (staging / BASE_FOLDER).exists():  # a half-extracted earlier attempt
            shutil.rmtree(staging / BASE_FOLDER)
        with datafiles.quiet_download(_DOWNLOAD_TIMEOUT_S):
            CIFAR10(root=str(staging), train=True, download=True)
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

