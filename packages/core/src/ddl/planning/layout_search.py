"""The layouts ``ddl plan`` considers for a world, and the bytes each moves per step.

Candidates: every pp x dp_replicate x dp_shard x tp whose product is the world, with tp
dividing the GPUs of one node (its all-reduces sit inside every layer: they must stay on
NVLink / Infinity Fabric), tp and pp only where the workload can split that way; every
split of the global batch into micro-batch x accumulation over the layout's replicas; each
activation checkpointing mode. Pipelines run 1F1B (GPipe's bubble, less memory) with
2 x pp micro-batches, or pp where 2 x pp does not divide the micro-batch. Layouts that
FSDP2 wraps (any sharding, and replicas beside tp or pp) run, when a GPU plan computes
in 16 bits, with FSDP2's mixed precision: parameters gathered in the compute dtype, gradients
reduced in fp32 (``param_dtype``, ``reduce_dtype``: torchtitan's defaults), which the
candidate's flags ask for.

Step time: ddl.planning.step_time_model (compute from FLOPs and the device's rate, an
alpha-beta model of the collectives, the pipeline bubble; docs/plan.md). What is here counts
the bytes each layout moves, which ranks layouts where no link numbers are known.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ddl.contract.layout import DIMS, ParallelLayout

CHECKPOINTING = ("none", "selective", "full")
SCHEDULE = "1f1b"


@dataclass(frozen=True)
class Candidate:
    layout: ParallelLayout
    micro_batch: int  # per replica per forward pass
    accumulation: int
    checkpointing: str
    microbatches: int = 1  # pipeline micro-batches per forward pass (pp > 1)
    param_dtype: str = "fp32"  # FSDP2's gathered parameters (fp32: no policy)

    def mesh(self) -> str:
        """``--mesh`` as ddl train takes it."""
        return ",".join(f"{d}={getattr(self.layout, d)}" for d in DIMS)

    def flags(self) -> list[str]:
        out = ["--mesh", self.mesh(), "--batch-size", str(self.micro_batch),
               "--activation-checkpointing", self.checkpointing]
        if self.layout.pp > 1:
            out += ["--microbatches", str(self.microbatches)]
        for key, value in self.strategy_options().items():
            out += ["--strategy-option", f"{key}={value}"]
        return out

    def strategy_options(self) -> dict[str, str]:
        """The ``--strategy-option``s the prediction assumes."""
        out = {"schedule": SCHEDULE} if self.layout.pp > 1 else {}
        if self.param_dtype != "fp32":
            out.update(param_dtype=self.param_dtype, reduce_dtype="fp32")
        return out


def uses_fsdp(layout: ParallelLayout) -> bool:
    """Whether ddl's mesh strategy wraps ``layout`` with FSDP2 (ddl_strategies.compose):
    data parallel beside anything else; replicas alone are DDP."""
    return layout.dp > 1 and not (layout.dp_shard == layout.tp == layout.pp == 1)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending: pairs (d, n // d) up to the square root, so a
    global batch of 10^9 takes 31623 steps, not 10^9."""
    import math

    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


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
               pp_ok: bool, computes_in: str = "fp32") -> Iterator[Candidate]:
    """``computes_in``: the runs' precision (fp32, bf16, fp16): FSDP2 layouts gather their
    parameters in it."""
    for layout in layouts(world, gpus_per_node, tp_ok=tp_ok, pp_ok=pp_ok):
        gather = computes_in if uses_fsdp(layout) else "fp32"
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
                yield Candidate(layout, micro, per_replica // micro, mode, m, gather)


def crosses_nodes(layout: ParallelLayout, dim: str, gpus_per_node: int) -> bool:
    """Whether some group of ``dim`` holds ranks of two nodes (ranks numbered node by node).

    Arithmetic, not a walk over every rank's group (a plan for 10000 nodes predicts
    thousands of candidates): a group is ``first + k x stride`` for k < size, so it stays
    in one node when its first and last rank do; the firsts are ``q x size x stride + r``
    (r < stride), whose positions within a node repeat after ``gpus_per_node`` values of
    q."""
    size = getattr(layout, dim)
    if size == 1:
        return False
    stride = 1
    for inner in DIMS[DIMS.index(dim) + 1:]:
        stride *= getattr(layout, inner)
    span = (size - 1) * stride  # from a group's first rank to its last
    g = gpus_per_node
    if span >= g:
        return True
    blocks = layout.world_size // (size * stride)
    for q in range(min(blocks, g)):
        start = q * size * stride % g  # where the block's first group starts in its node
        if start + stride - 1 + span >= g:  # the last first rank of the block, plus span
            return True
    return False


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
    gathered = local * (2 if candidate.param_dtype in ("bf16", "fp16") else 4) / 4
    out = {}
    if p.dp_shard > 1:  # all-gather forward and backward per micro-step; one reduce-scatter
        out["dp_shard"] = ring(p.dp_shard) * (2 * gathered * steps + local)
    if p.dp_replicate > 1:  # one all-reduce of (a shard of) the gradients per step
        out["dp_replicate"] = 2 * ring(p.dp_replicate) * local / p.dp_shard
    samples = candidate.micro_batch * steps
    if p.tp > 1:
        out["tp"] = 2 * 2 * ring(p.tp) * tp_bytes_per_sample * samples
    if p.pp > 1:
        out["pp"] = 2 * boundary_bytes_per_sample * samples
    return out
