"""`ddl watch` against a live run: one real `ddl train` (MNIST tiny, 2 ranks, a few seconds of
training) in the background; `ddl watch --once` while it trains shows both ranks and their
steps, `ddl watch` without it ends with exit 0 once the run has finished, and the run left
its live state (finished) and its TensorBoard events (when tensorboard is installed).

No sleeps as synchronisation: the test polls for the live files with a deadline.

The run is forked as run_ddl forks every command (tests/cli_fork.py), in a thread: a fresh
interpreter's launcher imported torch, and its fork server torchvision, again (~4 CPU-s)
for what the preloaded server holds; the launcher, its workers and their live state are the
same.
"""

import importlib.util
import json
import re
import threading
import time
from pathlib import Path

import pytest
import cli_fork
import rankpool
from conftest import live_workers, run_ddl

pytestmark = pytest.mark.distributed

EPOCHS = 3


def _live(run_dir, rank):
    try:
        return json.loads((run_dir / "live" / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        return None


class _Background:
    """``run_ddl(*args)`` in a thread: ``done`` (its CompletedProcess) once it has ended."""

    def __init__(self, args, cwd: Path, timeout: float = 300) -> None:
        rankpool.context()  # the fork server started in this thread, not in the run's
        self.done = self.error = None
        self.thread = threading.Thread(target=self._run, args=(args, cwd, timeout),
                                       daemon=True)
        self.thread.start()

    def _run(self, args, cwd, timeout) -> None:
        try:
            self.done = run_ddl(*args, cwd=cwd, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - raised in the test by result()
            self.error = exc

    def running(self) -> bool:
        return self.thread.is_alive()

    def result(self, timeout: float):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the run did not end within {timeout:g} s"
        if self.error is not None:
            raise self.error
        return self.done

    def end(self, run_dir: Path) -> None:
        """After the test: kill the launcher's session (a forked command leads its own)
        if the run still goes; the launcher is the grandparent of a worker (its fork
        server's parent). With no worker yet, run_ddl's own timeout ends it."""
        if self.thread.is_alive():
            for pid in live_workers(run_dir).values():
                launcher = _parent(_parent(pid))
                if cli_fork.session_of(launcher) == launcher:
                    cli_fork.kill_session(launcher)
                break
        self.thread.join(60)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_watch_follows_a_live_run(tmp_path, synthetic_mnist):
    run_dir = tmp_path / "run"
    # batch 32: ~60 steps per epoch, a few seconds of training on 2 busy cores
    proc = _Background(["train", "--plugin", "mnist", "--preset", "tiny", "--nproc", "2",
                        "--epochs", str(EPOCHS), "--global-batch-size", "32", "--log-every",
                        "10", "--seed", "3", "--live-every", "0.5",
                        "--data-dir", str(synthetic_mnist),
                        "--run-dir", str(run_dir)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not all((d := _live(run_dir, r)) and d["phase"] == "training" for r in (0, 1)):
            if not proc.running():
                done = proc.result(0)
                pytest.fail(f"the run ended before training: {done.stdout}{done.stderr}")
            assert time.monotonic() < deadline, "no live state of both ranks within 300 s"
            time.sleep(0.05)

        once = run_ddl("watch", str(run_dir), "--once", timeout=60)
        still_training = proc.running()
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
        trained = proc.result(120)
    finally:
        proc.end(run_dir)
    out, err = trained.stdout, trained.stderr
    assert trained.returncode == 0, out + err
    assert "Traceback" not in watched.stderr + once.stderr

    for rank in (0, 1):  # the last word of every rank
        doc = _live(run_dir, rank)
        assert doc["state"] == "finished" and doc["epoch"] == EPOCHS, doc
        assert doc["write_interval_s"] == 0.5, doc  # --live-every, through the run plan
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
