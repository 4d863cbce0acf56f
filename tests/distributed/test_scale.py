"""`ddl scale` runs real 1- and 2-process trainings in alternating rounds beside a CPU-bound
process, and reports exactly their numbers (medians, spread); `ddl report` renders the same
from the finished runs. Issue 38: on this 2-core machine no reported speedup may exceed
2.2, also with a busy core.

The study is docs/scaling-study.md's block (the MNIST course CNN, weak scaling, `--nprocs
1,2 --rounds 2`), run once for this module and tests/distributed/test_scaling_page.py
beside a busy loop on one core (test_scaling_page.shared_study). Until 2026-11-29 this
module ran a second study of its own (tiny preset, strong scaling, --peak-flops); the MFU
of a given peak is now checked through `ddl report --peak-flops` on the same runs."""

import csv
import json
import math
import statistics

import pytest

from conftest import run_ddl
from test_scaling_page import BATCH_PER_REPLICA, block_flag, shared_study

# serial: the study keeps a core busy for as long as it runs; in the parallel phase that
# core was taken from the other tests (the module's setup read 394 s wall there,
# 2026-11-29, at load 10-25), alone it is the study's own time
pytestmark = [pytest.mark.distributed, pytest.mark.serial]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PEAK = 1e9  # a given peak, so MFU is checkable by hand (local has none)
MAX_SPEEDUP = 2.2  # 2 processes on this 2-core machine (issue 38's bar)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return shared_study(tmp_path_factory)


def _rounds() -> int:
    return int(block_flag("rounds"))


def _results(study, run_dir):
    # the points name their runs as `ddl scale` was given its --output: relative to where
    # the block ran
    return json.loads((study.where / run_dir / "results.json").read_text())


def _points(study):
    return json.loads((study.out / "scale.json").read_text())["points"]


def test_the_study_ran_beside_a_busy_core(study):
    assert study.busy_share > 0.25, study.busy_share  # a core's worth, or much of one


def test_rounds_alternate_and_each_point_is_the_median_of_its_runs(study):
    rounds = _rounds()
    assert rounds >= 2  # else there is no median to take
    runs = sorted(study.out.glob("n*-r*"), key=lambda d: _results(study, d)["started_at"])
    assert [_results(study, d)["world"]["size"] for d in runs] == [1, 2] * rounds
    for p in _points(study):
        assert p["rounds"] == rounds and len(p["run_dirs"]) == rounds
        results = [_results(study, d) for d in p["run_dirs"]]
        rates = [r["summary"]["samples_per_s"] for r in results]
        times = [r["summary"]["epoch_time_s"] for r in results]
        assert all(r["world"]["size"] == p["devices"] for r in results)
        assert p["samples_per_s"] == statistics.median(rates)
        assert p["epoch_time_s"] == statistics.median(times)
        assert (p["samples_per_s_min"], p["samples_per_s_max"]) == (min(rates), max(rates))
        assert math.isclose(p["spread"], (max(rates) - min(rates)) / statistics.median(rates))
        # the median run by samples/s (the slower of the middle two for an even count)
        # supplies the other columns
        by_rate = sorted(zip(rates, p["run_dirs"]))
        assert p["run_dir"] == by_rate[(len(by_rate) - 1) // 2][1], (p["run_dir"], by_rate)


def test_json_agrees_with_the_runs(study):
    report = json.loads((study.out / "scale.json").read_text())
    assert report["scaling"] == "weak" and report["plugin"] == "mnist"
    assert report["preset"] == "course" and report["rounds"] == _rounds()
    points = report["points"]
    assert [p["devices"] for p in points] == [1, 2]
    base = points[0]
    for p in points:
        r = _results(study, p["run_dir"])
        assert r["world"]["size"] == p["devices"]
        assert r["summary"]["epochs_measured"] == [2]  # the first epoch is excluded
        assert p["data_wait_s"] == r["epochs"][1]["data_wait_s"]
        assert p["memory_per_rank"] == r["memory_per_rank"]
        assert len(p["memory_per_rank"]) == p["devices"]
        assert p["max_peak_rss_bytes"] == max(m["peak_rss_bytes"] for m in r["memory_per_rank"])
        # weak: the batch per replica kept, the global batch grows with the replicas
        assert p["batch_per_replica"] == r["batch"]["per_replica"] == BATCH_PER_REPLICA
        assert p["batch_global"] == r["batch"]["global"] == BATCH_PER_REPLICA * p["devices"]
        speedup = p["samples_per_s"] / base["samples_per_s"]  # of the medians
        assert math.isclose(p["speedup_measured"], speedup)
        if p["above_ideal"]:
            assert p["speedup"] is None and p["efficiency"] is None
        else:
            assert math.isclose(p["speedup"], speedup)
            assert math.isclose(p["efficiency"], speedup / p["devices"])
        assert r["mfu"]["flops_per_sample"] > 0
        assert p["mfu"] is None  # no peak given, and local has none: the table shows "-"
    assert "weak scaling" in study.stdout


def test_csv_agrees_with_the_json(study):
    points = _points(study)
    with open(study.out / "scale.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(points)
    for row, p in zip(rows, points):
        assert int(row["devices"]) == p["devices"]
        assert int(row["rounds"]) == p["rounds"]
        for key in ("epoch_time_s", "samples_per_s", "samples_per_s_min", "samples_per_s_max",
                    "spread", "speedup", "efficiency", "speedup_measured", "mfu",
                    "data_wait_s"):
            assert (float(row[key]) if row[key] else None) == p[key], key
        assert int(row["max_peak_rss_bytes"]) == p["max_peak_rss_bytes"]


def test_plots_are_pngs(study):
    import matplotlib.image

    for name in ("time.png", "throughput.png", "speedup.png"):
        data = (study.out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        height, width = matplotlib.image.imread(study.out / name).shape[:2]
        assert height > 100 and width > 100


def test_report_renders_the_same_from_finished_runs(study, tmp_path):
    """`ddl report` of the finished runs, given a peak: the same points, plus an MFU that
    is the median run's FLOPs per sample x the median samples/s per device over the peak."""
    proc = run_ddl("report", str(study.out.relative_to(study.where)), "--peak-flops",
                   str(PEAK), "--output", str(tmp_path), cwd=study.where)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = json.loads((tmp_path / "scale.json").read_text())["points"]
    first = _points(study)
    assert [_without(p, PEAK_KEYS) for p in again] == [_without(p, PEAK_KEYS) for p in first]
    for p in again:
        flops = _results(study, p["run_dir"])["mfu"]["flops_per_sample"]
        assert p["peak_flops_per_device"] == PEAK
        assert math.isclose(p["mfu"], flops * p["samples_per_s"] / p["devices"] / PEAK)
    with open(tmp_path / "scale.csv", newline="") as f:
        rows_again = list(csv.DictReader(f))
    with open(study.out / "scale.csv", newline="") as f:
        rows_first = list(csv.DictReader(f))
    assert [_without(r, {"mfu"}) for r in rows_again] == [_without(r, {"mfu"})
                                                           for r in rows_first]
    assert [float(r["mfu"]) for r in rows_again] == [p["mfu"] for p in again]


PEAK_KEYS = {"mfu", "peak_flops_per_device", "mfu_note"}  # what a given peak may change


def _without(row: dict, keys: set[str]) -> dict:
    return {k: v for k, v in row.items() if k not in keys}


def test_every_point_runs_one_thread_per_rank(study):
    """Issue 38: the 1-process point must not use more cores than a rank of the 2-process
    point (ddl's usual rule gave it both cores, and a busy core then wrecked its baseline)."""
    assert json.loads((study.out / "scale.json").read_text())["threads"]["per_rank"] == 1
    for p in _points(study):
        for run_dir in p["run_dirs"]:
            threads = _results(study, run_dir)["threads"]
            assert threads["per_rank"] == 1, threads
            assert "ddl scale" in threads["source"], threads
        assert p["threads_per_rank"] == 1
    assert "threads per rank: 1 at every point" in study.stdout


def test_no_reported_speedup_above_ideal_beside_a_busy_core(study):
    """Issue 38's acceptance: neither scale.json, the CSV nor the printed table reports a
    speedup above 2.2; a measured ratio above ideal is shown as invalid, with its reason."""
    out, stdout = study.out, study.stdout
    points = _points(study)
    for p in points:
        assert p["speedup"] is None or p["speedup"] <= MAX_SPEEDUP, p
        if p["speedup"] is None:
            assert p["above_ideal"] and f"warning: {p['warning']}" in stdout
    with open(out / "scale.csv", newline="") as f:
        assert all(not row["speedup"] or float(row["speedup"]) <= MAX_SPEEDUP
                   for row in csv.DictReader(f))
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["devices"])
    column = lines[header].replace("epoch s", "epoch_s").split().index("speedup")
    for line in lines[header + 1:header + 1 + len(points)]:
        cell = line.split()[column]
        assert cell.startswith("invalid") or float(cell) <= MAX_SPEEDUP, line
