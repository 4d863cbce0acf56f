"""`ddl scale` runs real 1- and 2-process trainings in alternating rounds beside a CPU-bound
process, and reports exactly their numbers (medians, spread); `ddl report` renders the same
from the finished runs. Issue 38: on this 2-core machine no reported speedup may exceed
2.2, also with a busy core."""

import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import DDL, run_bounded, run_ddl

# serial: the study keeps a core busy for as long as it runs; in the parallel phase that
# core was taken from the other tests (the module's setup read 394 s wall there,
# 2026-11-29, at load 10-25), alone it is the study's own time
pytestmark = [pytest.mark.distributed, pytest.mark.serial]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PEAK = 1e9  # a given peak, so MFU is checkable by hand (local has none)
ROUNDS = 2
MAX_SPEEDUP = 2.2  # 2 processes on this 2-core machine (issue 38's bar)


@pytest.fixture(scope="module")
def study(tmp_path_factory, synthetic_mnist):
    out = tmp_path_factory.mktemp("scale") / "study"
    # as a user runs it: no OMP_NUM_THREADS (run_ddl sets 1 for the equivalence tests), so
    # ddl scale chooses the threads per rank
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    # a real CPU-bound program on one core for the whole study (the busy machine)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        started = time.monotonic()
        proc = run_bounded([DDL, "scale", "--plugin", "mnist", "--preset", "tiny", "--nprocs",
                            "1,2", "--rounds", str(ROUNDS), "--scaling", "strong", "--epochs",
                            "2", "--steps-per-epoch", "2", "--data-dir", str(synthetic_mnist),
                            "--peak-flops", str(PEAK), "--output", str(out)],
                           env=env, timeout=600)
        wall = time.monotonic() - started
        busy_cpu = sum(psutil.Process(busy.pid).cpu_times()[:2])
    finally:
        busy.kill()
        busy.wait()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout, busy_cpu / wall


def _results(run_dir):
    return json.loads((Path(run_dir) / "results.json").read_text())


def _points(out):
    return json.loads((out / "scale.json").read_text())["points"]


def test_the_study_ran_beside_a_busy_core(study):
    _, _, busy_share = study
    assert busy_share > 0.25, busy_share  # the busy loop had a core's worth, or much of one


def test_rounds_alternate_and_each_point_is_the_median_of_its_runs(study):
    out, _, _ = study
    runs = sorted(out.glob("n*-r*"), key=lambda d: _results(d)["started_at"])
    assert [_results(d)["world"]["size"] for d in runs] == [1, 2] * ROUNDS
    for p in _points(out):
        assert p["rounds"] == ROUNDS and len(p["run_dirs"]) == ROUNDS
        rates = [_results(d)["summary"]["samples_per_s"] for d in p["run_dirs"]]
        times = [_results(d)["summary"]["epoch_time_s"] for d in p["run_dirs"]]
        assert all(_results(d)["world"]["size"] == p["devices"] for d in p["run_dirs"])
        assert p["samples_per_s"] == statistics.median(rates)
        assert p["epoch_time_s"] == statistics.median(times)
        assert (p["samples_per_s_min"], p["samples_per_s_max"]) == (min(rates), max(rates))
        assert math.isclose(p["spread"], (max(rates) - min(rates)) / statistics.median(rates))
        assert p["run_dir"] in p["run_dirs"]  # the median run supplies the other columns


def test_json_agrees_with_the_runs(study):
    out, stdout, _ = study
    report = json.loads((out / "scale.json").read_text())
    assert report["scaling"] == "strong" and report["plugin"] == "mnist"
    assert report["rounds"] == ROUNDS
    points = report["points"]
    assert [p["devices"] for p in points] == [1, 2]
    base = points[0]
    for p in points:
        r = _results(p["run_dir"])
        assert r["world"]["size"] == p["devices"]
        assert r["summary"]["epochs_measured"] == [2]  # the first epoch is excluded
        assert p["data_wait_s"] == r["epochs"][1]["data_wait_s"]
        assert p["memory_per_rank"] == r["memory_per_rank"]
        assert len(p["memory_per_rank"]) == p["devices"]
        assert p["max_peak_rss_bytes"] == max(m["peak_rss_bytes"] for m in r["memory_per_rank"])
        assert p["batch_global"] == r["batch"]["global"] == base["batch_global"]  # strong
        speedup = p["samples_per_s"] / base["samples_per_s"]  # of the medians
        assert math.isclose(p["speedup_measured"], speedup)
        if p["above_ideal"]:
            assert p["speedup"] is None and p["efficiency"] is None
        else:
            assert math.isclose(p["speedup"], speedup)
            assert math.isclose(p["efficiency"], speedup / p["devices"])
        flops = r["mfu"]["flops_per_sample"]
        assert flops > 0
        assert math.isclose(p["mfu"], flops * p["samples_per_s"] / p["devices"] / PEAK)
    assert "strong scaling" in stdout


def test_csv_agrees_with_the_json(study):
    out, _, _ = study
    points = _points(out)
    with open(out / "scale.csv", newline="") as f:
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
    out, _, _ = study
    import matplotlib.image

    for name in ("time.png", "throughput.png", "speedup.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        height, width = matplotlib.image.imread(out / name).shape[:2]
        assert height > 100 and width > 100


def test_report_renders_the_same_from_finished_runs(study, tmp_path):
    out, _, _ = study
    proc = run_ddl("report", str(out), "--peak-flops", str(PEAK), "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = json.loads((tmp_path / "scale.json").read_text())
    first = json.loads((out / "scale.json").read_text())
    assert again["points"] == first["points"]
    assert (tmp_path / "scale.csv").read_text() == (out / "scale.csv").read_text()


def test_every_point_runs_one_thread_per_rank(study):
    """Issue 38: the 1-process point must not use more cores than a rank of the 2-process
    point (ddl's usual rule gave it both cores, and a busy core then wrecked its baseline)."""
    out, stdout, _ = study
    assert json.loads((out / "scale.json").read_text())["threads"]["per_rank"] == 1
    for p in _points(out):
        for run_dir in p["run_dirs"]:
            threads = _results(run_dir)["threads"]
            assert threads["per_rank"] == 1, threads
            assert "ddl scale" in threads["source"], threads
        assert p["threads_per_rank"] == 1
    assert "threads per rank: 1 at every point" in stdout


def test_no_reported_speedup_above_ideal_beside_a_busy_core(study):
    """Issue 38's acceptance: neither scale.json, the CSV nor the printed table reports a
    speedup above 2.2; a measured ratio above ideal is shown as invalid, with its reason."""
    out, stdout, _ = study
    points = _points(out)
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
