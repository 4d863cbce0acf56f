"""Metric sums that are exact across ranks.

Each rank adds per-sample values (and a sample count) on its device; one all-reduce at the
end of an epoch turns them into global means. No per-step synchronisation is needed, and an
uneven last shard is weighted correctly.
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
        self._count = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, per_sample: dict[str, torch.Tensor], weight: torch.Tensor | None = None) -> None:
        """Add per-sample values; ``weight`` (0/1 per sample) masks padding."""
        for name, values in per_sample.items():
            values = values.detach().to(torch.float64)
            if weight is not None:
                values = values * weight
            total = self._sums.setdefault(name, torch.zeros((), dtype=torch.float64,
                                                            device=self.device))
            total += values.sum()
        any_values = next(iter(per_sample.values()))
        self._count += weight.sum() if weight is not None else any_values.shape[0]

    def reduce(self, world: World) -> dict[str, float]:
        """Global means over every sample on every rank (a collective: all ranks call it).

        Ranks may hold different metrics or none at all (under pipeline parallelism only
        the last stage sees outputs), so the names are agreed first."""
        names = sorted(self._sums)
        if world.size > 1:
            everyone: list = [None] * world.size
            dist.all_gather_object(everyone, names)
            names = sorted(set().union(*everyone))
        for name in names:
            self._sums.setdefault(name, torch.zeros((), dtype=torch.float64, device=self.device))
        packed = torch.stack([self._sums[n] for n in names] + [self._count])
        if world.size > 1:
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        count = packed[-1].item()
        return {n: (packed[i].item() / count if count else float("nan"))
                for i, n in enumerate(names)}
