"""`ddl watch` against a live run: one real `ddl train` (MNIST tiny, 2 ranks, a few seconds of
training) in the background; `ddl watch --once` while it trains shows both ranks and their
steps, `ddl watch` without it ends with exit 0 once the run has finished, and the run left
its live state (finished) and its TensorBoard events (when tensorboard is installed).

No sleeps as synchronisation: the test polls for the live files with a deadline.
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import time

import pytest
from conftest import DDL, run_ddl

pytestmark = pytest.mark.distributed

EPOCHS = 3


def _live(run_dir, rank):
    try:
        return json.loads((run_dir / "live" / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def test_watch_follows_a_live_run(tmp_path, synthetic_mnist):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # batch 32: ~60 steps per epoch, a few seconds of training on 2 busy cores
    proc = subprocess.Popen([DDL, "train", "--plugin", "mnist", "--preset", "tiny",
                             "--nproc", "2", "--epochs", str(EPOCHS), "--global-batch-size",
                             "32", "--log-every", "10", "--seed", "3", "--data-dir",
                             str(synthetic_mnist), "--run-dir", str(run_dir)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not all((d := _live(run_dir, r)) and d["phase"] == "training" for r in (0, 1)):
            assert proc.poll() is None, f"the run ended before training: {proc.communicate()}"
            assert time.monotonic() < deadline, "no live state of both ranks within 300 s"
            time.sleep(0.05)

        once = run_ddl("watch", str(run_dir), "--once", timeout=60)
        still_training = proc.poll() is None
        assert once.returncode == 0, once.stdout + once.stderr
        assert "mnist (tiny) with ddp on 2 rank(s)" in once.stdout, once.stdout
        rows = [line.split() for line in once.stdout.splitlines()
                if re.match(r"^[01] ", line)]
        assert [r[0] for r in rows] == ["0", "1"], once.stdout  # one row per rank
        assert all(re.fullmatch(r"\d+/\d+", r[3]) for r in rows), once.stdout  # its step
        assert re.search(rf"epoch [1-{EPOCHS}]/{EPOCHS} \[", once.stdout), once.stdout
        assert still_training, "the run had ended before --once looked; nothing was live"

        watched = run_ddl("watch", str(run_dir), "--interval", "0.5", timeout=300)
        assert watched.returncode == 0, watched.stdout + watched.stderr
        assert "ddl watch: the run finished" in watched.stdout, watched.stdout
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert "Traceback" not in watched.stderr + once.stderr

    for rank in (0, 1):  # the last word of every rank
        doc = _live(run_dir, rank)
        assert doc["state"] == "finished" and doc["epoch"] == EPOCHS, doc
        assert doc["step_in_epoch"] == doc["steps_per_epoch"] and doc["samples_per_s"] > 0
        assert doc["memory"]["peak_rss_bytes"] >= doc["memory"]["rss_bytes"] > 0
    assert _live(run_dir, 0)["loss"] is not None  # rank 0's logged loss

    _check_tensorboard(run_dir, out)


def _check_tensorboard(run_dir, out):
    if importlib.util.find_spec("tensorboard") is None:
        assert "ddl: tensorboard not installed; no event files" in out
        assert not (run_dir / "tensorboard").exists()
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    epoch_tags = {"train/loss", "train/accuracy", "val/loss", "val/accuracy",
                  "perf/samples_per_s", "perf/data_wait_share", "perf/epoch_time_s", "opt/lr"}
    assert epoch_tags <= tags, tags
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for tag in epoch_tags:
        assert len(events.Scalars(tag)) == EPOCHS, tag
    val_loss = [e.value for e in events.Scalars("val/loss")]
    assert val_loss == pytest.approx([r["val"]["loss"] for r in records], rel=1e-6)
    assert len(events.Scalars("train/step_loss")) >= EPOCHS  # every --log-every steps
