"""`--eval-samples N` (quick checks): validation and test read the first N samples of each
split, training all of its own; without the flag every sample is evaluated."""

from __future__ import annotations

import pytest
from pool_train import _plugins, prepare

pytestmark = pytest.mark.distributed


def split_sizes(plan) -> dict:
    import torch
    import torch.distributed as dist

    from ddl.contract.world import World
    from ddl.worker.train.setup import set_up

    world = World(rank=dist.get_rank(), local_rank=dist.get_rank(),
                  size=dist.get_world_size(), device=torch.device("cpu"), backend="gloo")
    run = set_up(plan.config, world, _plugins(), plan.run_dir, workers=0,
                 resolved=plan.resolved)
    return {"val": len(run.val_loader.dataset), "test": len(run.test_loader.dataset),
            "train": len(run.splits["train"])}


@pytest.mark.parametrize("limit", [None, 7])
def test_eval_samples_limits_evaluation_only(tmp_path, synthetic_mnist, rank_pools, limit):
    args = ["--plugin", "mnist", "--preset", "tiny", "--data-dir", str(synthetic_mnist),
            "--epochs", "1", "--steps-per-epoch", "1"]
    if limit:
        args += ["--eval-samples", str(limit)]
    sizes = rank_pools[1].run(split_sizes, prepare(args, tmp_path / "run", 1))[0]
    if limit is None:
        assert sizes["val"] > 7 and sizes["test"] > 7
    else:
        assert sizes["val"] == sizes["test"] == limit
    assert sizes["train"] > 7


def test_a_workloads_test_report_reads_the_limited_split(tmp_path, synthetic_xsum, rank_pools):
    """xsum's ROUGE reads its test set's own fields (the reference summaries): the limited
    split still has them, and ROUGE is computed over the first N articles."""
    from pool_train import train_cell

    args = ["--plugin", "xsum", "--preset", "tiny", "--data-dir", str(synthetic_xsum),
            "--epochs", "1", "--steps-per-epoch", "1", "--eval-samples", "3"]
    results = rank_pools[1].run(train_cell, prepare(args, tmp_path / "run", 1))[0]["results"]
    assert "rouge1" in results["final"]["test"]
