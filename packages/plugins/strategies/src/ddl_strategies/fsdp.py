"""Fully sharded data parallelism with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Like DDP every rank trains on its own slice of the global batch, but no rank holds the whole
model: each parameter is split along dim 0 into world-size shards (a DTensor on a 1-D device
mesh), and so are its gradient and its optimizer state. Before a unit's forward (and again
before its backward) FSDP all-gathers that unit's parameters; after the backward it
reduce-scatters the gradients, so every rank ends with the averaged gradient of its own
shard and steps only that. Memory for parameters + gradients + optimizer state drops to
~1/N of DDP's, at the price of the extra all-gathers (ZeRO stage 3: Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020).

Units: the workload's ``fsdp_units`` (ResNet stages, transformer blocks) are sharded one by
one, then the root, so only one unit's full parameters need to exist at a time and the
next unit's all-gather overlaps the current unit's compute. Without units the whole model
is one unit.

Options (``--strategy-option``): ``reshard_after_forward`` (default true: free the gathered
parameters after forward and gather again for backward; false keeps them, trading memory
for one all-gather less per unit). ``param_dtype`` and ``reduce_dtype`` (fp32, bf16, fp16;
default: FSDP's, i.e. the parameters' fp32) form FSDP2's mixed-precision policy: gathered
parameters, and so the unit's compute, in ``param_dtype`` (half the all-gather traffic at
bf16), gradients reduce-scattered in ``reduce_dtype`` (fp32 keeps the average exact to
fp32 rounding). The sharded parameters and the optimizer state stay fp32 either way.

HSDP (hybrid sharding: ``--mesh dp_replicate=R,dp_shard=S``, R x S = the world): shard
within groups of S ranks (on a real machine one node's GPUs, joined by NVLink or Infinity
Fabric) and keep R replicas of those shards (across nodes). A unit's all-gather and
reduce-scatter then stay inside a group; only one all-reduce of each shard's gradient
crosses groups. FSDP2 does this when given a 2-D mesh (replicate, shard). Memory per rank
is ~1/S of DDP's instead of 1/N; inter-node traffic drops to one gradient all-reduce per
step. Ranks of one shard group are neighbours (ddl.contract.layout: dp_shard varies faster
than dp_replicate).

Checkpoints are sharded through ``torch.distributed.checkpoint``; ``full_state_dict``
gathers plain tensors for export.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ddl.contract.errors import UsageError
from ddl.contract.strategy import Strategy
from ddl.contract.workload import Workload
from ddl.contract.world import World


class FSDPStrategy(Strategy):
    name = "fsdp"
    mesh_dims = frozenset({"dp", "dp_shard", "dp_replicate"})  # dp_replicate > 1: HSDP
    dp_means = "dp_shard"
    layout_fill = ("dp_shard", "dp_replicate")
    options_help = {"reshard_after_forward": "free gathered parameters after forward "
                                             "(default true)",
                    "param_dtype": "dtype of gathered parameters and compute: fp32, bf16, "
                                   "fp16 (default fp32)",
                    "reduce_dtype": "dtype of the gradient reduce-scatter: fp32, bf16, fp16 "
                                    "(default: param_dtype)"}
    DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.workload: Workload | None = None
        for name in ("param_dtype", "reduce_dtype"):
            value = self.options.get(name)
            if value is not None and value not in self.DTYPES:
                raise UsageError(f"--strategy-option: {name}={value!r}; allowed: "
                                 f"{', '.join(self.DTYPES)}")

    def mixed_precision(self) -> MixedPrecisionPolicy:
        """FSDP2's policy from the options (unset: FSDP's own default, no casting)."""
        param, reduce = (self.options.get(n) for n in ("param_dtype", "reduce_dtype"))
        return MixedPrecisionPolicy(param_dtype=self.DTYPES.get(param),
                                    reduce_dtype=self.DTYPES.get(reduce))

    def check(self, workload: Workload, world: World) -> None:
        self.workload = workload  # wrap() asks it for the sharding units

    def wrap(self, model: nn.Module, world: World) -> nn.Module:
        model = model.to(world.device)
        replicas, shards = self.parallel.dp_replicate, self.parallel.dp_shard
        if replicas == 1:
            mesh = init_device_mesh(world.device.type, (shards,), mesh_dim_names=("dp_shard",))
        else:  # HSDP: FSDP2 replicates over a 2-D mesh's first dimension, shards the second
            mesh = init_device_mesh(world.device.type, (replicas, shards),
                                    mesh_dim_names=("dp_replicate", "dp_shard"))
        reshard = self.option_flag("reshard_after_forward", True)
        policy = self.mixed_precision()
        units = self.workload.fsdp_units(model) if self.workload else []
        for unit in units:
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        # The root holds what no unit owns (stem, head, norms) and drives the schedule.
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        return model

    def generation_model(self, model: nn.Module, world: World) -> nn.Module:
        """A plain copy gathered from the shards (see ddl_strategies.gathered)."""
        from ddl_strategies.gathered import gathered_copy

        return gathered_copy(self.workload, model, world.device)

    def report(self, world: World) -> dict:
        return {"reshard_after_forward": self.option_flag("reshard_after_forward", True),
                "param_dtype": self.options.get("param_dtype", "fp32"),
                "reduce_dtype": self.options.get("reduce_dtype",
                                                 self.options.get("param_dtype", "fp32"))}

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        # A collective: every rank takes part; with cpu_offload only rank 0 keeps the result.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
