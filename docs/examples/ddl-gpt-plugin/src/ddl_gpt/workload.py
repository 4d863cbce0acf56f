"""The workload: next-character prediction with a small GPT, AdamW with weight-decay
groups, perplexity derived from the exact mean loss, and every parallelism hint."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from ddl.contract.errors import DataError, DataMissing, UsageError
from ddl.contract.workload import Workload
from ddl_gpt import corpus
from ddl_gpt.model import GPT, Attention, Stage


class Windows(Dataset):
    """Consecutive windows of ``context + 1`` tokens: inputs are the first ``context``,
    targets the same shifted by one."""

    def __init__(self, ids: list[int], context: int) -> None:
        self.ids, self.context = torch.tensor(ids, dtype=torch.long), context

    def __len__(self) -> int:
        return max(0, (len(self.ids) - 1) // self.context)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} of {len(self)}")
        chunk = self.ids[index * self.context: (index + 1) * self.context + 1]
        return chunk[:-1], chunk[1:]


class GptWorkload(Workload):
    def _option(self, key: str) -> int:
        return int(self.preset.options[key])

    # --- data -------------------------------------------------------------------------
    def check_data(self, data_dir: Path) -> None:
        missing = corpus.missing_files(data_dir)
        if missing:
            raise DataMissing(f"{corpus.dataset_dir(data_dir)} lacks {', '.join(missing)}; run "
                              f"`ddl prepare --plugin chargpt --synthetic --data-dir {data_dir}`")

    def prepare(self, data_dir: Path, *, synthetic: bool) -> Path:
        if not synthetic:
            raise DataError("chargpt has no official download; use --synthetic")
        return corpus.write_synthetic(data_dir)

    def is_synthetic(self, data_dir: Path) -> bool:
        return (corpus.dataset_dir(data_dir) / corpus.MARKER).exists()

    def datasets(self, data_dir: Path) -> dict[str, Dataset]:
        limits = {"train": self._option("train_chars"), "val": self._option("eval_chars"),
                  "test": self._option("eval_chars")}
        splits = {}
        for split, limit in limits.items():
            try:
                ids = corpus.read(corpus.dataset_dir(data_dir) / f"{split}.txt", limit)
            except ValueError as exc:
                raise DataError(f"{exc}; regenerate it with `ddl prepare --plugin chargpt "
                                "--synthetic`") from None
            splits[split] = Windows(ids, self._option("context"))
        return splits

    # --- model, loss, metrics -----------------------------------------------------------
    def build_model(self) -> nn.Module:
        return GPT(len(corpus.ALPHABET), self._option("context"), self._option("d_model"),
                   self._option("heads"), self._option("blocks"))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())

    def sample_metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
        per_token = F.cross_entropy(outputs.transpose(1, 2), targets, reduction="none")
        hits = (outputs.argmax(-1) == targets).float()
        return {"loss": per_token.mean(1), "accuracy": hits.mean(1)}  # equal-length samples

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        return {"perplexity": math.exp(means["loss"])}  # of the exact mean, not per sample

    # --- optimisation -------------------------------------------------------------------
    def param_groups(self, named: list[tuple[str, nn.Parameter]]) -> list[dict]:
        """Weight decay on the matrices of the blocks only (not biases, norms, embeddings)."""
        decays = {name: name.startswith("blocks.") and name.endswith(".weight")
                  and ".ln" not in name for name, _ in named}
        return [{"params": [p for n, p in named if decays[n]], "weight_decay": 0.1},
                {"params": [p for n, p in named if not decays[n]], "weight_decay": 0.0}]

    def optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))

    def flops_per_sample(self) -> float:
        d, blocks, t = self._option("d_model"), self._option("blocks"), self._option("context")
        matmul_params = blocks * 12 * d * d + len(corpus.ALPHABET) * d
        return 6.0 * matmul_params * t  # 2 FLOPs per multiply-add, x3 with the backward

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
                                     f"chargpt's {module.heads} attention heads; allowed: a "
                                     "divisor of the heads")
                module.heads //= tp_degree

    def pipeline_splits(self, model: nn.Module) -> list[str]:
        return [f"blocks.{i}" for i in range(1, len(model.blocks))]

    def pipeline_stages(self, model: nn.Module, n_stages: int) -> list[nn.Module]:
        """Runs of blocks as even as they come; names kept (see ddl_gpt.model.Stage). The
        default cut (top-level children in order) could not keep the tied head."""
        n_blocks = len(model.blocks)
        if not 1 <= n_stages <= n_blocks:
            raise UsageError(f"{n_stages} pipeline stages for chargpt's {n_blocks} blocks; "
                             f"allowed: 1 to {n_blocks} stages")
        cuts = [round(i * n_blocks / n_stages) for i in range(n_stages + 1)]
        return [Stage(model, start, stop) for start, stop in pairwise(cuts)]
