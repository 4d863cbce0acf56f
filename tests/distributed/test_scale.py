"""`ddl scale` runs real 1- and 2-process trainings and reports exactly their numbers;
`ddl report` renders the same from the finished runs."""

import csv
import json
import math
import os

import pytest

from conftest import DDL, run_bounded, run_ddl

pytestmark = pytest.mark.distributed

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PEAK = 1e9  # a given peak, so MFU is checkable by hand (local has none)


@pytest.fixture(scope="module")
def study(tmp_path_factory, synthetic_mnist):
    out = tmp_path_factory.mktemp("scale") / "study"
    # as a user runs it: no OMP_NUM_THREADS (run_ddl sets 1 for the equivalence tests), so
    # ddl's thread policy decides each point's threads
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = run_bounded([DDL, "scale", "--plugin", "mnist", "--preset", "tiny", "--nprocs",
                        "1,2", "--scaling", "strong", "--epochs", "2", "--steps-per-epoch", "2",
                        "--data-dir", str(synthetic_mnist), "--peak-flops", str(PEAK),
                        "--output", str(out)], env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


def _results(point):
    from pathlib import Path

    return json.loads((Path(point["run_dir"]) / "results.json").read_text())


def test_json_agrees_with_the_runs(study):
    out, stdout = study
    report = json.loads((out / "scale.json").read_text())
    assert report["scaling"] == "strong" and report["plugin"] == "mnist"
    points = report["points"]
    assert [p["devices"] for p in points] == [1, 2]
    base = _results(points[0])
    for p in points:
        r = _results(p)
        assert r["world"]["size"] == p["devices"]
        assert p["epoch_time_s"] == r["summary"]["epoch_time_s"]
        assert p["samples_per_s"] == r["summary"]["samples_per_s"]
        assert r["summary"]["epochs_measured"] == [2]  # the first epoch is excluded
        assert p["data_wait_s"] == r["epochs"][1]["data_wait_s"]
        assert p["memory_per_rank"] == r["memory_per_rank"]
        assert len(p["memory_per_rank"]) == p["devices"]
        assert p["max_peak_rss_bytes"] == max(m["peak_rss_bytes"] for m in r["memory_per_rank"])
        assert p["batch_global"] == r["batch"]["global"] == base["batch"]["global"]  # strong
        speedup = r["summary"]["samples_per_s"] / base["summary"]["samples_per_s"]
        assert math.isclose(p["speedup"], speedup)
        assert math.isclose(p["efficiency"], speedup / p["devices"])
        flops = r["mfu"]["flops_per_sample"]
        assert flops > 0
        assert math.isclose(p["mfu"], flops * r["summary"]["samples_per_s"] / p["devices"] / PEAK)
    assert "strong scaling" in stdout


def test_csv_agrees_with_the_json(study):
    out, _ = study
    points = json.loads((out / "scale.json").read_text())["points"]
    with open(out / "scale.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(points)
    for row, p in zip(rows, points):
        assert int(row["devices"]) == p["devices"]
        for key in ("epoch_time_s", "samples_per_s", "speedup", "efficiency", "mfu",
                    "data_wait_s"):
            assert float(row[key]) == p[key], key
        assert int(row["max_peak_rss_bytes"]) == p["max_peak_rss_bytes"]


def test_plots_are_pngs(study):
    out, _ = study
    import matplotlib.image

    for name in ("time.png", "throughput.png", "speedup.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        height, width = matplotlib.image.imread(out / name).shape[:2]
        assert height > 100 and width > 100


def test_report_renders_the_same_from_finished_runs(study, tmp_path):
    out, _ = study
    proc = run_ddl("report", str(out / "n2"), str(out / "n1"), "--peak-flops", str(PEAK),
                   "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = json.loads((tmp_path / "scale.json").read_text())
    first = json.loads((out / "scale.json").read_text())
    assert again["points"] == first["points"]
    assert (tmp_path / "scale.csv").read_text() == (out / "scale.csv").read_text()


def test_points_run_under_one_thread_policy_and_an_impossible_speedup_is_flagged(study):
    """Issue 23: every point splits the usable cores evenly over its ranks (ddl.worker.threads:
    1 process x all cores against 2 x half of them). Whether the speedup then stays below
    ideal is a measurement, not asserted here: on the loaded CI machine the 2-thread
    baseline was once slowed 4x by the other tests (speedup 4.03), which is exactly what the
    report's above-ideal warning is for; so a point above ideal must carry the warning."""
    out, stdout = study
    cores = len(os.sched_getaffinity(0))
    points = json.loads((out / "scale.json").read_text())["points"]
    for p in points:
        threads = _results(p)["threads"]
        assert threads["per_rank"] == max(cores // p["devices"], 1), threads
        assert p["threads_per_rank"] == threads["per_rank"]
    for p in points:
        assert p["above_ideal"] == (p["efficiency"] > 1.1)
        if p["above_ideal"]:
            assert p["warning"] in stdout and "warning:" in stdout
