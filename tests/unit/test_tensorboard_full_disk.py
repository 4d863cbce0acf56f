"""TensorBoard's event files on a real, small tmpfs that fills up: one line, said once, and
no traceback from TensorBoard's writer thread (issue 43, item 6). In-process: the writer and
its thread are the real ones, and so is the full disk.

Needs `mount -t tmpfs` (root, as in CI); where that is refused the test is skipped and says
so, as tests/distributed/test_faults_disk.py is.
"""

import threading

import pytest
from small_disk import mounted

from ddl.worker.observe.tensorboard_events import open_board

pytestmark = pytest.mark.unit


@pytest.fixture
def small_disk(tmp_path):
    with mounted(tmp_path / "disk", "64k") as disk:
        yield disk


def _fill(disk):
    """Write until the file system refuses: every later block is ENOSPC."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as exc:
            assert exc.errno == 28, exc


@pytest.mark.parametrize("full", ["before the writer starts", "while it writes"])
def test_a_full_disk_is_one_line_once(small_disk, capfd, monkeypatch, full):
    # Python's own hook, as in a worker (pytest's would turn a thread's error into a warning)
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    run_dir = small_disk / "run"
    run_dir.mkdir()
    said, before = [], set(threading.enumerate())
    if full == "before the writer starts":
        _fill(small_disk)
    board = open_board(run_dir, True, 0, said.append)
    if full == "while it writes":
        assert board is not None, said
        _fill(small_disk)
    for step in range(400):  # ~16 KB of events: past the event file's first page
        if board is not None:
            board.step_loss(step, 1.0 / (step + 1))
    if board is not None:
        board.epoch({"train": {"loss": 0.5}, "val": {"loss": 0.6}, "samples_per_s": 10.0,
                     "data_wait_share": 0.1, "time_s": 1.0, "lr": 0.01}, 400)
        board.close()
    for thread in set(threading.enumerate()) - before:  # the writer's: its hook has run
        thread.join()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert len(said) == 1, said
    assert "cannot write event files" in said[0] and "No space left on device" in said[0]
