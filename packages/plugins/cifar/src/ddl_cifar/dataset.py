"""Opening CIFAR-10 splits with torchvision's own reader.

Real data: ``torchvision.datasets.CIFAR10(root, train=..., download=False)`` itself, with its
official md5 checks. Synthetic data (marked by ``SYNTHETIC.txt``): :class:`SyntheticCIFAR10`,
the same class with the md5 sums it checks taken from the set's ``synthetic.md5`` manifest
instead of the official ones. Nothing else changes: the same ``_check_integrity``, the same
unpickling (``encoding="latin1"``), the same [N, 3072] -> [N, 32, 32, 3] reshape and PIL
images, the same ``batches.meta`` reading. Bypassing the check (md5 ``None``) would have been
simpler, but then a damaged synthetic file would go unnoticed by the reader.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torchvision.datasets import CIFAR10

from ddl_cifar import data


class SyntheticCIFAR10(CIFAR10):
    """torchvision's CIFAR10 checking a synthetic set's own md5 sums."""

    def __init__(self, root, md5: dict[str, str], **kwargs) -> None:
        # Instance attributes shadow the class's official lists that _check_integrity and
        # _load_meta read; set before CIFAR10.__init__ runs its checks.
        self.train_list = [[name, md5[name]] for name, _ in CIFAR10.train_list]
        self.test_list = [[name, md5[name]] for name, _ in CIFAR10.test_list]
        self.meta = {**CIFAR10.meta, "md5": md5[CIFAR10.meta["filename"]]}
        super().__init__(root, **kwargs)


def open_split(data_dir: Path, *, train: bool, transform=None) -> CIFAR10:
    """The training (data_batch_1..5) or test (test_batch) split, never downloading."""
    root = str(data_dir)
    if data.is_synthetic(data_dir):
        return SyntheticCIFAR10(root, data.read_manifest(data_dir), train=train,
                                transform=transform, download=False)
    return CIFAR10(root, train=train, transform=transform, download=False)


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
