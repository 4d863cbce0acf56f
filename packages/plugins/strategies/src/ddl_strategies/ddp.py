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

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddl.contract.world import World

OPTIONS_HELP = {"bucket_cap_mb": "size of DDP's gradient buckets in MB (default 25)"}


def replicate(model: nn.Module, world: World, bucket_cap_mb: float) -> DistributedDataParallel:
    """``model`` on this rank's device, wrapped by DDP over the whole world. DDP broadcasts
    rank 0's parameters and buffers at construction, so replicas start identical even if a
    workload's initialisation were not seeded alike."""
    model = model.to(world.device)
    device_ids = [world.device.index] if world.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb)
