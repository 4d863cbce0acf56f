"""Where each sample is cropped, and whether it is flipped: drawn per sample, applied per
batch on the device (:mod:`ddl_imagewoof.device_crops`).

The random draws come from a generator seeded by (seed, epoch, sample index), not from the
rank's RNG stream: a sample gets the same crop and flip in the same epoch whichever rank,
loader worker or batch position it lands on, so runs of different layouts (and worker
counts) see the same pixels. The draws follow torchvision's
``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3, ten tries, then a centre
crop of the clamped ratio) in the original image's pixels; the box is then mapped onto the
R x R canvas of the decode cache. No torch here.
"""

from __future__ import annotations

import math

import numpy as np

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
BOX_FIELDS = 5  # x0, y0, x1, y1 on the canvas (pixels), flip (0 or 1)


def random_resized_crop(rng: np.random.Generator, height: int,
                        width: int) -> tuple[int, int, int, int]:
    """(top, left, crop height, crop width) in the original image, as torchvision draws
    them (with numpy's generator instead of torch's)."""
    area = height * width
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height  # fallback: the whole image, cut to the allowed ratios
    if in_ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif in_ratio > RATIO[1]:
        h, w = height, int(round(height * RATIO[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def centre_square(height: int, width: int) -> tuple[float, float, float, float]:
    """Resize(shorter side) + CenterCrop as one box: the centred square of the shorter
    side, (top, left, height, width), unrounded."""
    side = min(height, width)
    return (height - side) / 2, (width - side) / 2, side, side


def canvas_box(top: float, left: float, h: float, w: float, height: int, width: int,
               canvas: int, flip: bool) -> np.ndarray:
    """A box in the original's pixels as ``[x0, y0, x1, y1, flip]`` on the canvas."""
    sy, sx = canvas / height, canvas / width
    return np.array([left * sx, top * sy, (left + w) * sx, (top + h) * sy, float(flip)],
                    dtype=np.float32)


def sample_box(index: int, dims: tuple[int, int], canvas: int, *, train: bool, seed: int,
               epoch: int) -> np.ndarray:
    """The box and flip of sample ``index`` in ``epoch``: random for training, the centre
    crop without flip for evaluation (and training without augmentation)."""
    height, width = int(dims[0]), int(dims[1])
    if not train:
        return canvas_box(*centre_square(height, width), height, width, canvas, False)
    rng = np.random.default_rng([seed, epoch, index])
    top, left, h, w = random_resized_crop(rng, height, width)
    return canvas_box(top, left, h, w, height, width, canvas, bool(rng.random() < 0.5))
