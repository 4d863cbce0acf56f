"""The persistent rank pools (tests/rankpool.py) the equivalence cells run on: every rank runs
a cell, a failure names its rank and the exception, a hang ends by the timeout naming the
ranks that did not answer, and after either the next cell runs on a fresh pool, as it does
when a rank ended between cells."""

from __future__ import annotations

import os
import signal
import time

import pytest
from rankpool import CellFailed

pytestmark = pytest.mark.distributed


# --- cells: module-level functions, so the ranks can import them ---------------------------

def whoami() -> dict:
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    return {"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": total.item(),
            "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
            "pid": os.getpid()}


def raise_on(bad_rank: int) -> None:
    import torch
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        raise ValueError(f"planted failure on rank {bad_rank}")
    dist.all_reduce(torch.ones(1))  # the others wait here for the rank that raised


def skip_collective_on(skipping_rank: int) -> None:
    import torch
    import torch.distributed as dist

    if dist.get_rank() != skipping_rank:
        dist.all_reduce(torch.ones(1))  # never completes: one rank is not taking part


def make_groups() -> int:
    """What strategies do: a DeviceMesh and an extra group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.distributed_c10d import _world

    init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("a", "b"))
    dist.new_group(list(range(dist.get_world_size())))
    return len(_world.pg_map)


def count_groups() -> int:
    from torch.distributed.distributed_c10d import _world

    return len(_world.pg_map)


# --- tests ----------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")  # the pool joins its ranks: no zombies linger


def test_every_rank_runs_the_cell_as_a_ddl_worker_would(rank_pools):
    results = rank_pools[2].run(whoami)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["sum"] == 1.0 for r in results)
    assert all(r["threads"] == 1 and r["omp"] == "1" for r in results)
    assert len({r["pid"] for r in results}) == 2 and os.getpid() not in {r["pid"] for r in results}


def test_failing_cell_names_rank_and_exception_and_the_pool_recovers(rank_pools):
    pool = rank_pools[2]
    pool.run(whoami)
    old_pids, starts = pool.pids(), pool.starts
    with pytest.raises(CellFailed) as failed:
        pool.run(raise_on, 1)
    message = str(failed.value)
    assert "failed on rank(s) 1\n" in message, message
    assert "--- rank 1: ValueError: planted failure on rank 1" in message, message
    assert "in raise_on" in message, message  # where it was raised, from the traceback
    assert "rank(s) 0 did not answer" in message, message  # stuck waiting for rank 1
    assert not pool.running and not any(_alive(pid) for pid in old_pids)

    results = pool.run(whoami)  # the next cell on the same world size
    assert [r["sum"] for r in results] == [1.0, 1.0]
    assert pool.starts == starts + 1 and not set(pool.pids()) & set(old_pids)


def test_a_rank_ended_between_cells_is_replaced_before_the_next_cell(rank_pools, capfd):
    """Between cells nothing has been sent: the cell runs on a fresh pool instead of
    failing for what happened before it (stderr says which rank had gone, and how)."""
    pool = rank_pools[2]
    pool.run(whoami)
    old_pids, starts = pool.pids(), pool.starts
    os.kill(old_pids[1], signal.SIGKILL)  # alive and the pool's own: the pid is not reused
    pool._procs[1].join(30)
    assert [r["sum"] for r in pool.run(whoami)] == [1.0, 1.0]
    assert pool.starts == starts + 1 and not set(pool.pids()) & set(old_pids)
    assert "ranks (rank, exit code) [(1, -9)] of the pool of 2 ended" in capfd.readouterr().err


def test_hang_ends_by_the_timeout_and_names_the_missing_ranks(rank_pools):
    pool = rank_pools[2]
    began = time.monotonic()
    with pytest.raises(CellFailed) as failed:
        pool.run(skip_collective_on, 0, timeout_s=5)
    waited = time.monotonic() - began
    message = str(failed.value)
    assert "rank(s) 1 did not answer within the cell's 5 s timeout" in message, message
    assert "failed on rank(s) -" in message, message  # nobody raised: rank 0 finished
    assert 5 <= waited < 60, waited
    assert pool.run(whoami)[1]["sum"] == 1.0


def test_a_cell_leaves_no_process_groups_behind(rank_pools):
    pool = rank_pools[2]
    before = pool.run(count_groups)
    assert all(n > before[0] for n in pool.run(make_groups))  # groups were made...
    assert pool.run(count_groups) == before == [1, 1]  # ...and destroyed after the cell


def test_close_stops_every_rank(rank_pools):
    pool = rank_pools[2]
    pool.run(whoami)
    pids = pool.pids()
    pool.close()
    assert not any(_alive(pid) for pid in pids)
