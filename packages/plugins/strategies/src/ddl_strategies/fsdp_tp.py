"""2-D parallelism: FSDP across data-parallel groups x tensor parallel within each group.

One named 2-D DeviceMesh ``(dp, tp)``, e.g. ``--mesh dp=2,tp=2`` on 4 ranks: ranks
{0,1} and {2,3} are tensor-parallel groups (in a real job: GPUs of one node, linked by the
fastest interconnect); ranks {0,2} and {1,3} hold the same tensor shards and split the
batch, sharding parameters, gradients and optimizer state FSDP-style. Tensor parallelism is
applied first (on ``mesh["tp"]``), then ``fully_shard`` on ``mesh["dp"]`` shards the
already tensor-parallel DTensors once more (torchtitan's composition).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ddl.contract.errors import UsageError
from ddl.contract.strategy import Strategy
from ddl.contract.workload import Workload
from ddl.contract.world import World
from ddl_strategies.tp import apply_tensor_parallel, full_state


class FSDPTensorParallelStrategy(Strategy):
    name = "fsdp+tp"
    mesh_dims = frozenset({"dp", "dp_shard", "tp"})
    dp_means = "dp_shard"
    layout_fill = ("dp_shard", "tp")  # without --mesh: tp=2, FSDP over the rest
    layout_defaults = {"tp": 2}

    def check(self, workload: Workload, world: World) -> None:
        self.dp, self.tp = self.parallel.dp_shard, self.parallel.tp
        self.workload = workload

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        model = model.to(world.device)
        mesh = init_device_mesh(world.device.type, (self.dp, self.tp),
                                mesh_dim_names=("dp", "tp"))
        apply_tensor_parallel(model, self.workload, mesh["tp"])
        for unit in self.workload.fsdp_units(model):
            fully_shard(unit, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        return model

    def generation_model(self, model: nn.Module, world: World) -> nn.Module:
        """A plain copy gathered from the shards (see ddl_strategies.gathered)."""
        from ddl_strategies.gathered import gathered_copy

        return gathered_copy(self.workload, model, world.device)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return full_state(model)
