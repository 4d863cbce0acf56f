"""A learnable generated CIFAR-10 stand-in: ten shape classes (``ddl prepare --synthetic``).

:func:`write_synthetic` writes batches in the official pickle format where
:mod:`ddl_cifar.data` (and torchvision) read the real ones, with the SYNTHETIC.txt marker
and the md5 manifest :mod:`ddl_cifar.dataset` checks. Only numpy and PIL are imported.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ddl.contract import datafiles
from ddl.contract.errors import DataError
from ddl_cifar.data import (
    ALL_FILES,
    MANIFEST,
    MARKER,
    META_FILE,
    SIDE,
    SYNTHETIC_LABEL_NAMES,
    TEST_FILE,
    TRAIN_FILES,
    cifar_dir,
)

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
        "generator:   ddl_cifar.synthetic.write_synthetic\n"
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
