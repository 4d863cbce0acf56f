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
    mesh_dims = frozenset({"dp", "tp"})

    def check(self, workload: Workload, world: World) -> None:
        mesh = dict(self.config.mesh)  # its dimensions are checked by configure()
        tp = mesh.get("tp") or (world.size // mesh["dp"] if mesh.get("dp") else 2)
        if world.size % tp:
            raise UsageError(f"--mesh: tp={tp} does not divide the world of {world.size} "
                             "processes; allowed: a divisor of the world size")
        dp = mesh.get("dp", world.size // tp)
        if dp * tp != world.size:
            raise UsageError(f"--mesh: dp={dp} x tp={tp} = {dp * tp}, but the world has "
                             f"{world.size} processes; the product must equal it")
        self.dp, self.tp, self.workload = dp, tp, workload

    def data_parallel_size(self, world: World) -> int:
        return self.dp

    def data_parallel_rank(self, world: World) -> int:
        return world.rank // self.tp  # ranks of one tensor-parallel group share the data

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
