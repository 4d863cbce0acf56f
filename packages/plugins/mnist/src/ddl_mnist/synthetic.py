"""A learnable generated digit set in MNIST's idx format (``ddl prepare --synthetic``).

For machines that cannot reach the MNIST mirrors: :func:`write_synthetic` draws handwritten-
looking digits and writes them where :mod:`ddl_mnist.data` (and torchvision) read the real
files, marked by SYNTHETIC.txt. Only numpy and PIL are imported: no torch.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ddl.contract import datafiles
from ddl.contract.errors import DataError
from ddl_mnist.data import IMAGES_MAGIC, LABELS_MAGIC, MARKER, RAW_FILES, SIDE, mnist_dir

# ---------------------------------------------------------------------------
# Synthetic digits
# ---------------------------------------------------------------------------
#
# Each digit is a few pen strokes given as control points in a unit box (x right, y down,
# the digit roughly spanning x 0.15..0.85, y 0..1, like MNIST's tall 20x20 box). Points
# are joined by a Catmull-Rom spline, so a handful of points gives a smooth handwritten
# curve; a point marked with a third element is a sharp corner (the top of a 7). Several
# digits have alternative shapes (open or closed 4, 1 with or without a flag), as people
# write them differently; jitter of the control points does the rest.

_C = 1  # corner marker


def _arc(cx, cy, rx, ry, a0, a1, step=45.0):
    """Control points on an ellipse from angle a0 to a1 (degrees; y down, so 270 is the top)."""
    n = max(2, int(abs(a1 - a0) / step) + 1)
    return [
        (cx + rx * math.cos(math.radians(a)), cy + ry * math.sin(math.radians(a)))
        for a in np.linspace(a0, a1, n)
    ]


def _strokes_0(rng):
    start = rng.uniform(230, 290)
    return [_arc(0.5, 0.5, 0.3, 0.47, start, start + rng.uniform(350, 385))]


def _strokes_1(rng):
    r = rng.random()
    if r < 0.6:
        return [[(0.52, 0.02), (0.48, 0.98)]]
    strokes = [[(0.36, 0.17), (0.54, 0.02, _C), (0.5, 0.98)]]
    if r > 0.9:
        strokes.append([(0.3, 0.98), (0.7, 0.98)])
    return strokes


def _strokes_2(rng):
    top = [(0.2, 0.24), (0.36, 0.06), (0.58, 0.03), (0.76, 0.16), (0.75, 0.37), (0.5, 0.65)]
    if rng.random() < 0.7:
        return [top + [(0.18, 0.95, _C), (0.5, 0.93), (0.84, 0.96)]]
    # a small loop at the bottom left, a common handwritten form
    return [top + [(0.26, 0.88), (0.2, 0.97), (0.34, 0.96), (0.36, 0.87, _C), (0.55, 0.95),
                   (0.84, 0.95)]]


def _strokes_3(rng):
    return [[
        (0.2, 0.14), (0.44, 0.02), (0.69, 0.07), (0.72, 0.25), (0.44, 0.47, _C),
        (0.72, 0.57), (0.79, 0.77), (0.62, 0.95), (0.36, 0.98), (0.16, 0.86),
    ]]


def _strokes_4(rng):
    if rng.random() < 0.5:  # closed: diagonal, bar, stem
        return [[(0.62, 0.02), (0.14, 0.65, _C), (0.86, 0.65)], [(0.65, 0.28), (0.64, 0.98)]]
    return [[(0.24, 0.02), (0.19, 0.6, _C), (0.86, 0.58)], [(0.7, 0.05), (0.67, 0.98)]]


def _strokes_5(rng):
    return [[
        (0.8, 0.04), (0.3, 0.05, _C), (0.25, 0.45, _C), (0.5, 0.38), (0.73, 0.48),
        (0.8, 0.71), (0.64, 0.93), (0.38, 0.98), (0.17, 0.86),
    ]]


def _strokes_6(rng):
    return [[
        (0.72, 0.03), (0.46, 0.14), (0.27, 0.4), (0.2, 0.66), (0.3, 0.9), (0.53, 0.98),
        (0.76, 0.85), (0.77, 0.64), (0.58, 0.51), (0.36, 0.55), (0.23, 0.7),
    ]]


def _strokes_7(rng):
    strokes = [[(0.17, 0.06), (0.83, 0.04, _C), (0.63, 0.4), (0.46, 0.98)]]
    if rng.random() < 0.25:  # continental crossbar
        strokes.append([(0.4, 0.5), (0.8, 0.49)])
    return strokes


def _strokes_8(rng):
    if rng.random() < 0.7:  # one stroke crossing itself in the middle
        return [[
            (0.72, 0.13), (0.5, 0.02), (0.28, 0.12), (0.31, 0.32), (0.5, 0.47), (0.74, 0.63),
            (0.76, 0.86), (0.5, 0.98), (0.24, 0.86), (0.27, 0.63), (0.5, 0.47), (0.7, 0.32),
            (0.72, 0.13),
        ]]
    return [_arc(0.5, 0.24, 0.21, 0.23, 90, 450), _arc(0.5, 0.72, 0.27, 0.26, 270, 640)]


def _strokes_9(rng):
    loop = [(0.75, 0.28), (0.6, 0.46), (0.37, 0.48), (0.23, 0.3), (0.33, 0.08),
            (0.56, 0.02), (0.75, 0.14), (0.75, 0.3)]
    if rng.random() < 0.7:
        return [loop + [(0.71, 0.62), (0.64, 0.98)]]
    return [loop + [(0.72, 0.62), (0.62, 0.9), (0.42, 0.98), (0.26, 0.9)]]


_DIGITS = [_strokes_0, _strokes_1, _strokes_2, _strokes_3, _strokes_4,
           _strokes_5, _strokes_6, _strokes_7, _strokes_8, _strokes_9]

_SCALE = 4  # draw at 4x, then box-downsample: cheap antialiasing
_BOX = 20.0  # MNIST fits digits into a 20x20 box centred in 28x28
_SEG = 6  # spline samples per control-point segment


def _spline(pts: np.ndarray) -> np.ndarray:
    """Catmull-Rom curve through pts (m, 2); two points give a straight line."""
    if len(pts) == 2:
        return pts
    ext = np.vstack([2 * pts[0] - pts[1], pts, 2 * pts[-1] - pts[-2]])
    p0, p1, p2, p3 = ext[:-3, None], ext[1:-2, None], ext[2:-1, None], ext[3:, None]
    t = np.linspace(0.0, 1.0, _SEG, endpoint=False)[None, :, None]
    curve = 0.5 * (
        2 * p1
        + (p2 - p0) * t
        + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t**2
        + (3 * p1 - p0 - 3 * p2 + p3) * t**3
    )
    return np.vstack([curve.reshape(-1, 2), pts[-1:]])


def _stroke_path(stroke, jitter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sampled pen path of a stroke, and the points that need a round pen tip.

    Round tips go on the ends and corners only: PIL's `joint="curve"` would round every
    vertex but costs a Python-level pieslice per vertex, which made generation 4x slower,
    and the bends between dense spline samples are too small to show a notch.
    """
    pts = np.array([p[:2] for p in stroke], dtype=float) + jitter
    corners = [i for i, p in enumerate(stroke) if len(p) > 2 and 0 < i < len(stroke) - 1]
    pieces, start = [], 0
    for c in corners + [len(stroke) - 1]:
        piece = _spline(pts[start : c + 1])
        pieces.append(piece if not pieces else piece[1:])
        start = c
    tips = pts[[0, *corners, len(stroke) - 1]]
    return np.vstack(pieces), tips


# Variation ranges. Tuned so that a small CNN still reaches ~98-99 % while a linear model on
# raw pixels stays near 88 % (on real MNIST: ~99 % and ~92 %); with less variation every
# class is one template and the set is trivially separable.
_JITTER = 0.04  # control-point noise, unit-box units
_WARP = 0.05  # amplitude of a smooth random warp of the whole digit
_ROTATE = 15.0  # degrees either way
_SCALE_RANGE = (0.75, 1.05)
_ASPECT_RANGE = (0.7, 1.25)  # width relative to height
_SHEAR = 0.35
_SHIFT = 2.0  # pixels either way, on top of centring
_WIDTH_RANGE = (1.4, 3.6)  # pen width in 28x28 pixels


def _render(label: int, rng: np.random.Generator) -> np.ndarray:
    """One 28x28 float image (0..255) of `label` with random handwriting variation."""
    strokes = _DIGITS[label](rng)
    angle = math.radians(rng.uniform(-_ROTATE, _ROTATE))
    scale = rng.uniform(*_SCALE_RANGE)
    aspect = rng.uniform(*_ASPECT_RANGE)
    shear = rng.uniform(-_SHEAR, _SHEAR)
    shift = rng.uniform(-_SHIFT, _SHIFT, size=2)
    width = rng.uniform(*_WIDTH_RANGE) * _SCALE
    # smooth warp: one sine wave along a random direction, displacing points in another;
    # bends the digit as a whole, e.g. bigger top loop, leaning stem
    wave_dir = rng.normal(size=2)
    wave_freq = rng.uniform(0.5, 1.5) * 2 * math.pi / np.linalg.norm(wave_dir)
    wave_phase = rng.uniform(0, 2 * math.pi)
    wave_amp = rng.normal(0.0, _WARP, size=2)
    cos, sin = math.cos(angle), math.sin(angle)
    # unit box -> centred, sheared, rotated 28x28 pixel coordinates, then up to 4x
    lin = np.array([[cos, -sin], [sin, cos]]) @ np.array([[1.0, shear], [0.0, 1.0]])
    lin = lin @ np.diag([aspect * scale * _BOX, scale * _BOX]) * _SCALE
    offset = (np.array([SIDE / 2, SIDE / 2]) + shift) * _SCALE

    def place(pts: np.ndarray) -> np.ndarray:
        pts = pts + np.sin(pts @ wave_dir * wave_freq + wave_phase)[:, None] * wave_amp
        return (pts - 0.5) @ lin.T + offset

    img = Image.new("L", (SIDE * _SCALE, SIDE * _SCALE), 0)
    draw = ImageDraw.Draw(img)
    r = width / 2
    for stroke in strokes:
        path, tips = _stroke_path(stroke, rng.normal(0.0, _JITTER, size=(len(stroke), 2)))
        draw.line(place(path).ravel().tolist(), fill=255, width=int(round(width)))
        for x, y in place(tips):
            draw.ellipse((x - r, y - r, x + r, y + r), fill=255)
    return np.asarray(img.resize((SIDE, SIDE), Image.BOX), dtype=np.float32)


def _generate(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)  # balanced, shuffled
    images = np.empty((n, SIDE, SIDE), dtype=np.float32)
    for i, label in enumerate(labels):
        images[i] = _render(int(label), rng)
    # mild sensor-like noise; clipping keeps most of the background at 0 as in MNIST
    sigma = rng.uniform(0.0, 10.0, size=(n, 1, 1)).astype(np.float32)
    images += rng.standard_normal(images.shape, dtype=np.float32) * sigma
    return np.clip(np.rint(images), 0, 255).astype(np.uint8), labels


def _synthetic_note(data_dir: Path, seed: int, train_size: int, test_size: int) -> str:
    return (
        "This is NOT the real MNIST data set.\n"
        "\n"
        "These files are a generated stand-in written in MNIST's format (idx files in\n"
        "torchvision's MNIST/raw layout), so that torchvision.datasets.MNIST can read them\n"
        "on machines that cannot download the real data. The digits are drawn from\n"
        "hand-defined pen strokes with random jitter, stroke width, rotation, scale, shear,\n"
        "shift and noise. Accuracy on this set says nothing about accuracy on real MNIST.\n"
        "\n"
        "generator:   ddl_mnist.synthetic.write_synthetic\n"
        f"seed:        {seed}\n"
        f"train size:  {train_size}\n"
        f"test size:   {test_size}\n"
        "\n"
        "To replace it with the real data, run on a machine with internet access:\n"
        f"  ddl prepare --plugin mnist --data-dir {data_dir}\n"
    )


def write_synthetic(
    data_dir: Path, train_size: int = 12000, test_size: int = 2000, seed: int = 0
) -> Path:
    """Write a learnable generated digit set in MNIST's format and return the MNIST dir.

    Deterministic for a given seed; train and test use separate random streams, so the
    test set does not change with `train_size`. Replaces an earlier synthetic set but
    refuses (DataError) to touch a directory holding anything else, real data above all.
    """
    data_dir = Path(data_dir)
    if train_size < 1 or test_size < 1:
        raise DataError(
            f"synthetic MNIST sizes must be positive (got train {train_size}, test {test_size})"
        )
    target = mnist_dir(data_dir)
    with datafiles.new_synthetic_set(target, "MNIST") as new:
        raw = new / "raw"
        raw.mkdir()
        for stream, (split, size) in enumerate((("train", train_size), ("test", test_size))):
            images, labels = _generate(size, np.random.default_rng([seed, stream]))
            images_name, labels_name = RAW_FILES[split]
            images_header = struct.pack(">4I", IMAGES_MAGIC, size, SIDE, SIDE)
            (raw / images_name).write_bytes(images_header + images.tobytes())
            labels_header = struct.pack(">2I", LABELS_MAGIC, size)
            (raw / labels_name).write_bytes(labels_header + labels.tobytes())
        (new / MARKER).write_text(_synthetic_note(data_dir, seed, train_size, test_size))
    return target
