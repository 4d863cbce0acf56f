"""benchmarks/plan_accuracy.py's summary and figure from a results document (no runs: the
runs are the benchmark's, and `ddl plan --verify`'s code they use is tested in
tests/distributed/test_plan_verify.py). The summary counts what lies within 5 % and 15 %,
xsum's trimmed batches apart; the figure is an SVG with one panel per quantity."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit
sys.path.insert(0, str(REPO / "benchmarks"))

import plan_accuracy  # noqa: E402


def _run(plugin, processes, pp, predicted, measured):
    keys = ("model_state_bytes", "activation_bytes")
    return {"plugin": plugin, "processes": processes, "label": "x",
            "mesh": {"pp": pp, "dp_replicate": 1, "dp_shard": processes // pp, "tp": 1},
            "predicted": {**dict(zip(keys, predicted)), "memory_per_rank_bytes": sum(predicted),
                          "step_s": None},
            "measured": {**dict(zip(keys, measured)), "peak_bytes": 500 * 2 ** 20,
                         "step_s": 0.01}}


def test_summary_and_figure(tmp_path):
    runs = [_run("mnist", 2, 1, (1000, 2 ** 20), (1000, 1.1 * 2 ** 20)),
            _run("xsum", 4, 2, (4000, 2 ** 22), (4100, 2 ** 22)),
            _run("xsum", 2, 1, (4000, 2 ** 22), (4000, 0.5 * 2 ** 22))]
    got = plan_accuracy.summary(runs)
    assert got["model state"] == {"runs": 3, "min_ratio": 1.0, "max_ratio": 1.025,
                                  "within_5_percent": 3, "within_15_percent": 3}
    assert got["activations (untrimmed batches)"] == {
        "runs": 2, "min_ratio": 1.0, "max_ratio": pytest.approx(1.1),
        "within_5_percent": 1, "within_15_percent": 2}
    assert got["activations (xsum trimmed, the plan a bound)"]["max_ratio"] == 0.5
    assert got["peak above the plan's memory (bytes)"]["min"] > 400 * 2 ** 20
    doc = {"runs": runs, "machine": {"cpus": 2, "cpu": "test CPU", "load_average": [0.5] * 3,
                                     "date": "2026-11-27T20:00:00+0000"}}
    svg = tmp_path / "plan-accuracy.svg"
    plan_accuracy.figure(doc, svg)
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for title in ("model state", "activations", "peak", "2 cores", "load 0.5"):
        assert title in text, title
