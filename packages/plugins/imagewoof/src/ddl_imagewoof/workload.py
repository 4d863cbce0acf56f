"""Imagewoof with an xresnet50: the example of the JSC intro talk (fastai's
``nbs/examples/distrib.py``).

The course script: Imagewoof 320 px from fastai's archive, ImageFolder-style train/val
folders; RandomResizedCrop(160) and a horizontal flip (p = 0.5); ImageNet normalisation;
batch 64 per GPU; ``xresnet50(n_out=10)``; fp16; metrics accuracy and top-k accuracy
(k = 5). The talk trains 6 epochs.

What this workload does (and where it differs, see docs/workloads/imagewoof.md):

* Model: :mod:`ddl_imagewoof.model` (own implementation of fastai's xresnet, no fastai).
* Data: ``torchvision.datasets.ImageFolder`` on ``imagewoof2-320/{train,val}`` with its
  default PIL loader (``torchvision.io``'s JPEG decoder was ~1.5x faster here, but is
  deprecated since torchvision 0.29 in favour of TorchCodec), transforms from
  ``torchvision.transforms.v2``:
  train RandomResizedCrop(size) (scale 0.08-1, fastai's default too) + flip + normalise;
  eval Resize(size, shorter side) + CenterCrop(size) + normalise (fastai crops the centre
  of validation images in the same way).
* Splits: Imagewoof has no test split, so its ``val`` folder is the ``test`` split and every
  10th image of ``train`` (in ImageFolder's sorted order: stratified per class, fixed) is
  held out as ``val``. Held-out images get the eval transform.
* By default the images are read from a decode cache (:mod:`ddl_imagewoof.decode_cache`,
  built on first use) and cropped, flipped and normalised per batch on the device in
  :meth:`ImagewoofWorkload.to_device`, with crops drawn from (seed, epoch, sample index):
  the same pixels on any layout. On the JPEG path (option ``decode_cache=False`` or
  ``DDL_IMAGEWOOF_CACHE=off``) the transforms above run in the loader, and randomness comes
  from each rank's own torch RNG (the trainer seeds rank r with seed + r; DataLoader workers
  derive theirs from it), so runs of different layouts match in data order, not in pixels.
  The ``augment=False`` option (presets tiny-exact, tiny-ghostbn) trains on the eval
  crop instead.
* BatchNorm is per rank and per microbatch, as in fastai. ``--sync-bn`` (the core's) takes
  its statistics over all data-parallel ranks; the ``batchnorm="ghost"`` option with
  ``bn_group`` swaps in :mod:`ddl.contract.batchnorm`'s ghost BN for pipelines, so that runs
  of any layout compute what one process does (the equivalence tests).
* Optimizer: fastai's default, Adam with decoupled weight decay (= AdamW, betas
  (0.9, 0.99), eps 1e-5, weight decay 0.01, none on BatchNorm and bias parameters), at a
  constant learning rate 1e-3 (the course uses ``fit_flat_cos``; see the docs for why the
  cosine tail is not reproduced).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Subset

from ddl.contract.errors import DataError
from ddl.contract.fast_optim import fused_on_gpu
from ddl.contract.workload import Workload
from ddl_imagewoof import data
from ddl_imagewoof.cached_folder import EpochSubset, open_folder
from ddl_imagewoof.device_crops import crop_batch
from ddl_imagewoof.model import XResNet, XResNetConfig, scaled_config, train_flops_per_sample

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VAL_EVERY = 10  # every 10th training image is held out for validation
TOP_K = 5  # fastai's top_k_accuracy default


def transforms(image_size: int, train: bool):
    """PIL image in (ImageFolder's loader converts to RGB), normalised float tensor out.
    ``train`` adds the random crop and flip."""
    from torchvision.transforms import v2

    geometry = ([v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip(0.5)]
                if train else [v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)])
    return v2.Compose([*geometry, v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def _spread(indices: list[int], n: int | None) -> list[int]:
    """n indices evenly spread over ``indices`` (keeps every class when capping a split)."""
    if n is None or n >= len(indices):
        return indices
    return [indices[(i * len(indices)) // n] for i in range(n)]


class ImagewoofWorkload(Workload):
    data_module = "ddl_imagewoof.data"
    synthetic_module = "ddl_imagewoof.synthetic"
    channels_last = True  # NHWC convolutions on CUDA (ddl.contract.workload)

    def __init__(self, preset) -> None:
        super().__init__(preset)
        options = preset.options
        self.image_size = int(options.get("image_size", 160))
        config = XResNetConfig(n_out=len(data.WNIDS))
        if "width_divisor" in options or "layers" in options:
            config = scaled_config(config, int(options.get("width_divisor", 1)),
                                   options.get("layers", config.layers))
        self.model_config = config
        self.augment = bool(options.get("augment", True))
        self.batchnorm = options.get("batchnorm", "plain")
        self.bn_group = options.get("bn_group")
        # the decode cache (docs/workloads/imagewoof.md): off reads the JPEGs per epoch
        self.decode_cache = bool(options.get("decode_cache", True))
        self.canvas = options.get("cache_size")  # None: cached_folder.canvas_size

    # --- data -------------------------------------------------------------------------
    def datasets(self, data_dir: Path) -> dict:
        from torchvision.datasets import ImageFolder

        top = data.root(data_dir)

        def folder(split: str, train: bool) -> ImageFolder:
            ds = ImageFolder(str(top / split), transform=transforms(self.image_size, train),
                             is_valid_file=data.is_jpeg_name)
            if ds.classes != list(data.WNIDS):  # check_data ran, but be sure of the labels
                raise DataError(f"{top / split} has class folders {ds.classes}, expected "
                                f"{list(data.WNIDS)}; {data.fix_hint(data_dir)}")
            return ds

        train_folder = folder("train", train=self.augment)
        held_out = copy.copy(train_folder)  # same file list, eval transform
        held_out.transform = transforms(self.image_size, train=False)
        test_folder = folder("val", train=False)
        subset = Subset
        if self.decode_cache:
            cached = self._cached(train_folder, test_folder, data_dir)
            if cached is not None:
                (train_folder, held_out, test_folder), subset = cached, EpochSubset

        n = len(train_folder)
        train_idx = [i for i in range(n) if i % VAL_EVERY != VAL_EVERY - 1]
        val_idx = [i for i in range(n) if i % VAL_EVERY == VAL_EVERY - 1]
        test_idx = list(range(len(test_folder)))
        options = self.preset.options
        train_idx = _spread(train_idx, options.get("train_samples"))
        val_idx = _spread(val_idx, options.get("eval_samples"))
        test_idx = _spread(test_idx, options.get("eval_samples"))
        return {"train": subset(train_folder, train_idx), "val": Subset(held_out, val_idx),
                "test": Subset(test_folder, test_idx)}

    def _cached(self, train_folder, test_folder, data_dir: Path) -> tuple | None:
        """train, held-out and test read from the decode cache (the held-out images share
        the train cache), or None where the cache is off or cannot be written."""
        train = open_folder(train_folder, "train", self.image_size, data_dir,
                            canvas=self.canvas, train=self.augment)
        if train is None:
            return None
        test = open_folder(test_folder, "val", self.image_size, data_dir, canvas=self.canvas,
                           train=False)
        if test is None:
            return None
        held_out = copy.copy(train)
        held_out.train = False
        return train, held_out, test

    def to_device(self, batch, device: torch.device):
        """Move a batch; a decode-cache batch ((canvases, boxes), labels) is cropped,
        flipped and normalised here, on the device, after the (uint8) copy."""
        inputs, targets = batch
        targets = targets.to(device, non_blocking=True)
        if isinstance(inputs, (list, tuple)):
            canvases, boxes = (t.to(device, non_blocking=True) for t in inputs)
            return crop_batch(canvases, boxes, self.image_size), targets
        return inputs.to(device, non_blocking=True), targets

    # --- model, loss, metrics -----------------------------------------------------------
    def build_model(self) -> nn.Module:
        from ddl.contract.batchnorm import convert

        return convert(XResNet(self.model_config), self.batchnorm, self.bn_group)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def sample_metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        k = min(TOP_K, outputs.shape[1])
        top = outputs.topk(k, dim=1).indices
        return {"loss": F.cross_entropy(outputs.float(), targets, reduction="none"),
                "accuracy": (top[:, 0] == targets).to(torch.float32),
                "top5_accuracy": (top == targets[:, None]).any(dim=1).to(torch.float32)}

    def optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        """fastai's default optimizer: Adam, betas (0.9, 0.99), eps 1e-5, decoupled weight
        decay 0.01 (Loshchilov & Hutter 2019) on weights only - not on BatchNorm or bias
        parameters (fastai's ``wd_bn_bias=False``; "no bias decay" in Bag of Tricks, sec.
        3.1). Those are told apart by shape (1-D), as parameters arrive without names."""
        params = list(params)
        decay = [p for p in params if p.ndim > 1]
        no_decay = [p for p in params if p.ndim <= 1]
        groups = [{"params": decay, "weight_decay": 0.01},
                  {"params": no_decay, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), eps=1e-5,
                                 **fused_on_gpu(groups))

    # --- measurement and parallelism hints ------------------------------------------------
    def flops_per_sample(self) -> float:
        """3 x 2 x the forward multiply-accumulates of convolutions and the linear layer at
        the preset's input size (see ddl_imagewoof.model.forward_macs)."""
        return train_flops_per_sample(self.model_config, self.image_size)

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """Every residual block (16 in xresnet50): blocks differ ~60x in size from stage 1
        to stage 4, and sharding per block keeps the largest all-gathered unit at one
        stage-4 block (4.5 M parameters) instead of a whole stage (15 M)."""
        return _unwrap(model).blocks()

    def pipeline_splits(self, model: nn.Module) -> list[str]:
        """Stage boundaries: stem + stage1 | stage2 | stage3 | stage4 + head."""
        return ["stage2", "stage3", "stage4"]

    def pipeline_costs(self, model: nn.Module) -> list[float]:
        """Forward multiply-adds per segment (model.forward_macs_by_part): stage 4 holds
        most parameters but not most of the work, so the cut balances the work."""
        from ddl_imagewoof.model import forward_macs_by_part

        stem, *stages, head = forward_macs_by_part(self.model_config, self.image_size)
        return [stem + stages[0], *stages[1:-1], stages[-1] + head]


def _unwrap(model: nn.Module) -> XResNet:
    while not isinstance(model, XResNet) and hasattr(model, "module"):
        model = model.module
    if not isinstance(model, XResNet):
        raise TypeError(f"expected the Imagewoof XResNet, got {type(model).__name__}")
    return model
