"""The parallel layout of a run: how many ways each kind of parallelism splits the world.

Four named degrees, after torchtitan's ParallelDims, in the order ranks are laid out
(outermost first, the order of the one DeviceMesh a run builds):

    pp            pipeline stages            (activations sent between neighbours)
    dp_replicate  whole replicas of the batch's shards (gradients all-reduced, DDP-style)
    dp_shard      ranks sharing one replica's parameters (FSDP: gathered, reduce-scattered)
    tp            ranks splitting each big matrix (tensor parallel: all-reduce per layer pair)

Their product is the world size. Rank r sits at coordinates ``r`` written in that mixed
radix: tensor-parallel ranks are neighbours (one node's GPUs share the fastest links), the
pipeline is outermost (only its hand-offs cross nodes). ``dp`` = dp_replicate x dp_shard
replicas see different data; ``--mesh dp=N`` is shorthand for the kind of data parallelism
the strategy does.

:func:`resolve` is the one place degrees are worked out from ``--mesh`` and the world
size; the CLI's pre-flight check runs it before any worker starts. No torch here except in
:meth:`ParallelLayout.device_mesh`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ddl.contract.errors import UsageError

DIMS = ("pp", "dp_replicate", "dp_shard", "tp")  # outermost first
DATA_PARALLEL = ("dp_replicate", "dp_shard")
# How --mesh resolves when no strategy is named (the composed strategy "mesh",
# ddl_strategies.compose, and `ddl layout`): every dimension, dp meaning dp_shard, and
# what --mesh leaves open is FSDP-sharded.
MESH_ALLOWED = frozenset(DIMS) | {"dp"}
MESH_DP_MEANS = "dp_shard"
MESH_FILL = ("dp_shard",)


@dataclass(frozen=True)
class ParallelLayout:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Replicas that see different data: the global batch is split over them."""
        return self.dp_replicate * self.dp_shard

    def degrees(self) -> dict[str, int]:
        return asdict(self)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits on each dimension (0-based)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a layout of {self.world_size}")
        where: dict[str, int] = {}
        for dim in reversed(DIMS):  # tp varies fastest
            rank, where[dim] = divmod(rank, getattr(self, dim))
        return {dim: where[dim] for dim in DIMS}

    def dp_rank(self, rank: int) -> int:
        """Which share of the global batch ``rank`` trains on."""
        at = self.coordinates(rank)
        return at["dp_replicate"] * self.dp_shard + at["dp_shard"]

    def groups(self, dim: str) -> list[list[int]]:
        """The process groups of ``dim``: ranks that differ only in that coordinate (the
        ones that talk over it), by their first rank. The same groups as ``mesh[dim]`` of
        :meth:`device_mesh` (tests/distributed/test_layout_groups.py)."""
        if dim not in DIMS:
            raise ValueError(f"no dimension {dim!r}; the dimensions are {', '.join(DIMS)}")
        stride = 1  # ranks between neighbours along dim: the sizes of the faster dims
        for inner in DIMS[DIMS.index(dim) + 1:]:
            stride *= getattr(self, inner)
        size = getattr(self, dim)
        return [[first + k * stride for k in range(size)]
                for first in range(self.world_size) if self.coordinates(first)[dim] == 0]

    def describe(self) -> str:
        """e.g. ``pp=2 x dp_shard=2 x tp=2`` (the degrees above 1; ``1 process`` if none)."""
        parts = [f"{dim}={getattr(self, dim)}" for dim in DIMS if getattr(self, dim) > 1]
        return " x ".join(parts) or "1 process"

    def device_mesh(self, device_type: str) -> Any:
        """The run's one DeviceMesh over all four dimensions (sizes of 1 included, so every
        dimension can be sliced by name: ``mesh["tp"]``, ``mesh["pp"]``). A collective: every
        rank of the world calls it."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, tuple(getattr(self, d) for d in DIMS),
                                mesh_dim_names=DIMS)


def resolve(mesh: Mapping[str, int], world_size: int, *, strategy: str,
            allowed: frozenset[str], dp_means: str, fill: tuple[str, ...],
            defaults: Mapping[str, int] | None = None,
            minimum: Mapping[str, int] | None = None) -> ParallelLayout:
    """The layout ``--mesh`` asks for on ``world_size`` processes, for a strategy that
    accepts the dimensions ``allowed`` (``dp`` meaning ``dp_means``). The first dimension of
    ``fill`` that ``--mesh`` leaves open takes the processes the others leave; the other open
    ones take ``defaults`` (else 1). Each problem is one UsageError naming the degree and
    what is allowed."""
    given = dict(mesh)
    unknown = sorted(set(given) - allowed)
    if unknown:
        names = ", ".join(sorted(allowed)) or "none (--mesh is for strategies with several " \
            "parallel dimensions, e.g. fsdp+tp, pp)"
        raise UsageError(f"--mesh: {strategy} has no dimension {unknown[0]!r}; allowed: {names}")
    if "dp" in given:
        if dp_means in given:
            raise UsageError(f"--mesh: dp is shorthand for {dp_means} under {strategy}; give "
                             "one of them")
        given[dp_means] = given.pop("dp")
    for dim, size in given.items():
        if size < 1:
            raise UsageError(f"--mesh: {dim}={size}; allowed: a whole number >= 1")
    rest = next((dim for dim in fill if dim not in given), None)
    degrees = {dim: size for dim, size in (defaults or {}).items() if dim != rest}
    degrees.update(given)
    if rest is not None:
        others = 1
        for size in degrees.values():
            others *= size
        if world_size % others:
            named = " x ".join(f"{d}={s}" for d, s in degrees.items())
            named += f" = {others}" if len(degrees) > 1 else ""
            raise UsageError(f"--mesh: {named} does not divide the world of "
                             f"{world_size} processes; allowed: degrees whose product "
                             f"divides {world_size}")
        degrees[rest] = world_size // others
    layout = ParallelLayout(**degrees)
    if layout.world_size != world_size:
        raise UsageError(f"--mesh: {layout.describe()} = {layout.world_size} processes, but "
                         f"the world has {world_size}; the product of the degrees must equal it")
    for dim, least in (minimum or {}).items():
        if getattr(layout, dim) < least:
            where = "--mesh" if dim in mesh else f"--strategy {strategy}"
            raise UsageError(f"{where}: {strategy} needs {dim} >= {least}, but {world_size} "
                             f"process(es) as {layout.describe()} give {dim}="
                             f"{getattr(layout, dim)}; allowed: at least {least} processes on "
                             f"{dim} (more processes, or smaller degrees elsewhere)")
    return layout


def check_heads(heads: int, tp: int) -> None:
    """Tensor parallel splits each attention layer's heads over the ``tp`` ranks of a group:
    ``tp`` must divide ``heads``. One rule, two callers: a workload's
    ``prepare_tensor_parallel`` on its model's real head count (in the job), and ``ddl
    submit`` on the count a preset declares (``Preset.attention_heads``), before the queue
    and without torch."""
    if tp > 1 and heads % tp:
        fitting = ([d for d in range(1, heads + 1) if heads % d == 0] if heads <= 4096
                   else [])  # listed where short to work out (real models: a few dozen)
        listed = f" ({', '.join(map(str, fitting))})" if fitting else ""
        raise UsageError(f"--mesh: tp={tp}, but {heads} attention heads do not split over "
                         f"{tp} ranks; allowed: tp dividing {heads}{listed}")
