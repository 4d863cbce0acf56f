"""The layouts ``ddl plan`` considers for a world, and its first step-time estimate.

Candidates: every pp x dp_replicate x dp_shard x tp whose product is the world, with tp
dividing the GPUs of one node (its all-reduces sit inside every layer: they must stay on
NVLink / Infinity Fabric), tp and pp only where the workload can split that way; every
split of the global batch into micro-batch x accumulation over the layout's replicas; each
activation checkpointing mode. Pipelines run 1F1B (GPipe's bubble, less memory) with
2 x pp micro-batches, or pp where 2 x pp does not divide the micro-batch.

Step time, a first model (docs/plan.md): compute = training FLOPs of the global batch /
world / (peak x ASSUMED_MFU), stretched by the pipeline bubble (pp - 1) / (m + pp - 1) and
by full checkpointing's extra forward (x 4/3); communication = bytes each rank moves per
step through ring collectives / the bandwidth of the slowest link its groups cross. No
overlap of the two is assumed. The alpha-beta model of collectives and measured link
numbers (`ddl doctor --collectives`) are a later step (issue 41, item 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ddl.contract.layout import DIMS, ParallelLayout

CHECKPOINTING = ("none", "selective", "full")
SCHEDULE = "1f1b"
ASSUMED_MFU = 0.4  # a plausible fraction of peak for a large dense model; ranks only
RECOMPUTE = {"none": 1.0, "selective": 1.0, "full": 4 / 3}  # selective redoes cheap ops only


@dataclass(frozen=True)
class Candidate:
    layout: ParallelLayout
    micro_batch: int  # per replica per forward pass
    accumulation: int
    checkpointing: str
    microbatches: int = 1  # pipeline micro-batches per forward pass (pp > 1)

    def mesh(self) -> str:
        """``--mesh`` as ddl train takes it."""
        return ",".join(f"{d}={getattr(self.layout, d)}" for d in DIMS)

    def flags(self) -> list[str]:
        out = ["--mesh", self.mesh(), "--batch-size", str(self.micro_batch),
               "--activation-checkpointing", self.checkpointing]
        if self.layout.pp > 1:
            out += ["--microbatches", str(self.microbatches),
                    "--strategy-option", f"schedule={SCHEDULE}"]
        return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(world: int, gpus_per_node: int, *, tp_ok: bool, pp_ok: bool
            ) -> Iterator[ParallelLayout]:
    for pp in divisors(world) if pp_ok else [1]:
        for tp in divisors(world // pp) if tp_ok else [1]:
            if gpus_per_node % tp:
                continue
            rest = world // (pp * tp)
            for replicate in divisors(rest):
                yield ParallelLayout(pp=pp, dp_replicate=replicate,
                                     dp_shard=rest // replicate, tp=tp)


def candidates(world: int, gpus_per_node: int, global_batch: int, *, tp_ok: bool,
               pp_ok: bool) -> Iterator[Candidate]:
    for layout in layouts(world, gpus_per_node, tp_ok=tp_ok, pp_ok=pp_ok):
        if global_batch % layout.dp:
            continue
        per_replica = global_batch // layout.dp
        for micro in divisors(per_replica):
            m = 1
            if layout.pp > 1:
                m = next((k for k in (2 * layout.pp, layout.pp) if micro % k == 0), 0)
                if not m:
                    continue
            for mode in CHECKPOINTING:
                yield Candidate(layout, micro, per_replica // micro, mode, m)


def bubble(candidate: Candidate) -> float:
    pp, m = candidate.layout.pp, candidate.microbatches
    return (pp - 1) / (m + pp - 1) if pp > 1 else 0.0


def compute_seconds(candidate: Candidate, flops_per_sample: float, global_batch: int,
                    peak_flops: float) -> float:
    world = candidate.layout.world_size
    busy = flops_per_sample * global_batch / world / (peak_flops * ASSUMED_MFU)
    return busy * RECOMPUTE[candidate.checkpointing] / (1 - bubble(candidate))


def crosses_nodes(layout: ParallelLayout, dim: str, gpus_per_node: int) -> bool:
    return any(len({rank // gpus_per_node for rank in group}) > 1
               for group in layout.groups(dim))


def ring(n: int) -> float:
    """Fraction of a buffer each rank sends in a ring all-gather or reduce-scatter."""
    return (n - 1) / n if n > 1 else 0.0


def comm_bytes(candidate: Candidate, full_param_bytes: int, tp_bytes_per_sample: float,
               boundary_bytes_per_sample: float) -> dict[str, float]:
    """Bytes one rank sends per optimizer step, per dimension. ``full_param_bytes``: the
    parameters of one pipeline rank before tensor parallel and FSDP split them;
    ``tp_bytes_per_sample``: what tensor parallel all-reduces per sample (forward outputs
    of the row-parallel layers; the backward as much again); ``boundary_bytes_per_sample``:
    activations crossing one stage boundary per sample (the gradient comes back)."""
    p, steps = candidate.layout, candidate.accumulation
    local = full_param_bytes / p.tp  # what FSDP and DDP see of a rank's stages
    out = {}
    if p.dp_shard > 1:  # all-gather forward and backward, reduce-scatter: per micro-step
        out["dp_shard"] = 3 * ring(p.dp_shard) * local * steps
    if p.dp_replicate > 1:  # one all-reduce of (a shard of) the gradients per step
        out["dp_replicate"] = 2 * ring(p.dp_replicate) * local / p.dp_shard
    samples = candidate.micro_batch * steps
    if p.tp > 1:
        out["tp"] = 2 * 2 * ring(p.tp) * tp_bytes_per_sample * samples
    if p.pp > 1:
        out["pp"] = 2 * boundary_bytes_per_sample * samples
    return out


def comm_seconds(candidate: Candidate, moved: dict[str, float], gpus_per_node: int,
                 intra_bytes_per_s: float, inter_bytes_per_s: float) -> float:
    """Each dimension's bytes over its slowest link: inside a node the device's link, across
    nodes its share of the node's network."""
    per_device_inter = inter_bytes_per_s / gpus_per_node
    return sum(nbytes / (per_device_inter if crosses_nodes(candidate.layout, dim,
                                                           gpus_per_node)
                         else intra_bytes_per_s)
               for dim, nbytes in moved.items())
