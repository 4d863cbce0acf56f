"""Metric sums that are exact across ranks.

Each rank adds per-sample values (and a sample count) on its device; one all-reduce at the
end of an epoch turns them into global means. No per-step synchronisation is needed, and an
uneven last shard is weighted correctly.

Cheap per step: the training loop adds after every optimizer step, so each metric costs
one reduction (``torch.sum`` in float64, which casts as it sums) and one in-place add; the
sample count of an unweighted batch is known on the host and stays a Python int.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from ddl.contract.world import World


class MetricSums:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sums: dict[str, torch.Tensor] = {}
        self._counted = 0  # samples of unweighted batches (known on the host)
        self._weighted: torch.Tensor | None = None  # the weights' sum, on the device

    def add(self, per_sample: dict[str, torch.Tensor], weight: torch.Tensor | None = None) -> None:
        """Add per-sample values; ``weight`` (0/1 per sample) masks padding."""
        for name, values in per_sample.items():
            values = values.detach()
            if weight is not None:
                values = values * weight
            total = torch.sum(values, dtype=torch.float64)
            kept = self._sums.get(name)
            if kept is None:
                self._sums[name] = total
            else:
                kept += total
        if weight is not None:
            weights = torch.sum(weight, dtype=torch.float64)
            self._weighted = weights if self._weighted is None else self._weighted + weights
        else:
            self._counted += next(iter(per_sample.values())).shape[0]

    def reduce(self, world: World) -> dict[str, float]:
        """Global means over every sample on every rank (a collective: all ranks call it).

        Ranks may hold different metrics or none at all (under pipeline parallelism only
        the last stage sees outputs), so the names are agreed first."""
        names = sorted(self._sums)
        if world.size > 1:
            everyone: list = [None] * world.size
            dist.all_gather_object(everyone, names)
            names = sorted(set().union(*everyone))
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        count = torch.full((), float(self._counted), dtype=torch.float64, device=self.device)
        if self._weighted is not None:
            count = count + self._weighted
        packed = torch.stack([self._sums.get(n, zero) for n in names] + [count])
        if world.size > 1:
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        total = packed[-1].item()
        return {n: (packed[i].item() / total if total else float("nan"))
                for i, n in enumerate(names)}
