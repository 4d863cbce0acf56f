"""One global-batch rule (issue 50, item 4): global batch = per-replica batch x dp, the
tensor- and pipeline-parallel ranks of a replica sharing its batch. ``--mesh auto`` (with
the planner stubbed to choose a tp=2 or a pp=2 layout) and the pre-flight's batch split
(ddl.settings.batch.resolve_batch) must arrive at the same numbers for the same layout,
and neither may keep an arithmetic of its own."""

from __future__ import annotations

import pytest

from ddl.contract.layout import ParallelLayout
from ddl.contract.plugins import Plugins
from ddl.settings import batch
from ddl.settings import config as cfg
from ddl.settings import plan as run_plan

pytestmark = pytest.mark.unit

WORLD = 4
MESHES = {"tp=2": {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 2},
          "pp=2": {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 1}}


def _auto(monkeypatch, tmp_path, mesh: dict, **flags):
    """``--mesh auto`` on WORLD processes with the planner choosing ``mesh``: (the global
    batch the planner was asked to split, the configuration auto made)."""
    from ddl.commands import auto_layout
    from ddl.commands import plan as plan_command

    asked = {}

    def planner(spec, preset, site, per_node, world, global_batch, data_dir, **_):
        asked["global"] = global_batch
        per_replica = global_batch // ParallelLayout(**mesh).dp  # as layout_search cuts it
        return {"ranked_by": "stub", "dropped": [], "fits": [{
            "mesh": mesh, "micro_batch": per_replica // 2, "accumulation": 2,
            "activation_checkpointing": "none", "pipeline_microbatches": None,
            "memory_per_rank_bytes": 1, "model_state_bytes": 1, "activation_bytes": 1,
            "step_s": None}]}

    monkeypatch.setattr(plan_command, "plan_layouts", planner)
    plugins = Plugins()
    built = cfg.build({"plugin": "mnist", "site": "local", "nproc": WORLD,
                       "strategy": "mesh", **flags}, {}, plugins)
    chosen = auto_layout.choose(run_plan.make_plan(built, env={}, runs=tmp_path), plugins)
    return asked["global"], chosen.config


@pytest.mark.parametrize("name", MESHES)
def test_auto_and_the_preflight_split_the_batch_alike(monkeypatch, tmp_path, name):
    mesh, layout = MESHES[name], ParallelLayout(**MESHES[name])
    preset = Plugins().workload("mnist").presets["course"].batch_size
    planned, config = _auto(monkeypatch, tmp_path, mesh)
    # auto keeps the global batch of the layout it starts from: every process a replica
    assert planned == preset * WORLD
    # the pre-flight, given auto's choice, trains that global batch on the layout's dp
    split = batch.resolve_batch(config, preset, layout.dp)
    assert split.global_ == planned == split.per_replica * layout.dp
    assert (split.micro, split.accumulation) == (planned // layout.dp // 2, 2)
    # the same layout asked for by hand, with that global batch: the same split
    by_hand = cfg.build({"plugin": "mnist", "site": "local", "nproc": WORLD, "mesh": mesh,
                         "global_batch_size": planned, "batch_size": split.micro}).config
    assert batch.resolve_batch(by_hand, preset, layout.dp) == split
    # and without --global-batch-size: tp and pp ranks share a replica's batch
    plain = cfg.build({"plugin": "mnist", "site": "local", "nproc": WORLD,
                       "mesh": mesh}).config
    assert batch.resolve_batch(plain, preset, layout.dp).global_ == preset * layout.dp


def test_auto_has_no_batch_arithmetic_of_its_own(monkeypatch, tmp_path):
    """A second rule in auto_layout (or a per-process x world of its own) fails here."""
    monkeypatch.setattr(batch, "global_batch", lambda given, per_replica, dp: 4242)
    planned, _ = _auto(monkeypatch, tmp_path, MESHES["tp=2"], batch_size=8)
    assert planned == 4242
