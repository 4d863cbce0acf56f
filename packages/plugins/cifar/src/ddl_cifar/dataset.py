"""Opening CIFAR-10 splits: torchvision's CIFAR10 class, with its batches unpickled safely.

:class:`CheckedCIFAR10` is ``torchvision.datasets.CIFAR10(root, train=..., download=False)``
with one change: the batch files are read by :func:`ddl_cifar.data.load_batch`, whose
unpickler admits only what the format holds (dict, list, str, bytes, int, numpy arrays),
instead of torchvision's plain ``pickle.load``, which runs whatever a pickle names (a data
file whose ``__reduce__`` calls ``os.system`` would run it in every rank). The rest is
torchvision's: the same ``_check_integrity`` md5 checks first, the same ``encoding="latin1"``
keys, the same [N, 3072] -> [N, 32, 32, 3] reshape and PIL images, the same ``classes`` from
``batches.meta``. Real data is checked against the official md5s; a synthetic set (marked by
``SYNTHETIC.txt``) against its own ``synthetic.md5`` manifest (:class:`SyntheticCIFAR10`).
Bypassing the check (md5 ``None``) would have been simpler, but then a damaged synthetic
file would go unnoticed by the reader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import CIFAR10, VisionDataset
from torchvision.datasets.utils import check_integrity

from ddl_cifar import data


class CheckedCIFAR10(CIFAR10):
    """torchvision's CIFAR10, its batches read by the allow-listing unpickler."""

    def __init__(self, root, train: bool = True, transform=None, target_transform=None,
                 download: bool = False) -> None:
        if download:
            raise ValueError("CheckedCIFAR10 never downloads (ddl prepare does)")
        VisionDataset.__init__(self, root, transform=transform,
                               target_transform=target_transform)
        self.train = train
        if not self._check_integrity():  # torchvision's md5 checks, its message
            raise RuntimeError("Dataset not found or corrupted. You can use download=True to "
                               "download it")
        base = Path(self.root) / self.base_folder
        data_dir = Path(self.root)
        batches = [data.load_batch(base / name, data_dir)
                   for name, _ in (self.train_list if train else self.test_list)]
        self.data = np.vstack([rows for rows, _ in batches]).reshape(-1, 3, 32, 32)
        self.data = self.data.transpose((0, 2, 3, 1))  # HWC, as torchvision has it
        self.targets = [label for _, labels in batches for label in labels]
        self._load_meta()

    def _load_meta(self) -> None:
        path = Path(self.root) / self.base_folder / self.meta["filename"]
        if not check_integrity(str(path), self.meta["md5"]):
            raise RuntimeError("Dataset metadata file not found or corrupted. You can use "
                               "download=True to download it")
        self.classes = data.load_label_names(path, Path(self.root))
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}


class SyntheticCIFAR10(CheckedCIFAR10):
    """The same, checking a synthetic set's own md5 sums."""

    def __init__(self, root, md5: dict[str, str], **kwargs) -> None:
        # Instance attributes shadow the class's official lists that _check_integrity and
        # _load_meta read; set before CheckedCIFAR10.__init__ runs its checks.
        self.train_list = [[name, md5[name]] for name, _ in CIFAR10.train_list]
        self.test_list = [[name, md5[name]] for name, _ in CIFAR10.test_list]
        self.meta = {**CIFAR10.meta, "md5": md5[CIFAR10.meta["filename"]]}
        super().__init__(root, **kwargs)


def open_split(data_dir: Path, *, train: bool, transform=None) -> CIFAR10:
    """The training (data_batch_1..5) or test (test_batch) split, never downloading."""
    root = str(data_dir)
    if data.is_synthetic(data_dir):
        return SyntheticCIFAR10(root, data.read_manifest(data_dir), train=train,
                                transform=transform)
    return CheckedCIFAR10(root, train=train, transform=transform)


class CifarTensors(torch.utils.data.Dataset):
    """A split read once by torchvision's class (its md5 checks, its unpickling), held as one
    uint8 tensor [N, 3, 32, 32] (a view of the reader's array, no copy), transformed on
    tensors a batch at a time: the DataLoader fetches a batch's indices with one
    ``__getitems__`` call, so ``transform`` runs once per batch instead of once per PIL image
    (23 % of a tiny CIFAR epoch waited for data that way, measured 2026-11-26). The
    per-channel arithmetic is the same element by element as on a single image.
    ``per_sample=True`` (random augmentation) transforms each image on its own, so each
    gets its own random crop and flip, still without PIL."""

    def __init__(self, source: CIFAR10, transform, per_sample: bool = False) -> None:
        self.images = torch.from_numpy(source.data).permute(0, 3, 1, 2)
        self.targets = torch.as_tensor(source.targets)
        self.transform, self.per_sample = transform, per_sample

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self._plain(self.transform(self.images[index])), int(self.targets[index])

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        if self.per_sample:
            return [self[i] for i in indices]
        chosen = torch.as_tensor(indices)
        images = self._plain(self.transform(self.images[chosen]))
        return list(zip(images.unbind(0), self.targets[chosen].tolist()))

    @staticmethod
    def _plain(image) -> torch.Tensor:
        return image.as_subclass(torch.Tensor)  # a tv_tensors.Image out of v2: plain again
