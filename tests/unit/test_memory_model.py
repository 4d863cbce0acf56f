"""ddl plan's memory arithmetic (ddl.planning.memory_model) against torch itself: the
torch.chunk rule FSDP2 and DTensor shard with, and the optimizer cost probe against a real
optimizer's state. The whole model against measured runs: test_equivalence_matrix.py."""

from __future__ import annotations

import pytest
import torch

from ddl.planning import memory_model as mm

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("length", [1, 3, 5, 8, 13])
@pytest.mark.parametrize("parts", [1, 2, 4])
def test_chunk_size_is_torch_chunk(length, parts):
    pieces = torch.arange(length).chunk(parts)
    got = [mm.chunk_size(length, parts, i) for i in range(parts)]
    assert got == [len(p) for p in pieces] + [0] * (parts - len(pieces))


def test_tp_then_fsdp_split():
    # a (6, 10) weight, column-parallel (dim 0) over 2, then FSDP dim 0 over 4: 3 rows -> 1,1,1,0
    got = [mm.local_numel((6, 10), tp_dim=0, tp=2, tp_rank=0, shard=4, shard_rank=r)
           for r in range(4)]
    assert got == [10, 10, 10, 0]
    state = mm.model_state([mm.ParamShape("w", (6, 10), 4, 0)], mm.OptimizerCost(2.0, 4),
                           tp=2, dp_shard=4, shard_rank=3)
    assert state.as_dict() == {"params_bytes": 0, "grads_bytes": 0, "optimizer_bytes": 4,
                               "model_state_bytes": 4}


def test_in_flight_per_schedule():
    assert mm.in_flight("gpipe", 8, 4) == 8
    assert [mm.in_flight("1f1b", 8, 4, r) for r in range(4)] == [4, 3, 2, 1]
    assert mm.in_flight("1f1b", 8, 1) == 1


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp, microbatches", [(2, 4), (4, 4), (4, 8), (4, 2)])
def test_in_flight_is_the_peak_of_the_schedule_order(schedule, pp, microbatches):
    for rank in range(pp):
        actions = mm.single_stage_actions(schedule, microbatches, pp, rank)
        assert sorted(actions) == sorted([("F", rank), ("B", rank)] * microbatches)
        assert mm.pipeline_peak(actions, {rank: 1.0}) == \
            mm.in_flight(schedule, microbatches, pp, rank)


def test_pipeline_peak_weighs_stages_and_zero_bubble_frees_at_the_weight_pass():
    order = [("F", 0), ("F", 2), ("B", 2), ("F", 0), ("B", 0), ("B", 0)]
    assert mm.pipeline_peak(order, {0: 10, 2: 1}) == 20
    assert mm.pipeline_peak([("F", 1), ("I", 1), ("F", 1), ("W", 1)], {1: 3}) == 6


@pytest.mark.parametrize("schedule", ["interleaved1f1b", "looped_bfs", "interleaved_zb"])
def test_multi_stage_orders_are_torchs(schedule):
    """Each rank's order comes from torch's own schedule class: every micro-batch of each
    of its stages goes forward once and is freed once; looped BFS holds all of them."""
    from ddl.planning.plan_probe import pipeline_actions

    pp, m, v = 2, 4, 2
    for rank in range(pp):
        actions = pipeline_actions(schedule, pp, rank, m, v)
        stages = {rank, rank + pp}
        frees = "W" if schedule == "interleaved_zb" else "B"
        for s in stages:
            assert actions.count(("F", s)) == m and actions.count((frees, s)) == m
        peak = mm.pipeline_peak(actions, {s: 1.0 for s in stages})
        assert 1 < peak <= 2 * m
        if schedule == "looped_bfs":
            assert peak == 2 * m


def test_optimizer_cost_from_the_workload_class():
    from ddl.contract.plugins import Plugins
    from ddl.planning.plan_probe import optimizer_cost

    plugins = Plugins()
    mnist = plugins.workload("mnist")  # Adam: two moments + a 4-byte step per tensor
    cifar = plugins.workload("cifar")  # SGD without momentum: no state
    assert optimizer_cost(mnist.create(mnist.presets["tiny"])) == mm.OptimizerCost(2.0, 4)
    assert optimizer_cost(cifar.create(cifar.presets["tiny"])) == mm.OptimizerCost(0.0, 0)
