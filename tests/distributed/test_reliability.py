"""Crashes and stops through the real CLI: SIGKILL of every rank, a kill during a checkpoint
write, a killed worker under --max-restarts, a requested stop, a diverging loss.

Each interrupted run is continued with ``--resume auto`` (what a requeued job does) and must
end with parameters bit-identical to an uninterrupted run: same world, same arithmetic.
Processes are killed for real (SIGKILL); the tests wait for a checkpoint to appear on disk
before killing, so the kill lands mid-run whatever the machine's speed.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from background_ddl import Run
from conftest import live_workers, run_ddl

pytestmark = pytest.mark.distributed

ARGS = ["train", "--plugin", "mnist", "--preset", "tiny", "--global-batch-size", "64",
        "--epochs", "2", "--steps-per-epoch", "40", "--checkpoint-every", "4", "--seed", "7",
        "--nproc", "2"]


def _args(data, run_dir, strategy, *extra):
    return [*ARGS, "--strategy", strategy, "--data-dir", str(data), "--run-dir", str(run_dir),
            *extra]


def _weights(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)


def _identical(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _descendants(pid):
    """Every process below ``pid`` (the launcher's agent spawns the workers)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _wait_for(condition, proc, what, limit=300):
    """Poll a condition on disk while the run goes on (bounded; fails if the run ends)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {limit} s"
        time.sleep(0.05)


@pytest.fixture
def start():
    """Start `ddl ...` in the background, forked as run_ddl forks it
    (tests/background_ddl.py); whatever is left of it is killed after the test."""
    started = []

    def _start(args, cwd):
        run = Run(args, cwd=cwd, run_dir=Path(args[args.index("--run-dir") + 1]))
        started.append(run)
        return run

    yield _start
    for run in started:
        run.end()


def _first_checkpoint(run_dir):
    return lambda: (run_dir / "checkpoints" / "latest").is_file()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, synthetic_mnist):
    root = tmp_path_factory.mktemp("whole")
    proc = run_ddl(*_args(synthetic_mnist, root / "ddp", "ddp"), cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"ddp": _weights(root / "ddp")}


def test_sigkill_of_all_ranks_then_resume_is_bit_identical(tmp_path, synthetic_mnist,
                                                           uninterrupted, start):
    """DDP only: the checkpoint code (dcp.save of the strategy's checkpoint_state, the
    partial directory and ``latest``) is the same for every strategy. FSDP's state through
    a SIGKILL of the run mid-way and ``--resume auto``, bit-identical to its uninterrupted
    run, is test_checkpoint.py's async-write kill; its synchronous checkpoint resumed
    bit-identically there too (mid-epoch). (This test ran for fsdp as well, at the cost of
    a second 80-step reference and two more runs.)"""
    run_dir = tmp_path / "run"
    args = _args(synthetic_mnist, run_dir, "ddp")
    proc = start(args, tmp_path)
    _wait_for(_first_checkpoint(run_dir), proc, "a checkpoint")
    for pid in [proc.pid, *_descendants(proc.pid)]:
        os.kill(pid, signal.SIGKILL)
    proc.communicate()
    assert not (run_dir / "results.json").exists(), "killed too late to test anything"

    resumed = run_ddl(*args, "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout
    assert _identical(_weights(run_dir), uninterrupted["ddp"])


def test_kill_during_checkpoint_write_keeps_the_previous_one(tmp_path, synthetic_mnist,
                                                             uninterrupted):
    run_dir = tmp_path / "run"
    args = _args(synthetic_mnist, run_dir, "ddp")
    crashed = run_ddl(*args, cwd=tmp_path, env={"DDL_TEST_KILL_DURING_CHECKPOINT": "8"})
    assert crashed.returncode != 0
    ckpts = run_dir / "checkpoints"
    assert (ckpts / ".step-00000008.partial").is_dir()  # half-written, never made visible
    assert not (ckpts / "step-00000008").exists()
    assert (ckpts / "latest").read_text() == "step-00000004"

    resumed = run_ddl(*args, "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "step-00000004 (step 4" in resumed.stdout
    assert _identical(_weights(run_dir), uninterrupted["ddp"])
    assert not (ckpts / ".step-00000008.partial").exists()  # cleared by the next save


def test_killed_worker_is_restarted_and_resumes(tmp_path, synthetic_mnist, uninterrupted,
                                               start):
    run_dir = tmp_path / "run"
    proc = start(_args(synthetic_mnist, run_dir, "ddp", "--max-restarts", "1"), tmp_path)
    _wait_for(_first_checkpoint(run_dir), proc, "a checkpoint")
    workers = live_workers(run_dir)
    assert sorted(workers) == [0, 1], workers
    os.kill(workers[1], signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    results = json.loads((run_dir / "results.json").read_text())
    assert results["restarts"]["worker_restarts"] == 1
    assert results["checkpoints"]["resumed_from"] is not None
    assert _identical(_weights(run_dir), uninterrupted["ddp"])


def test_stop_file_stops_cleanly_after_a_checkpoint(tmp_path, synthetic_mnist, uninterrupted,
                                                   start):
    """What ddl's batch scripts do when Slurm signals the time limit: create RUN_DIR/STOP."""
    run_dir = tmp_path / "run"
    args = _args(synthetic_mnist, run_dir, "ddp")
    # Present from the start: rank 0 looks at most once a second, and a quiet machine runs
    # all 80 steps in about that, so a file created later could come too late.
    run_dir.mkdir()
    (run_dir / "STOP").touch()
    proc = start(args, tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, out + err  # stopped, resumable
    assert "stopped after step" in out and "--resume auto" in out
    assert not (run_dir / "results.json").exists()
    assert not (run_dir / "STOP").exists()  # consumed: the resume below must not stop again

    resumed = run_ddl(*args, "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _identical(_weights(run_dir), uninterrupted["ddp"])


def test_non_finite_loss_stops_with_one_line(tmp_path, synthetic_mnist):
    """A learning rate of 1e30 overflows the weights within two steps."""
    run_dir = tmp_path / "run"
    proc = run_ddl(*_args(synthetic_mnist, run_dir, "ddp", "--lr", "1e30"), cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "non-finite loss at step" in lines[0] and "rank(s) 0, 1" in lines[0]
    assert "last good checkpoint" in lines[0]
