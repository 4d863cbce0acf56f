"""ImageFolder's samples read from the decode cache (:mod:`ddl_imagewoof.decode_cache`).

A sample is ``((canvas, box), label)``: the uint8 R x R canvas and the float box of
:mod:`ddl_imagewoof.crops` (where to crop, whether to flip). The workload's ``to_device``
moves a batch of them to the device, where :mod:`ddl_imagewoof.device_crops` turns it into
the normalised crops the model reads; the loader processes only copy bytes.

Training draws each box from (seed, epoch, sample index): the trainer's sampler calls
``begin_epoch(epoch, seed)`` on the training split before each epoch's loader starts
(``ddl.worker.train.loaders``), so the same sample gets the same crop in the same epoch on any
rank. The memory map is opened lazily in each process: loader processes never receive the
array in a pickle.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from ddl_imagewoof import crops, decode_cache

CACHE_ENV = "DDL_IMAGEWOOF_CACHE"  # a directory, or "off" for the JPEG path
CACHE_DIRNAME = "imagewoof2-320-cache"


def cache_dir(data_dir: Path) -> Path | None:
    """Where the decode cache lives: ``$DDL_IMAGEWOOF_CACHE``, else beside the data;
    None when that variable says ``off``."""
    chosen = os.environ.get(CACHE_ENV, "").strip()
    if chosen.lower() == "off":
        return None
    return Path(chosen) if chosen else Path(data_dir) / CACHE_DIRNAME


def canvas_size(image_size: int) -> int:
    """The default canvas: 1.5 x the crop size, a multiple of 8 (240 px for 160 px crops),
    so an average crop is taken at about the model's resolution or above."""
    return max(8, (image_size * 3 // 2 + 7) // 8 * 8)


class CachedImages(Dataset):
    """The images of one cache with their labels; ``train`` draws random boxes."""

    def __init__(self, decoded: decode_cache.Decoded, targets: list[int], train: bool) -> None:
        self.path = decoded.path
        self.dims = decoded.dims
        self.canvas = int(decoded.images.shape[1])
        self.targets = list(targets)
        self.train = train
        self.epoch, self.seed = 0, 0
        self._images: np.ndarray | None = decoded.images

    def begin_epoch(self, epoch: int, seed: int) -> None:
        self.epoch, self.seed = int(epoch), int(seed)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_images": None}  # each process maps the file itself

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        if self._images is None:
            self._images = np.load(self.path / "images.npy", mmap_mode="r")
        canvas = torch.from_numpy(np.array(self._images[index]))  # a copy out of the map
        box = crops.sample_box(index, self.dims[index], self.canvas, train=self.train,
                               seed=self.seed, epoch=self.epoch)
        return (canvas, torch.from_numpy(box)), self.targets[index]


class EpochSubset(Subset):
    """A Subset that passes ``begin_epoch`` on to the dataset it selects from."""

    def begin_epoch(self, epoch: int, seed: int) -> None:
        self.dataset.begin_epoch(epoch, seed)


def open_folder(folder, split: str, image_size: int, data_dir: Path, *, canvas: int | None,
                train: bool) -> CachedImages | None:
    """A torchvision ImageFolder's images as :class:`CachedImages` (building the cache on
    first use), or None where the cache is off or cannot be written (said in one line)."""
    where = cache_dir(data_dir)
    if where is None:
        return None
    top = Path(folder.root).parent
    files = [Path(path) for path, _ in folder.samples]
    try:
        decoded = decode_cache.open_or_build(files, top, split, canvas or canvas_size(image_size),
                                             where)
    except OSError as e:
        if os.environ.get("RANK", "0") == "0":  # one line per run, not per rank
            print(f"ddl: cannot write the Imagewoof decode cache in {where} ({e.strerror or e}); "
                  f"decoding the JPEGs instead (set {CACHE_ENV} to a writable directory, or "
                  "to off)", file=sys.stderr, flush=True)
        return None
    return CachedImages(decoded, folder.targets, train)
