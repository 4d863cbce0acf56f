"""Tensor parallelism with DTensor (``parallelize_module``), Megatron style.

Instead of splitting the batch, split the big matrices. In a transformer block the first
projection of each pair (attention q/k/v, the feed-forward's input layer) is split by
output columns: every rank computes its share of heads / hidden units from the full input
("colwise"). The second projection (attention output, feed-forward output) is split by
input rows: every rank multiplies its share and one all-reduce sums the partial results
("rowwise"). One all-reduce per pair in the forward pass, one in the backward pass
(Shoeybi et al., "Megatron-LM", 2019, sec. 3).

The workload says which layers are which (``tp_plan``: module path pattern -> "colwise" or
"rowwise"; ``*`` matches one path component, as in torch's plans) and adjusts attributes
that count heads (``prepare_tensor_parallel``). All ranks see the same batch, so the data-
parallel degree is 1; combine with FSDP on a 2-D mesh for both (``fsdp+tp``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from ddl.contract.errors import UsageError
from ddl.contract.strategy import Strategy
from ddl.contract.workload import Workload
from ddl.contract.world import World

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def apply_tensor_parallel(model: nn.Module, workload: Workload, mesh: DeviceMesh) -> None:
    """Shard ``model`` over the 1-D ``mesh`` by the workload's plan (shared with fsdp+tp)."""
    plan = workload.tp_plan(model)
    unknown = sorted({style for style in plan.values()} - set(STYLES))
    if unknown:
        raise UsageError(f"the workload's tp_plan uses style {unknown[0]!r}; allowed: "
                         f"{', '.join(STYLES)}")
    workload.prepare_tensor_parallel(model, mesh.size())
    parallelize_module(model, mesh, {path: STYLES[style]() for path, style in plan.items()})


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Plain, gathered tensors from a DTensor-sharded model (a collective)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


class TensorParallelStrategy(Strategy):
    name = "tp"
    layout_fill = ("tp",)  # every rank computes on the same batch, with its slice of each matrix

    def check(self, workload: Workload, world: World) -> None:
        if world.size < 2:
            raise UsageError("--strategy tp: needs at least 2 processes; allowed: --nproc 2+")
        self.workload = workload

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        model = model.to(world.device)
        mesh = init_device_mesh(world.device.type, (world.size,), mesh_dim_names=("tp",))
        apply_tensor_parallel(model, self.workload, mesh)
        return model

    def generation_model(self, model: nn.Module, world: World) -> None:
        """None: generate on the tensor-parallel model itself, all ranks on the same inputs
        (each forward runs collectives; a gathered copy would cost a whole model per rank)."""

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return full_state(model)
