"""benchmarks/plan_ranking.py's judgement of issue 51's bars from a results document (no
runs: they are the benchmark's; the `ddl plan --verify` code it runs is tested in
tests/distributed/test_plan_verify.py), and its --check exit code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit
sys.path.insert(0, str(REPO / "benchmarks"))

import plan_ranking  # noqa: E402


def _row(mesh, step=1.0, activations=1.0, peak=1.0):
    return {"mesh": mesh, "status": "measured", "why": None,
            "ratio": {"step": step, "activations": activations, "peak": peak,
                      "model_state": 1.0}}


def _doc(rows, first_over_fastest):
    return {"workloads": {"mnist": {"verify": {
        "layouts": rows, "order": {"first_over_fastest": first_over_fastest}}}}}


MESHES = [{"pp": 1, "dp_replicate": 2, "dp_shard": 1, "tp": 1},
          {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1},
          {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 1}]


def test_bars_met_and_each_miss_named(tmp_path):
    # measured / predicted 1.3: predicted 0.77 of measured, inside 25 %; 0.85 likewise
    good = _doc([_row(MESHES[0], step=1.3), _row(MESHES[1], step=0.85), _row(MESHES[2])],
                1.05)
    assert plan_ranking.bars(good) == []
    bad = _doc([_row(MESHES[0], step=1.5), _row(MESHES[1], activations=0.8),
                _row(MESHES[1], peak=None)], 1.3)
    misses = plan_ranking.bars(bad)
    assert any(line.startswith("mnist #1 step: measured / predicted 1.50") for line in misses)
    assert any(line.startswith("mnist #2 activations") for line in misses)
    assert any(line.startswith("mnist #3 peak: measured / predicted n/a") for line in misses)
    assert "mnist: a mesh verified twice" in misses
    assert any("1.30x the measured fastest" in line and "also missed" in line
               for line in misses)
    # --check: a command that fails on a missed bar, and passes on a met one
    for doc, code in ((bad, 1), (good, 0)):
        path = tmp_path / "r.json"
        path.write_text(json.dumps(doc))
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "plan_ranking.py"),
                               "--check", str(path)], capture_output=True, text=True)
        assert proc.returncode == code, proc.stdout + proc.stderr
