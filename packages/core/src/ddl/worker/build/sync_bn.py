"""``--sync-bn``: BatchNorm statistics over the whole global batch, for any workload's model.

Plain BatchNorm normalises each rank's share of the batch with that share's own mean and
variance, so N data-parallel ranks compute something else than one process with the whole
batch (BatchNorm's semantics, not a strategy error). ``--sync-bn`` makes every plain
``nn.BatchNorm1d/2d/3d`` of the built model take its training statistics over all
data-parallel ranks; then N ranks train what one process trains (tests/distributed/
test_cifar_train.py checks it). Evaluation uses the running statistics, as plain BN does.

Which implementation:

* torch's ``nn.SyncBatchNorm`` on the device types its forward accepts (torch 2.14,
  torch/nn/modules/batchnorm.py: cuda - which includes ROCm - xpu, hpu); it all-gathers
  per-rank statistics, over NCCL/RCCL or gloo.
* :class:`CrossReplicaBatchNorm` on CPU, which torch's refuses ("SyncBatchNorm expected
  input tensor to be on GPU"): sums over ranks with all-reduce, in float64 so the result
  does not depend on how the batch is cut (float32 left 1e-4 differences after 3 Adam steps).

The statistics group is the default process group, which is the data-parallel group of
ddp, fsdp and accelerate. Strategies whose ranks hold different layers (pp: the collectives
would not line up) or whose data-parallel group is smaller than the world (tp, fsdp+tp:
ranks of one tensor-parallel group see the same samples, which would count them twice in
the gradients) declare ``StrategySpec(sync_bn=False)`` and ``--sync-bn`` is refused there
(:func:`check`). A later N-D mesh must pass its data-parallel group as ``group``.

Only plain BatchNorm is converted: a workload's own variant (ghost BatchNorm, subclasses)
is left as it is. Imports torch: worker side only.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ddl.contract.errors import UsageError

PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: Device types torch's SyncBatchNorm.forward accepts (torch 2.14; CPU is not one).
TORCH_SYNC_DEVICES = frozenset({"cuda", "xpu", "hpu", torch._C._get_privateuse1_backend_name()})


def check(sync_bn: bool, strategy, strategies) -> None:
    """Refuse ``--sync-bn`` under a strategy that cannot synchronise BatchNorm
    (``strategy`` and ``strategies``: StrategySpecs, the chosen one and all installed)."""
    if sync_bn and not strategy.sync_bn:
        able = sorted(s.name for s in strategies if s.sync_bn)
        raise UsageError(f"--sync-bn: strategy {strategy.name} cannot synchronise BatchNorm "
                         "(its ranks hold different layers or split the data-parallel group);"
                         f" allowed with: {', '.join(able) or 'none installed'}")


def apply(model: nn.Module, world, dp_mesh=None) -> nn.Module:
    """``--sync-bn`` for a run: convert ``model`` (built, not yet wrapped by the strategy) on
    every rank, its statistics reduced over the run's data-parallel ranks (``dp_mesh``; the
    whole world without one). A model without plain BatchNorm is left as it is, with a
    note on rank 0."""
    group = None if dp_mesh is None else dp_mesh.get_group()
    model, converted = convert(model, world.device, group)
    if not converted and world.is_main:
        print("ddl: note: --sync-bn: the model has no plain BatchNorm layer; nothing to "
              "synchronise", file=sys.stderr, flush=True)
    return model


def convert(model: nn.Module, device: torch.device, group=None) -> tuple[nn.Module, int]:
    """Convert every plain BatchNorm of ``model`` (not yet wrapped by a strategy) to the
    cross-replica kind for ``device``; statistics over ``group`` (None: the default group).
    Returns the (possibly new) model and how many layers were converted."""
    use_torch = device.type in TORCH_SYNC_DEVICES
    converted = 0

    def swap(module: nn.Module) -> nn.Module:
        nonlocal converted
        if type(module) in PLAIN:
            converted += 1
            if use_torch:
                return nn.SyncBatchNorm.convert_sync_batchnorm(module, group)
            return CrossReplicaBatchNorm.from_plain(module, group)
        for name, child in module.named_children():
            replacement = swap(child)
            if replacement is not child:
                setattr(module, name, replacement)
        return module

    return swap(model), converted


class _SumOverRanks(torch.autograd.Function):
    """All-reduce (sum) whose backward is again an all-reduce of the gradients: each rank's
    statistics feed every rank's loss, so their gradient is the sum over ranks."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        tensor = tensor.clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class CrossReplicaBatchNorm(_BatchNorm):
    """BatchNorm (any input of 2 or more dimensions, channels in dimension 1) with training
    statistics over all ranks of ``group``. Computes in float64 (twice the activation memory
    of plain BN while training): it exists to make 1-vs-N runs agree on CPU, not for speed."""

    def __init__(self, num_features: int, *, group=None, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.group = group

    @classmethod
    def from_plain(cls, bn: _BatchNorm, group=None) -> CrossReplicaBatchNorm:
        """The same layer (settings, parameters, running statistics, mode), synchronised."""
        new = cls(bn.num_features, group=group, eps=bn.eps, momentum=bn.momentum,
                  affine=bn.affine, track_running_stats=bn.track_running_stats,
                  device=(bn.weight.device if bn.affine else None),
                  dtype=(bn.weight.dtype if bn.affine else None))
        new.load_state_dict(bn.state_dict())
        new.train(bn.training)
        return new

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        self._check_input_dim(x)
        synced = (dist.is_available() and dist.is_initialized()
                  and dist.get_world_size(self.group) > 1)

        def total(t: torch.Tensor) -> torch.Tensor:
            return _SumOverRanks.apply(t, self.group) if synced else t

        dims = [0, *range(2, x.dim())]  # every dimension but the channels
        shape = [1, -1] + [1] * (x.dim() - 2)  # a per-channel vector, broadcast over x
        # float64: a sum over the whole batch and the sum of N per-rank partial sums then
        # round to the same float32, so rounding does not depend on the layout.
        xd = x.double()
        count = total(torch.tensor([x.numel() / x.shape[1]], dtype=xd.dtype, device=x.device))
        mean = total(xd.sum(dim=dims)) / count
        centred = xd - mean.view(shape)
        var = total((centred * centred).sum(dim=dims)) / count  # two passes: no cancellation
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count)
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.double().view(shape) + self.bias.double().view(shape)
        return out.to(x.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean, var, count) -> None:
        self.num_batches_tracked += 1
        m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
        unbiased = var * (count / (count - 1).clamp(min=1))
        self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
