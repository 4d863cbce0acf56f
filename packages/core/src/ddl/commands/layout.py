"""``ddl layout --mesh pp=2,tp=2,dp_shard=2 --nproc 4 --nodes 2``: which rank holds what.

Resolves ``--mesh`` as a run without ``--strategy`` does (the composed strategy: what the
mesh leaves open is FSDP-sharded), then prints each rank's node and coordinates, the process
groups of every split dimension, and whether each dimension's traffic stays inside a node.
Ranks are numbered node by node (rank = node x processes per node + local rank), as srun's
default block distribution and torchrun number them. No torch: the layout is arithmetic.
"""

from __future__ import annotations

import argparse
import textwrap

from ddl.contract.errors import UsageError
from ddl.contract.layout import (
    DIMS,
    MESH_ALLOWED,
    MESH_DP_MEANS,
    MESH_FILL,
    ParallelLayout,
    resolve,
)

TRAFFIC = {  # what travels between the ranks of one group
    "pp": "activations, stage to next stage",
    "dp_replicate": "a gradient all-reduce per step",
    "dp_shard": "all-gathers and reduce-scatters per layer",
    "tp": "all-reduces inside every layer",
}
ADVICE = {  # when a dimension's groups cross nodes
    "tp": "its all-reduces sit inside every layer; keep tp <= processes per node",
    "dp_shard": "HSDP (--mesh dp_replicate=R) can keep the sharding inside a node and "
                "replicate across nodes",
}
#: The most ranks a layout is drawn for: ddl submit's largest job (10000 nodes) of 8 GPUs.
MAX_WORLD = 80_000
WIDTH = 88
DIM_WIDTH = 14  # "dp_replicate" and a gap


def cmd_layout(ns: argparse.Namespace) -> int:
    print(render(*_place(ns.mesh, ns.nproc, ns.nodes)), end="")
    return 0


def _place(mesh: dict[str, int], nproc: int | None, nodes: int) -> tuple[ParallelLayout, int]:
    """The layout and the processes per node, from the flags (each mistake one line)."""
    from ddl.commands.flags import check_whole
    from ddl.launch.submit import MAX_NODES
    from ddl.settings.config import MAX_NPROC

    # the bounds of `ddl train` and `ddl submit`: the table has a row per rank
    check_whole("--nproc", nproc, MAX_NPROC)
    check_whole("--nodes", nodes, MAX_NODES)
    world = 1
    for dim, size in mesh.items():
        world *= size
        check_whole("--mesh (the degrees' product)", world, MAX_WORLD,
                    f" ranks ({MAX_NODES} nodes x 8 GPUs)")
    if nproc is None:  # the world the named degrees make, spread evenly over the nodes
        if world % nodes:
            raise UsageError(f"--nodes: {nodes} nodes cannot share the "
                             f"{_count(world, 'process')} of --mesh evenly; allowed: a divisor of {world}, or --nproc N "
                             "processes per node")
        nproc = world // nodes
    check_whole("--nproc x --nodes", nproc * nodes, MAX_WORLD,
                f" ranks ({MAX_NODES} nodes x 8 GPUs)")
    layout = resolve(mesh, nproc * nodes, strategy="mesh", allowed=MESH_ALLOWED,
                     dp_means=MESH_DP_MEANS, fill=MESH_FILL)
    return layout, nproc


def render(layout: ParallelLayout, nproc: int) -> str:
    """The whole report: degrees, the rank table, the groups and where their traffic runs."""
    nodes = layout.world_size // nproc
    lines = [f"{layout.describe()} on {_count(nodes, 'node')} x {_count(nproc, 'process')}",
             "degrees: " + " ".join(f"{d}={s}" for d, s in layout.degrees().items()), ""]
    lines += _table(layout, nproc)
    split = [dim for dim in DIMS if getattr(layout, dim) > 1]
    if split:
        lines += ["", "groups (ranks that differ only in that coordinate):"]
        for dim in split:
            groups = " ".join("[" + ",".join(map(str, g)) + "]" for g in layout.groups(dim))
            lines += textwrap.wrap(groups, WIDTH, initial_indent=f"  {dim:<{DIM_WIDTH}}",
                                   subsequent_indent=" " * (2 + DIM_WIDTH))
        lines += ["", "where each dimension's traffic runs:"]
        lines += _localities(layout, split, nproc)
    return "\n".join(lines) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"


def _table(layout: ParallelLayout, nproc: int) -> list[str]:
    heads = ["rank", "node", "local", *DIMS]
    rows = [[rank, rank // nproc, rank % nproc, *layout.coordinates(rank).values()]
            for rank in range(layout.world_size)]
    widths = [max(len(head), len(str(rows[-1][k]))) for k, head in enumerate(heads)]
    return ["  ".join(f"{cell:>{w}}" for cell, w in zip(row, widths))
            for row in [heads, *rows]]


def _localities(layout: ParallelLayout, split: list[str], nproc: int) -> list[str]:
    where, notes = {}, []
    for dim in split:
        groups = layout.groups(dim)
        crossing = sum(len({rank // nproc for rank in group}) > 1 for group in groups)
        where[dim] = ("inside a node" if not crossing else "crosses nodes"
                      if crossing == len(groups) else
                      f"{crossing} of {len(groups)} groups cross{'es' * (crossing == 1)} nodes")
        if crossing and dim in ADVICE:
            notes += textwrap.wrap(f"{dim} crosses nodes: {ADVICE[dim]}", WIDTH,
                                   initial_indent="  note: ", subsequent_indent=" " * 8)
    width = max(map(len, where.values()))
    return [f"  {dim:<{DIM_WIDTH}}{at:<{width}}  {TRAFFIC[dim]}" for dim, at in where.items()] \
        + notes
