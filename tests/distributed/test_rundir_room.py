"""The room `ddl train` leaves below a run directory (ddl.settings.rundir.ROOM_BELOW, the
most a run dir's path may take of PATH_MAX: tests/unit/test_rundir_length.py) is measured,
not guessed: a real 2-rank run with everything that writes there (sharded checkpoints at
every step, asynchronous too, TensorBoard events, live state, a profile, a resume) records,
through a Python audit hook in every process (sitecustomize.py on PYTHONPATH), each path
it opens for writing, creates or renames to below the run directory (and, for what C++
writes, the files there at the end). The longest of them,
with this machine's host name widened to Linux's 64 bytes (TensorBoard names its files
after the host), fits the room."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from conftest import run_ddl
from ddl.settings import rundir

pytestmark = pytest.mark.distributed

HOOK = '''
import os, sys
_root = os.environ.get("DDL_TEST_RECORD_UNDER")
if _root:
    _fd = os.open(os.environ["DDL_TEST_RECORD_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    _WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def _record(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(mode, str) and not set(mode) & set("wax+"):
                return
            if mode is None and not (flags or 0) & _WRITES:
                return
        elif event in ("os.mkdir", "tempfile.mkstemp", "os.symlink"):
            path = args[0]
        elif event in ("os.rename", "os.replace"):
            path = args[1]
        else:
            return
        if isinstance(path, (str, bytes, os.PathLike)):
            path = os.fsdecode(path)
            if path.startswith(_root + "/"):
                os.write(_fd, (path[len(_root) + 1:] + "\\n").encode())

    sys.addaudithook(_record)
'''

RUN = ("train", "--site", "local", "--plugin", "mnist", "--preset", "tiny", "--nproc", "2",
       "--strategy", "fsdp", "--steps-per-epoch", "3", "--checkpoint-every", "1",
       "--profile", "1")


def test_what_a_run_writes_below_its_directory_fits_the_room(tmp_path, synthetic_mnist):
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    run_dir, log = tmp_path / "run", tmp_path / "written.txt"
    env = {"PYTHONPATH": str(hook_dir), "DDL_TEST_RECORD_UNDER": str(run_dir),
           "DDL_TEST_RECORD_LOG": str(log)}
    common = (*RUN, "--data-dir", str(synthetic_mnist), "--run-dir", str(run_dir))
    first = run_ddl(*common, "--epochs", "1", "--async-checkpoint", cwd=tmp_path, env=env,
                    fresh=True)  # a new interpreter, so its sitecustomize runs
    assert first.returncode == 0, first.stdout + first.stderr
    (run_dir / rundir.RESULTS).unlink()  # resume it for one more epoch
    (run_dir / rundir.MODEL).unlink()
    resumed = run_ddl(*common, "--epochs", "2", "--resume", "auto", cwd=tmp_path, env=env,
                      fresh=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    written = set(log.read_text().splitlines())
    # The hook saw every kind of writer (else this test could not fail): files written
    # aside, a checkpoint being made, DCP's shards, TensorBoard's events, live state.
    for kind in (".partial/.metadata.tmp", ".partial/__1_0.distcp", ".results.json.",
                 "tensorboard/events.out.tfevents.", f"{rundir.LIVE}/.rank-1.json"):
        assert any(kind in path for path in written), (kind, sorted(written))
    # What C++ code writes (the profiler's traces) passes no audit hook: its final names
    written |= {str(p.relative_to(run_dir)) for p in run_dir.rglob("*")}
    assert "trace-rank1.json" in written
    host = socket.gethostname()
    widest = max((p.replace(host, "h" * rundir.HOST_NAME_MAX) for p in written),
                 key=lambda p: len(p.encode()))
    print(f"widest of {len(written)} paths written below the run dir: {widest}")
    assert 1 + len(widest.encode()) <= rundir.ROOM_BELOW, widest
