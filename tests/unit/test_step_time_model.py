"""The step-time model (ddl.planning.step_time_model): the ring formulas of each collective,
the alpha-beta fit, what each layout communicates, the pipeline bubble, CPU ranks sharing
cores; `ddl plan`'s JSON carrying the breakdown; `ddl doctor --collectives`' table and bad
input. The real collectives are timed in tests/distributed/test_doctor_collectives.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import assert_one_line_error, run_ddl
from ddl.contract.layout import ParallelLayout
from ddl.planning import alpha_beta_fit
from ddl.planning import step_time_model as stm

pytestmark = pytest.mark.unit

ALPHA, BW = 5e-6, 1e10  # 5 us, 10 GB/s
LINK = stm.Link(ALPHA, BW)


@pytest.mark.parametrize("op, p, want", [
    ("all_reduce", 4, 2 * 3 * ALPHA + 2 * 3 / 4 * 1e8 / BW),
    ("all_gather", 4, 3 * ALPHA + 3 / 4 * 1e8 / BW),
    ("reduce_scatter", 8, 7 * ALPHA + 7 / 8 * 1e8 / BW),
    ("p2p", 2, ALPHA + 1e8 / BW),
    ("all_reduce", 1, 0.0),  # one rank sends nothing
])
def test_ring_formulas(op, p, want):
    assert LINK.seconds(op, 1e8, p) == pytest.approx(want, rel=1e-12)


def test_unknown_collective_is_refused():
    with pytest.raises(ValueError, match="all_to_all"):
        stm.ring_factors("all_to_all", 4)


def test_fit_recovers_alpha_and_beta():
    sizes = [4096, 65536, 2 ** 20, 2 ** 24]
    points = [(op, n, LINK.seconds(op, n, 4)) for op in stm.OPS for n in sizes]
    fit = alpha_beta_fit.fit(points, 4)
    assert fit["latency_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert fit["bytes_per_s"] == pytest.approx(BW, rel=1e-6)
    assert fit["worst_error"] < 1e-9 and fit["points"] == 16
    # noise of +-10 % moves the fit by about as much, not more
    noisy = [(op, n, t * (1.1 if i % 2 else 0.9)) for i, (op, n, t) in enumerate(points)]
    fit = alpha_beta_fit.fit(noisy, 4)
    assert fit["latency_s"] == pytest.approx(ALPHA, rel=0.25)
    assert fit["bytes_per_s"] == pytest.approx(BW, rel=0.25)
    assert 0.05 < fit["worst_error"] < 0.3


def test_fit_clamps_a_negative_latency():
    # pure bandwidth with a small message measured fast: alpha would come out negative
    points = [("p2p", 1000, 0.5e-7), ("p2p", 10 ** 6, 1e-4), ("p2p", 10 ** 7, 1e-3)]
    fit = alpha_beta_fit.fit(points, 2)
    # the bandwidth alone then fits the three rates (2e10, 1e10, 1e10 B/s), each weighed by
    # its relative error: 1.5e10
    assert fit["latency_s"] == 0.0 and fit["bytes_per_s"] == pytest.approx(1.5e10)
    with pytest.raises(ValueError, match="two"):
        alpha_beta_fit.fit(points[:1], 2)


NET = stm.Network(stm.Link(ALPHA, BW), stm.Link(10 * ALPHA, 4 * BW), gpus_per_node=4)
SIZES = stm.Sizes(param_bytes=4e8, rowwise_bytes=1e6, boundary_bytes=2e6)


def test_each_layout_communicates_what_it_should():
    intra = NET.intra
    ddp = stm.comm_seconds(stm.StepLayout(ParallelLayout(dp_replicate=4), micro_batch=8), SIZES, NET)
    # DDP all-reduces bucket by bucket (25 MiB): each of the 16 calls pays its latency
    assert ddp == {"dp_replicate": pytest.approx(intra.seconds("all_reduce", 4e8, 4, 16))}
    # FSDP: per micro-step two all-gathers (forward, backward); one reduce-scatter per
    # step (accumulating micro-steps skip it)
    fsdp = stm.comm_seconds(stm.StepLayout(ParallelLayout(dp_shard=4), micro_batch=8, accumulation=3),
                            SIZES, NET)
    per_micro = 2 * intra.seconds("all_gather", 4e8, 4)
    assert fsdp["dp_shard"] == pytest.approx(3 * per_micro + intra.seconds("reduce_scatter",
                                                                           4e8, 4))
    # HSDP: the replicas all-reduce only their shard of the gradients
    hsdp = stm.comm_seconds(stm.StepLayout(ParallelLayout(dp_replicate=2, dp_shard=2), micro_batch=8),
                            SIZES, NET)
    assert hsdp["dp_replicate"] == pytest.approx(intra.seconds("all_reduce", 2e8, 2))
    # FSDP2 gathers and reduces unit by unit: every unit's call pays the latency
    units = stm.Sizes(param_bytes=4e8, units=5)
    five = stm.comm_seconds(stm.StepLayout(ParallelLayout(dp_shard=4), micro_batch=8),
                            units, NET)
    assert five["dp_shard"] == pytest.approx(2 * (
        intra.seconds("all_gather", 4e8, 4) + 4 * 3 * ALPHA)
        + intra.seconds("reduce_scatter", 4e8, 4) + 4 * 3 * ALPHA)
    # TP: an all-reduce forward and one backward of the row-parallel outputs per pass
    tp = stm.comm_seconds(stm.StepLayout(ParallelLayout(tp=2, dp_replicate=2), micro_batch=8), SIZES, NET)
    assert tp["tp"] == pytest.approx(2 * intra.seconds("all_reduce", 8e6, 2))
    assert tp["dp_replicate"] == pytest.approx(intra.seconds("all_reduce", 2e8, 2))
    # PP: per micro-batch one message forward and one back; per step the loss's broadcast
    pp = stm.comm_seconds(stm.StepLayout(ParallelLayout(pp=2, dp_replicate=2), micro_batch=8, microbatches=4), SIZES, NET)
    assert pp["pp"] == pytest.approx(2 * 4 * intra.seconds("p2p", 4e6, 2)
                                     + intra.seconds("p2p", 4, 2))


def test_groups_across_nodes_share_the_node_network():
    layout = stm.StepLayout(ParallelLayout(dp_replicate=8), micro_batch=8)
    across = stm.comm_seconds(layout, SIZES, NET, {"dp_replicate": True})
    slow = stm.Link(10 * ALPHA, 4 * BW / 4)  # the node's injection bandwidth over 4 GPUs
    assert across["dp_replicate"] == pytest.approx(slow.seconds("all_reduce", 4e8, 8, 16))
    assert across["dp_replicate"] > stm.comm_seconds(layout, SIZES, NET)["dp_replicate"]
    with pytest.raises(ValueError, match="inter-node"):
        stm.comm_seconds(layout, SIZES, stm.Network(NET.intra), {"dp_replicate": True})


def test_bubble_and_recomputation_stretch_the_compute():
    gpu = stm.Compute(peak_flops=1e14, efficiency=0.5)
    flat = stm.step_time(stm.StepLayout(ParallelLayout(dp_replicate=4), micro_batch=10), 1e12, gpu, SIZES,
                         NET)
    assert flat.compute_s == pytest.approx(1e12 * 10 / 5e13) and flat.bubble == 0
    piped = stm.step_time(stm.StepLayout(ParallelLayout(pp=4), micro_batch=8, microbatches=8), 1e12, gpu,
                          SIZES, NET)
    assert piped.bubble == pytest.approx(3 / 11)  # (p-1)/(m+p-1)
    assert piped.compute_s == pytest.approx(1e12 * 8 / 4 / 5e13)
    assert piped.total_s == pytest.approx(piped.compute_s / (1 - 3 / 11)
                                          + sum(piped.comm_s.values()))
    full = stm.compute_seconds(stm.StepLayout(micro_batch=10, checkpointing="full"), 1e12,
                               gpu)
    assert full == pytest.approx(flat.compute_s * 4 / 3)


def test_cpu_ranks_split_threads_then_share_cores():
    cpu = stm.Compute(peak_flops=1e10, efficiency=1.0, fixed_s=0.01, cpu=True, cores=2,
                      thread_efficiency=0.9)
    one = stm.compute_seconds(stm.StepLayout(micro_batch=64), 1e8, cpu, local_ranks=1)
    assert one == pytest.approx(64 * 1e8 / (1e10 * 2 * 0.9) + 0.01)  # 2 threads
    two = stm.compute_seconds(stm.StepLayout(ParallelLayout(dp_replicate=2), micro_batch=32), 1e8, cpu,
                              local_ranks=2)
    assert two == pytest.approx(32 * 1e8 / 1e10 + 0.01)  # 1 thread, a core each
    four = stm.compute_seconds(stm.StepLayout(ParallelLayout(dp_replicate=4), micro_batch=16), 1e8, cpu,
                               local_ranks=4)
    assert four == pytest.approx(2 * (16 * 1e8 / 1e10 + 0.01))  # two ranks per core
    assert [stm.threads_per_rank(2, n) for n in (1, 2, 4)] == [2, 1, 1]
    assert [stm.core_share(2, n, stm.threads_per_rank(2, n)) for n in (1, 2, 4)] == [1, 1, 2]


def test_cpu_ranks_wait_for_the_slowest_in_proportion_to_their_compute():
    """``sync_wait`` (measured by ``ddl doctor --collectives``) adds that share of the
    compute to a step of several CPU ranks, and nothing to one rank's or a GPU's."""
    def timed(mesh, sync_wait, cpu=True):
        compute = stm.Compute(peak_flops=1e10, efficiency=1.0, fixed_s=0.01, cpu=cpu,
                              cores=2, sync_wait=sync_wait)
        return stm.step_time(stm.StepLayout(mesh, micro_batch=32), 1e8, compute,
                             stm.Sizes(param_bytes=4e6), NET, local_ranks=mesh.world_size)

    ddp = ParallelLayout(dp_replicate=2)
    plain, waiting = timed(ddp, 0.0), timed(ddp, 0.2)
    assert waiting.sync_wait_s == pytest.approx(0.2 * plain.compute_s)
    assert waiting.total_s == pytest.approx(plain.total_s + 0.2 * plain.compute_s)
    assert waiting.as_dict()["sync_wait_s"] == waiting.sync_wait_s
    alone = ParallelLayout()
    assert timed(alone, 0.2).total_s == timed(alone, 0.0).total_s
    assert timed(ddp, 0.2, cpu=False).sync_wait_s == 0.0


def test_model_imports_without_torch():
    code = ("import sys; import ddl.planning.step_time_model, ddl.planning.layout_search; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_json_carries_the_step_time(synthetic_mnist, tmp_path):
    proc = run_ddl("plan", "--plugin", "mnist", "--preset", "tiny", "--site", "juwels",
                   "--nodes", "2", "--global-batch-size", "64", "--data-dir",
                   str(synthetic_mnist), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ranked_by"] == "predicted step time"
    steps = []
    for row in report["fits"]:
        timed = row["step_time"]
        assert timed["step_s"] == row["step_s"] == pytest.approx(
            timed["compute_s"] / (1 - timed["bubble"]) + sum(timed["exposed_s"].values()))
        mesh = row["mesh"]
        # a rank's own hand-offs are 2 m messages; the schedule's wait follows a chain of
        # them through every stage, at most 2 (m + p - 1) (the fill and the drain)
        m, p = row["pipeline_microbatches"] or 1, mesh["pp"]
        assert all(timed["exposed_s"][d] <= timed["comm_s"][d] * (1 + 1e-9)
                   * ((m + p - 1) / m if d == "pp" else 1) for d in timed["comm_s"])
        assert (timed["bubble"] > 0) == (mesh["pp"] > 1)
        # every dimension that moves bytes costs time, and only those
        assert set(timed["comm_s"]) == set(row["comm_bytes_per_step"])
        steps.append(row["step_s"])
    assert steps == sorted(steps)
    # issue 51: a 16-bit GPU plan runs FSDP2 layouts with bf16 gathers and fp32 reductions,
    # and says so in their flags; DDP (replicas alone) keeps its fp32 all-reduce
    for row in report["fits"]:
        mesh, options = row["mesh"], row["strategy_options"]
        fsdp = mesh["dp_shard"] > 1 or (mesh["dp_replicate"] > 1 and mesh["pp"] > 1)
        assert (options.get("param_dtype") == "bf16") == fsdp, row["flags"]
        assert ("param_dtype=bf16" in row["flags"]) == fsdp
    # checkpointing costs its measured recompute: selective a little, full ~ the forward
    compute = {r["activation_checkpointing"]: r["step_time"]["compute_s"]
               for r in report["fits"] if r["mesh"]["dp_replicate"] == 8
               and r["micro_batch"] == 8}
    assert compute["none"] < compute["selective"] < 1.05 * compute["none"]
    assert 1.2 * compute["none"] < compute["full"] <= 4 / 3 * compute["none"] * (1 + 1e-9)
    # pure DDP over the 8 GPUs of 2 nodes: its ring crosses the nodes, so its all-reduce runs
    # at the juwels profile's network numbers (9.6 us a step; 100 GB/s a node, 4 GPUs)
    ddp = next(r for r in report["fits"] if r["mesh"]["dp_replicate"] == 8)
    sent = ddp["comm_bytes_per_step"]["dp_replicate"]  # 2 (p-1)/p of the gradients
    assert ddp["step_time"]["comm_s"]["dp_replicate"] == pytest.approx(
        14 * 9.6e-6 + sent / (1e11 / 4))


def test_doctor_collectives_table_and_bad_input(tmp_path):
    from ddl.commands.doctor import render_collectives
    from ddl.settings.sites import get_site

    measured = {"seconds": {"all_reduce": {"4096": 1e-4, "16777216": 1e-2}},
                "fits": {"all_reduce": {"latency_s": 5e-5, "bytes_per_s": 1.5e9,
                                        "worst_error": 0.12},
                         "all": {"latency_s": 6e-5, "bytes_per_s": 1.4e9,
                                 "worst_error": 0.2}}}
    table = render_collectives(measured, get_site("juwels")).splitlines()
    assert table[0].split()[:3] == ["op", "4", "KiB"]
    assert table[1].split() == ["all_reduce", "100", "us", "10000", "us", "50.0", "us",
                                "1.50", "GB/s", "12%"]
    assert table[-1].split() == ["juwels-booster", "profile", "3.4", "us", "300.00", "GB/s"]
    proc = run_ddl("doctor", "--collectives", "--nproc", "1", cwd=tmp_path)
    assert_one_line_error(proc, "--nproc: 1", "2 or more")
    proc = run_ddl("doctor", "--nproc", "2", cwd=tmp_path)
    assert_one_line_error(proc, "--nproc", "only with --collectives")


# --- issue 51: the strategies as they run on a GPU ----------------------------------------

JUWELS = stm.Network(stm.Link(3.4e-6, 3e11), stm.Link(9.6e-6, 1e11), gpus_per_node=4)
A100 = stm.Compute(peak_flops=312e12)
T5_3B = stm.Sizes(param_bytes=11.4e9, units=49)  # 48 blocks + the root, fp32 as stored
T5_3B_FLOPS = 6 * 2.85e9 * 1024  # 6 N per token, 512 + 512 tokens


def test_fsdp_gathers_bf16_and_hides_its_traffic_under_compute():
    """FSDP over 8 A100s of 2 nodes, t5-3b, bf16 run: the old model charged 3 fp32
    transfers with no overlap (1.2 s on top of 0.56 s compute). Now: two bf16 gathers per
    micro-step and one fp32 reduce-scatter per step, of which only what the compute cannot
    hide, plus the first and last unit, is exposed."""
    layout = stm.StepLayout(ParallelLayout(dp_shard=8), micro_batch=4, param_dtype="bf16")
    crosses = {"dp_shard": True}
    t = stm.step_time(layout, T5_3B_FLOPS, A100, T5_3B, JUWELS, crosses)
    ib = JUWELS.link(True)
    gather = ib.seconds("all_gather", 11.4e9 / 2, 8, 49)  # bf16: half the stored bytes
    scatter = ib.seconds("reduce_scatter", 11.4e9, 8, 49)  # fp32 gradients; per unit
    assert t.comm_s["dp_shard"] == pytest.approx(2 * gather + scatter)
    forward, backward = t.compute_s / 3, 2 * t.compute_s / 3
    want = (gather / 49 + max(0, gather * 48 / 49 - forward)
            + 2 * (gather + scatter) / 49 + max(0, (gather + scatter) * 47 / 49 - backward))
    assert t.exposed_s["dp_shard"] == pytest.approx(want)
    assert t.total_s == pytest.approx(t.compute_s + want)
    # the bound the old model broke: compute + the bf16/fp32 bytes that compute cannot hide
    assert t.total_s <= t.compute_s + 2 * gather + scatter - 0.5 * t.compute_s
    assert t.total_s < 0.85  # old model: 1.39 s
    fp32 = stm.step_time(stm.StepLayout(ParallelLayout(dp_shard=8), micro_batch=4),
                         T5_3B_FLOPS, A100, T5_3B, JUWELS, crosses)
    assert fp32.comm_s["dp_shard"] > t.comm_s["dp_shard"]


def test_hsdp_traffic_hides_under_compute_across_nodes():
    """HSDP 2 x 4 (shards inside a node, replicas across): its NVLink gathers and one
    inter-node all-reduce of a quarter of the gradients hide under a micro-batch of 4
    t5-3b samples; the old model charged 51 % of the step to them."""
    layout = stm.StepLayout(ParallelLayout(dp_replicate=2, dp_shard=4), micro_batch=4,
                            param_dtype="bf16")
    t = stm.step_time(layout, T5_3B_FLOPS, A100, T5_3B, JUWELS,
                      {"dp_replicate": True, "dp_shard": False})
    assert sum(t.exposed_s.values()) < 0.02 * t.total_s
    assert t.exposed_s.keys() == t.comm_s.keys() == {"dp_shard", "dp_replicate"}


def test_without_compute_nothing_hides_and_cpus_never_overlap():
    layout = stm.StepLayout(ParallelLayout(dp_shard=4), micro_batch=1, accumulation=2)
    sizes = stm.Sizes(param_bytes=4e8, units=5)
    raw = stm.comm_seconds(layout, sizes, NET)
    assert stm.exposed_seconds(layout, sizes, NET, busy_s=0.0) == pytest.approx(raw)
    assert stm.exposed_seconds(layout, sizes, NET, busy_s=10.0, overlap=False) == raw
    # accumulation: gathers every micro-step, the reduce-scatter once per step
    intra = NET.intra
    assert raw["dp_shard"] == pytest.approx(4 * intra.seconds("all_gather", 4e8, 4, 5)
                                            + intra.seconds("reduce_scatter", 4e8, 4, 5))
    # DDP: all buckets but the last hide under the backward
    ddp = stm.StepLayout(ParallelLayout(dp_replicate=4), micro_batch=8)
    buckets = -(-int(4e8) // stm.DDP_BUCKET_BYTES)
    ar = intra.seconds("all_reduce", 4e8, 4, buckets)
    assert stm.exposed_seconds(ddp, SIZES, NET, busy_s=100.0)["dp_replicate"] == \
        pytest.approx(ar / buckets)


def test_tensor_parallel_pays_each_layers_latency_and_full_recompute_repeats_it():
    sizes = stm.Sizes(param_bytes=4e8, rowwise_bytes=1e6, rowwise_layers=8)
    layout = stm.StepLayout(ParallelLayout(tp=2), micro_batch=8)
    per_layer = NET.intra.seconds("all_reduce", 8e6 / 8, 2)
    assert stm.comm_seconds(layout, sizes, NET)["tp"] == pytest.approx(2 * 8 * per_layer)
    full = stm.StepLayout(ParallelLayout(tp=2), micro_batch=8, checkpointing="full")
    assert stm.comm_seconds(full, sizes, NET)["tp"] == pytest.approx(3 * 8 * per_layer)
    # never hidden
    assert stm.exposed_seconds(layout, sizes, NET, busy_s=100.0)["tp"] == \
        pytest.approx(2 * 8 * per_layer)


def test_checkpointing_costs_its_measured_recompute():
    gpu = stm.Compute(peak_flops=1e14, efficiency=0.5)
    sizes = stm.Sizes(param_bytes=0, recompute={"none": 0.0, "selective": 0.03,
                                                "full": 0.9})
    none, sel, full = (stm.compute_seconds(stm.StepLayout(micro_batch=10, checkpointing=m),
                                           1e12, gpu, sizes=sizes)
                       for m in ("none", "selective", "full"))
    assert sel == pytest.approx(none * 1.01) and full == pytest.approx(none * 1.3)
    assert none < sel < full


def test_bubble_follows_the_schedule_and_the_slowest_stage():
    assert stm.bubble(4, 8) == pytest.approx(3 / 11)
    assert stm.bubble(4, 8, "interleaved1f1b", 2) == pytest.approx(3 / 19)  # v m
    assert stm.bubble(4, 8, "gpipe") == stm.bubble(4, 8, "1f1b")
    # one stage doing 70 % of 2: it is always busy, the other waits
    uneven = stm.Sizes(param_bytes=0, stage_shares=(0.7, 0.3))
    gpu = stm.Compute(peak_flops=1e14, efficiency=0.5)
    layout = stm.StepLayout(ParallelLayout(pp=2), micro_batch=8, microbatches=4)
    t = stm.step_time(layout, 1e12, gpu, uneven, NET)
    whole = 1e12 * 8 / 5e13  # the step's work on one device
    assert t.compute_s == pytest.approx(0.7 * whole)
    assert t.total_s == pytest.approx(whole / 4 * (3 * 0.7 + 1))
