"""No stuck state after a kill between the last checkpoint and results.json, through the real
CLI (MNIST tiny, one process, 3 steps): `--resume auto` tests, exports and writes the
results. The killed state is made exactly: a finished run without results.json and model.pt
(the checkpoint of the last epoch's end and metrics.jsonl are what a kill there leaves), plus
a torn last metrics line (what an in-place append cut short left). A second `--resume auto`
while the directory is locked is refused in one line."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_one_line_error, run_ddl

pytestmark = pytest.mark.distributed

HOLD = ("import sys; from pathlib import Path; from ddl.settings import rundir; "
        "rundir.create(Path(sys.argv[1]), 'auto'); print('locked', flush=True); "
        "sys.stdin.read()")


def test_run_killed_before_results_finishes_with_resume_auto(tmp_path, synthetic_mnist):
    run_dir = tmp_path / "run"
    args = ["train", "--plugin", "mnist", "--preset", "tiny", "--nproc", "1", "--epochs", "1",
            "--steps-per-epoch", "3", "--seed", "3", "--data-dir", str(synthetic_mnist),
            "--run-dir", str(run_dir)]
    first = run_ddl(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    want = torch.load(run_dir / "model.pt", weights_only=True)
    test_metrics = json.loads((run_dir / "results.json").read_text())["final"]
    (run_dir / "results.json").unlink()
    (run_dir / "model.pt").unlink()
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"epoch": 2, "train_lo')

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "locked"
        busy = run_ddl(*args, "--resume", "auto", cwd=tmp_path)
        assert_one_line_error(busy, str(run_dir), f"in use by a run still going (pid "
                                                  f"{holder.pid} on")
    finally:
        holder.communicate("")
    assert not (run_dir / "results.json").exists()

    resumed = run_ddl(*args, "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "all 1 epoch(s) were trained; testing and writing the results" in resumed.stdout
    assert "dropped a torn last line" in resumed.stdout
    assert "Traceback" not in resumed.stderr
    got = torch.load(run_dir / "model.pt", weights_only=True)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert json.loads((run_dir / "results.json").read_text())["final"] == test_metrics
    assert [r["epoch"] for r in map(json.loads, (run_dir / "metrics.jsonl").open())] == [1]


def test_a_refused_setting_leaves_the_run_dir_usable(tmp_path, synthetic_mnist):
    """fp16 on CPU is refused by the pre-flight (which works out the precision for the
    workers), before the run directory is made; the corrected command then runs in that
    directory (it once said "already holds a run")."""
    run_dir = tmp_path / "run"
    args = ["train", "--plugin", "mnist", "--preset", "tiny", "--nproc", "1", "--epochs", "1",
            "--steps-per-epoch", "2", "--data-dir", str(synthetic_mnist),
            "--run-dir", str(run_dir)]
    refused = run_ddl(*args, "--precision", "fp16", cwd=tmp_path)
    assert_one_line_error(refused, "--precision", "fp16 needs a GPU")
    assert not (run_dir / "config.json").exists()  # refused before anything was written
    corrected = run_ddl(*args, cwd=tmp_path)
    assert corrected.returncode == 0, corrected.stdout + corrected.stderr
    assert (run_dir / "results.json").is_file()
