"""Starting the workers of a run on this machine.

``--nproc 1`` trains in this process (easiest to debug). ``--nproc N`` hands the workers to
torch's own elastic agent (the engine behind torchrun, ``torch.distributed.launcher``): it
picks a free port for a c10d rendezvous on 127.0.0.1, sets RANK/LOCAL_RANK/WORLD_SIZE and
MASTER_ADDR/MASTER_PORT for each worker, streams their output and reports failures.
Each worker is forked from a fork server that has imported torch and the workload's
libraries once (``ddl.launch.fork_server``; the worker's entry is
``ddl.worker.process.entry.forked``).

Signals to ``ddl train`` (see docs/checkpoints.md, "Faults and what ddl does"): SIGTERM and
SIGUSR1 ask the workers for a clean stop (passed on as SIGUSR1; they stop after the next step
with a checkpoint, exit code 3); the same signal again, or SIGINT (Ctrl-C, exit code 130),
ends them at once. The agent starts each worker in a session of its own, so nothing reaches
them unless passed on; a worker also dies with its launcher (``ddl.worker.process.entry``).
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

from ddl.contract.errors import DdlError
from ddl.launch import fork_server
from ddl.settings import cores
from ddl.worker.process import crash, socket_folder
from ddl.worker.train.control import STOP_FILE, STOP_SIGNAL_FILE
from ddl.worker.process.entry import LAUNCHER_PID, WORKER_NAME, forked


def launch_local(run_dir: Path, nproc: int, max_restarts: int = 0,
                 cpu_only: bool = False) -> int:
    """Run the workers; return the exit code of the run (0, or the first failing rank's).
    ``cpu_only``: no rank uses a GPU, so the fork server may be forked from this process
    (``ddl.launch.fork_server``)."""
    check_loopback()
    if nproc == 1:
        from ddl.worker.train import control
        from ddl.worker.process.entry import main as worker_main

        kept = _handlers((signal.SIGTERM, signal.SIGUSR1))
        control.listen()  # SIGINT stays Python's KeyboardInterrupt: exit 130
        signal.signal(signal.SIGTERM, _stop_then_end)
        try:
            return worker_main([str(run_dir)])
        finally:
            _restore(kept)

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    one_thread_per_rank()
    # The agent logs every failure at length; ddl reports the worker's own one-line error.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    for name in list(logging.root.manager.loggerDict):  # torch gives each module a level
        if name.startswith("torch.distributed.elastic."):  # ("Received 2 death signal")
            logging.getLogger(name).setLevel(logging.CRITICAL)
    # and the process context under it ("Terminating process N via signal SIGTERM")
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.CRITICAL)
    socket_folder.keep_short()  # the fork server's socket, under a long TMPDIR too
    started = time.time()
    # before the fork server starts: its workers inherit its environment
    os.environ[crash.LAUNCHER_REPORTS] = "1"  # workers leave the crash line to us
    os.environ[LAUNCHER_PID] = str(os.getpid())  # a worker checks it still has its launcher
    agent_dir = tempfile.TemporaryDirectory(prefix="ddl-agent-", ignore_cleanup_errors=True)
    fork_server.start(cpu_only)
    kept = _handlers((signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP,
                      signal.SIGQUIT))
    _forget_signal(run_dir)  # one a killed launcher left
    forward = _StopForwarder(run_dir)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGUSR1, forward)
    try:
        # after the fork server: LaunchConfig asks torch.accelerator.is_available(), which on
        # a machine with a GPU driver starts a CUDA driver thread in this process, and a
        # process with threads is not forked (seen on an H100 machine, docs/measuring.md)
        elastic_launch(_launch_config(nproc, max_restarts, agent_dir.name), forked)(
            str(run_dir))
    except SignalException as exc:  # the agent has ended the workers by now
        if exc.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None  # `ddl: interrupted`, exit 130
        stopped = DdlError(f"stopped at once by {exc.sigval.name}; the workers were ended "
                           "without a checkpoint; --resume auto continues from the newest one")
        stopped.exit_code = 128 + exc.sigval
        raise stopped from None
    except ChildFailedError as exc:
        # When one rank fails the agent stops the others (SIGTERM). Its failures list the
        # rank(s) that ended by themselves first, then those it stopped; a rank that only
        # lost contact with a failed one is not the one to name.
        first = next((r for r, f in exc.failures.items() if f.exitcode != crash.LOST_CONTACT),
                     next(iter(exc.failures)))
        crashed = crash.read(run_dir / "logs", since=started)
        if crashed:  # exceptions in plugin (or ddl) code: one line for all ranks
            raise DdlError(crash.summary(crashed, first)) from None
        ddl_exits = sorted(f.exitcode for f in exc.failures.values() if f.exitcode in (1, 2))
        if ddl_exits:  # the worker printed ddl's own one-line error
            return ddl_exits[-1]
        raise DdlError(_died(first, exc.failures[first].exitcode, len(exc.failures))) from None
    finally:
        _restore(kept)
        _forget_signal(run_dir)
        agent_dir.cleanup()
        fork_server.end()
        os.environ.pop(crash.LAUNCHER_REPORTS, None)
        os.environ.pop(LAUNCHER_PID, None)
    return 0


def check_loopback() -> None:
    """Every local run talks over 127.0.0.1 (the rendezvous store, gloo). With the loopback
    interface down (a network namespace made without bringing `lo` up, e.g. `unshare -n`;
    not `apptainer run --net --network none`, whose namespace keeps its loopback up, so a
    local run trains there), gloo failed with "Unable to find interface for
    127.0.0.1" and two processes retried their rendezvous for 3 minutes, printing ~1000
    lines; one connection to ourselves says so in a millisecond."""
    import socket

    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            socket.create_connection(server.getsockname(), timeout=5).close()
    except OSError as exc:
        raise DdlError(f"127.0.0.1 is unreachable here ({exc.strerror or exc}): the loopback "
                       "interface is down, as in a network namespace made without it "
                       "(unshare -n); local processes talk over "
                       "it, even one: bring it up (ip link set lo up) or run where it "
                       "is") from None


def _launch_config(nproc: int, max_restarts: int, agent_dir: str):
    """torch's elastic agent settings for one machine: a c10d rendezvous on a free port."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                        run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                        rdzv_endpoint="127.0.0.1:0", max_restarts=max_restarts,
                        monitor_interval=0.1,
                        # SIGTERM and SIGUSR1 are ours (a clean stop); the agent stops the
                        # workers at once on these:
                        signals_to_handle="SIGINT,SIGHUP,SIGQUIT",
                        start_method="forkserver",
                        # the agent's own folder (empty: output is not redirected), which
                        # torch would leave in /tmp after every run; removed at the end
                        logs_specs=DefaultLogsSpecs(log_dir=agent_dir))


def one_thread_per_rank() -> None:
    """Several ranks on few cores: more than one thread per rank makes them all slower
    (measured: 5-10x on 2 cores); torchrun does the same. Set before this process imports
    torch, so that its pre-flight starts no OpenMP threads and it may be forked."""
    cores.capture_user_setting()  # the worker tells the user's value from ours
    os.environ.setdefault("OMP_NUM_THREADS", "1")


class _StopForwarder:
    """SIGTERM or SIGUSR1 to the launcher: pass SIGUSR1 on to every worker (a clean stop at
    the next step); the second one ends the workers at once (the agent's SignalException)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.received = 0

    def __call__(self, signum: int, frame) -> None:
        from torch.distributed.elastic.multiprocessing import SignalException

        self.received += 1
        name = signal.Signals(signum).name
        if self.received > 1:
            raise SignalException(f"second {name}", sigval=signal.SIGTERM)
        try:  # the workers say the signal this launcher got, not the SIGUSR1 they get
            (self.run_dir / STOP_SIGNAL_FILE).write_text(name)
        except OSError:
            pass
        workers = _worker_pids()
        listening = [pid for pid in workers if _catches_sigusr1(pid)]
        for pid in listening:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:  # ended meanwhile
                pass
        if len(listening) < len(workers) or not workers:
            # a worker still starting would die of SIGUSR1: rank 0 finds this file instead
            (self.run_dir / STOP_FILE).touch()
        # os.write: print() from a signal handler may interrupt a print() in progress
        os.write(2, f"ddl: {name}: the workers stop after their next step and its checkpoint "
                    f"(send {name} again to stop at once)\n".encode())


def _forget_signal(run_dir: Path) -> None:
    """The received signal's name is this launch's alone (_StopForwarder writes it)."""
    try:
        (run_dir / STOP_SIGNAL_FILE).unlink(missing_ok=True)
    except OSError:
        pass


def _stop_then_end(signum: int, frame) -> None:
    """SIGTERM to a one-process run: a clean stop; the second one ends it at once."""
    from ddl.worker.train import control

    if not control.stop_requested():
        control.request_stop(signum)
        return
    os.write(2, b"ddl: error: stopped at once by a second SIGTERM, without a checkpoint; "
                b"--resume auto continues from the newest one\n")
    raise SystemExit(128 + signum)


def _worker_pids() -> list[int]:
    """This process's workers (Linux /proc; the agent keeps its worker handles to itself):
    the children of its fork server, named ``ddl.worker``."""
    pids: list[int] = []
    for child in _children(os.getpid()):
        for pid in [child, *_children(child)]:
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name == WORKER_NAME:
                pids.append(pid)
    return pids


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += map(int, (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _catches_sigusr1(pid: int) -> bool:
    """Whether ``pid`` has a SIGUSR1 handler (the ``SigCgt`` mask in /proc/PID/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _handlers(signals: tuple[signal.Signals, ...]) -> dict[signal.Signals, object]:
    return {signum: signal.getsignal(signum) for signum in signals}


def _restore(handlers: dict[signal.Signals, object]) -> None:
    """The agent leaves its handlers installed; a later Ctrl-C must be a KeyboardInterrupt."""
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def _died(rank: int, code: int, failed: int) -> str:
    """A worker that ended without a word of its own (killed, or a crash of the interpreter)."""
    import signal

    if code == crash.LOST_CONTACT:  # none said why (all lost contact): unusual
        return f"worker rank {rank} lost contact with the other ranks; none reported an error"
    try:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else \
            f"exited with code {code}"
    except ValueError:
        how = f"was killed by signal {-code}"
    rest = f"; {failed - 1} other rank(s) stopped with it" if failed > 1 else ""
    return (f"worker rank {rank} {how} without an error message (out of memory, or killed "
            f"from outside?){rest}")
