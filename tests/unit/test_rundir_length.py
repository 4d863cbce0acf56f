"""A run directory too long for what ddl writes below it is refused by `ddl train` before
anything is written (issue 42): one line, exit 2, what was wrong and what is allowed.
Before, a name over NAME_MAX gave "cannot resolve ... allowed: a path to a directory", and
a path that left no room under PATH_MAX trained until its first checkpoint, then stopped
with a 194-line traceback. How much room ddl needs is measured against a real run in
tests/distributed/test_rundir_room.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import assert_one_line_error, run_ddl
from ddl.contract.errors import UsageError
from ddl.settings import rundir

pytestmark = pytest.mark.unit

TRAIN = ("train", "--site", "local", "--plugin", "mnist", "--preset", "tiny", "--epochs", "1")
LONGEST = rundir.PATH_MAX - 1 - rundir.ROOM_BELOW  # bytes a run dir's path may have


def _deep(root: Path, length: int) -> Path:
    """A path under ``root`` exactly ``length`` bytes long, of names of 200 bytes or less."""
    path = str(root)
    while len(path) < length:
        path += "/" + "d" * min(200, length - len(path) - 1)
    assert len(path) == length, path
    return Path(path)


def test_room_is_that_of_the_widest_path_written_below():
    assert rundir.ROOM_BELOW == 1 + max(len(p.encode()) for p in rundir.WIDEST_BELOW)
    assert LONGEST + rundir.ROOM_BELOW + 1 == rundir.PATH_MAX  # + the closing NUL


def test_the_longest_allowed_path_passes_and_one_byte_more_does_not(tmp_path):
    rundir.check_length(_deep(tmp_path, LONGEST))
    with pytest.raises(UsageError, match=f"is {LONGEST + 1} bytes long; allowed: at most "
                                         f"{LONGEST} bytes"):
        rundir.check_length(_deep(tmp_path, LONGEST + 1))
    rundir.check_length(tmp_path / ("n" * 255))
    with pytest.raises(UsageError, match="has a name of 256 bytes"):
        rundir.check_length(tmp_path / ("n" * 256))
    with pytest.raises(UsageError, match="has a name of 256 bytes"):  # bytes, not characters
        rundir.check_length(tmp_path / ("é" * 128))


@pytest.mark.parametrize("run_dir, needles", [
    (lambda tmp: tmp / ("n" * 256),
     ["--run-dir: ", "has a name of 256 bytes", "allowed: at most 255 bytes a name"]),
    (lambda tmp: _deep(tmp, LONGEST + 1),
     ["--run-dir: ", f"is {LONGEST + 1} bytes long", f"allowed: at most {LONGEST} bytes"]),
    # relative: measured as the absolute path it becomes (the cwd is part of it)
    (lambda tmp: Path(os.path.relpath(_deep(tmp, LONGEST + 1), tmp)),
     [f"is {LONGEST + 1} bytes long"]),
])
def test_train_refuses_before_anything_is_written(tmp_path, run_dir, needles):
    target = run_dir(tmp_path)
    proc = run_ddl(*TRAIN, "--run-dir", str(target), cwd=tmp_path)
    assert_one_line_error(proc, *needles)
    assert list(tmp_path.iterdir()) == []  # no data generated, no run directory made


def test_an_existing_run_to_resume_is_left_as_it_was(tmp_path):
    """`--resume auto` in a directory that is already there and too long: refused; its
    files, and the absence of a lock, as they were."""
    run_dir = _deep(tmp_path, LONGEST + 20)
    run_dir.mkdir(parents=True)
    (run_dir / rundir.CONFIG).write_text("{}\n")
    (run_dir / rundir.METRICS).write_text('{"epoch": 1}\n')
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    proc = run_ddl(*TRAIN, "--resume", "auto", "--run-dir", str(run_dir), cwd=tmp_path)
    assert_one_line_error(proc, f"is {LONGEST + 20} bytes long")
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
