"""`ddl plan --verify K` (issue 41, item 5) trains the plan's K best distinct layouts (issue
51: the best of each mesh first) on this machine, says whether their measured order is the
predicted one, and sets what each real run measured beside what the plan predicted: for
MNIST on 2 local CPU processes, every verified row is the plan's row (same layout, same
predictions), the run trained that layout, and the measured model state and activations agree with the
prediction within the acceptance's 5 % and 15 % - numbers that come from the runs'
results.json, not from the planner (a run's peak resident set, its step time)."""

import json

import pytest

from conftest import run_ddl

pytestmark = pytest.mark.distributed


def test_verify_2_sets_measured_beside_predicted(tmp_path, synthetic_mnist):
    proc = run_ddl("plan", "--plugin", "mnist", "--preset", "tiny", "--site", "local",
                   "--nproc", "2", "--data-dir", str(synthetic_mnist), "--verify", "2",
                   "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(line.startswith("ddl: note: --verify: layout ")
               for line in proc.stderr.splitlines()), proc.stderr
    report = json.loads(proc.stdout)
    verified = report["verify"]
    assert verified["processes"] == report["world"] == 2 and verified["device"] == "cpu"
    assert len(verified["layouts"]) == 2 and verified["notes"] == []  # real data, 2 fit
    # two distinct meshes (issue 51): the plan's best, then the best of another mesh
    ranks = [row["plan_rank"] for row in verified["layouts"]]
    assert ranks[0] == 1 and verified["layouts"][0]["mesh"] != verified["layouts"][1]["mesh"]
    assert all(report["fits"][r - 1]["mesh"] == report["fits"][0]["mesh"]
               for r in range(1, ranks[1]))
    order = verified["order"]
    assert order["predicted"] == [1, 2] and sorted(order["measured"]) == [1, 2]
    assert order["matches"] == (order["measured"] == [1, 2])
    assert order["first_over_fastest"] >= 1.0
    for row in verified["layouts"]:
        plan_row = report["fits"][row["plan_rank"] - 1]
        assert row["status"] == "measured", row
        assert row["flags"] == plan_row["flags"] and row["mesh"] == plan_row["mesh"]
        predicted, measured = row["predicted"], row["measured"]
        assert predicted == {"model_state_bytes": plan_row["model_state_bytes"],
                             "activation_bytes": plan_row["activation_bytes"],
                             "memory_per_rank_bytes": plan_row["memory_per_rank_bytes"],
                             "peak": plan_row["peak"], "step_s": plan_row["step_s"],
                             "step_time": plan_row["step_time"]}
        assert measured["mesh"] == plan_row["mesh"]  # ddl train ran the plan's layout
        assert measured["model_state_bytes"] == pytest.approx(
            predicted["model_state_bytes"], rel=0.05)
        assert measured["activation_bytes"] == pytest.approx(
            predicted["activation_bytes"], rel=0.15)
        # from the run, not the plan: a whole torch process, and a timed second epoch
        assert measured["peak_source"] == "peak_rss_bytes"
        assert measured["peak_bytes"] > 50 * 2 ** 20  # a whole process, baseline and all
        # the peak above the process's own baseline: the prediction within 25 % of the
        # measured peak (issue 51's wording: the measured peak is the reference). On
        # this 2-core machine the FSDP layout's measured peak varies with what runs beside
        # it: 37.8-41.1 MB alone or beside CPU burners, 46.3 MB twice in CI's parallel
        # phase, against 36.8 MB predicted (docs/plan.md)
        above = measured["peak_bytes"] - measured["baseline_bytes"]
        assert above == measured["peak_above_baseline_bytes"]
        assert predicted["peak"]["above_interpreter_bytes"] == pytest.approx(above, rel=0.25)
        assert 0 < measured["step_s"] < 60
        assert row["ratio"]["model_state"] == pytest.approx(
            measured["model_state_bytes"] / predicted["model_state_bytes"])
