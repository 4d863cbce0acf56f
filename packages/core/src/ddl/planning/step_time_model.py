"""The step-time model: one optimizer step of a layout, from FLOPs, a device's rate and an
alpha-beta model of the collectives. No torch here (``ddl plan`` and reports use it).

Compute. A rank's training FLOPs per step (``Workload.flops_per_sample``, forward +
backward, x its samples; tp splits them, a pipeline rank does its stage's share,
checkpointing adds what it recomputes: below) over ``peak x efficiency``: the site's
``device_peak_flops`` (or ``ddl.worker.mfu.measure_matmul_peak``) x an assumed 0.4 on a
GPU; + ``fixed_s`` per step (the optimizer, per-operator overhead: 0 unless measured).

CPU ranks compute with ``cores // ranks`` threads each (at least one, ddl.settings.cores)
at ``thread_efficiency`` each; ranks whose threads outnumber the cores take ``ranks x
threads / cores`` times as long; with several ranks the step also waits for the slowest
at its collectives: ``sync_wait`` x the compute (``ddl doctor --collectives``).

Communication: one collective's alpha-beta cost is ddl.planning.collective_cost's.

Per layout, per optimizer step (``accumulation`` micro-steps):
- DDP (dp_replicate alone): one all-reduce of the gradients (fp32: autocast keeps fp32
  parameters), in 25 MiB buckets that start while the backward still runs; before each
  forward rank 0's buffers (BatchNorm's statistics) broadcast, one call per dtype
  (``broadcast_buffers``, torch's default; a ring: (p-1) alpha + n beta on the p2p fit);
- FSDP (dp_shard): per micro-step, an all-gather of each unit's parameters in the forward
  and again in the backward (``reshard_after_forward``, ddl's default), in the parameter
  dtype FSDP2's ``MixedPrecisionPolicy`` gathers in (``param_dtype``: ``ddl plan`` runs its
  16-bit layouts with ``param_dtype`` = the compute dtype, as torchtitan does by default);
  one reduce-scatter of the gradients per step in ``reduce_dtype`` (fp32), since
  accumulating micro-steps skip it (ddl.contract.strategy.gradient_sync). HSDP adds one
  all-reduce of the shard's gradients over dp_replicate, per step, in ``reduce_dtype``;
- tensor parallel: per block, an all-reduce of the row-parallel layers' outputs in the
  forward and of the column-parallel inputs' gradients in the backward (Megatron-LM,
  Shoeybi et al. 2019, fig. 3): 2 all-reduces per row-parallel layer and forward pass, each
  with its own latency, on the intra-node link (tp divides a node's GPUs); full activation
  checkpointing repeats the forward's (3 per layer);
- pipeline parallel: each boundary sends the activations forward and their gradients back,
  point-to-point, per micro-batch (what a rank waits for: Overlap); the schedule's bubble
  stretches the compute; once per step the loss's broadcast and the all-reduce of the
  weights several stages hold (ddl.planning.pipeline_schedule: ``bubble``, ``step_end``).

Activation checkpointing costs its recomputed forward: ``recompute`` (the share of the
forward FLOPs the backward runs again, measured on the meta device by
ddl.planning.plan_probe.recompute_shares: full = everything inside the checkpointed units,
selective = their non-matrix ops at one FLOP per output element) adds ``share / 3`` of the
training FLOPs.

Overlap (GPU ranks; a CPU's gloo collectives run on the cores that compute, so none
there). FSDP2 issues each unit's all-gather on its own CUDA stream: in the forward the next
unit's gather runs under the current unit's compute ("implicit prefetching"; the first
all-gather overlaps nothing: PyTorch docs, notes/fsdp.rst, "FSDP Prefetch Nuances"), and
in the backward it prefetches the next unit explicitly, in reverse post-forward order
(pytorch/pytorch#128884); the reduce-scatter of a unit runs while earlier units compute
their backward. So of ``U`` units' communication, the first unit's gather and the last
unit's reduction are exposed, and the rest only where it exceeds the compute of that pass:

    exposed = first + last + max(0, rest - compute of the pass)

with the forward's third of a micro-step's compute hiding the forward gathers and the
backward's two thirds (plus recomputation) the backward's gathers and reductions. DDP's
bucketed all-reduce overlaps the backward the same way (all but its last bucket; PyTorch
docs, notes/ddp.rst). Tensor parallel's all-reduces are all exposed; a pipeline's
hand-offs as long as its schedule waits for them (pipeline_schedule.handoff_wait).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddl.contract.layout import ParallelLayout
# re-exported: callers name the link model through the step-time model
from ddl.planning.collective_cost import OPS, Link, Network, ring_factors  # noqa: F401
from ddl.planning.layout_search import uses_fsdp
from ddl.planning.pipeline_schedule import (  # noqa: F401
    MULTI_STAGE, bubble, handoff_wait, step_end)

RECOMPUTE = {"none": 1.0, "selective": 1.0, "full": 4 / 3}  # assumed where not measured
ASSUMED_GPU_EFFICIENCY = 0.4  # model FLOPs utilisation assumed on a GPU: ranks, not promises


@dataclass(frozen=True)
class CpuCosts:
    """A workload's costs measured on ONE CPU thread (ddl.planning.cpu_calibration):
    ``stages`` per pipeline degree, per stage ``(pass_s, sample_s)``: a forward + backward
    of a micro-batch of n samples takes ``pass_s + n x sample_s`` (pp 1: the whole model
    with its loss); ``optimizer_s``: zero_grad + step over the whole model, whose fp32
    parameters are ``param_bytes``; ``data``: a rank's host work per batch of n samples
    outside the model (fetching it, the trainer's training metrics on its outputs) takes
    ``data[0] + n data[1]`` (every rank of a pipeline loads the batch);
    ``wrappers``: the host work DDP, FSDP2, tensor parallel and a pipeline schedule add
    (``{"ddp": {"pass_s", "optimizer_s"}, "fsdp": {"pass_s" per unit, ...}, "tp": {...},
    "pipeline": {"pass_s" per micro-batch}}``,
    ddl.planning.wrapper_calibration)."""

    stages: Mapping[int, tuple[tuple[float, float], ...]]
    optimizer_s: float
    param_bytes: float
    data: tuple[float, float] = (0.0, 0.0)  # fetching a batch: per batch, per sample
    wrappers: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Compute:
    """What one rank computes with. ``peak_flops``: of one device (a GPU) or of ONE thread
    (a CPU: ``cpu=True``). ``costs`` (CPU): the workload's measured costs, which replace
    FLOPs / rate for the pipeline degrees they cover."""

    peak_flops: float
    efficiency: float = ASSUMED_GPU_EFFICIENCY
    fixed_s: float = 0.0  # per optimizer step, independent of the samples
    cpu: bool = False
    cores: int = 1  # CPU: cores the node's ranks share
    thread_efficiency: float = 1.0  # CPU: rate of t threads / (t x one thread's)
    costs: CpuCosts | None = None
    # CPU, several ranks: the slowest rank's lateness that the others wait for in the
    # step's collectives, per second of compute (ddl.commands.collective_probe._skew)
    sync_wait: float = 0.0


def threads_per_rank(cores: int, ranks: int) -> int:
    """ddl's rule (ddl.settings.cores): the usable cores split over the local ranks."""
    return max(cores // max(ranks, 1), 1)


def core_share(cores: int, ranks: int, threads: int) -> float:
    """How much longer a rank's CPU work takes because ranks share cores: 1 while every
    thread has a core, ranks x threads / cores beyond."""
    return max(1.0, ranks * threads / max(cores, 1))


@dataclass(frozen=True)
class StepLayout:
    """What the model needs of a candidate: its mesh's degrees, batch split, checkpointing,
    and how the run's FSDP and pipeline are set up."""

    mesh: ParallelLayout = ParallelLayout()
    micro_batch: int = 1  # samples per replica per forward pass
    accumulation: int = 1
    microbatches: int = 1  # pipeline micro-batches per forward pass
    checkpointing: str = "none"
    param_dtype: str = "fp32"  # FSDP2's MixedPrecisionPolicy: what its all-gathers move
    reduce_dtype: str = "fp32"  # ... and its reduce-scatter / HSDP all-reduce
    reshard_after_forward: bool = True  # FSDP gathers again for the backward
    schedule: str = "1f1b"  # pipeline schedule (ddl_strategies.pipeline)
    stages_per_rank: int = 1  # the interleaved and looped schedules' v


@dataclass(frozen=True)
class Sizes:
    """What the layout moves and recomputes. ``param_bytes``: the parameters one pipeline
    rank holds (as stored: fp32) before tensor parallel and FSDP split them (gradients are
    as big); ``rowwise_bytes``: per sample, the outputs of the row-parallel layers tensor
    parallel all-reduces, over ``rowwise_layers`` layers (one all-reduce each);
    ``boundary_bytes``: per sample, the activations crossing one stage boundary;
    ``units``: FSDP units of a pipeline rank (the workload's ``fsdp_units`` it holds + the
    root); ``recompute``: per checkpointing mode, the share of the forward FLOPs its
    backward runs again (missing: :data:`RECOMPUTE`'s assumption); ``stage_shares``: each
    pipeline stage's share of the FLOPs (empty: equal); ``shared``: (weights, bytes) that
    more than one pipeline rank holds a copy of (fp32, before tp and FSDP split them);
    ``buffers``: (dtypes, bytes) of the model's buffers, which DDP broadcasts."""

    param_bytes: float
    rowwise_bytes: float = 0.0
    boundary_bytes: float = 0.0
    units: int = 1
    rowwise_layers: int = 0
    recompute: Mapping[str, float] = field(default_factory=dict)
    stage_shares: tuple[float, ...] = ()
    shared: tuple[int, float] = (0, 0.0)
    buffers: tuple[int, float] = (0, 0.0)


@dataclass(frozen=True)
class StepTime:
    compute_s: float  # the slowest rank's compute, before the bubble
    comm_s: dict[str, float]  # each dimension's collectives, as if nothing overlapped
    bubble: float
    total_s: float
    exposed_s: dict[str, float] = field(default_factory=dict)  # what compute cannot hide
    sync_wait_s: float = 0.0  # waiting for the slowest rank (Compute.sync_wait)

    def as_dict(self) -> dict:
        return {"step_s": self.total_s, "compute_s": self.compute_s,
                "comm_s": dict(self.comm_s), "exposed_s": dict(self.exposed_s),
                "bubble": self.bubble, "sync_wait_s": self.sync_wait_s}


def recompute_share(layout: StepLayout, sizes: Sizes | None = None) -> float:
    """Share of the forward FLOPs the backward recomputes under the layout's checkpointing."""
    measured = sizes.recompute if sizes is not None else {}
    if layout.checkpointing in measured:
        return measured[layout.checkpointing]
    return RECOMPUTE[layout.checkpointing] * 3 - 3


def measured_parts(layout: StepLayout, compute: Compute, sizes: Sizes | None = None
                   ) -> tuple[float, float, tuple[float, ...]] | None:
    """From a CPU's measured costs (``compute.costs``), on one thread and before the
    cores are shared: (the slowest stage's passes per step, the optimizer's step over
    what the rank holds, each stage's share of one micro-batch's time through all
    stages), or None where the costs do not cover the layout's pipeline degree (the
    second number also holds fetching the step's batches). A pass
    of n samples costs ``pass_s + n sample_s / tp`` (tensor parallel splits the
    arithmetic, not the operators' count), recomputation adding its share of the
    forward (a third of the pass)."""
    costs = compute.costs
    if costs is None or layout.mesh.pp not in costs.stages:
        return None
    m = max(layout.microbatches, 1)
    n = layout.micro_batch / m  # samples per pipeline micro-batch (pp 1: per pass)
    grow = 1 + recompute_share(layout, sizes) / 3
    times = [(a + b * n / layout.mesh.tp) * grow for a, b in costs.stages[layout.mesh.pp]]
    slowest = max(times)
    passes = layout.accumulation * m * slowest
    stage = sizes.param_bytes if sizes is not None else costs.param_bytes
    share = min(stage / costs.param_bytes, 1.0) if costs.param_bytes else 1.0
    optimizer = costs.optimizer_s * share / (layout.mesh.tp * layout.mesh.dp_shard)
    fetch = layout.accumulation * (costs.data[0] + costs.data[1] * layout.micro_batch)
    # the wrappers' own host work (wrapper_calibration): FSDP2's per unit and pass, DDP's
    # and tensor parallel's per pass; each also in the optimizer's step (DTensor)
    mesh, wrap = layout.mesh, costs.wrappers
    data = "fsdp" if uses_fsdp(mesh) else "ddp" if mesh.dp_replicate > 1 else None
    for kind in (data, "tp" if mesh.tp > 1 else None, "pipeline" if mesh.pp > 1 else None):
        if kind in wrap:
            units = (sizes.units if sizes is not None else wrap[kind].get("units", 1)) \
                if kind == "fsdp" else 1
            passes += layout.accumulation * m * wrap[kind]["pass_s"] * max(units, 1)
            optimizer += wrap[kind]["optimizer_s"] * share
    return passes, optimizer + fetch, tuple(t / sum(times) if sum(times) else 1 / len(times)
                                            for t in times)


def compute_seconds(layout: StepLayout, flops_per_sample: float, compute: Compute,
                    local_ranks: int | None = None, sizes: Sizes | None = None) -> float:
    """One rank's compute per optimizer step, before the bubble: the slowest pipeline
    stage's share (``sizes.stage_shares``; equal: 1/pp), recomputation included; on a
    CPU with measured costs, the slowest stage's measured passes and the optimizer."""
    ranks = local_ranks or layout.mesh.world_size
    threads = threads_per_rank(compute.cores, ranks)
    speed = threads * (compute.thread_efficiency if threads > 1 else 1.0)
    measured = measured_parts(layout, compute, sizes) if compute.cpu else None
    if measured is not None:
        return (measured[0] / speed + measured[1]) * core_share(compute.cores, ranks, threads)
    samples = layout.micro_batch * layout.accumulation  # per replica per step
    shares = sizes.stage_shares if sizes is not None and layout.mesh.pp > 1 else ()
    share = max(shares) if shares else 1 / layout.mesh.pp
    flops = flops_per_sample * samples * share / layout.mesh.tp
    flops *= 1 + recompute_share(layout, sizes) / 3
    rate = compute.peak_flops * compute.efficiency
    fixed = compute.fixed_s
    if not compute.cpu:
        return flops / rate + fixed
    return (flops / (rate * speed) + fixed) * core_share(compute.cores, ranks, threads)


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DDP_BUCKET_BYTES = 25 * 2 ** 20  # DistributedDataParallel's bucket_cap_mb default


def _comm(layout: StepLayout, sizes: Sizes, network: Network,
          crosses: Mapping[str, bool]) -> dict[str, tuple[float, ...]]:
    """Per dimension the times of its collectives, kept apart where overlap treats them
    apart: dp_shard (forward gathers, backward gathers, reduce-scatter) per step;
    dp_replicate (its all-reduce); tp, pp (one number)."""
    out: dict[str, tuple[float, ...]] = {}

    def link(dim: str) -> Link:
        return network.link(bool(crosses.get(dim)))

    mesh, steps = layout.mesh, layout.accumulation
    local = sizes.param_bytes / mesh.tp  # what FSDP and DDP see of a rank's stages (fp32)
    gathered = local * DTYPE_BYTES[layout.param_dtype] / 4
    reduced = local * DTYPE_BYTES[layout.reduce_dtype] / 4
    units = max(sizes.units, 1)  # FSDP2 gathers and reduces unit by unit
    if mesh.dp_shard > 1:
        ln, p = link("dp_shard"), mesh.dp_shard
        gather = ln.seconds("all_gather", gathered, p, units)
        out["dp_shard"] = (steps * gather, steps * gather * layout.reshard_after_forward,
                           ln.seconds("reduce_scatter", reduced, p, units))
    if mesh.dp_replicate > 1:
        fsdp2 = mesh.dp_shard > 1 or mesh.tp > 1 or mesh.pp > 1
        nbytes = reduced if fsdp2 else local
        # DDP: one call per 25 MiB bucket; FSDP2 (HSDP): one per unit
        calls = units if fsdp2 else max(1, -(-int(local) // DDP_BUCKET_BYTES))
        ln, p = link("dp_replicate"), mesh.dp_replicate
        alpha, bandwidth = ln.numbers("p2p")
        out["dp_replicate"] = (ln.seconds("all_reduce", nbytes / mesh.dp_shard, p, calls),
                               0.0 if fsdp2 else steps * (sizes.buffers[0] * (p - 1) * alpha
                                                          + sizes.buffers[1] / bandwidth))
    if mesh.tp > 1 and sizes.rowwise_bytes:
        # per forward pass of m samples one all-reduce per row-parallel layer (its output)
        # and one in the backward (full checkpointing: the forward's again)
        layers = max(sizes.rowwise_layers, 1)
        passes = steps * max(layout.microbatches, 1)
        per_layer = sizes.rowwise_bytes * layout.micro_batch / max(layout.microbatches, 1) \
            / layers
        calls = 3 if layout.checkpointing == "full" else 2
        out["tp"] = (calls * passes * layers * link("tp").seconds("all_reduce", per_layer,
                                                                  mesh.tp),)
    if mesh.pp > 1 and sizes.boundary_bytes:
        m = max(layout.microbatches, 1)
        per_message = sizes.boundary_bytes * layout.micro_batch / m
        # a middle stage sends forward and backward, per micro-batch; then once per step
        out["pp"] = (2 * steps * m * link("pp").seconds("p2p", per_message, 2)
                     + step_end(link("pp"), sizes.shared, mesh.tp * mesh.dp_shard),)
    return out


def comm_seconds(layout: StepLayout, sizes: Sizes, network: Network,
                 crosses: Mapping[str, bool] | None = None) -> dict[str, float]:
    """Seconds of communication per optimizer step, per mesh dimension, as if none of it
    overlapped. ``crosses``: which dimensions' groups span nodes (default: none)."""
    return {dim: sum(parts) for dim, parts in _comm(layout, sizes, network,
                                                    crosses or {}).items()}


def _hidden(comm: float, compute: float, pieces: int, edges: int = 1) -> float:
    """Exposed part of ``comm`` split in ``pieces`` equal pieces that each run under the
    compute of a neighbouring piece: the ``edges`` pieces nothing overlaps (the first
    gather; the last reduction), and what the compute cannot cover of the rest."""
    if comm <= 0:
        return 0.0
    edge = min(comm, edges * comm / max(pieces, 1))
    return edge + max(0.0, comm - edge - compute)


def exposed_seconds(layout: StepLayout, sizes: Sizes, network: Network, busy_s: float,
                    crosses: Mapping[str, bool] | None = None, overlap: bool = True
                    ) -> dict[str, float]:
    """Per dimension, the communication compute does not hide (module docstring:
    Overlap). ``busy_s``: the rank's compute per step; ``overlap`` False (CPU ranks):
    all of it."""
    parts = _comm(layout, sizes, network, crosses or {})
    if not overlap:
        return {dim: sum(p) for dim, p in parts.items()}
    r = recompute_share(layout, sizes)
    per_micro = busy_s / max(layout.accumulation, 1)
    forward, backward = per_micro / (3 + r), per_micro * (2 + r) / (3 + r)
    out = {dim: sum(p) for dim, p in parts.items() if dim in ("tp", "pp")}
    mesh, steps = layout.mesh, max(layout.accumulation, 1)
    units = max(sizes.units, 1)
    ddp = mesh.dp_shard == mesh.tp == mesh.pp == 1
    fwd_gather, bwd_gather, scatter = parts.get("dp_shard", (0.0, 0.0, 0.0))
    replicate = parts.get("dp_replicate", (0.0,))[0]
    if ddp and replicate:  # buckets filled as the last micro-step's backward runs; the
        # buffers' broadcast before each forward hides under nothing
        buckets = max(1, -(-int(sizes.param_bytes) // DDP_BUCKET_BYTES))
        out["dp_replicate"] = _hidden(replicate, backward, buckets) + parts["dp_replicate"][1]
        return out
    # FSDP2 (HSDP; replicate-only under tp or pp is FSDP2 too): per micro-step the
    # forward's gathers under the forward, the backward's under the backward; the last
    # micro-step's backward also reduces (reduce-scatter, then HSDP's all-reduce)
    fwd = steps * _hidden(fwd_gather / steps, forward, units)
    bwd = (steps - 1) * _hidden(bwd_gather / steps, backward, units)
    last = bwd_gather / steps + scatter + replicate
    bwd += _hidden(last, backward, units, edges=2 if bwd_gather and scatter else 1)
    total = fwd + bwd
    raw = fwd_gather + bwd_gather + scatter + replicate
    for dim, own in (("dp_shard", fwd_gather + bwd_gather + scatter),
                     ("dp_replicate", replicate)):
        if dim in parts:
            out[dim] = total * own / raw if raw else 0.0
    return out


def step_time(layout: StepLayout, flops_per_sample: float, compute: Compute,
              sizes: Sizes, network: Network, crosses: Mapping[str, bool] | None = None,
              local_ranks: int | None = None) -> StepTime:
    """Compute stretched by the pipeline bubble, plus the communication compute does not
    hide (on a CPU: all of it); a pipeline's hand-offs as long as its schedule waits for
    them (:func:`ddl.planning.pipeline_schedule.handoff_wait`)."""
    busy = compute_seconds(layout, flops_per_sample, compute, local_ranks, sizes)
    mesh, crosses = layout.mesh, crosses or {}
    shares = tuple(sizes.stage_shares) if mesh.pp > 1 else ()
    measured = measured_parts(layout, compute, sizes) if compute.cpu else None
    stretched = busy
    if measured is not None:  # the measured stage times set the fill and drain; the
        # optimizer runs once, after the schedule
        shares = measured[2] if mesh.pp > 1 else ()
        stretched = busy * measured[0] / (measured[0] + measured[1]) \
            if measured[0] + measured[1] else busy
    b = bubble(mesh.pp, layout.microbatches, layout.schedule, layout.stages_per_rank,
               max(shares) if shares else None)
    comm = comm_seconds(layout, sizes, network, crosses)
    exposed = exposed_seconds(layout, sizes, network, busy, crosses, overlap=not compute.cpu)
    if "pp" in exposed:
        shares = shares if len(shares) == mesh.pp else (1 / mesh.pp,) * mesh.pp
        m = max(layout.microbatches, 1)
        slowest = stretched / (max(layout.accumulation, 1) * m)  # one micro-batch, F + B
        times = [slowest * share / max(shares) for share in shares]
        link = network.link(bool(crosses.get("pp")))
        message = link.seconds("p2p", sizes.boundary_bytes * layout.micro_batch / m, 2)
        wait = handoff_wait(layout.schedule, m, [t / 3 for t in times],
                            [t * 2 / 3 for t in times], message)
        if wait is not None:  # else (several stages per rank): every hand-off exposed;
            # then the loss's broadcast and the shared weights' all-reduce
            exposed["pp"] = max(layout.accumulation, 1) * wait \
                + step_end(link, sizes.shared, mesh.tp * mesh.dp_shard)
    late = compute.sync_wait * busy if compute.cpu and mesh.world_size > 1 else 0.0
    total = stretched / (1 - b) + (busy - stretched) + sum(exposed.values()) + late
    return StepTime(busy, comm, b, total, exposed, late)
