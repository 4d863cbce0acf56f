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
parallel degree is 1; ddl_strategies.compose combines it with FSDP and pipelines.
"""

from __future__ import annotations

from fnmatch import fnmatch

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from ddl.contract.errors import UsageError
from ddl.contract.workload import Workload

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def apply_tensor_parallel(model: nn.Module, workload: Workload, mesh: DeviceMesh,
                          plan: dict[str, str]) -> None:
    """Shard ``model`` (a whole model or one pipeline stage, whose modules keep the whole
    model's paths) over the 1-D ``mesh`` by the workload's ``plan`` for the whole model;
    paths the module does not hold are skipped."""
    unknown = sorted({style for style in plan.values()} - set(STYLES))
    if unknown:
        raise UsageError(f"the workload's tp_plan uses style {unknown[0]!r}; allowed: "
                         f"{', '.join(STYLES)}")
    held = _held(model, plan)
    workload.prepare_tensor_parallel(model, mesh.size())
    if held:
        parallelize_module(model, mesh, {path: STYLES[plan[path]]() for path in held})


def _held(model: nn.Module, plan: dict[str, str]) -> list[str]:
    """The plan's paths (fnmatch per component, as torch reads them) that ``model`` holds."""
    names = [name.split(".") for name, _ in model.named_modules() if name]
    return [path for path in plan
            if any(len(parts) == len(name) and all(map(fnmatch, name, parts))
                   for parts in [path.split(".")] for name in names)]


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Plain, gathered tensors from a DTensor-sharded model (a collective)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
