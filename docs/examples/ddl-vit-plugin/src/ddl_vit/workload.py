"""The workload: image classification with a small ViT, AdamW with weight-decay groups,
and every parallelism hint."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from ddl.contract.errors import DataError, DataMissing, UsageError
from ddl.contract.workload import Workload
from ddl_vit import data
from ddl_vit.model import Attention, Stage, ViT

MEAN, STD = 0.5, 0.2  # of the generated pixels, roughly: inputs near zero mean, unit scale


class VitWorkload(Workload):
    def _option(self, key: str) -> int:
        return int(self.preset.options[key])

    # --- data -------------------------------------------------------------------------
    def check_data(self, data_dir: Path) -> None:
        missing = data.missing_files(data_dir)
        if missing:
            raise DataMissing(f"{data.dataset_dir(data_dir)} lacks {', '.join(missing)}; run "
                              f"`ddl prepare --plugin vit --synthetic --data-dir {data_dir}`")

    def prepare(self, data_dir: Path, *, synthetic: bool) -> Path:
        if not synthetic:
            raise DataError("vit has no download: its images are generated; use --synthetic")
        return data.write_synthetic(data_dir)

    def is_synthetic(self, data_dir: Path) -> bool:
        return (data.dataset_dir(data_dir) / data.MARKER).exists()

    def datasets(self, data_dir: Path) -> dict[str, Dataset]:
        limits = {"train": self._option("train_images"), "val": self._option("eval_images"),
                  "test": self._option("eval_images")}
        splits = {}
        for split, limit in limits.items():
            try:
                images, labels = data.read(data_dir, split, limit, self._option("image_size"))
            except ValueError as exc:
                raise DataError(f"{exc}; regenerate it with `ddl prepare --plugin vit "
                                "--synthetic`") from None
            splits[split] = TensorDataset((torch.from_numpy(images) - MEAN) / STD,
                                          torch.from_numpy(labels))
        return splits

    # --- model, loss, metrics -----------------------------------------------------------
    def build_model(self) -> nn.Module:
        return ViT(self._option("image_size"), self._option("patch"), data.CHANNELS,
                   data.CLASSES, self._option("d_model"), self._option("heads"),
                   self._option("blocks"))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def sample_metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        return {"loss": F.cross_entropy(outputs, targets, reduction="none"),
                "accuracy": (outputs.argmax(1) == targets).float()}

    # --- optimisation -------------------------------------------------------------------
    def param_groups(self, named: list[tuple[str, nn.Parameter]]) -> list[dict]:
        """Weight decay on the matrices (Linear and patch-embedding weights), not on
        biases, norms, the class token or the positions (timm's rule)."""
        decays = {name: name.endswith(".weight") and ".ln" not in name
                  and not name.startswith("norm.") for name, _ in named}
        return [{"params": [p for n, p in named if decays[n]], "weight_decay": 0.05},
                {"params": [p for n, p in named if not decays[n]], "weight_decay": 0.0}]

    def optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=lr)

    def flops_per_sample(self) -> float:
        d, blocks = self._option("d_model"), self._option("blocks")
        patch, patches = self._option("patch"), (self._option("image_size")
                                                 // self._option("patch")) ** 2
        tokens = patches + 1
        macs = (tokens * blocks * 12 * d * d  # q, k, v, out, fc, proj
                + blocks * 2 * tokens * tokens * d  # scores and their weighted sum
                + patches * patch * patch * data.CHANNELS * d + d * data.CLASSES)
        return 6.0 * macs  # 2 FLOPs per multiply-add, x3 with the backward

    # --- parallelism hints ----------------------------------------------------------------
    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return list(model.blocks)

    def tp_plan(self, model: nn.Module) -> dict[str, str]:
        """Megatron pairs: q, k, v and the MLP's first layer split by output columns, the
        attention's and the MLP's output projections by input rows."""
        return {"blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise",
                "blocks.*.attn.v": "colwise", "blocks.*.attn.out": "rowwise",
                "blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise"}

    def prepare_tensor_parallel(self, model: nn.Module, tp_degree: int) -> None:
        """In place: each rank computes heads / tp_degree of every attention's heads."""
        for module in model.modules():
            if isinstance(module, Attention):
                if module.heads % tp_degree:
                    raise UsageError(f"tensor parallel degree {tp_degree} does not divide "
                                     f"vit's {module.heads} attention heads; allowed: a "
                                     "divisor of the heads")
                module.heads //= tp_degree

    def pipeline_splits(self, model: nn.Module) -> list[str]:
        return [f"blocks.{i}" for i in range(1, len(model.blocks))]

    def pipeline_stages(self, model: nn.Module, n_stages: int) -> list[nn.Module]:
        """Runs of blocks as even as they come; names kept (see ddl_vit.model.Stage). The
        default cut (top-level children in order) fits neither the blocks (one ModuleList)
        nor the class token and positions (parameters of the model itself, no child's)."""
        n_blocks = len(model.blocks)
        if not 1 <= n_stages <= n_blocks:
            raise UsageError(f"{n_stages} pipeline stages for vit's {n_blocks} blocks; "
                             f"allowed: 1 to {n_blocks} stages")
        cuts = [round(i * n_blocks / n_stages) for i in range(n_stages + 1)]
        return [Stage(model, start, stop) for start, stop in pairwise(cuts)]
