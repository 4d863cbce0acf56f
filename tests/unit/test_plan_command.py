"""`ddl plan` end to end on the CLI: a table and JSON of layouts that fit, the dropped ones
with their reason, and bad input as one line (exit 2). MNIST only: its meta-device probes
take seconds; T5-3B's fit is in docs/plan.md."""

from __future__ import annotations

import json

import pytest

from conftest import assert_one_line_error, run_ddl

pytestmark = pytest.mark.unit


def test_json_ranks_layouts_that_fit(synthetic_mnist, tmp_path):
    proc = run_ddl("plan", "--plugin", "mnist", "--preset", "tiny", "--site", "juwels",
                   "--nodes", "2", "--global-batch-size", "64", "--data-dir",
                   str(synthetic_mnist), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["world"] == 8 and report["fits"]
    for row in report["fits"]:
        mesh = row["mesh"]
        assert mesh["pp"] * mesh["dp_replicate"] * mesh["dp_shard"] * mesh["tp"] == 8
        assert mesh["tp"] == 1  # MNIST's CNN has no tensor-parallel plan
        dp = mesh["dp_replicate"] * mesh["dp_shard"]
        assert row["micro_batch"] * row["accumulation"] * dp == 64
        assert 0 < row["model_state_bytes"] < row["memory_per_rank_bytes"] < 40 * 2 ** 30
    steps = [row["step_s"] for row in report["fits"]]
    assert steps == sorted(steps)
    # a pipeline deeper than the CNN's 4 stages is dropped, saying why
    assert any(row["mesh"]["pp"] == 8 and "stages" in row["dropped"]
               for row in report["dropped"])


def test_table_and_bad_input(tmp_path):
    proc = run_ddl("plan", "--plugin", "mnist", "--site", "juwels", "--nodes", "0",
                   cwd=tmp_path)
    assert_one_line_error(proc, "--nodes: 0")  # CPU sites: test_plan_cpu_site
