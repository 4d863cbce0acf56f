"""CPU sites predict a step time (issue 51, item 2): the step-time model on a CPU's
measured costs (ddl.planning.step_time_model.CpuCosts) and this machine's gloo links, the
per-machine cache those links live in (ddl.planning.cpu_calibration), and `ddl plan`'s
ranking following the links it is given. Speeds are not asserted here: the measured
step times are in docs/plan.md ("CPU sites")."""

from __future__ import annotations

import json

import pytest

from conftest import PLANTED_LINKS, plant_cpu_links, run_ddl
from ddl.contract.layout import ParallelLayout
from ddl.planning import cpu_calibration
from ddl.planning import step_time_model as stm
from ddl.planning import wrapper_calibration

pytestmark = pytest.mark.unit

DDP = ParallelLayout(dp_replicate=2)
FSDP = ParallelLayout(dp_shard=2)
PP = ParallelLayout(pp=2)


def cpu(stages, optimizer_s=1e-3, cores=2) -> stm.Compute:
    return stm.Compute(5e10, 1.0, cpu=True, cores=cores,
                       costs=stm.CpuCosts(stages, optimizer_s, 4e4))


def link(bandwidth=1e9, **latency) -> stm.Network:
    per_op = {op: (latency.get(op, 1e-4), bandwidth) for op in stm.OPS}
    return stm.Network(stm.Link(1e-4, bandwidth, per_op))


FREE = link(float("inf"), p2p=0.0, all_reduce=0.0)  # links that cost nothing


def step(layout, compute, network, micro=32, microbatches=1, units=3) -> float:
    lay = stm.StepLayout(layout, micro_batch=micro, microbatches=microbatches)
    sizes = stm.Sizes(4e4 / layout.pp, boundary_bytes=4e3, units=units)
    return stm.step_time(lay, 0.0, compute, sizes, network, local_ranks=2).total_s


def test_a_planted_slow_gather_reorders_ddp_and_fsdp():
    costs = cpu({1: ((2e-3, 1e-4),), 2: ((1e-3, 5e-5), (1e-3, 5e-5))})
    even = link()
    assert step(DDP, costs, even) < step(FSDP, costs, even)  # 9 FSDP calls against one
    slow_reduce = link(all_reduce=5e-2, all_gather=1e-6, reduce_scatter=1e-6)
    assert step(FSDP, costs, slow_reduce) < step(DDP, costs, slow_reduce)


def test_every_fsdp_unit_pays_its_own_latency():
    """3 units, 2 ranks, nothing to move but the calls: forward and backward gathers and
    the reduce-scatter, one call per unit each; CPU ranks overlap none of it."""
    alpha = 2e-3
    network = stm.Network(stm.Link(0.0, float("inf"), {
        "all_gather": (alpha, float("inf")), "reduce_scatter": (alpha, float("inf"))}))
    lay = stm.StepLayout(FSDP, micro_batch=8)
    one = stm.step_time(lay, 0.0, cpu({1: ((0.0, 0.0),)}, 0.0), stm.Sizes(1.0, units=1),
                        network, local_ranks=2).total_s
    three = stm.step_time(lay, 0.0, cpu({1: ((0.0, 0.0),)}, 0.0), stm.Sizes(1.0, units=3),
                          network, local_ranks=2).total_s
    assert one == pytest.approx(3 * alpha)
    assert three == pytest.approx(9 * alpha)


def test_per_pass_cost_makes_a_pipeline_lose_and_arithmetic_makes_it_win():
    """The ViT of issue 51: a small model's step is its operators' fixed cost per pass,
    which a pipeline pays once per micro-batch (4 here) and its bubble stretches; a model
    whose cost grows with the samples gains from the halved stages instead (links free)."""
    free = FREE
    overhead = cpu({1: ((4e-3, 1e-5),), 2: ((2e-3, 5e-6), (2e-3, 5e-6))})
    assert step(PP, overhead, free, micro=64, microbatches=4) > \
        1.5 * step(DDP, overhead, free)
    arithmetic = cpu({1: ((0.0, 1e-3),), 2: ((0.0, 5e-4), (0.0, 5e-4))}, optimizer_s=0.0,
                     cores=4)
    # 4 cores: DDP's 2 ranks get 2 threads each; 2 pipeline ranks likewise
    assert step(PP, arithmetic, free, micro=64, microbatches=4) == pytest.approx(
        step(DDP, arithmetic, free) / (1 - stm.bubble(2, 4)), rel=1e-6)


def test_a_head_only_last_stage_sets_the_bubble_from_the_measured_times():
    """Stages of 90 % and 10 % of the time: the slow stage sets the pace, as measured."""
    lopsided = cpu({2: ((9e-3, 0.0), (1e-3, 0.0))}, optimizer_s=0.0)
    even = cpu({2: ((5e-3, 0.0), (5e-3, 0.0))}, optimizer_s=0.0)
    free = FREE
    slow, balanced = (step(PP, c, free, micro=64, microbatches=4) for c in (lopsided, even))
    # (m-1) x slowest + one pass through every stage: 3 x 9 + 10 = 37 ms against 3 x 5 + 10
    assert slow == pytest.approx(37e-3) and balanced == pytest.approx(25e-3)


def test_wrapper_host_work_is_charged_per_fsdp_unit_and_per_ddp_pass():
    """The wrappers' own host work (cpu_calibration.wrapper_costs): FSDP2's per unit the
    rank holds and per pass, DDP's per pass, both once more in the optimizer step; the
    layouts they do not wrap (a pipeline alone) pay none of it. Links and compute free."""
    free = link(float("inf"), p2p=0.0, all_reduce=0.0, all_gather=0.0, reduce_scatter=0.0)
    stages = {1: ((0.0, 0.0),), 2: ((0.0, 0.0), (0.0, 0.0))}
    wrappers = {"ddp": {"pass_s": 1e-3, "optimizer_s": 2e-3},
                "fsdp": {"pass_s": 3e-3, "optimizer_s": 5e-3, "units": 3}}
    plain = stm.Compute(5e10, 1.0, cpu=True, cores=2, costs=stm.CpuCosts(stages, 0.0, 4e4))
    wrapped = stm.Compute(5e10, 1.0, cpu=True, cores=2,
                          costs=stm.CpuCosts(stages, 0.0, 4e4, wrappers=wrappers))
    assert step(DDP, plain, free) == step(FSDP, plain, free) == 0.0
    assert step(DDP, wrapped, free) == pytest.approx(1e-3 + 2e-3)
    # 4 units held (3 + the root), one pass; the optimizer's extra once
    assert step(FSDP, wrapped, free, units=4) == pytest.approx(4 * 3e-3 + 5e-3)
    # accumulation: every micro-step is a pass through the units
    lay = stm.StepLayout(FSDP, micro_batch=16, accumulation=2)
    two = stm.step_time(lay, 0.0, wrapped, stm.Sizes(4e4, units=4), free, local_ranks=2)
    assert two.total_s == pytest.approx(2 * 4 * 3e-3 + 5e-3)
    assert step(PP, wrapped, free, micro=64, microbatches=4) == step(PP, plain, free,
                                                                     micro=64, microbatches=4)
    # a pipeline schedule's bookkeeping: per micro-batch, on the slowest stage, stretched
    # by the bubble like its compute (m + p - 1 micro-batch times of 2 ms), and only there
    piped = stm.Compute(5e10, 1.0, cpu=True, cores=2, costs=stm.CpuCosts(
        stages, 0.0, 4e4, wrappers={"pipeline": {"pass_s": 2e-3, "optimizer_s": 0.0}}))
    assert step(PP, piped, free, micro=64, microbatches=4) == pytest.approx(5 * 2e-3)
    assert step(DDP, piped, free) == 0.0


def test_wrapper_costs_are_measured_in_a_child_and_leave_no_process_group(synthetic_mnist):
    """The real calibration: MNIST's model wrapped by DDP and FSDP2 in a one-rank gloo
    group, timed beside the plain model in a forked child; this process ends with no
    process group (and so no gloo threads a launcher's fork server would refuse)."""
    import torch
    import torch.distributed as dist
    from ddl.contract.plugins import Plugins

    spec = Plugins().workload("mnist")
    workload = spec.create(spec.presets["tiny"])
    inputs, targets = cpu_calibration.real_batch(workload, synthetic_mnist, 8)
    torch.manual_seed(0)
    costs = wrapper_calibration.wrapper_costs(workload, workload.build_model(), inputs, targets)
    assert not dist.is_initialized()
    # MNIST has no tp_plan; its tensor inputs run through a one-stage pipeline schedule
    assert set(costs) == {"ddp", "fsdp", "pipeline"}, costs
    assert costs["fsdp"]["units"] == len(workload.fsdp_units(workload.build_model())) + 1
    # FSDP2's hooks, copies and DTensor dispatch cost something; never a negative time
    assert costs["fsdp"]["pass_s"] > 0, costs
    assert all(v >= 0 for kind in costs.values() for v in kind.values())


def test_cache_is_per_machine_and_expires(tmp_path, monkeypatch):
    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path))
    calls = []

    def measure(n):
        calls.append(n)
        return {"fits": {"all_reduce": {"latency_s": 1e-3, "bytes_per_s": 1e9}},
                "seconds": {}}

    first, fresh = cpu_calibration.links(2, measure)
    again, fresh_again = cpu_calibration.links(2, measure)
    assert (fresh, fresh_again, calls) == (True, False, [2]) and first == again
    cpu_calibration.links(4, measure)  # another process count is another entry
    assert calls == [2, 4]
    stored = json.loads((tmp_path / cpu_calibration.CACHE_FILE).read_text())
    assert list(stored) == [cpu_calibration.machine_key()]
    later = stored[cpu_calibration.machine_key()]["links-2"]["measured_at"] \
        + cpu_calibration.MAX_AGE_S + 1
    assert cpu_calibration.cached("links-2", now=later) is None
    # another machine's entry is not this one's
    monkeypatch.setattr(cpu_calibration, "machine_key", lambda: "elsewhere|cpu|2|torch")
    assert cpu_calibration.cached("links-2") is None


def test_a_skew_measured_too_close_to_divide_is_not_cached(tmp_path, monkeypatch):
    """The skew probe's slope divides by the two compute blocks' time difference (8x the
    products apart): under load one block was seen at 1.87 ms against the other's 0.77.
    Such a reading is kept out of the week's cache, so no plan counts a wild wait; a
    reading far enough apart is kept."""
    from ddl.commands.collective_probe import SKEW_MIN_SPAN, skew_slope

    per, reliable = skew_slope([1e-3, 8e-3], [1.0e-3, 2.4e-3])
    assert reliable and per == pytest.approx(1.4e-3 / 7e-3)
    assert skew_slope([2e-3, 2e-3 * SKEW_MIN_SPAN], [1e-3, 3e-3])[1]  # at the floor: kept
    assert not skew_slope([2e-3, 2e-3 * SKEW_MIN_SPAN * 0.99], [1e-3, 3e-3])[1]
    assert skew_slope([1.87e-3, 0.77e-3], [1e-3, 2e-3]) == (0.0, False)  # no span at all
    assert not skew_slope([0.0, 8e-3], [1e-3, 2e-3])[1]

    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path))
    fits = {"all_reduce": {"latency_s": 1e-3, "bytes_per_s": 1e9}}
    wild = {"wait_per_compute": 9.0, "compute_s": [1.9e-3, 4e-3], "latency_s": [1e-3, 2e-2],
            "products": [10, 80], "attempts": 3, "reliable": False}
    links, _ = cpu_calibration.links(2, lambda n: {"fits": fits, "seconds": {}, "skew": wild})
    assert "skew" not in links and links["all_reduce"] == fits["all_reduce"]
    good = {**wild, "wait_per_compute": 0.2, "compute_s": [1e-3, 8e-3], "reliable": True}
    links, _ = cpu_calibration.links(3, lambda n: {"fits": fits, "seconds": {}, "skew": good})
    assert links["skew"]["wait_per_compute"] == 0.2


def test_one_burst_does_not_decide_a_message_sizes_time():
    """A size's time is the mean of its repeated timings (a run pays its slow calls),
    without the slowest of three or more: one timing caught in a burst of other work
    (0.125 s against ~0.03 s, a CI run) no longer sets the fit's largest point."""
    from ddl.commands.collective_probe import size_time

    assert size_time([0.03, 0.031, 0.029, 0.03, 0.125]) == pytest.approx(0.03)
    assert size_time([1.0, 2.0, 6.0]) == pytest.approx(1.5)
    assert size_time([1.0, 3.0]) == pytest.approx(2.0)  # too few to leave one out


def test_local_plan_ranks_by_step_time_and_follows_the_links(synthetic_mnist, tmp_path):
    """One planted slow collective moves `ddl plan --site local`'s ranking: with the
    usual links DDP leads (tests/unit/test_plan_cpu_site.py, 4 processes); with gloo's
    all-reduce and point-to-point planted 100x slower and FSDP's collectives nearly free,
    an FSDP layout does, its wrapper's measured host work included. (The workload's own
    costs are measured here: the links alone decide the order.)"""
    slow = {**PLANTED_LINKS, "all_reduce": {"latency_s": 7e-2, "bytes_per_s": 1.5e7},
            "p2p": {"latency_s": 7e-2, "bytes_per_s": 1.5e7},
            "all_gather": {"latency_s": 1e-6, "bytes_per_s": 1e12},
            "reduce_scatter": {"latency_s": 1e-6, "bytes_per_s": 1e12}}
    folder = plant_cpu_links(tmp_path / "slow", slow, nprocs=[2])
    proc = run_ddl("plan", "--plugin", "mnist", "--preset", "tiny", "--site", "local",
                   "--nproc", "2", "--data-dir", str(synthetic_mnist), "--format", "json",
                   cwd=tmp_path, env={"DDL_CACHE_DIR": str(folder)})
    assert proc.returncode == 0, proc.stderr
    moved = json.loads(proc.stdout)
    assert moved["ranked_by"] == "predicted step time"
    assert moved["fits"][0]["mesh"]["dp_shard"] == 2, moved["fits"][0]


def test_the_trainers_metrics_are_priced_with_the_batch(synthetic_mnist):
    """What the trainer does per batch beside the model (ddl.worker.train.epoch): the
    workload's own per-sample metrics, summed as MetricSums sums them, timed at two batch
    sizes; a workload with dearer metrics is priced dearer (the same run, as a ratio)."""
    import torch
    from ddl.contract.plugins import Plugins
    from ddl.worker.train.metrics import TrainingMetrics

    spec = Plugins().workload("mnist")
    workload = spec.create(spec.presets["tiny"])
    model = workload.build_model()
    batches = {n: cpu_calibration.real_batch(workload, synthetic_mnist, n) for n in (2, 32)}
    calls = []

    class Counted:
        def __getattr__(self, name):
            return getattr(workload, name)

        def sample_metrics(self, outputs, targets):
            calls.append(outputs.shape[0])
            return workload.sample_metrics(outputs, targets)

    class Dear(Counted):
        def sample_metrics(self, outputs, targets):
            square = torch.ones(96, 96)
            # a small matrix product per sample (~40 us): a cost that grows with the
            # samples, so gathering steps into one call does not dilute it
            for _ in range(outputs.shape[0]):
                square = square @ square / 96
            return {**workload.sample_metrics(outputs, targets), "dear": square[0, :1]
                    .expand(outputs.shape[0])}

    cheap = cpu_calibration._metrics_costs(Counted(), model, batches)
    dear = cpu_calibration._metrics_costs(Dear(), model, batches)
    # the workload's own metrics, at both sizes, on outputs gathered as the trainer does
    steps = TrainingMetrics.GATHER_STEPS
    assert sorted(set(calls)) == [2 * steps, 32 * steps]
    assert min(cheap) >= 0 and cheap[0] + 32 * cheap[1] > 0
    assert dear[0] + 32 * dear[1] > 2 * (cheap[0] + 32 * cheap[1])


def test_a_rank_with_several_cores_is_priced_at_the_models_own_thread_efficiency(
        synthetic_mnist):
    """When the ranks leave a rank several cores (``ddl plan --nproc 1`` on 2 cores), the
    calibration times the workload's own pass on that many threads: a small model gains
    less than a matmul, and the model divides its passes by threads x that efficiency
    (before, the planner never passed one: 2 threads counted as twice one)."""
    import torch

    from ddl.contract.plugins import Plugins

    spec = Plugins().workload("mnist")
    workload = spec.create(spec.presets["tiny"])
    inputs, targets = cpu_calibration.real_batch(workload, synthetic_mnist, 32)
    torch.manual_seed(0)
    model = workload.build_model()
    previous = torch.get_num_threads()
    try:
        assert cpu_calibration._thread_efficiency(workload, model, inputs, targets, 1) == 1.0
        two = cpu_calibration._thread_efficiency(workload, model, inputs, targets, 2)
    finally:
        torch.set_num_threads(previous)
    assert 0 < two <= 1.0
    one_rank = stm.StepLayout(ParallelLayout(), micro_batch=32)
    costs = stm.CpuCosts({1: ((0.0, 1e-4),)}, 0.0, 4e4)
    full, half = (stm.compute_seconds(one_rank, 0.0, stm.Compute(
        5e10, 1.0, cpu=True, cores=2, costs=costs, thread_efficiency=e), local_ranks=1)
        for e in (1.0, 0.5))
    assert full == pytest.approx(32e-4 / 2) and half == pytest.approx(32e-4)
