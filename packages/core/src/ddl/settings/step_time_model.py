"""The step-time model: how long one optimizer step of a layout takes, from FLOPs, a device's
rate and an alpha-beta model of the collectives. No torch here (``ddl plan`` and reports
use it without).

Compute. One rank's arithmetic per optimizer step is the workload's training FLOPs per
sample (``Workload.flops_per_sample``: forward + backward) x the samples it processes, over
the rate it reaches: ``peak x efficiency``, with ``peak`` the site profile's
``device_peak_flops`` (or measured: ``ddl.worker.mfu.measure_matmul_peak``) and
``efficiency`` an assumed model FLOPs utilisation (0.4 on GPUs) or a measured one. Tensor
and pipeline parallel split a sample's FLOPs over their degrees; full activation
checkpointing repeats the forward (x 4/3); ``fixed_s`` is a per-step cost that does not
grow with the batch (the optimizer's pass over the parameters, the framework's per-operator
overhead): 0 unless measured (on a CPU it is not small, see ``CpuShare``).

CPU ranks. A CPU "device" is the threads a rank computes with. ddl gives each local rank
``cores // ranks`` threads (at least one, ``ddl.worker.threads``). The rate of ``t`` threads
is ``t`` x the rate of one thread x ``thread_efficiency`` (measured: the workload's
speed-up on ``t`` threads / ``t``; a large matmul's, ~1.0 on 2 cores, overstates what a
second thread gives a small model, ~0.73); the fixed part runs on one thread. When the ranks'
threads outnumber the cores (4 ranks of 1 thread on 2 cores) the kernel shares the cores
out: every rank's compute and fixed part take ``ranks x threads / cores`` times as long.

Communication, alpha-beta (Hockney) with ring algorithms, ``p`` ranks, ``n`` bytes (the
full buffer: the all-reduced tensor, the all-gather's output, the reduce-scatter's input),
``alpha`` the latency of one message, ``beta`` seconds per byte (1 / bandwidth):

    all-reduce      2 (p-1) alpha + 2 (p-1)/p n beta   (reduce-scatter, then all-gather)
    all-gather        (p-1) alpha +   (p-1)/p n beta
    reduce-scatter    (p-1) alpha +   (p-1)/p n beta
    point-to-point          alpha +           n beta

Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1), 2005 (sec. 4: ring all-gather, Rabenseifner's all-reduce as
reduce-scatter + all-gather); the reduction's arithmetic is folded into beta. NCCL's own
tuning model counts the same steps (2 (p-1) for all-reduce, p-1 for all-gather and
reduce-scatter: NVIDIA/nccl src/graph/tuning.cc) and its docs define "bus bandwidth" from the
same factors (nccl-tests doc/PERFORMANCE.md). A group inside one node uses the site's
intra-node link (``intra_node_latency_s``, ``intra_node_bytes_per_s``); a group that crosses
nodes the inter-node link, whose bandwidth is the node's injection bandwidth shared by its
GPUs (``inter_node_bytes_per_s / gpus_per_node``): every GPU of a node runs its own ring at
the same time.

Per layout, per optimizer step (``accumulation`` micro-steps):
- DDP (dp_replicate): one all-reduce of the rank's gradients (after FSDP: its shard);
- FSDP (dp_shard): per micro-step, an all-gather of the parameters in the forward and again
  in the backward, and a reduce-scatter of the gradients (ZeRO-3; FSDP2 without
  reshard_after_forward would skip the second all-gather);
- tensor parallel: per block, an all-reduce of the row-parallel layers' outputs in the
  forward and of the column-parallel inputs' gradients in the backward (Megatron-LM,
  Shoeybi et al. 2019, fig. 3): 2 all-reduces of ``rowwise bytes`` per row-parallel layer;
- pipeline parallel: each boundary sends the activations forward and their gradients back,
  point-to-point, per pipeline micro-batch; the step is stretched by the bubble
  ``(pp-1) / (m + pp-1)`` of GPipe and 1F1B (Narayanan et al. 2021, sec. 2.2), which both
  ddl schedules have; the interleaved and zero-bubble schedules ddl offers are modelled
  with the same bubble (an upper bound for them).

Overlap: none assumed. The step is compute + communication; DDP's bucketed all-reduce and
FSDP's prefetch do overlap them on GPUs, so on a GPU the prediction is an upper bound and
the ranking favours layouts that communicate less. On a CPU with gloo the collectives run
on the same cores as the compute, so little overlaps there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddl.contract.layout import ParallelLayout

OPS = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
RECOMPUTE = {"none": 1.0, "selective": 1.0, "full": 4 / 3}  # selective redoes cheap ops only
ASSUMED_GPU_EFFICIENCY = 0.4  # model FLOPs utilisation assumed on a GPU: ranks, not promises


def ring_factors(op: str, p: int) -> tuple[float, float]:
    """(messages, fraction of the buffer) one rank sends in ``op`` over ``p`` ranks: the
    multipliers of alpha and of ``n beta`` in the formulas above."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; allowed: {', '.join(OPS)}")
    if op == "p2p":
        return 1.0, 1.0
    if p <= 1:
        return 0.0, 0.0
    steps = float(p - 1)
    share = (p - 1) / p
    return (2 * steps, 2 * share) if op == "all_reduce" else (steps, share)


@dataclass(frozen=True)
class Link:
    """One level of the network: latency of a message (alpha, s) and bandwidth (1/beta,
    bytes/s); ``per_op`` holds measured fits of single collectives (op -> (alpha, bytes/s)),
    which win over the pair for that op."""

    latency_s: float
    bytes_per_s: float
    per_op: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def numbers(self, op: str) -> tuple[float, float]:
        return self.per_op.get(op, (self.latency_s, self.bytes_per_s))

    def seconds(self, op: str, nbytes: float, p: int) -> float:
        """Time of one ``op`` of ``nbytes`` over ``p`` ranks on this link."""
        if nbytes <= 0 or (p <= 1 and op != "p2p"):
            return 0.0
        alpha, bandwidth = self.numbers(op)
        messages, share = ring_factors(op, p)
        return messages * alpha + share * nbytes / bandwidth


@dataclass(frozen=True)
class Network:
    intra: Link
    inter: Link | None = None  # None: one node only
    gpus_per_node: int = 1

    def link(self, crosses_nodes: bool) -> Link:
        if not crosses_nodes:
            return self.intra
        if self.inter is None:
            raise ValueError("a group crosses nodes but the network has no inter-node link")
        # the node's injection bandwidth is shared by its devices' rings
        share = max(self.gpus_per_node, 1)
        return Link(self.inter.latency_s, self.inter.bytes_per_s / share,
                    {op: (a, b / share) for op, (a, b) in self.inter.per_op.items()})


@dataclass(frozen=True)
class Compute:
    """What one rank computes with. ``peak_flops``: of one device (a GPU) or of ONE thread
    (a CPU: ``cpu=True``)."""

    peak_flops: float
    efficiency: float = ASSUMED_GPU_EFFICIENCY
    fixed_s: float = 0.0  # per optimizer step, independent of the samples
    cpu: bool = False
    cores: int = 1  # CPU: cores the node's ranks share
    thread_efficiency: float = 1.0  # CPU: rate of t threads / (t x one thread's)


def threads_per_rank(cores: int, ranks: int) -> int:
    """ddl's rule (ddl.worker.threads): the usable cores split over the local ranks."""
    return max(cores // max(ranks, 1), 1)


def core_share(cores: int, ranks: int, threads: int) -> float:
    """How much longer a rank's CPU work takes because ranks share cores: 1 while every
    thread has a core, ranks x threads / cores beyond."""
    return max(1.0, ranks * threads / max(cores, 1))


@dataclass(frozen=True)
class StepLayout:
    """What the model needs of a candidate: its mesh's degrees, batch split, checkpointing."""

    mesh: ParallelLayout = ParallelLayout()
    micro_batch: int = 1  # samples per replica per forward pass
    accumulation: int = 1
    microbatches: int = 1  # pipeline micro-batches per forward pass
    checkpointing: str = "none"


@dataclass(frozen=True)
class Sizes:
    """Bytes the layout moves. ``param_bytes``: the parameters one pipeline rank holds
    before tensor parallel and FSDP split them (gradients are as big); ``rowwise_bytes``:
    per sample, the outputs of the row-parallel layers tensor parallel all-reduces;
    ``boundary_bytes``: per sample, the activations crossing one stage boundary."""

    param_bytes: float
    rowwise_bytes: float = 0.0
    boundary_bytes: float = 0.0


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    comm_s: dict[str, float]
    bubble: float
    total_s: float

    def as_dict(self) -> dict:
        return {"step_s": self.total_s, "compute_s": self.compute_s,
                "comm_s": dict(self.comm_s), "bubble": self.bubble}


def bubble(pp: int, microbatches: int) -> float:
    """Idle share of a GPipe or 1F1B step: (p-1) / (m+p-1)."""
    return (pp - 1) / (microbatches + pp - 1) if pp > 1 else 0.0


def compute_seconds(layout: StepLayout, flops_per_sample: float, compute: Compute,
                    local_ranks: int | None = None) -> float:
    """One rank's compute per optimizer step, before the bubble."""
    samples = layout.micro_batch * layout.accumulation  # per replica per step
    flops = flops_per_sample * samples / (layout.mesh.tp * layout.mesh.pp)
    flops *= RECOMPUTE[layout.checkpointing]
    rate = compute.peak_flops * compute.efficiency
    fixed = compute.fixed_s
    if not compute.cpu:
        return flops / rate + fixed
    ranks = local_ranks or layout.mesh.world_size
    threads = threads_per_rank(compute.cores, ranks)
    speed = threads * (compute.thread_efficiency if threads > 1 else 1.0)
    return (flops / (rate * speed) + fixed) * core_share(compute.cores, ranks, threads)


def comm_seconds(layout: StepLayout, sizes: Sizes, network: Network,
                 crosses: Mapping[str, bool] | None = None) -> dict[str, float]:
    """Seconds of communication per optimizer step, per mesh dimension. ``crosses``: which
    dimensions' groups span nodes (default: none)."""
    crosses = crosses or {}
    out: dict[str, float] = {}

    def link(dim: str) -> Link:
        return network.link(bool(crosses.get(dim)))

    mesh = layout.mesh
    local = sizes.param_bytes / mesh.tp  # what FSDP and DDP see of a rank's stages
    steps = layout.accumulation
    if mesh.dp_shard > 1:
        ln, p = link("dp_shard"), mesh.dp_shard
        out["dp_shard"] = steps * (2 * ln.seconds("all_gather", local, p)
                                   + ln.seconds("reduce_scatter", local, p))
    if mesh.dp_replicate > 1:
        out["dp_replicate"] = link("dp_replicate").seconds(
            "all_reduce", local / mesh.dp_shard, mesh.dp_replicate)
    if mesh.tp > 1 and sizes.rowwise_bytes:
        # per forward pass of m samples one all-reduce per row-parallel layer (its output),
        # and one in the backward; rowwise_bytes sums the layers' outputs per sample
        passes = steps * max(layout.microbatches, 1)
        per_pass = sizes.rowwise_bytes * layout.micro_batch / max(layout.microbatches, 1)
        out["tp"] = 2 * passes * link("tp").seconds("all_reduce", per_pass, mesh.tp)
    if mesh.pp > 1 and sizes.boundary_bytes:
        m = max(layout.microbatches, 1)
        per_message = sizes.boundary_bytes * layout.micro_batch / m
        # a middle stage sends forward and backward, per micro-batch
        out["pp"] = 2 * steps * m * link("pp").seconds("p2p", per_message, 2)
    return out


def step_time(layout: StepLayout, flops_per_sample: float, compute: Compute,
              sizes: Sizes, network: Network, crosses: Mapping[str, bool] | None = None,
              local_ranks: int | None = None) -> StepTime:
    """Compute stretched by the pipeline bubble, plus the communication (no overlap)."""
    busy = compute_seconds(layout, flops_per_sample, compute, local_ranks)
    b = bubble(layout.mesh.pp, layout.microbatches)
    comm = comm_seconds(layout, sizes, network, crosses)
    total = busy / (1 - b) + sum(comm.values())
    return StepTime(busy, comm, b, total)


def fit_alpha_beta(points: list[tuple[str, int, float]], p: int) -> dict[str, float]:
    """Least-squares alpha (s) and bandwidth (bytes/s) from measured ``(op, bytes,
    seconds)`` over ``p`` ranks, each point weighted by 1 / its time (relative errors: the
    small messages set alpha, the large ones beta). A negative solution for either is
    clamped to 0 and the other refitted alone. ``worst_error``: the largest relative
    deviation of a point from the fitted line."""
    rows = []
    for op, nbytes, seconds in points:
        messages, share = ring_factors(op, p)
        if seconds > 0 and (messages or share):
            rows.append((messages / seconds, share * nbytes / seconds))
    if len(rows) < 2:
        raise ValueError("fitting alpha and beta needs at least two timed sizes")
    # minimise sum((a alpha + b beta - 1)^2): the normal equations of the weighted problem
    saa = sum(a * a for a, _ in rows)
    sab = sum(a * b for a, b in rows)
    sbb = sum(b * b for _, b in rows)
    sa1 = sum(a for a, _ in rows)
    sb1 = sum(b for _, b in rows)
    det = saa * sbb - sab * sab
    alpha = (sa1 * sbb - sb1 * sab) / det if det else 0.0
    beta = (saa * sb1 - sab * sa1) / det if det else 0.0
    if alpha < 0 or not det:
        alpha, beta = 0.0, sb1 / sbb
    elif beta <= 0:
        alpha, beta = sa1 / saa, 0.0
    worst = max(abs(a * alpha + b * beta - 1) for a, b in rows)
    return {"latency_s": alpha, "bytes_per_s": 1 / beta if beta > 0 else float("inf"),
            "worst_error": worst, "points": len(rows)}
