"""`ddl plan --verify [K]` before anything trains: a bad K, or a plan this machine cannot run
as planned, is one line and exit 2; and the table renders a verified row's predicted and
measured values side by side ("n/a" where the plan predicts no step time, a failed run
with its reason). The runs themselves: tests/distributed/test_plan_verify.py."""

from __future__ import annotations

import pytest

from conftest import assert_one_line_error, run_ddl
from ddl.commands import plan_verify

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("k, needle", [("0", "--verify: 0; allowed: a whole number >= 1"),
                                       ("-2", "--verify: -2; allowed"),
                                       ("three", "--verify: invalid int value")])
def test_bad_k_is_one_line(tmp_path, k, needle):
    proc = run_ddl("plan", "--plugin", "mnist", "--site", "local", "--verify", k,
                   cwd=tmp_path)
    assert_one_line_error(proc, needle)


def test_a_plan_of_more_gpus_than_here_is_refused_not_shrunk(tmp_path):
    # 2 nodes of juwels are never on one machine: refused whatever GPUs this one has
    proc = run_ddl("plan", "--plugin", "mnist", "--site", "juwels", "--nodes", "2",
                   "--verify", cwd=tmp_path)
    line = assert_one_line_error(proc, "--verify: the plan's layouts run on 2 nodes x 4 GPUs")
    assert "another layout" in line and "--site local" in line


def _row(status="measured", **measured):
    row = {"mesh": {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1}, "micro_batch": 32,
           "accumulation": 1, "activation_checkpointing": "none", "status": status,
           "why": None if status == "measured" else "exit code 1: ddl: error: boom",
           "predicted": {"model_state_bytes": 48 * 1024, "activation_bytes": 3 * 2 ** 20,
                         "memory_per_rank_bytes": 3 * 2 ** 20 + 48 * 1024, "step_s": None},
           "measured": None}
    if status == "measured":
        row["measured"] = {"model_state_bytes": 48 * 1024, "activation_bytes": 2 ** 21,
                           "peak_bytes": 500 * 2 ** 20, "peak_source": "peak_rss_bytes",
                           "step_s": 0.0213, **measured}
    return row


def test_render_sets_predicted_beside_measured():
    text = plan_verify.render({"processes": 2, "device": "cpu", "epochs": 2,
                               "steps_per_epoch": 3, "notes": ["a note"],
                               "how": plan_verify._how("cpu"),
                               "layouts": [_row(), _row("failed")]})
    lines = text.splitlines()
    first = next(line for line in lines if line.startswith("1 "))
    assert "dp_shard=2" in first and "48.0 KiB / 48.0 KiB" in first
    assert "3.0 MiB / 2.0 MiB" in first and "500.0 MiB" in first and "n/a / 0.0213" in first
    second = next(line for line in lines if line.startswith("2 "))
    assert second.endswith("n/a / n/a")  # nothing measured: nothing invented
    assert "  #2 failed: exit code 1: ddl: error: boom" in lines
    assert "  a note" in lines and any("peak resident set" in line for line in lines)
    assert plan_verify.exit_code({"layouts": [_row()]}) == 0
    assert plan_verify.exit_code({"layouts": [_row(), _row("failed")]}) == 1


def test_measured_reads_results_json_fields():
    # a pipeline: the first stage holds more activations, the last more parameters; the
    # fullest rank (state + activations, as the plan's row) is the first, all its fields
    results = {"world": {"parallel": {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 1}},
               "steps_per_epoch": 3, "summary": {"epoch_time_s": 0.6},
               "memory_per_rank": [
                   {"model_state_bytes": 10, "saved_for_backward_bytes": 7,
                    "peak_rss_bytes": 5, "device_peak_allocated_bytes": 3},
                   {"model_state_bytes": 12, "saved_for_backward_bytes": 2,
                    "peak_rss_bytes": 9, "device_peak_allocated_bytes": 4}]}
    got = plan_verify.measured(results)
    assert got == {"mesh": results["world"]["parallel"], "rank": 0, "model_state_bytes": 10,
                   "activation_bytes": 7, "peak_bytes": 3,
                   "peak_source": "device_peak_allocated_bytes", "step_s": pytest.approx(0.2),
                   "baseline_bytes": None, "peak_above_baseline_bytes": None,
                   "peak_reserved_bytes": None}
    results["memory_per_rank"][0]["saved_for_backward_bytes"] = None  # no meter reading
    got = plan_verify.measured(results)  # rank 1 (12 + 2) is the fullest now
    assert (got["rank"], got["model_state_bytes"], got["activation_bytes"]) == (1, 12, 2)
    for rank in results["memory_per_rank"]:  # a CPU run: no allocator peak
        del rank["device_peak_allocated_bytes"]
        rank["baseline_rss_bytes"] = 1
    got = plan_verify.measured(results)  # the peak above the process's own baseline
    assert (got["peak_source"], got["peak_bytes"], got["baseline_bytes"],
            got["peak_above_baseline_bytes"]) == ("peak_rss_bytes", 9, 1, 8)
    # the plan's row is a rank of stage 0 (its pp_rank): that stage's rank is compared,
    # though stage 1's is fuller (CIFAR tiny at pp=2 compared the other stage: 52x)
    got = plan_verify.measured(results, pp_rank=0)
    assert (got["rank"], got["model_state_bytes"]) == (0, 10)
    assert plan_verify.measured(results, pp_rank=1)["rank"] == 1


def _fit(pp=1, replicate=1, shard=1, ckpt="none", micro=32):
    return {"mesh": {"pp": pp, "dp_replicate": replicate, "dp_shard": shard, "tp": 1},
            "micro_batch": micro, "activation_checkpointing": ckpt}


def test_verify_chooses_distinct_meshes_before_variants():
    """Issue 51: `--verify 2` trained one mesh twice (two checkpointing modes). Now the
    best row of each mesh comes first, variants only when meshes run out."""
    fits = [_fit(replicate=2), _fit(replicate=2, ckpt="selective"), _fit(shard=2),
            _fit(replicate=2, micro=16), _fit(pp=2), _fit(shard=2, ckpt="full")]
    assert plan_verify.choose(fits, 3) == [0, 2, 4]
    assert plan_verify.choose(fits, 5) == [0, 2, 4, 1, 3]
    assert plan_verify.choose(fits[:2], 3) == [0, 1]


def _timed(rank, step, status="measured"):
    return {"plan_rank": rank, "status": status,
            "measured": {"step_s": step} if status == "measured" else None}


def test_order_says_whether_measured_matches_predicted():
    same = plan_verify.order([_timed(1, 0.01), _timed(3, 0.02), _timed(5, 0.03)], "x")
    assert same["matches"] is True and same["first_over_fastest"] == 1.0
    assert same["predicted"] == same["measured"] == [1, 2, 3]
    line = plan_verify.order_line({"order": same})
    assert line.startswith("order: the measured step times match the plan's order")
    swapped = plan_verify.order([_timed(1, 0.03), _timed(2, 0.02), _timed(4, 0.01),
                                 _timed(6, None, "failed")], "predicted step time")
    assert swapped["matches"] is False and swapped["measured"] == [3, 2, 1]
    assert swapped["fastest"] == 3 and swapped["first_over_fastest"] == pytest.approx(3.0)
    assert swapped["left_out"] == [4]
    line = plan_verify.order_line({"order": swapped})
    assert "not the plan's #1 < #2 < #3" in line and "ran 200% slower" in line
    assert "\n" not in line
    alone = plan_verify.order([_timed(1, 0.01)], "x")
    assert alone["matches"] is None
    assert "nothing to compare" in plan_verify.order_line({"order": alone})


def test_step_time_is_the_median_of_the_timed_epochs():
    """One epoch of 10 steps varied ~30 % between runs on a 2-core host: verify times 3
    epochs after the warm-up and takes their median, so one slow epoch moves nothing."""
    results = {"world": {"parallel": {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "tp": 1}},
               "steps_per_epoch": 10, "summary": {"epoch_time_s": 0.5},
               "memory_per_rank": [{"model_state_bytes": 1}],
               "epochs": [{"epoch": 1, "warmup": True, "time_s": 9.0},
                          {"epoch": 2, "warmup": False, "time_s": 0.20},
                          {"epoch": 3, "warmup": False, "time_s": 0.90},
                          {"epoch": 4, "warmup": False, "time_s": 0.30}]}
    assert plan_verify.measured(results)["step_s"] == pytest.approx(0.030)
    del results["epochs"]  # an older results.json: the summary's mean
    assert plan_verify.measured(results)["step_s"] == pytest.approx(0.05)
    assert plan_verify.EPOCHS - 1 >= 3  # timed epochs, beside the warm-up
