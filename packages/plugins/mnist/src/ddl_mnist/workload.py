"""MNIST with the CNN of the BSC CTE-POWER hands-on (Jordi Torres' "Fundamentals of DL").

Model: Conv 32 5x5 + ReLU, MaxPool 2, Conv 64 5x5 + ReLU, MaxPool 2, Dense 10 — the course's
Keras model in PyTorch ('valid' convolutions: 28 -> 24 -> 12 -> 8 -> 4). The course trains
5 epochs at batch 100 and reports ~96.7 % test accuracy on the real MNIST.

Data: torchvision's MNIST class reading the official idx files (``<data>/MNIST/raw``), the
images then converted and normalised once, as one batch, into a float tensor
(:class:`DecodedImages`; 188 MB for the 60k training images). The same torchvision
transform as per sample, so the values are the same bits; a sample is then an index into a
tensor instead of a per-sample transform (measured: docs/testing.md). MNIST
has no validation split, so the last 10 % of the training file is held out as ``val``
(fixed, not shuffled), like Keras' ``validation_split``.

Optimizer: Adam, lr 1e-3 (our choice: the course material we have does not record its
optimizer; Adam reaches the course's accuracy within its 5 epochs).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ddl.contract.fast_optim import fused_on_gpu
from ddl.contract.workload import Workload

VAL_FRACTION = 0.1
MEAN, STD = 0.1307, 0.3081  # of the real MNIST training set, as in torchvision's examples


class MnistCNN(nn.Module):
    """Four top-level children applied in order, so pipeline stages can cut between them
    (up to 4 stages: the last two are light, which the bubble shows, but 4 pipeline ranks
    can train it)."""

    def __init__(self, channels: tuple[int, int] = (32, 64)) -> None:
        super().__init__()
        c1, c2 = channels
        self.block1 = nn.Sequential(nn.Conv2d(1, c1, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2))
        self.block2 = nn.Sequential(nn.Conv2d(c1, c2, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2))
        self.flatten = nn.Flatten()
        self.head = nn.Linear(c2 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # logits; softmax is inside the loss
        return self.head(self.flatten(self.block2(self.block1(x))))


class DecodedImages(torch.utils.data.Dataset):
    """A torchvision image data set held in memory, its images transformed once as one
    batch: ``(image, label)`` like the data set it was made from."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, transform) -> None:
        self.images = transform(images.unsqueeze(1)).as_subclass(torch.Tensor)  # N x 1 x H x W
        self.targets = targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.targets[index])


class MnistWorkload(Workload):
    data_module = "ddl_mnist.data"
    synthetic_module = "ddl_mnist.synthetic"

    def datasets(self, data_dir: Path) -> dict:
        from torchvision import datasets
        from torchvision.transforms import v2

        transform = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                v2.Normalize((MEAN,), (STD,))])
        full_train, test = (datasets.MNIST(str(data_dir), train=train) for train in (True, False))
        return self.holdout_splits(DecodedImages(full_train.data, full_train.targets, transform),
                                   DecodedImages(test.data, test.targets, transform),
                                   VAL_FRACTION)

    def build_model(self) -> nn.Module:
        return MnistCNN(tuple(self.preset.options.get("channels", (32, 64))))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def sample_metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        return {"loss": F.cross_entropy(outputs, targets, reduction="none"),
                "accuracy": (outputs.argmax(dim=1) == targets).to(torch.float32)}

    def optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        params = list(params)
        return torch.optim.Adam(params, lr=lr, **fused_on_gpu(params))

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return [model.block1, model.block2]

    def pipeline_splits(self, model: nn.Module) -> list[str]:
        return ["block2", "flatten", "head"]

    def flops_per_sample(self) -> float:
        """Forward multiply-adds x 2 FLOPs, x 3 for forward + backward."""
        c1, c2 = self.preset.options.get("channels", (32, 64))
        macs = 24 * 24 * c1 * 25 + 8 * 8 * c2 * c1 * 25 + c2 * 16 * 10
        return 3 * 2 * macs
