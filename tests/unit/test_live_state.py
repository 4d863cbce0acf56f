"""The worker's observers one by one, without a run: the live state file (what it holds, how
often it is written, that a failed write is harmless), the progress bar against the plain
lines, and the TensorBoard writer's failure handling."""

import io
import json
import os
import re
import sys

import pytest

from ddl.worker.observe import live, progress, tensorboard_events
from ddl.worker.observe.live import LiveState
from ddl.worker.observe.progress import Progress

pytestmark = pytest.mark.unit

ABOUT = {"plugin": "mnist", "strategy": "ddp", "epochs": 2, "steps_per_epoch": 10,
         "global_batch": 64}


class Loss:
    """A stand-in for the loss tensor: counts the host syncs (``item``)."""

    def __init__(self, value=0.25):
        self.value, self.fetched = value, 0

    def item(self):
        self.fetched += 1
        return self.value


def _doc(run_dir, rank=0):
    return json.loads((run_dir / "live" / f"rank-{rank}.json").read_text())


def test_live_file_follows_the_run(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])

    class Sampler:
        def latest(self):
            return {"cpu_percent": 55.0, "device_util_percent": None}

    state = LiveState(tmp_path, 1, 2, ABOUT, sampler=Sampler(),
                      memory=lambda: {"rss_bytes": 5, "peak_rss_bytes": 7})
    first = _doc(tmp_path, 1)
    assert first["phase"] == "starting" and first["state"] == "running"
    assert first["rank"] == 1 and first["world_size"] == 2 and first["plugin"] == "mnist"
    assert first["cpu_percent"] == 55.0 and first["memory"]["peak_rss_bytes"] == 7
    state.begin_epoch(1, 0, 0)
    assert _doc(tmp_path, 1)["phase"] == "training"
    clock[0] += 0.5
    state.step(1, 1, 1)  # within the interval: nothing written
    assert _doc(tmp_path, 1)["step_in_epoch"] == 0
    clock[0] += 1.6  # 2.1 s since the epoch began, 3 steps
    state.step(1, 2, 2)
    state.step(1, 3, 3)
    doc = _doc(tmp_path, 1)
    assert (doc["epoch"], doc["step_in_epoch"], doc["step"]) == (1, 2, 2)
    assert doc["step_time_s"] == pytest.approx(2.1 / 2)
    assert doc["samples_per_s"] == pytest.approx(64 / (2.1 / 2))
    state.loss(0.5, 3)
    state.end("stopped", "SIGUSR1")
    doc = _doc(tmp_path, 1)
    assert (doc["state"], doc["phase"], doc["reason"]) == ("stopped", "done", "SIGUSR1")
    assert doc["step_in_epoch"] == 3 and doc["loss"] == 0.5  # the last step, not the last write
    assert [p.name for p in (tmp_path / "live").iterdir()] == ["rank-1.json"]  # no temp left


def test_rank0_removes_files_of_an_older_larger_world(tmp_path):
    (tmp_path / "live").mkdir()
    for rank in (0, 1, 2, 3):
        (tmp_path / "live" / f"rank-{rank}.json").write_text("{}")
    LiveState(tmp_path, 0, 2, ABOUT)
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == ["rank-0.json",
                                                                    "rank-1.json"]


def test_a_failed_write_does_not_stop_training(tmp_path):
    (tmp_path / "live").write_text("a file where the directory should be")
    state = LiveState(tmp_path, 0, 1, ABOUT, interval=0)
    state.step(1, 1, 1)
    state.end("finished")  # no exception: the live state is best effort


def test_plain_lines_when_not_a_terminal(capsys):
    shown = Progress(True, log_every=5, steps_per_epoch=10, epochs=2, global_batch=64,
                     stream=io.StringIO())
    loss = Loss()
    shown.begin_epoch(1, 0)
    values = [shown.step(1, done, loss) for done in range(1, 11)]
    assert capsys.readouterr().out == ("  epoch 1 step 5/10 loss 0.2500 (rank 0)\n"
                                       "  epoch 1 step 10/10 loss 0.2500 (rank 0)\n")
    assert loss.fetched == 2 and values[4] == 0.25 and values[3] is None


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_on_a_terminal(capsys, monkeypatch):
    # progress.shutil is the stdlib module pytest's own terminal writer calls too (-v):
    # the stand-in takes its arguments
    monkeypatch.setattr(progress.shutil, "get_terminal_size",
                        lambda *args, **kwargs: os.terminal_size((80, 24)))
    stream = Terminal()
    shown = Progress(True, log_every=5, steps_per_epoch=10, epochs=2, global_batch=64,
                     stream=stream)
    loss = Loss()
    shown.begin_epoch(2, 0)
    for done in range(1, 11):
        shown.step(2, done, loss)
    shown.finish_line()
    out = stream.getvalue()
    assert capsys.readouterr().out == ""  # no plain lines
    assert loss.fetched == 2  # the loss is still fetched every --log-every steps only
    last = out.rstrip("\n").split("\r")[-1]
    assert re.match(r"  epoch 2/2 \[#{5,30}\]  10/10  100%  0:00<0:00 ", last), last
    assert "samples/s  loss 0.2500" in last and out.endswith("\x1b[K\n")
    assert max(len(part.replace("\x1b[K", "").rstrip("\n")) for part in out.split("\r")) < 80
    narrow = shown.line(5, shown.t0 + 1, columns=30)
    assert len(narrow) < 30 and "[" not in narrow  # too narrow for a bar: numbers only


def test_other_ranks_show_nothing_and_fetch_nothing(capsys):
    shown = Progress(False, 1, 10, 2, 64, stream=Terminal())
    loss = Loss()
    assert shown.step(1, 1, loss) is None and loss.fetched == 0
    assert capsys.readouterr().out == ""


class Writer:
    def __init__(self, fail_on=None):
        self.scalars, self.fail_on, self.closed = [], fail_on, False

    def add_scalar(self, tag, value, step):
        if tag == self.fail_on:
            raise OSError(28, "No space left on device")
        self.scalars.append((tag, value, step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


RECORD = {"epoch": 1, "time_s": 2.0, "samples_per_s": 500.0, "data_wait_s": 0.5,
          "data_wait_share": 0.25, "lr": 0.1,
          "train": {"loss": 0.9, "accuracy": 0.5}, "val": {"loss": 0.8, "accuracy": 0.6}}


def test_board_logs_epochs_against_the_step():
    writer, said = Writer(), []
    board = tensorboard_events.Board(writer, said.append)
    board.step_loss(10, 0.7)
    board.epoch(RECORD, 20)
    got = {tag: (value, step) for tag, value, step in writer.scalars}
    assert got["train/step_loss"] == (0.7, 10)
    assert got["val/accuracy"] == (0.6, 20) and got["train/loss"] == (0.9, 20)
    assert got["perf/data_wait_share"] == (0.25, 20) and got["opt/lr"] == (0.1, 20)
    board.close()
    assert writer.closed and said == []


def test_board_failure_is_one_note_then_silence():
    writer, said = Writer(fail_on="val/loss"), []
    board = tensorboard_events.Board(writer, said.append)
    board.epoch(RECORD, 20)
    board.epoch(RECORD, 40)
    board.close()
    assert len(said) == 1 and "No space left on device" in said[0]
    assert "no more event files" in said[0]


def test_without_tensorboard_one_note(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    said = []
    assert tensorboard_events.open_board(tmp_path, True, 0, said.append) is None
    assert said == ["ddl: tensorboard not installed; no event files"]
    assert tensorboard_events.open_board(tmp_path, False, 0, said.append) is None
    assert len(said) == 1 and not (tmp_path / "tensorboard").exists()


def test_the_live_interval_stretches_beyond_256_ranks():
    """Every rank replaces its file each interval (a create and a rename on the file
    system's metadata server): 2 s up to 256 ranks, then ~128 files a second in all."""
    from ddl.settings.plan import live_interval

    assert [live_interval(None, n) for n in (1, 2, 256, 1024, 4096)] == [2, 2, 2, 8, 32]
    assert live_interval(5.0, 4096) == 5.0 and live_interval(0.5, 2) == 0.5  # --live-every


def test_the_run_plan_holds_the_interval_the_workers_use(tmp_path):
    """Decided in the pre-flight, from the world the plan counts (here torchrun's
    variables: a 1024-rank job's worker), or --live-every."""
    from ddl.settings.config import build
    from ddl.settings.plan import make_plan

    torchrun = {"RANK": "5", "WORLD_SIZE": "1024", "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "node0"}
    built = build({"plugin": "mnist", "site": "local", "run_dir": tmp_path / "r"}, {}, None)
    assert make_plan(built, env=torchrun).live_every_s == 8
    assert make_plan(built, env={}).live_every_s == 2  # a local run of one process
    given = build({"plugin": "mnist", "site": "local", "run_dir": tmp_path / "r",
                   "live_every": 30}, {}, None)
    assert make_plan(given, env=torchrun).live_every_s == 30
