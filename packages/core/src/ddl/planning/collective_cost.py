"""The alpha-beta cost of a collective on one link of the network: what the step-time model
(ddl.planning.step_time_model) charges for every all-reduce, all-gather, reduce-scatter and
pipeline hand-off, and what ddl.planning.alpha_beta_fit fits measured timings to. No torch.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

OPS = ("all_reduce", "all_gather", "reduce_scatter", "p2p")


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

    def seconds(self, op: str, nbytes: float, p: int, calls: int = 1) -> float:
        """Time of ``op`` moving ``nbytes`` in all over ``p`` ranks on this link, in
        ``calls`` calls (FSDP gathers unit by unit: each call pays its own latency)."""
        if nbytes <= 0 or (p <= 1 and op != "p2p"):
            return 0.0
        alpha, bandwidth = self.numbers(op)
        messages, share = ring_factors(op, p)
        return max(calls, 1) * messages * alpha + share * nbytes / bandwidth


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
