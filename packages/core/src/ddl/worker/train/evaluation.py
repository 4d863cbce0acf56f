"""Exact evaluation over a split, however it is sharded over the ranks.

The evaluation sampler pads each rank's shard to the same length (every rank must run the
same number of forwards for FSDP and tensor parallel), so the padded positions get weight zero
and the sums over all ranks cover each sample of the split exactly once.
"""

from __future__ import annotations

from typing import Any

import torch

from ddl.contract.workload import Workload
from ddl.contract.world import World
from ddl.worker.train.metrics import MetricSums


def evaluate(step, loader, workload: Workload, world: World) -> dict[str, float]:
    """Exact metrics over a split: ``step(inputs, targets)`` gives outputs (or None on ranks
    without any); padding positions of the shard get weight zero."""
    sums = MetricSums(world.device)
    real = loader.sampler.real  # positions beyond this on this rank are padding
    position = 0
    with torch.no_grad():
        for batch in loader:
            inputs, targets = workload.to_device(batch, world.device)
            outputs = step(inputs, targets)
            n = _batch_len(targets)
            if outputs is not None:
                per_sample = workload.sample_metrics(outputs, targets)
                positions = torch.arange(position, position + n, device=world.device)
                sums.add(per_sample, weight=(positions < real).to(torch.float64))
            position += n
    return with_derived(sums.reduce(world), workload)


def with_derived(means: dict[str, float], workload: Workload) -> dict[str, float]:
    """The means over all samples plus what the workload derives from them (an object that
    only quacks like a Workload may lack the method: nothing derived)."""
    derive = getattr(workload, "derived_metrics", None)
    return {**means, **derive(dict(means))} if means and derive else means


def _batch_len(targets: Any) -> int:
    if isinstance(targets, dict):
        targets = next(iter(targets.values()))
    return targets.shape[0] if hasattr(targets, "shape") else len(targets)


def fmt(metrics: dict[str, float]) -> str:
    """Metrics as one log fragment: ``accuracy 0.9042 loss 0.2720``."""
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
