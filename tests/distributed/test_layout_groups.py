"""The process groups ``ParallelLayout.groups`` names (and ``ddl layout`` prints) are the ones
torch builds: the real DeviceMesh of the layout on 4 gloo ranks, each rank reading the ranks
of its group on every dimension. Four layouts of two split dimensions each put every
neighbouring pair of the order pp, dp_replicate, dp_shard, tp (and pp against tp) side by
side, which fixes the whole row-major order; the 4-rank pool is the one the equivalence
tests use (an 8-rank pool would cost its start-up for this test alone)."""

from __future__ import annotations

import pytest

from ddl.contract.layout import DIMS, ParallelLayout

pytestmark = pytest.mark.distributed

LAYOUTS = {"pp x tp": ParallelLayout(pp=2, tp=2),
           "HSDP": ParallelLayout(dp_replicate=2, dp_shard=2),
           "pp x dp_replicate": ParallelLayout(pp=2, dp_replicate=2),
           "dp_shard x tp": ParallelLayout(dp_shard=2, tp=2)}


def mesh_groups(layouts: dict[str, ParallelLayout]) -> dict[str, dict[str, list[int]]]:
    """Cell: this rank's group on each dimension of each layout's DeviceMesh."""
    import torch.distributed as dist

    seen = {}
    for name, layout in layouts.items():
        mesh = layout.device_mesh("cpu")
        seen[name] = {dim: sorted(dist.get_process_group_ranks(mesh[dim].get_group()))
                      for dim in DIMS}
    return seen


def test_groups_are_the_device_mesh_groups(rank_pools):
    by_rank = rank_pools[4].run(mesh_groups, LAYOUTS, timeout_s=120)
    for name, layout in LAYOUTS.items():
        for dim in DIMS:
            expected = layout.groups(dim)
            assert sorted(r for group in expected for r in group) == list(range(4))
            for rank, seen in enumerate(by_rank):
                mine = next(group for group in expected if rank in group)
                assert seen[name][dim] == mine, (name, dim, rank, seen[name][dim], mine)
