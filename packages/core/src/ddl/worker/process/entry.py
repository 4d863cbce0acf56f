"""The one code path every training process runs, however it was started.

A worker gets the run plan ``ddl train`` made (``ddl.settings.plan``: configuration, site
profile, launcher, run directory) either from ``RUN_DIR/plan.json`` (written by a local
``ddl train`` before it started the workers) or from the ``DDL_RUN_PLAN`` environment
variable (set by a per-node launcher in a Slurm job, whose workers start on several nodes at
once; rank 0 then creates the run directory). It decides nothing again: it joins the
process group the launcher described in the environment, and trains.

Started as ``python -m ddl.worker [RUN_DIR]`` by the local elastic agent or torchrun, or
called in-process by ``ddl train`` under srun.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ddl.contract.errors import DdlError, UsageError
from ddl.settings import plan as run_plan
from ddl.settings import rundir
from ddl.worker.process import cpu_binding, crash, heartbeat, socket_folder


def _create_run_dir_on_rank0(plan, world) -> None:
    """Rank 0 creates the run directory; every rank learns whether that worked, so a refusal
    stops all ranks with the same message instead of leaving them waiting."""
    import torch.distributed as dist

    problem = None
    if world.is_main:
        try:
            rundir.create(plan.run_dir, plan.config.resume)
            run_plan.write(plan)
        except UsageError as exc:
            problem = str(exc)
    if world.size > 1:
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem:
        raise UsageError(problem)


def run(plan, *, create_run_dir: bool) -> None:
    from ddl.contract.plugins import Plugins
    from ddl.worker.checkpointing.checkpoint import latest
    from ddl.worker.process.distributed import close_world, init_world
    from ddl.worker.train.trainer import train

    socket_folder.keep_short()  # loader workers' sockets, under a long TMPDIR too
    config = plan.config
    restarts = max(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                   int(os.environ.get("SLURM_RESTART_COUNT", 0)))
    if restarts and config.resume != "auto" and (
            config.resume == "none" or latest(plan.run_dir) is not None):
        # Restarted by the launcher or requeued by Slurm: continue from the newest
        # checkpoint of this run (not from where it first started, nor from scratch).
        plan = plan.model_copy(update={"config": config.model_copy(update={"resume": "auto"})})
    site = plan.site
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if local_rank >= len(plan.cores):
        raise DdlError(f"the run plan has cores for {len(plan.cores)} local ranks; this is "
                       f"local rank {local_rank}")
    cpu_binding.apply(plan.cores[local_rank], local_rank)  # as the pre-flight decided
    world = init_world(plan.config.device, site.accelerator, site.backend,
                       rendezvous_timeout_s=plan.config.rendezvous_timeout)
    beat = None
    try:
        if create_run_dir:
            _create_run_dir_on_rank0(plan, world)
        beat = heartbeat.start(world, config.hang_timeout, plan.run_dir)
        train(plan, world, Plugins())
    except Exception as exc:  # plugin code (or ddl's): one line, not a traceback
        if isinstance(exc, DdlError) or _lost_peer(exc):
            raise
        _raise_if_write_failed(exc, plan.run_dir, world)
        raise crash.failed(exc, world.rank, plan) from None
    except BaseException as exc:  # DCP's CheckpointException is not an Exception
        _raise_if_write_failed(exc, plan.run_dir, world)
        raise
    finally:
        if beat is not None:
            beat.stop()
        close_world()


def _raise_if_write_failed(exc: BaseException, run_dir: Path, world) -> None:
    """A full disk or a refused write: one line (rank 0's, when every rank saw it in a
    checkpoint), then every rank leaves."""
    from ddl.worker.checkpointing import write_errors

    failed = write_errors.one_line(exc, run_dir)
    if failed is None:
        return
    if world.is_main or not hasattr(exc, "failures"):
        print(f"ddl: error: {failed}", file=sys.stderr, flush=True)
    raise failed from None


def load_plan(args: list[str]):
    """(the run plan, whether this worker's rank 0 must create the run directory)."""
    if os.environ.get(run_plan.PLAN_ENV):
        return run_plan.RunPlan.model_validate_json(os.environ[run_plan.PLAN_ENV]), True
    if len(args) != 1:
        raise UsageError(f"usage: python -m ddl.worker RUN_DIR (or set {run_plan.PLAN_ENV})")
    return run_plan.read(Path(args[0])), False


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown. Results are written and the process group
    is destroyed by now; seen on the local Slurm: a gloo rank occasionally aborted during
    teardown ("terminate called without an active exception", exit 134) after a complete
    run, failing a finished job."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _lost_peer(exc: Exception) -> bool:
    text = str(exc)
    return any(marker in text for marker in ("Connection reset by peer",
                                             "Connection closed by peer", "Broken pipe"))


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _report(failure: crash.Failed) -> int:
    """This rank's line, unless the local launcher prints one line for all ranks."""
    if failure.should_print():
        print(f"ddl: error: {failure}", file=sys.stderr, flush=True)
    return failure.exit_code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    _quiet_library_remarks()
    rank = int(os.environ.get("RANK", 0))
    plan = None
    try:
        plan, create = load_plan(args)
        run(plan, create_run_dir=create)
    except UsageError as exc:
        if rank == 0:  # the same on every rank; say it once
            print(f"ddl: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except crash.Failed as exc:  # from plugin (or ddl) code; the traceback is in RUN_DIR/logs/
        return _report(exc)
    except RuntimeError as exc:
        if not _lost_peer(exc):
            return _report(crash.failed(exc, rank, plan))
        # Another rank died (its own message, if any, says why); no need for a traceback,
        # nor a line at all under the local launcher, which names the rank that failed.
        if os.environ.get(crash.LAUNCHER_REPORTS):
            # torch's agent reports the first rank it sees end; give the one that failed
            # (killed, crashed) the time to be seen first, so it is the one named
            time.sleep(LOST_CONTACT_GRACE_S)
            return crash.LOST_CONTACT
        print(f"ddl: error on rank {rank}: lost contact with another rank "
              f"({_first_line(exc)})", file=sys.stderr, flush=True)
        return 1
    except DdlError as exc:
        if getattr(exc, "once", False):
            # Every rank knows it and rank 0 has said it; leave at once, without the
            # teardown during which the launcher's SIGTERM to slower ranks adds noise.
            exit_now(exc.exit_code)
        print(f"ddl: error on rank {rank}: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except Exception as exc:  # a bug in a plugin's code (or ddl's): say where, keep the rest
        return _report(crash.failed(exc, rank, plan))
    return 0


#: Set by the local launcher for its workers: its pid, to notice it died before we tied to it.
LAUNCHER_PID = "DDL_LAUNCHER_PID"
#: How long a rank that lost contact with another waits before it ends, under the local
#: launcher (which names the first rank it sees end: see main).
LOST_CONTACT_GRACE_S = 2.0
#: A forked worker's process name (``/proc/PID/comm``, ``ps``): how the launcher finds it.
WORKER_NAME = "ddl.worker"


def forked(run_dir: str) -> int:
    """A worker of a local multi-process run, forked by the launcher's fork server
    (ddl.launch.local) with torch and the workload's libraries already imported. As a
    worker started by ``python -m ddl.worker``: a session of its own (nothing from the
    terminal reaches it unless the launcher passes it on), tied to the launcher. Returns 0
    on success (torch's agent waits for the return value); other codes are exit codes."""
    os.setsid()
    _name_process(WORKER_NAME)
    tie_to_launcher()
    code = main([run_dir])
    sys.stdout.flush()
    sys.stderr.flush()
    if code != 0:
        sys.exit(code)
    return 0  # the fork server's child ends with os._exit: no interpreter teardown


def _name_process(name: str) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_name = 15  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_name, name.encode()[:15], 0, 0, 0)


def _parent_of(pid: int) -> int | None:
    """The parent of ``pid`` (Linux /proc), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _quiet_library_remarks() -> None:
    """DTensor warns on every rank, at each gather of a tensor sharded twice over one
    dimension (tp and dp_shard of a 3-D layout, when the full weights are exported), that it
    takes two all-gathers and how torch could merge them: a note for torch's developers that
    a user cannot act on, eight times in the middle of a run's output. Errors still show."""
    import logging

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def tie_to_launcher() -> None:
    """A worker process ends with its launcher, and takes its signals as ddl means them.

    torch's agent starts each worker in a session of its own, so a launcher killed with
    SIGKILL (``kill -9``, ``timeout -s KILL``, an OOM killer) takes no worker with it; the
    orphans would train on and write the run directory. Linux's parent-death signal
    (prctl(2) PR_SET_PDEATHSIG) kills the worker when the process that started it dies.
    SIGINT (Ctrl-C, or the agent passing it on) ends a worker at once without a traceback;
    SIGUSR1 asks for a clean stop at the next step (``ddl.worker.train.control``)."""
    import signal

    from ddl.worker.train import control

    control.listen()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        launcher = os.environ.get(LAUNCHER_PID)
        parent = os.getppid()
        if launcher and int(launcher) not in (parent, _parent_of(parent)):
            os._exit(128 + signal.SIGKILL)  # it died before the prctl above
        if launcher and int(launcher) != parent:
            _end_with(int(launcher))  # forked by its fork server: not our parent


def _end_with(pid: int) -> None:
    """A worker forked by the launcher's fork server has the server as its parent, and
    the server outlives the launcher while its workers hold its pipe: a thread waits on
    the launcher's pidfd (Linux >= 5.3) and kills this process when the launcher ends."""
    import select
    import signal
    import threading

    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # gone already, or no pidfd here
        if not _alive(pid):
            os._exit(128 + signal.SIGKILL)
        return

    def watch() -> None:
        select.select([pidfd], [], [])  # readable once the process has ended
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="ddl-launcher-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start() -> None:
    """Run as a process's main program (``python -m ddl.worker``) and exit with its code."""
    tie_to_launcher()
    code = main()
    if code == 0:
        exit_now(0)
    # On failure keep the normal exit: rank 0 prints the one-line error, and the slower
    # teardown keeps it alive long enough when other ranks fail first and the agent
    # starts stopping the rest.
    sys.exit(code)


if __name__ == "__main__":
    start()
