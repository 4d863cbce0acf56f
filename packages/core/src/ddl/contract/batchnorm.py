"""Ghost BatchNorm: BatchNorm whose result does not depend on how a pipeline cuts a batch.

Plain BatchNorm normalises whatever slice of the batch it is given with that slice's own
mean and variance, so a pipeline stage fed M microbatches of B/M samples computes something
else than one process with B samples: a property of BatchNorm, not an error of the strategy,
but it makes "same numbers as one process" impossible to check. :class:`GhostBatchNorm2d`
takes its statistics over fixed consecutive groups of ``group`` samples ("ghost batch
normalisation", Hoffer, Hubara, Soudry, NeurIPS 2017): a microbatch that is a whole number of
groups is normalised exactly as inside the full batch, and the running statistics are
updated group by group in the same order. It equals ``nn.BatchNorm2d`` in evaluation mode.

Workloads build plain BatchNorm and call :func:`convert` when a preset asks for ghost BN.
For data parallelism the core has ``--sync-bn`` (statistics over all ranks, any workload:
ddl.worker.build.sync_bn), so no workload needs a variant for that. Imports torch: not for the
CLI's fast paths.
"""

from __future__ import annotations

import torch
from torch import nn

KINDS = ("plain", "ghost")


class GhostBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm with training statistics over consecutive groups of ``group`` samples (a
    last, smaller group takes what is left). Running statistics see one update per group."""

    def __init__(self, num_features: int, group: int, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        if group < 1:
            raise ValueError(f"GhostBatchNorm2d: group must be >= 1, got {group}")
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or x.shape[0] <= self.group:
            return super().forward(x)
        return torch.cat([super(GhostBatchNorm2d, self).forward(part)
                          for part in x.split(self.group)])

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group={self.group}"


def convert(module: nn.Module, kind: str, group: int | None = None) -> nn.Module:
    """Replace every plain ``nn.BatchNorm2d`` under ``module`` by the ``kind`` variant,
    keeping its settings, parameters and running statistics (like torch's
    ``SyncBatchNorm.convert_sync_batchnorm``). Returns the (possibly new) module."""
    if kind not in KINDS:
        raise ValueError(f"batchnorm kind {kind!r}; allowed: {', '.join(KINDS)}")
    if kind == "ghost" and not group:
        raise ValueError("ghost batchnorm needs a group size")
    if kind == "plain":
        return module
    if type(module) is nn.BatchNorm2d:
        settings = dict(eps=module.eps, momentum=module.momentum, affine=module.affine,
                        track_running_stats=module.track_running_stats,
                        device=(module.weight.device if module.affine else None),
                        dtype=(module.weight.dtype if module.affine else None))
        new = GhostBatchNorm2d(module.num_features, group, **settings)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        replacement = convert(child, kind, group)
        if replacement is not child:
            setattr(module, name, replacement)
    return module
