"""BatchNorm whose result does not depend on how a batch is cut up.

Plain BatchNorm normalises whatever slice of the batch it is given with that slice's own
mean and variance. So N data-parallel replicas of B/N samples, or a pipeline stage fed M
microbatches of B/M, compute something else than one process with B samples: a property of
BatchNorm, not an error of the strategy, but it makes "same numbers as one process"
impossible to check. The two variants here remove the dependence:

* :class:`CrossReplicaBatchNorm2d` (data parallelism): statistics summed over all ranks of
  the default process group, i.e. over the whole global batch, as torch's SyncBatchNorm does
  (that one refuses CPU tensors). Every rank must run the same BN layers in the same order,
  so it cannot run under a pipeline, where ranks hold different layers.
* :class:`GhostBatchNorm2d` (pipelines): statistics over fixed consecutive groups of ``group``
  samples ("ghost batch normalisation", Hoffer, Hubara, Soudry, NeurIPS 2017). A microbatch
  that is a whole number of groups is normalised exactly as inside the full batch, and the
  running statistics are updated group by group in the same order.

Both equal ``nn.BatchNorm2d`` in evaluation mode. Workloads build plain BatchNorm and call
:func:`convert` when a preset asks for a variant. Imports torch: not for the CLI's fast paths.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

KINDS = ("plain", "cross_replica", "ghost")


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) whose backward is again an all-reduce of the gradients: each rank's
    statistics feed every rank's loss, so their gradient is the sum over ranks."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class CrossReplicaBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm with training statistics over the global batch (all ranks). It computes in
    float64 (twice the activation memory of plain BN while training): it exists to make
    1-vs-N runs agree, not for speed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        synced = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

        def total(t: torch.Tensor) -> torch.Tensor:
            return _SumOverRanks.apply(t) if synced else t

        # In float64: a sum over the whole batch and the sum of N per-rank partial sums then
        # round to the same float32, so float rounding does not depend on the layout (in
        # float32 it did, and 3 Adam steps amplified it to 1e-4 on the ResNets).
        xd = x.double()
        count = total(torch.tensor([x.numel() / x.shape[1]], dtype=xd.dtype, device=x.device))
        mean = total(xd.sum(dim=(0, 2, 3))) / count
        centred = xd - mean[None, :, None, None]
        var = total((centred * centred).sum(dim=(0, 2, 3))) / count  # two passes: no cancellation
        with torch.no_grad():
            self.num_batches_tracked += 1
            m = (self.momentum if self.momentum is not None
                 else 1.0 / float(self.num_batches_tracked))
            self.running_mean.mul_(1 - m).add_(mean.detach().to(x.dtype), alpha=m)
            unbiased = var.detach() * (count / (count - 1).clamp(min=1))
            self.running_var.mul_(1 - m).add_(unbiased.to(x.dtype), alpha=m)
        scale = self.weight.double() * torch.rsqrt(var + self.eps)
        out = centred * scale[None, :, None, None] + self.bias.double()[None, :, None, None]
        return out.to(x.dtype)


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
        new = (GhostBatchNorm2d(module.num_features, group, **settings) if kind == "ghost"
               else CrossReplicaBatchNorm2d(module.num_features, **settings))
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        replacement = convert(child, kind, group)
        if replacement is not child:
            setattr(module, name, replacement)
    return module
