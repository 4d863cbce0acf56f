"""The workload: an MLP of two hidden blocks and a linear head, mean squared error."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ddl.contract.errors import DataError, DataMissing
from ddl.contract.workload import Workload
from ddl_example import data


def build_mlp(width: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict(
        block1=nn.Sequential(nn.Linear(data.FEATURES, width), nn.Tanh()),
        block2=nn.Sequential(nn.Linear(width, width), nn.Tanh()),
        head=nn.Linear(width, 1),
    ))


class RegressionWorkload(Workload):
    def check_data(self, data_dir: Path) -> None:
        missing = data.missing_files(data_dir)
        if missing:
            raise DataMissing(
                f"{data.dataset_dir(data_dir)} lacks {', '.join(missing)}; run `ddl prepare "
                f"--plugin example --synthetic --data-dir {data_dir}`")

    def prepare(self, data_dir: Path, *, synthetic: bool) -> Path:
        if not synthetic:
            raise DataError("example has no official download; use --synthetic")
        return data.generate(data_dir)

    def is_synthetic(self, data_dir: Path) -> bool:
        return (data.dataset_dir(data_dir) / data.MARKER).exists()

    def datasets(self, data_dir: Path) -> dict:
        options = self.preset.options
        limits = {"train": options.get("train_rows"), "val": options.get("eval_rows"),
                  "test": options.get("eval_rows")}
        splits = {}
        for split, limit in limits.items():
            try:
                xs, ys = data.read(data.dataset_dir(data_dir) / f"{split}.csv", limit)
            except ValueError as exc:
                raise DataError(f"{exc}; regenerate it with `ddl prepare --plugin "
                                "example --synthetic`") from None
            splits[split] = TensorDataset(torch.tensor(xs), torch.tensor(ys).unsqueeze(1))
        return splits

    def build_model(self) -> nn.Module:
        return build_mlp(int(self.preset.options.get("width", 64)))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(outputs, targets)

    def sample_metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        error = (outputs - targets).squeeze(1)
        return {"loss": error.square(), "abs_error": error.abs()}

    def optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr)

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return [model.block1, model.block2]

    def flops_per_sample(self) -> float:
        width = int(self.preset.options.get("width", 64))
        macs = data.FEATURES * width + width * width + width
        return 3 * 2 * macs  # forward multiply-adds x 2 FLOPs, x 3 with the backward pass
