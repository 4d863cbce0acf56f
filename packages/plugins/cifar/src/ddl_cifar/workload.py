"""CIFAR-10 with ResNet50 v2, the BSC CTE-POWER hands-on (Jordi Torres' "Fundamentals of DL").

The course trains ``tf.keras.applications.ResNet50V2(weights=None, input_shape=(128, 128, 3),
classes=10)`` with SGD (lr 0.01 x GPUs, no momentum: Keras' default) and sparse categorical
cross-entropy for 5 epochs at batch 256 per GPU, and reports epoch time, images/s and
speedup. The model is :mod:`ddl_cifar.model` (the same network in PyTorch).

Data: torchvision's CIFAR10 reading the official ``cifar-10-batches-py`` batches
(:mod:`ddl_cifar.dataset`), held in memory as one uint8 tensor and transformed on tensors a
batch at a time (``CifarTensors``; 150 MB for the 50000 training images). CIFAR-10 has no validation split, so the last 10 % of the 50000
training images (the second half of data_batch_5) is held out as ``val``, fixed. Images are
resized from 32x32 to the preset's size (128 for the course) with bilinear, antialiased
``transforms.v2.Resize`` and normalised with the training set's per-channel mean and std.
The course's own loader (a ``cifar-utils`` module on the BSC file system) is not public;
whether it normalised is not known.

Augmentation (``augment`` option: 4-pixel padded random crop and horizontal flip, the usual
CIFAR recipe) is off in every preset, as nothing says the course used it; it draws from each
rank's own random stream, so runs with it on are not comparable across world sizes.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ddl.contract.fast_optim import fused_on_gpu
from ddl.contract.workload import Workload
from ddl_cifar import data, model

VAL_FRACTION = 0.1
# Per-channel mean and (population) std of the 50000 real training images, on the 0..1
# scale. The often copied (0.2023, 0.1994, 0.2010) is the mean of per-image stds instead.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


class CifarWorkload(Workload):
    # --- data -------------------------------------------------------------------------
    data_module = "ddl_cifar.data"
    synthetic_module = "ddl_cifar.synthetic"
    channels_last = True  # NHWC convolutions on CUDA (ddl.contract.workload)

    def transforms(self, train: bool):
        from torchvision.transforms import v2

        size = int(self.preset.options.get("image_size", 128))
        steps = [v2.ToImage()]
        if train and self.preset.options.get("augment", False):
            steps += [v2.RandomCrop(data.SIDE, padding=4), v2.RandomHorizontalFlip()]
        if size != data.SIDE:
            steps.append(v2.Resize((size, size), antialias=True))
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
        return v2.Compose(steps)

    def datasets(self, data_dir: Path) -> dict:
        from ddl_cifar.dataset import CifarTensors, open_split

        train_split, test_split = (open_split(data_dir, train=t) for t in (True, False))
        augment = bool(self.preset.options.get("augment", False))
        full_train = CifarTensors(train_split, self.transforms(train=True), per_sample=augment)
        full_val = CifarTensors(train_split, self.transforms(train=False))
        test = CifarTensors(test_split, self.transforms(train=False))
        return self.holdout_splits(full_train, test, VAL_FRACTION, val_view=full_val)

    # --- model, loss, metrics -----------------------------------------------------------
    @property
    def arch(self) -> model.Arch:
        return model.Arch.from_options(self.preset.options)

    def build_model(self) -> nn.Module:
        return model.build(self.preset.options)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)  # Keras' sparse_categorical_crossentropy

    def sample_metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        return {"loss": F.cross_entropy(outputs, targets, reduction="none"),
                "accuracy": (outputs.argmax(dim=1) == targets).to(torch.float32)}

    def optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        """The course's ``tf.keras.optimizers.SGD(lr)``: plain SGD, no momentum, no decay."""
        params = list(params)
        return torch.optim.SGD(params, lr=lr, **fused_on_gpu(params))

    # --- measurement and parallelism hints ------------------------------------------------
    def flops_per_sample(self) -> float:
        """Convolution and dense multiply-adds at the preset's input size, x2 FLOPs, x3 for
        forward + backward (derivation: model.forward_macs, docs/workloads/cifar.md)."""
        return model.train_flops_per_sample(self.arch, int(self.preset.options.get("image_size", 128)))

    def fsdp_units(self, net: nn.Module) -> list[nn.Module]:
        """Every bottleneck block. Stages would be too coarse: conv4 of ResNet152 holds 40.6 M
        of its 58.2 M parameters, so a stage-sized unit would barely shard peak memory."""
        return [block for stage in net.stages for block in stage]

    def pipeline_splits(self, net: nn.Module) -> list[str]:
        """Stage boundaries: stem+conv2 | conv3 | conv4 | conv5+head. The forward pass is
        stem -> stages.0..3 -> head, so each split is a clean cut of one activation tensor."""
        return [f"stages.{i}" for i in range(1, len(net.stages))]

    def pipeline_costs(self, net: nn.Module) -> list[float]:
        """Forward multiply-adds per segment (stem + conv2 | conv3 | conv4 | conv5 + head,
        :func:`model.forward_macs_by_part`): a ResNet's late stages hold most parameters
        but not most of the work, so the cut balances the work."""
        parts = model.forward_macs_by_part(
            self.arch, int(self.preset.options.get("image_size", 128)))
        stem, *stages, head = parts
        return [stem + stages[0], *stages[1:-1], stages[-1] + head] if len(stages) > 1 \
            else [stem + stages[0] + head]

    def pipeline_stages(self, net: nn.Module, n_stages: int) -> list[nn.Module]:
        """The core's default cuts top-level children only; the split points here are one
        level down (``stages.i``), so cut with :func:`model.pipeline_pieces` at the points
        the core chooses (:meth:`pipeline_cut`, balanced by :meth:`pipeline_costs`)."""
        return model.pipeline_pieces(net, set(self.pipeline_cut(net, n_stages)))
