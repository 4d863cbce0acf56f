"""The run's one DeviceMesh: built once per worker from the parallel layout, handed to
everything that needs a rank or a group through the strategy context (``run.mesh``, and
``run.dp_mesh`` for the data-parallel ranks).

After torchtitan's ParallelDims: the four named dimensions of the layout
(``pp``, ``dp_replicate``, ``dp_shard``, ``tp``; sizes of 1 included, so each can be sliced
by name) and ``dp``, the two data-parallel dimensions flattened into one: the ranks that
see different data. The strategies shard and split over ``mesh[dim]``, the pipeline runs
over ``mesh["pp"]``, sync-BN reduces over the ``dp`` mesh, and the data loaders take their
share of the batch from its local rank. No other module works a rank out by arithmetic
(tests/unit/test_mesh_owner.py).
"""

from __future__ import annotations

from typing import Any

from ddl.contract.layout import ParallelLayout
from ddl.contract.world import World

DP = "dp"  # the flattened data-parallel dimension


def build(layout: ParallelLayout, world: World) -> tuple[Any, Any]:
    """(the mesh of ``layout`` over this world, its ``dp`` mesh): a collective, every rank
    calls it. The flattened mesh is kept apart, not sliced from the root again later
    (torch deprecates slicing a flattened dimension from the root mesh)."""
    mesh = layout.device_mesh(world.device.type)
    return mesh, mesh["dp_replicate", "dp_shard"]._flatten(DP)


def data_shard(dp_mesh: Any) -> tuple[int, int]:
    """(which share of the global batch this rank trains on, how many shares)."""
    return dp_mesh.get_local_rank(), dp_mesh.size()
