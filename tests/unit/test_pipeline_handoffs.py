"""How long a pipeline waits for its hand-offs (ddl.planning.pipeline_schedule.handoff_wait):
walked through every rank's order as torch.distributed.pipelining runs GPipe and 1F1B,
checked against what can be worked out by hand, and the step-time model charging it in
place of "every hand-off exposed" (issue 51: MNIST pp=2 was predicted at 2x its measured
step for that)."""

from __future__ import annotations

import pytest

from ddl.contract.layout import ParallelLayout
from ddl.planning import pipeline_schedule as ps
from ddl.planning import step_time_model as stm

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("microbatches", [1, 4, 8])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_without_a_delay_the_walk_gives_the_documented_bubble(schedule, pp, microbatches):
    # equal stages, forward 1 and backward 2: (m + p - 1) passes of 3
    span = ps._span(schedule, microbatches, [1.0] * pp, [2.0] * pp, 0.0)
    assert span == pytest.approx((microbatches + pp - 1) * 3.0)
    assert 1 - microbatches * 3.0 / span == pytest.approx(ps.bubble(pp, microbatches))


@pytest.mark.parametrize("pp", [2, 4])
def test_gpipe_pays_the_delay_in_the_fill_and_the_drain_only(pp):
    for m in (1, 4, 8):  # p - 1 boundaries each way, whatever m
        assert ps.handoff_wait("gpipe", m, [1.0] * pp, [2.0] * pp, 0.5) == \
            pytest.approx(2 * (pp - 1) * 0.5)


def test_1f1b_on_two_stages_pays_a_round_trip_per_micro_batch_pair():
    """Stage 0 runs one forward ahead: micro-batch i's gradient must come back before its
    backward, after stage 1's forward and backward of i; with equal stages that round trip
    (2 delays + 3) outlasts the 3 units stage 0 has in hand, by the 2 delays, and two
    micro-batches share one wait: m delays a step."""
    for m in (2, 4, 8):
        assert ps.handoff_wait("1f1b", m, [1.0, 1.0], [2.0, 2.0], 0.5) == \
            pytest.approx(m * 0.5)


def test_a_short_delay_hides_behind_a_heavy_first_stage():
    """MNIST tiny's pp=2 cut: the convolutions on stage 0, the head on stage 1; a 0.2 ms
    hand-off hides under stage 0's next forward, a 3 ms one does not."""
    first, last = (0.9e-3, 1.8e-3), (0.18e-3, 0.37e-3)
    forward, backward = [first[0], last[0]], [first[1], last[1]]
    assert ps.handoff_wait("1f1b", 4, forward, backward, 0.2e-3) < 0.1e-3
    assert ps.handoff_wait("1f1b", 4, forward, backward, 3e-3) > 4 * 3e-3 / 2


def test_schedules_with_several_stages_per_rank_are_not_walked():
    assert ps.handoff_wait("interleaved1f1b", 4, [1.0] * 2, [2.0] * 2, 0.5) is None


def test_the_step_time_charges_the_walked_wait_not_every_hand_off():
    """A CPU pipeline of two equal measured stages and a 2 ms hand-off: the model's
    pipeline part is the walk's m x delay (8 ms over 4 micro-batches), not 2 m x delay,
    + the last stage's broadcast of the loss (one message)."""
    delay = 2e-3
    network = stm.Network(stm.Link(delay, float("inf")))
    compute = stm.Compute(5e10, 1.0, cpu=True, cores=2,
                          costs=stm.CpuCosts({2: ((3e-3, 0.0), (3e-3, 0.0))}, 0.0, 4e4))
    layout = stm.StepLayout(ParallelLayout(pp=2), micro_batch=64, microbatches=4)
    timed = stm.step_time(layout, 0.0, compute, stm.Sizes(2e4, boundary_bytes=4e3),
                          network, local_ranks=2)
    assert timed.comm_s["pp"] == pytest.approx((2 * 4 + 1) * delay)  # the rank's messages
    assert timed.exposed_s["pp"] == pytest.approx((4 + 1) * delay)
    assert timed.total_s == pytest.approx((4 + 1) * 3e-3 + (4 + 1) * delay)


def test_weights_several_stages_hold_cost_an_all_reduce_each_per_step():
    """A tied embedding and head: both end stages hold the weight, and after the schedule
    ddl_strategies.pipeline all-reduces its gradient between them, one call per weight;
    tensor parallel and FSDP shrink what each call moves. Without shared weights the step
    ends with the loss's broadcast alone."""
    network = stm.Network(stm.Link(1e-3, 1e6))
    compute = stm.Compute(5e10, 1.0, cpu=True, cores=2,
                          costs=stm.CpuCosts({2: ((3e-3, 0.0), (3e-3, 0.0))}, 0.0, 4e4))
    layout = stm.StepLayout(ParallelLayout(pp=2), micro_batch=8, microbatches=4)

    def pp_seconds(shared, mesh=layout.mesh):
        sizes = stm.Sizes(2e4, boundary_bytes=100.0, shared=shared)
        at = stm.StepLayout(mesh, micro_batch=8, microbatches=4)
        timed = stm.step_time(at, 0.0, compute, sizes, network, local_ranks=mesh.world_size)
        return timed.comm_s["pp"], timed.exposed_s["pp"]

    alone = pp_seconds((0, 0.0))
    one = network.intra.seconds("all_reduce", 8e3, 2)  # 1 latency + 8 KB at 1 MB/s
    for before, after in zip(alone, pp_seconds((1, 8e3))):
        assert after - before == pytest.approx(one)
    two_calls = network.intra.seconds("all_reduce", 8e3, 2, calls=2)
    assert pp_seconds((2, 8e3))[1] - alone[1] == pytest.approx(two_calls)
    split = ParallelLayout(pp=2, dp_shard=2)  # FSDP: each rank reduces its half
    assert pp_seconds((1, 8e3), split)[1] - pp_seconds((0, 0.0), split)[1] == \
        pytest.approx(network.intra.seconds("all_reduce", 4e3, 2))
