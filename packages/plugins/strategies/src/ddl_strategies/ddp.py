"""Data parallelism with torch's DistributedDataParallel (DDP).

Every process holds a full copy of the model and trains on its own slice of each global
batch. During ``backward()`` DDP all-reduces (averages) the gradients bucket by bucket,
overlapping communication with the rest of the backward pass, so after ``optimizer.step()``
every replica holds identical parameters again. Li et al., "PyTorch Distributed: Experiences
on Accelerating Data Parallel Training", VLDB 2020, describe the bucketing and overlap.

Because gradients are averaged over replicas that each see batch/N samples, one DDP step
equals one single-process step on the whole global batch (for models without batch-coupled
layers such as BatchNorm, whose statistics stay per replica). The equivalence test checks
exactly that.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddl.contract.strategy import Strategy
from ddl.contract.world import World


class DDPStrategy(Strategy):
    name = "ddp"
    options_help = {"bucket_cap_mb": "size of DDP's gradient buckets in MB (default 25)"}

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        model = model.to(world.device)
        # DDP broadcasts rank 0's parameters and buffers at construction, so replicas start
        # identical even if a workload's initialisation were not seeded alike.
        device_ids = [world.device.index] if world.device.type == "cuda" else None
        bucket = self.option_number("bucket_cap_mb", 25.0)
        return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket)

    def eval_model(self, model: nn.Module) -> nn.Module:
        # Evaluate on the plain module: DDP's forward would sync buffers every call, which
        # is wasted work when no gradients follow.
        return model.module

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
