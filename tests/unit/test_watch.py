"""`ddl watch` on hand-written run directories: what the view shows (progress, ETA, one row
per rank, a stale rank marked), when it ends and with which exit code (finished 0, stopped
3, failed 1), and bad input (one line, exit 2). The live run is
tests/distributed/test_watch_live_run.py."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from conftest import assert_one_line_error, run_ddl

from ddl.commands import watch

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


def _rank(rank, **changes):
    doc = {"rank": rank, "world_size": 2, "host": "node1", "pid": 100 + rank, "plugin": "mnist",
           "strategy": "ddp", "preset": "tiny", "device": "cpu", "epochs": 3,
           "steps_per_epoch": 100, "global_batch": 64, "write_interval_s": 2.0,
           "state": "running", "phase": "training", "epoch": 2, "step_in_epoch": 40,
           "step": 140, "samples_per_s": 3200.0, "step_time_s": 0.02,
           "loss": 0.5 if rank == 0 else None, "loss_step": 140 if rank == 0 else None,
           "started": NOW - 75, "cpu_percent": 97.0, "device_util_percent": None,
           "memory": {"rss_bytes": 700 * 2**20, "peak_rss_bytes": 720 * 2**20},
           "time": NOW - 0.5, "reason": None}
    return {**doc, **changes}


def _run_dir(tmp_path, *docs, epochs=1, lock=None):
    run = tmp_path / "run"
    (run / "live").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"plugin": "mnist", "strategy": "ddp"}))
    for doc in docs:
        (run / "live" / f"rank-{doc['rank']}.json").write_text(json.dumps(doc))
    records = [{"epoch": e, "time_s": 2.0, "samples_per_s": 3000.0, "data_wait_s": 0.1,
                "eval_time_s": 1.0, "lr": 0.1, "train": {"loss": 0.9 / e},
                "val": {"accuracy": 0.8, "loss": 0.8 / e}} for e in range(1, epochs + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if lock is not None:
        (run / ".lock").write_text(f"pid {lock} on {socket.gethostname()}\n")
    return run


def _row(lines, rank):
    return next(line for line in lines if line.startswith(f"{rank} "))


def test_view_of_a_running_job_marks_the_stale_rank(tmp_path):
    run = _run_dir(tmp_path, _rank(0), _rank(1, time=NOW - 7, step_in_epoch=38))
    lines = watch.render(watch.read(run, now=NOW))
    text = "\n".join(lines)
    assert "mnist (tiny) with ddp on 2 rank(s), cpu  ·  running (training)" in text
    assert "started 1:15 ago" in text
    assert "epoch 2/3 [############" in text and "step 40/100 (40 %)" in text
    assert "run 140/300 steps (46 %)" in text
    # ETA: 60 steps x 0.02 s in this epoch; then 100 more steps and 2 validations of 1 s
    assert "3,200 samples/s" in text and "ETA epoch 0:01, run 0:05" in text
    assert "loss 0.5000 (rank 0, step 140)" in text
    assert "last epoch 1: train loss 0.9000 | val accuracy 0.8000 loss 0.8000" in text
    assert "data wait 5 %" in text
    assert "STALE" not in _row(lines, 0) and "0.5 s ago" in _row(lines, 0)
    assert "7.0 s ago  STALE" in _row(lines, 1) and "38/100" in _row(lines, 1)
    assert "700 MiB / 720 MiB" in _row(lines, 0)
    assert "GPU" not in text  # a CPU run has no GPU columns


def test_stale_means_no_step_for_three_intervals_while_training():
    assert not watch.stale(_rank(1, time=NOW - 5.9), NOW)
    assert watch.stale(_rank(1, time=NOW - 6.1), NOW)
    assert not watch.stale(_rank(1, time=NOW - 10, step_time_s=4.0), NOW)  # slow steps
    assert not watch.stale(_rank(1, time=NOW - 60, phase="validating"), NOW)
    assert not watch.stale(_rank(1, time=NOW - 60, state="finished", phase="done"), NOW)


def test_gpu_columns_missing_and_unreadable_ranks(tmp_path):
    gpu = {"device": "cuda", "device_util_percent": 88.0, "device_total_bytes": 80 * 2**30,
           "memory": {"rss_bytes": 2**30, "peak_rss_bytes": 2**30,
                      "device_allocated_bytes": 12 * 2**30,
                      "device_peak_allocated_bytes": 20 * 2**30}}
    run = _run_dir(tmp_path, _rank(0, world_size=3, **gpu))
    (run / "live" / "rank-1.json").write_text('{"rank": 1, "sta')  # torn by hand
    lines = watch.render(watch.read(run, now=NOW))
    assert "12.0 GiB / 20.0 GiB / 80.0 GiB" in _row(lines, 0) and " 88 " in _row(lines, 0)
    assert "unreadable file" in _row(lines, 1)
    assert "no live state yet" in _row(lines, 2)


def test_ranks_of_an_older_larger_world_are_ignored(tmp_path):
    run = _run_dir(tmp_path, _rank(0), _rank(1), _rank(2, world_size=4, state="stopped"))
    snap = watch.read(run, now=NOW)
    assert sorted(snap.ranks) == [0, 1]


def test_before_the_ranks_write(tmp_path):
    run = _run_dir(tmp_path, epochs=0)
    text = "\n".join(watch.render(watch.read(run, now=NOW)))
    assert "no live state yet" in text and "mnist with ddp" in text


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(("states", "results", "code", "says"), [
    (("finished", "finished"), True, 0, "the run finished"),
    (("finished", "finished"), False, 0, "every rank says so"),
    (("failed", "running"), False, 1, "the run failed: boom"),
    (("stopped", "stopped"), False, 3, "--resume auto"),
    (("running", "running"), False, 1, "gone and left no results"),
])
def test_the_view_ends_with_the_run(tmp_path, states, results, code, says):
    docs = [_rank(r, state=s, phase="done" if s != "running" else "training",
                  reason="boom" if s == "failed" else None) for r, s in enumerate(states)]
    run = _run_dir(tmp_path, *docs, lock=_dead_pid())
    if results:
        (run / "results.json").write_text("{}")
    proc = run_ddl("watch", str(run), "--interval", "0.1", timeout=60)
    assert proc.returncode == code, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("ddl watch: ") and says in last, proc.stdout
    assert re.search(r"^rank +host +phase", proc.stdout, re.MULTILINE)  # the full view, at the end
    assert proc.stderr == ""


def test_a_failed_attempt_under_a_live_launcher_is_not_the_end(tmp_path):
    """The launcher (holding .lock) still runs: it may restart the workers."""
    run = _run_dir(tmp_path, _rank(0, state="failed"), _rank(1, state="failed"),
                   lock=os.getpid())
    assert watch.verdict(watch.read(run, now=NOW))[0] is False
    (run / ".lock").write_text("pid 1 on another-host\n")  # unknown: the files decide
    assert watch.verdict(watch.read(run, now=NOW))[:2] == (True, 1)


def test_once_prints_one_view_without_torch(tmp_path):
    run = _run_dir(tmp_path, _rank(0), _rank(1))
    probe = ("import sys; from ddl.commands.cli import main; code = main(['watch', "
             f"{str(run)!r}, '--once']); print('TORCH' if 'torch' in sys.modules else "
             "'NO-TORCH'); sys.exit(code)")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("NO-TORCH"), proc.stdout
    assert proc.stdout.count("ddl watch ") == 1
    assert re.search(r"^rank +host", proc.stdout, re.MULTILINE)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("make", ["missing", "file", "not-a-run"])
def test_bad_run_dir_is_one_line_exit_2(tmp_path, make):
    target = tmp_path / "x"
    if make == "file":
        target.write_text("hello")
    elif make == "not-a-run":
        target.mkdir()
        (target / "notes.txt").write_text("hello")
    proc = run_ddl("watch", str(target), "--once", timeout=60)
    assert_one_line_error(proc, "RUN_DIR", str(target))


def test_interval_must_be_positive(tmp_path):
    run = _run_dir(tmp_path, _rank(0))
    assert_one_line_error(run_ddl("watch", str(run), "--interval", "0", timeout=60),
                          "--interval")


def test_a_run_dir_that_appears_later_is_waited_for(tmp_path):
    """`ddl train ... &` then `ddl watch` at once: the directory comes a moment later. The
    watcher says it waits (the test creates the run when it reads that line: no sleep)."""
    target = tmp_path / "later"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from ddl.commands.cli import "
                             "main; sys.exit(main())", "watch", str(target), "--interval",
                             "0.05", "--wait", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("ddl watch: waiting up to 60 s for ") and str(target) in first
        run = _run_dir(tmp_path / "made", _rank(0, state="finished", phase="done"),
                       _rank(1, state="finished", phase="done"))
        (run / "results.json").write_text("{}")
        run.rename(target)  # appears whole, as a directory some marker already names
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, first + out + err
    assert out.splitlines()[-1].startswith("ddl watch: ") and err == ""


def test_a_run_dir_that_never_appears_is_one_line_after_the_wait(tmp_path):
    target = tmp_path / "never"
    proc = run_ddl("watch", str(target), "--interval", "0.05", "--wait", "0.2", timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
    assert "RUN_DIR" in proc.stderr and str(target) in proc.stderr
    assert proc.stdout.startswith("ddl watch: waiting up to 0.2 s")
    proc = run_ddl("watch", str(target), "--wait", "-1", timeout=60)
    assert_one_line_error(proc, "--wait")
