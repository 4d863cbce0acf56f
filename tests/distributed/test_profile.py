"""`--profile`: a 2-rank DDP run writes one Chrome trace per rank and a summary per rank."""

import json

import pytest

from conftest import run_ddl

pytestmark = pytest.mark.distributed


def _profiled_run(run_dir, data_dir, nproc: int, steps: int, profile: int) -> list[dict]:
    """One epoch of MNIST tiny with --profile; the per-rank summaries from results.json."""
    proc = run_ddl("train", "--plugin", "mnist", "--preset", "tiny", "--nproc", str(nproc),
                   "--epochs", "1", "--steps-per-epoch", str(steps), "--profile", str(profile),
                   "--data-dir", str(data_dir), "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # on CPU kineto logged "gpuGetDeviceCount failed with code 35" and its trace markers
    assert "gpuGetDeviceCount" not in proc.stderr and "USDT:" not in proc.stderr, proc.stderr
    return json.loads((run_dir / "results.json").read_text())["profile"]


def test_profiled_run_writes_one_readable_trace_per_rank(tmp_path, synthetic_mnist):
    run_dir = tmp_path / "run"
    profile = _profiled_run(run_dir, synthetic_mnist, nproc=2, steps=5, profile=2)
    assert [p["rank"] for p in profile] == [0, 1]
    for rank, summary in enumerate(profile):
        trace = json.loads((run_dir / f"trace-rank{rank}.json").read_text())
        names = {e.get("name", "") for e in trace["traceEvents"]}
        # the profiled steps: 2 of them, after the skipped and the warm-up step
        assert sum(n.startswith("ProfilerStep#") for n in names) == 2
        assert any("allreduce" in n or "all_reduce" in n for n in names)  # DDP's gradients
        assert summary["trace"] == f"trace-rank{rank}.json"
        assert summary["communication_time_s"] > 0
        assert summary["op_time_s"] >= summary["communication_time_s"] + summary["compute_time_s"] - 1e-9
        assert summary["top_ops"] and "communication" in summary["summary"]
    assert not list(run_dir.glob("trace-rank2*"))


def test_profile_longer_than_the_run_says_so(tmp_path, synthetic_mnist):
    (summary,) = _profiled_run(tmp_path / "run", synthetic_mnist, nproc=1, steps=1, profile=3)
    assert summary["trace"] is None and "nothing was profiled" in summary["note"]


def test_profile_must_not_be_negative(tmp_path):
    proc = run_ddl("train", "--profile", "-1", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "profile" in proc.stderr and "Traceback" not in proc.stderr
