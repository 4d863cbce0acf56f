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

Checkpoints are sharded through ``torch.distributed.checkpoint``. Here: the options and
``shard`` (what FSDP does to one module); ddl_strategies.compose decides when it runs and
over which slice of the run's DeviceMesh (after tensor parallel and the pipeline split).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ddl.contract.errors import UsageError

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

OPTIONS_HELP = {"reshard_after_forward": "free gathered parameters after forward "
                                         "(default true)",
                "param_dtype": "dtype of gathered parameters and compute: fp32, bf16, "
                               "fp16 (default fp32)",
                "reduce_dtype": "dtype of the gradient reduce-scatter: fp32, bf16, fp16 "
                                "(default: param_dtype)",
                "generation": "a workload's whole-model loop after training (xsum's ROUGE "
                              "generate): gather (a whole copy per rank), sharded (on the "
                              "shards, every rank the same inputs), auto (default: gather "
                              "when a copy fits in half the free memory)"}
GENERATION = ("auto", "gather", "sharded")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_options(options: dict[str, str]) -> None:
    generation = options.get("generation", "auto")
    if generation not in GENERATION:
        raise UsageError(f"--strategy-option: generation={generation!r}; allowed: "
                         f"{', '.join(GENERATION)}")
    for name in ("param_dtype", "reduce_dtype"):
        value = options.get(name)
        if value is not None and value not in DTYPES:
            raise UsageError(f"--strategy-option: {name}={value!r}; allowed: "
                             f"{', '.join(DTYPES)}")


def mixed_precision(options: dict[str, str]) -> MixedPrecisionPolicy:
    """FSDP2's policy from the options (unset: FSDP's own default, no casting)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy  # ~0.5 s: only when sharding

    param, reduce = (options.get(n) for n in ("param_dtype", "reduce_dtype"))
    return MixedPrecisionPolicy(param_dtype=DTYPES.get(param), reduce_dtype=DTYPES.get(reduce))


def shard(module: nn.Module, units: list[nn.Module], mesh, *, reshard: bool,
          options: dict[str, str]) -> None:
    """``fully_shard`` each unit, then the root ``module`` (which holds what no unit owns:
    stem, head, norms, and drives the schedule). ``mesh``: 1-D (dp_shard) for FSDP, 2-D
    (dp_replicate, dp_shard) for HSDP."""
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision(options)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)


def report(options: dict[str, str], reshard: bool) -> dict[str, object]:
    return {"reshard_after_forward": reshard,
            "param_dtype": options.get("param_dtype", "fp32"),
            "reduce_dtype": options.get("reduce_dtype", options.get("param_dtype", "fp32"))}


def gather_for_generation(model: nn.Module, options: dict[str, str], device: torch.device
                          ) -> bool:
    """Whether a whole-model loop gets a gathered copy (True) or runs on the shards (False:
    the root's own parameters are then unsharded here, since ``generate()`` calls the
    encoder directly, past the root forward through which FSDP2 gathers them). ``auto``
    gathers when the whole model's parameters take at most half the memory free to this
    rank: the device's, or on a CPU the node's available memory shared by its ranks (a
    t5-large copy on each of 4 CPU ranks would not fit a 24 GB node beside training)."""
    choice = options.get("generation", "auto")
    if choice == "auto":
        seen, whole = set(), 0
        for param in model.parameters():
            if id(param) not in seen:
                seen.add(id(param))
                whole += param.numel() * param.element_size()  # a DTensor's global size
        choice = "gather" if whole <= 0.5 * _free_bytes(device) else "sharded"
    if choice == "sharded":
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            model.unshard()
    return choice == "gather"


def _free_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    import os

    from ddl.contract.host_memory import available_bytes

    available = available_bytes()
    if not available:
        return float("inf")  # unknown: gather, as before
    return available / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
