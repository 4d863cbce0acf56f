"""A learnable generated Imagewoof stand-in: real JPEG files in the real folders
(``ddl prepare --synthetic``), marked by SYNTHETIC.txt, for machines that cannot reach the
download server. :mod:`ddl_imagewoof.data` checks and reads them like the real set.
Only numpy and PIL are imported: no torch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ddl.contract import datafiles
from ddl.contract.errors import DataError
from ddl_imagewoof.data import MARKER, WNIDS, root

# ---------------------------------------------------------------------------------------
# Synthetic images
# ---------------------------------------------------------------------------------------
#
# Each class is one texture (stripes, checks, dots, rings, ...) on a foreground object; pairs
# of classes share a hue, so colour alone gives at most 50 % and the texture has to be
# learnt. Everything else is nuisance: the object's outline (a random blob), position, size,
# rotation and texture frequency, a cluttered background, a small distractor patch with
# another class's texture, brightness/contrast jitter and sensor noise. Random crops (the
# training augmentation keeps as little as 8 % of the image) sometimes miss the object,
# as with real photos.

_HUES = (0.0, 0.2, 0.4, 0.6, 0.8)  # class k uses hue _HUES[k // 2]


def _texture(kind: int, u: np.ndarray, v: np.ndarray, r: np.ndarray, theta: np.ndarray,
             period: float, rng: np.random.Generator) -> np.ndarray:
    """Pattern in [-1, 1] over rotated coordinates (u, v) / polar (r, theta), in pixels."""
    w = 2 * math.pi / period
    if kind == 0:  # stripes
        t = np.sin(w * u)
    elif kind == 1:  # checkerboard
        t = np.sign(np.sin(w * u) * np.sin(w * v))
    elif kind == 2:  # dots
        t = np.clip((np.cos(w * u) * np.cos(w * v) - 0.3) * 3, -1, 1)
    elif kind == 3:  # concentric rings
        t = np.sin(w * r)
    elif kind == 4:  # zigzag (chevrons)
        t = np.sin(w * (u + 0.6 * period * np.abs(((v / period) % 2) - 1)))
    elif kind == 5:  # radial spokes
        t = np.sin(int(rng.integers(7, 12)) * theta)
    elif kind == 6:  # crosshatch (diagonal grid of thin dark lines)
        t = 1 - 2 * np.maximum(np.abs(np.sin(w * (u + v) / 1.4)) > 0.85,
                               np.abs(np.sin(w * (u - v) / 1.4)) > 0.85)
    elif kind == 7:  # grid of squares
        t = np.where((np.abs(np.sin(w * u)) < 0.35) | (np.abs(np.sin(w * v)) < 0.35), -1.0, 1.0)
    elif kind == 8:  # waves
        t = np.sin(w * (u + 0.35 * period * np.sin(w * v / 2.5)))
    else:  # hexagonal blobs: three plane waves at 60 degrees
        a, b = w * u, w * v * math.sqrt(3) / 2
        t = np.clip((np.cos(a) + np.cos(a / 2 + b) + np.cos(a / 2 - b)) / 1.5, -1, 1)
    return t.astype(np.float32)


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    import colorsys

    return np.array(colorsys.hsv_to_rgb(h % 1.0, s, v), dtype=np.float32) * 255


def _patch(img: np.ndarray, kind: int, hue: float, cx: float, cy: float, radius: float,
           rng: np.random.Generator) -> None:
    """Paint a textured blob (class ``kind``, colours around ``hue``) onto img, in place."""
    lobes = int(rng.integers(2, 6))
    wobble, phase = rng.uniform(0.05, 0.3), rng.uniform(0, 6.3)
    stretch, direction = rng.uniform(-0.25, 0.25), rng.uniform(0, 3.2)
    reach = radius * (1 + wobble) * (1 + abs(stretch)) + 2  # bounding box of the blob
    height, width = img.shape[:2]
    x0, x1 = max(0, int(cx - reach)), min(width, int(cx + reach) + 1)
    y0, y1 = max(0, int(cy - reach)), min(height, int(cy + reach) + 1)
    if x0 >= x1 or y0 >= y1:
        return
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dx, dy = xx - np.float32(cx), yy - np.float32(cy)
    r = np.sqrt(dx * dx + dy * dy)
    theta = np.arctan2(dy, dx)
    # outline: a radius that wobbles with the angle (ellipse-ish to star-ish blobs)
    edge = radius * (1 + wobble * np.cos(lobes * theta + phase))
    edge *= 1 + stretch * np.cos(2 * (theta - direction))
    alpha = np.clip((edge - r) / 1.5, 0, 1)[..., None]  # soft edge
    angle = rng.uniform(0, math.pi)
    u = dx * math.cos(angle) + dy * math.sin(angle)
    v = -dx * math.sin(angle) + dy * math.cos(angle)
    period = rng.uniform(4.5, 8) * radius / 50 + 2.5
    t = _texture(kind, u, v, r, theta, period, rng)[..., None]
    hue += rng.normal(0, 0.025)
    light = _hsv(hue, rng.uniform(0.45, 0.8), rng.uniform(0.8, 1.0))
    dark = _hsv(hue + rng.normal(0, 0.03), rng.uniform(0.6, 1.0), rng.uniform(0.2, 0.45))
    texture = dark + (light - dark) * (t + 1) / 2
    view = img[y0:y1, x0:x1]
    view *= 1 - alpha
    view += alpha * texture


def _render(label: int, width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """One image of class ``label``, drawn at half resolution and upscaled: 4x fewer pixels
    to compute, and the textures' periods stay well above the pixel size."""
    w, h = (width + 1) // 2, (height + 1) // 2
    # background: a gradient between two dull colours, plus clutter drawn with PIL
    c0 = _hsv(rng.uniform(), rng.uniform(0, 0.35), rng.uniform(0.3, 0.8))
    c1 = _hsv(rng.uniform(), rng.uniform(0, 0.35), rng.uniform(0.3, 0.8))
    g = np.linspace(0, 1, w if rng.random() < 0.5 else h, dtype=np.float32)
    g = g[None, :, None] if g.size == w else g[:, None, None]
    background = Image.fromarray(np.broadcast_to(c0 + (c1 - c0) * g, (h, w, 3))
                                 .astype(np.uint8))
    draw = ImageDraw.Draw(background)
    short = min(w, h)
    for _ in range(int(rng.integers(4, 10))):
        x, y = rng.uniform(0, w), rng.uniform(0, h)
        s = rng.uniform(0.03, 0.15) * short
        fill = tuple(int(c) for c in _hsv(rng.uniform(), rng.uniform(0, 0.6), rng.uniform(0.2, 0.9)))
        if rng.random() < 0.5:
            draw.ellipse((x - s, y - s * rng.uniform(0.4, 1), x + s, y + s), fill=fill)
        else:
            draw.line((x, y, x + rng.normal(0, 2 * s), y + rng.normal(0, 2 * s)), fill=fill,
                      width=int(rng.integers(1, 4)))
    img = np.asarray(background, dtype=np.float32).copy()

    # a distractor: a small patch of another class's texture
    if rng.random() < 0.7:
        other = (label + int(rng.integers(1, 10))) % 10
        _patch(img, other, _HUES[other // 2], rng.uniform(0, w), rng.uniform(0, h),
               rng.uniform(0.08, 0.15) * short, rng)
    # the object: large, mostly inside the frame
    _patch(img, label, _HUES[label // 2], rng.uniform(0.3, 0.7) * w, rng.uniform(0.3, 0.7) * h,
           rng.uniform(0.25, 0.42) * short, rng)

    img = (img - 128) * rng.uniform(0.75, 1.15) + 128 + rng.normal(0, 12)  # contrast, brightness
    img += rng.standard_normal((h, w, 1), dtype=np.float32) * rng.uniform(3, 10)  # sensor noise
    small = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    return small.resize((width, height), Image.BILINEAR)


def _size(rng: np.random.Generator, short: int) -> tuple[int, int]:
    """(width, height): shorter side ``short``, aspect ratio 1 to 1.5, mostly landscape like
    the photos of the real set."""
    long = round(short * rng.uniform(1.0, 1.5))
    return (long, short) if rng.random() < 0.75 else (short, long)


def _synthetic_note(data_dir: Path, seed: int, per_class: dict[str, int], short: int) -> str:
    return (
        "This is NOT the real Imagewoof data set.\n"
        "\n"
        "These are generated JPEG files in Imagewoof's layout (imagewoof2-320/{train,val}/<wnid>/),\n"
        "so that torchvision.datasets.ImageFolder reads them on machines that cannot download\n"
        "the real data. Each class is a texture on a foreground blob (pairs of classes share a\n"
        "hue) over a cluttered background, with random placement, size, rotation, a distractor\n"
        "patch and noise. Accuracy on this set says nothing about accuracy on real Imagewoof.\n"
        "\n"
        "generator:        ddl_imagewoof.synthetic.write_synthetic\n"
        f"seed:             {seed}\n"
        f"images per class: train {per_class['train']}, val {per_class['val']}\n"
        f"shorter side:     {short} px\n"
        "\n"
        "To replace it with the real data, run on a machine with internet access:\n"
        f"  ddl prepare --plugin imagewoof --data-dir {data_dir}\n"
    )


def write_synthetic(data_dir: Path, train_per_class: int = 100, val_per_class: int = 30,
                    seed: int = 0, short_side: int = 320, quality: int = 90) -> Path:
    """Write a learnable generated Imagewoof stand-in (real JPEG files) and return its root.

    Deterministic for a given seed: every (split, class) has its own random stream, so the
    val images do not change with ``train_per_class``. Replaces an earlier synthetic set but
    refuses (DataError) to touch a directory holding anything else, real data above all.
    """
    data_dir = Path(data_dir)
    if train_per_class < 1 or val_per_class < 1:
        raise DataError(f"synthetic Imagewoof sizes must be positive (got train "
                        f"{train_per_class}, val {val_per_class} per class)")
    target = root(data_dir)
    with datafiles.new_synthetic_set(target, "Imagewoof") as new:
        val_number = 0
        for s, (split, n) in enumerate((("train", train_per_class), ("val", val_per_class))):
            for c, wnid in enumerate(WNIDS):
                folder = new / split / wnid
                folder.mkdir(parents=True)
                rng = np.random.default_rng([seed, s, c])
                for i in range(n):
                    image = _render(c, *_size(rng, short_side), rng)
                    if split == "train":
                        name = f"{wnid}_{i}.JPEG"
                    else:  # the real val files keep their ILSVRC2012 validation names
                        val_number += 1
                        name = f"ILSVRC2012_val_{val_number:08d}.JPEG"
                    image.save(folder / name, format="JPEG", quality=quality)
        (new / MARKER).write_text(_synthetic_note(
            data_dir, seed, {"train": train_per_class, "val": val_per_class}, short_side))
    return target
