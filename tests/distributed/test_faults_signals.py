"""Signals to `ddl train` with two real workers (MNIST tiny, gloo on CPU): SIGTERM and SIGUSR1
stop the run cleanly with a checkpoint (exit 3), SIGINT ends it at once (exit 130, one line),
and `kill -9` of the launcher leaves no worker behind (they die with it: parent-death signal).

The runs ask for 50 epochs, so none can finish before the signal lands; each signal is sent
once the first checkpoint is on disk (the workers are training by then). Workers are found
through /proc and their end is polled with a bounded wait.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from background_ddl import Python, Run
from conftest import DDL, end_session, live_workers, run_ddl

pytestmark = pytest.mark.distributed

ARGS = ["train", "--plugin", "mnist", "--preset", "tiny", "--global-batch-size", "64",
        "--epochs", "50", "--checkpoint-every", "2", "--seed", "7", "--nproc", "2",
        "--strategy", "ddp"]


def _workers(run_dir: Path) -> list[int]:
    """The run's workers still running, in rank order (tests/conftest.live_workers)."""
    return [pid for _, pid in sorted(live_workers(run_dir).items())]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def _start_and_wait_for_training(tmp_path, data, *extra, fresh=False):
    """The run, forked as run_ddl forks it (tests/background_ddl.py), or with ``fresh`` the
    console script in a new interpreter; returned once its first checkpoint is on disk."""
    run_dir = tmp_path / "run"
    args = [*ARGS, *extra, "--data-dir", str(data), "--run-dir", str(run_dir)]
    if fresh:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([DDL, *args], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env=env)
    else:
        proc = Run(args, cwd=tmp_path, run_dir=run_dir)
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "latest").is_file():
        assert proc.poll() is None, f"the run ended before its first checkpoint: " \
                                    f"{proc.communicate()}"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    workers = _workers(run_dir)
    assert len(workers) == 2, workers
    _assert_forked_from_the_launcher(proc.pid, workers)
    return proc, run_dir, workers


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _assert_forked_from_the_launcher(launcher: int, workers: list[int]) -> None:
    """A CPU run's fork server is a fork of `ddl train` itself (ddl.launch.fork_server), not
    a fresh interpreter that imports torch again: its command line is the launcher's."""
    servers = {_parent(pid) for pid in workers}
    assert len(servers) == 1, f"workers {workers} have different parents {servers}"
    server = servers.pop()
    assert _parent(server) == launcher, f"fork server {server} is not ddl train's child"
    cmdline = Path(f"/proc/{server}/cmdline").read_bytes()
    assert cmdline == Path(f"/proc/{launcher}/cmdline").read_bytes(), \
        f"the fork server was spawned, not forked: {cmdline[:200]!r}"


@pytest.fixture
def cleanup():
    """Whatever a failing test leaves running is killed (workers found by their run dir)."""
    procs: list[tuple[subprocess.Popen, Path]] = []
    yield procs
    for proc, run_dir in procs:
        if isinstance(proc, Run):
            proc.end()
        else:
            end_session(proc, _workers(run_dir))


def _none_outlive(workers: list[int], limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, \
            f"workers {[p for p in workers if _alive(p)]} outlived their launcher"
        time.sleep(0.05)


def test_kill_9_of_the_launcher_takes_the_workers_with_it(tmp_path, synthetic_mnist,
                                                         cleanup):
    # The console script itself, once in this module: a fork server whose command line is
    # the launcher's is then a fork of `ddl train` (the other tests' launchers are forks of
    # the test session's server, tests/background_ddl.py, and their pid is read off the tree)
    proc, run_dir, workers = _start_and_wait_for_training(tmp_path, synthetic_mnist, fresh=True)
    cleanup.append((proc, run_dir))
    proc.kill()
    proc.communicate(timeout=60)
    _none_outlive(workers)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_sigterm_and_sigusr1_stop_cleanly_with_a_checkpoint(tmp_path, synthetic_mnist,
                                                            cleanup, sig):
    proc, run_dir, workers = _start_and_wait_for_training(tmp_path, synthetic_mnist)
    cleanup.append((proc, run_dir))
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, out + err  # stopped on request, resumable (docs)
    assert "Traceback" not in out + err and "SignalException" not in out + err
    stopped = [line for line in out.splitlines() if "stopped after step" in line]
    assert len(stopped) == 1 and "--resume auto" in stopped[0], out
    assert f"({sig.name})" in stopped[0], out  # the signal received, not the one passed on
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest in stopped[0]  # the checkpoint written on the way out
    assert f"ddl: {sig.name}:" in err and len(err.strip().splitlines()) == 1, err
    _none_outlive(workers)
    for rank in (0, 1):  # the live state says so too, and `ddl watch` ends with stop's 3
        assert json.loads((run_dir / "live" / f"rank-{rank}.json").read_text())["state"] \
            == "stopped"
    watched = run_ddl("watch", str(run_dir), timeout=60)
    assert watched.returncode == 3 and "--resume auto" in watched.stdout, watched.stdout


def test_sigint_ends_the_run_at_once_with_exit_130(tmp_path, synthetic_mnist, cleanup):
    proc, run_dir, workers = _start_and_wait_for_training(tmp_path, synthetic_mnist)
    cleanup.append((proc, run_dir))
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends the launcher (the foreground group)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert err.strip() == "ddl: interrupted", err
    assert "Traceback" not in out
    _none_outlive(workers)


def test_a_stopped_rank_is_named_by_the_heartbeat_long_before_the_collective_timeout(
        tmp_path, synthetic_mnist, cleanup):
    """SIGSTOP of rank 1: rank 0's heartbeat watcher finds its counter still after
    --hang-timeout (4 s here; the collective timeout is 600 s), kills it and ends the run
    with one line naming rank 1."""
    proc, run_dir, workers = _start_and_wait_for_training(
        tmp_path, synthetic_mnist, "--hang-timeout", "4")
    cleanup.append((proc, run_dir))
    hung = live_workers(run_dir)[1]
    os.kill(hung, signal.SIGSTOP)
    out, err = proc.communicate(timeout=120)  # far below the 600 s collective timeout
    assert proc.returncode == 1, out + err
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddl: error: rank 1 "), err
    assert "sent no heartbeat for" in lines[0] and "--hang-timeout 4" in lines[0], err
    assert f"its process (pid {hung}) was killed" in lines[0], err
    _none_outlive(workers)


def test_a_stopped_rank_0_that_hosts_the_store_is_named_by_rank_1(tmp_path, synthetic_mnist):
    """As under srun (no agent): rank 0's own process hosts the store, so stopping it
    silences the store too; rank 1 counts that silence as rank 0's, prints the one line
    itself (no launcher merges lines here), kills rank 0 and exits 1."""
    from ddl.settings.config import build
    from ddl.settings.plan import PLAN_ENV, make_plan

    run_dir = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = {"site": "local", "device": "cpu", "run_dir": run_dir, "plugin": "mnist",
             "preset": "tiny", "global_batch_size": 64, "epochs": 50, "checkpoint_every": 2,
             "strategy": "ddp", "data_dir": synthetic_mnist, "hang_timeout": 4}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC_", "SLURM_", "DDL_"))}
    env.update(LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1")
    env[PLAN_ENV] = make_plan(build(flags), env).model_dump_json()
    # `python -m ddl.worker` each, forked from the test session's preloaded fork server
    # (tests/background_ddl.py) rather than two fresh interpreters importing torch
    procs = [Python(["-m", "ddl.worker"], {**env, "RANK": str(r)}) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "latest").is_file():
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        os.kill(procs[0].pid, signal.SIGSTOP)
        out, err = procs[1].communicate(timeout=120)
        assert procs[1].returncode == 1, out + err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ddl: error: rank 0 "), err
        assert "sent no heartbeat" in lines[0], err
        assert f"its process (pid {procs[0].pid}) was killed" in lines[0], err
        procs[0].communicate(timeout=30)
        assert procs[0].returncode == -signal.SIGKILL
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


_NEVER_BEAT = """
import os, socket, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from ddl.contract.world import World
from ddl.worker.process.heartbeat import Heartbeat

store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
# rank 1 as its own start leaves it: it said where it runs, then stopped before its first beat
store.set("ddl/heartbeat/who/1", f"{socket.gethostname()} {sys.argv[2]}")
world = World(0, 0, 2, torch.device("cpu"), "gloo")
Heartbeat(store, world, 1.2, Path(sys.argv[1]))
time.sleep(60)  # the watcher's os._exit ends this process long before
"""


def test_a_rank_stopped_before_its_first_beat_is_still_killed_and_named(tmp_path):
    """A quick run reaches its first checkpoint within one beat interval, so rank 1 can be
    stopped before it ever beat: the watcher must still know its pid (from the store), kill
    it and name it. Rank 1 here is a real stopped process; rank 0's watcher a real Heartbeat
    on a real TCPStore."""
    rank1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.kill(rank1.pid, signal.SIGSTOP)
        # forked from the preloaded fork server (torch imported), tests/background_ddl.py
        watcher = Python(["-c", _NEVER_BEAT, str(tmp_path), str(rank1.pid)], dict(os.environ))
        try:
            _, err = watcher.communicate(timeout=60)
        finally:
            watcher.kill()
        assert watcher.returncode == 1, err
        line = json.loads((tmp_path / "logs" / "rank1-error.json").read_text())["line"]
        assert f"its process (pid {rank1.pid}) was killed" in line, line
        assert rank1.wait(timeout=30) == -signal.SIGKILL
    finally:
        rank1.kill()
        rank1.wait()
