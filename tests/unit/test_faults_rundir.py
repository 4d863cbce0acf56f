"""Stuck states and honest errors around the run directory, without training: the run-dir
lock, reuse of a directory whose run never trained, file modes, torn metrics lines, the STOP
file being consumed, absurd numbers, and `ddl report` on results.json of another shape."""

import json
import os
import subprocess
import sys

import pytest
from conftest import assert_one_line_error, run_ddl

from ddl.contract.errors import UsageError
from ddl.settings import rundir

pytestmark = pytest.mark.unit

HOLD = ("import sys; from pathlib import Path; from ddl.settings import rundir; "
        "rundir.create(Path(sys.argv[1]), 'auto'); print('locked', flush=True); "
        "sys.stdin.read()")


def hold(run_dir):
    """Lock ``run_dir`` from another process (a stand-in for a running `ddl train`: the lock
    is the same rundir.create call it makes); ``.communicate("")`` ends it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_one_run_at_a_time_in_a_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rundir.CONFIG).write_text("{}\n")  # an interrupted run
    holder = hold(run_dir)
    try:
        with pytest.raises(UsageError, match=f"in use by a run still going \\(pid {holder.pid} "):
            rundir.create(run_dir, "auto")
        with pytest.raises(UsageError, match="in use"):  # a fresh command on a never-trained dir
            rundir.create(run_dir, "none")
    finally:
        holder.communicate("")
    assert rundir.create(run_dir, "auto") == run_dir  # the lock went with its process
    assert (run_dir / rundir.LOCK).read_text().startswith(f"pid {os.getpid()} on ")


def test_a_run_that_never_trained_leaves_nothing_that_blocks(tmp_path):
    """Errors found in the workers (a refused batch size, fp16 on CPU) come after config.json
    is written; the corrected command must run in the same directory."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rundir.CONFIG).write_text("{}\n")
    (run_dir / "plan.json").write_text("{}\n")
    assert rundir.create(run_dir) == run_dir
    (run_dir / rundir.METRICS).write_text('{"epoch": 1}\n')  # this one trained: kept
    with pytest.raises(UsageError, match="already holds a run"):
        rundir.create(run_dir)


def test_written_files_get_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        rundir.write_json(tmp_path / "results.json", {"a": 1})
        rundir.append_jsonl(tmp_path / "metrics.jsonl", {"epoch": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "metrics.jsonl").stat().st_mode & 0o777 == 0o644


def test_metrics_appends_and_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rundir.append_jsonl(path, {"epoch": 1})
    rundir.append_jsonl(path, {"epoch": 2})
    assert [r["epoch"] for r in rundir.read_jsonl(path)] == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary left
    path.write_text(path.read_text() + '{"epoch": 3, "val')  # an older ddl's cut append
    said = []
    assert [r["epoch"] for r in rundir.read_jsonl(path, said.append)] == [1, 2]
    assert len(said) == 1 and "dropped a torn last line" in said[0]
    path.write_text('{"epoch": 1}\nnot json\n{"epoch": 3}\n')
    with pytest.raises(UsageError, match="line 2 is not a JSON object"):
        rundir.read_jsonl(path)


def test_stop_file_is_consumed_when_the_stop_is_honoured(tmp_path):
    import torch

    from ddl.contract.world import World
    from ddl.worker.train.control import STOP_FILE, StepGuard

    (tmp_path / STOP_FILE).touch()
    guard = StepGuard(World(rank=0, local_rank=0, size=1, device=torch.device("cpu"),
                            backend="gloo"), tmp_path)
    reason = guard.after_step(torch.tensor(0.5), 1, 1, 1, lambda: None)
    assert reason and STOP_FILE in reason
    assert not (tmp_path / STOP_FILE).exists()
    guard._next_look = 0.0  # look again at once: nothing asks to stop any more
    assert guard.after_step(torch.tensor(0.5), 2, 1, 2, lambda: None) is None


@pytest.mark.parametrize("args", [["--nproc", "100000"], ["--epochs", "99999999999999999999"],
                                  ["--global-batch-size", "10000000000000"]])
def test_absurd_numbers_are_refused_in_one_line(tmp_path, args):
    proc = run_ddl("train", *args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert_one_line_error(proc, args[0], "less than or equal to")
    assert not (tmp_path / "run").exists()


def test_huge_integer_in_a_config_file(tmp_path):
    (tmp_path / "c.toml").write_text("epochs = 99999999999999999999\n")
    proc = run_ddl("train", "--config", str(tmp_path / "c.toml"),
                   "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert_one_line_error(proc, "epochs", "less than or equal to 1000000000")


@pytest.mark.parametrize("content", ["{}", "[1, 2]", '{"world": 3}'])
def test_report_on_a_results_file_of_another_shape(tmp_path, content):
    (tmp_path / "results.json").write_text(content)
    proc = run_ddl("report", str(tmp_path), cwd=tmp_path)
    assert_one_line_error(proc, "results.json", "not a ddl results file")
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(content)


def test_write_errors_become_one_line_and_reads_do_not(tmp_path):
    """The shapes a failed write reaches a worker in (mocked exceptions: a real full disk
    is tests/distributed/test_faults_disk.py)."""
    import errno

    from ddl.worker.checkpointing.write_errors import one_line

    full = OSError(errno.ENOSPC, "No space left on device")
    wrapped = BaseException("CheckpointException ranks:dict_keys([0])")
    wrapped.failures = {0: (full, None)}
    line = str(one_line(wrapped, tmp_path))
    assert f"cannot write {tmp_path / 'checkpoints'}: No space left on device (" in line
    assert "MiB free there" in line and "none yet" in line
    short = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598")
    assert "failed short" in str(one_line(short, tmp_path))
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "metrics.jsonl"))
    assert "metrics.jsonl: Permission denied" in str(one_line(denied, tmp_path))
    data = PermissionError(errno.EACCES, "Permission denied", "/data/train.bin")
    assert one_line(data, tmp_path) is None  # reading the data is not a write
    assert one_line(ValueError("a plugin's bug"), tmp_path) is None


@pytest.mark.parametrize("flag", ["--run-dir", "--data-dir"])
def test_a_path_through_a_symlink_loop_is_one_line(tmp_path, flag):
    """Issue 43: pathlib's RuntimeError (a ~30-line traceback) from the run plan."""
    from ddl.settings.config import build
    from ddl.settings.plan import make_plan

    (tmp_path / "loop").symlink_to("loop")
    built = build({flag[2:].replace("-", "_"): tmp_path / "loop" / "x", "site": "local"}, {},
                  None)
    with pytest.raises(UsageError, match=f"^{flag}: cannot resolve .*loop/x: "):
        make_plan(built, env={})


RESUME = ("import sys; from pathlib import Path; from ddl.settings import rundir; "
          "from ddl.contract.errors import UsageError\n"
          "try: rundir.create(Path(sys.argv[1]), 'auto')\n"
          "except UsageError as exc: print(f'ddl: error: {exc}', file=sys.stderr); "
          "sys.exit(2)")  # as the CLI ends on a UsageError


def test_resume_into_a_read_only_run_directory_is_bad_input(tmp_path):
    """Issue 43: `--resume auto` into a run directory made read-only (its `.lock` left
    writable) passed the lock and failed at the first file written, exit 1; it is refused
    where bad input is, before anything is written."""
    from unprivileged import bound_by_modes

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / rundir.CONFIG).write_text('{"kept": true}\n')  # an interrupted run
    (run_dir / rundir.LOCK).write_text("")
    run_dir.chmod(0o555)
    try:
        proc = subprocess.run(bound_by_modes([sys.executable, "-c", RESUME, str(run_dir)]),
                              capture_output=True, text=True, check=False)
    finally:
        run_dir.chmod(0o755)
    assert proc.returncode == 2 and proc.stderr.startswith("ddl: error: --run-dir: cannot "
                                                           "write in "), proc
    assert "Permission denied" in proc.stderr, proc.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [rundir.LOCK, rundir.CONFIG]
    assert (run_dir / rundir.CONFIG).read_text() == '{"kept": true}\n'
