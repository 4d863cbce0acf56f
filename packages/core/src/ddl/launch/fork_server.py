"""The fork server the local launcher's workers are forked from (``ddl.launch.local``).

Each worker used to import torch, torchvision and the workload's libraries itself (2-4
CPU-s each). multiprocessing's ``forkserver`` start method imports them once, in a server
process, and forks every worker (and a restart's) from it. Two ways to get that server:

- **forked from the launcher** (:func:`start`), for CPU runs: the launcher has imported
  torch and the workload's libraries for its pre-flight already, so a fork of it right
  before the agent starts is a server with everything loaded, at no import cost. Saves a
  whole interpreter start (2.3-6 CPU-s per ``ddl train``: the server re-imported torch,
  torchvision, transformers). Done only when forking is safe: no thread in the launcher
  but jemalloc's (fork-aware) background thread, CUDA never touched, and the Python's
  forkserver protocol is the one this module speaks (3.10-3.13).
- **spawned** (multiprocessing's own way, a fresh interpreter that imports the preload
  list), everywhere else: GPU runs (the pre-flight may have initialised CUDA, which a
  forked child cannot use), a Python with another protocol, a launcher with threads.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import signal
import socket
import sys
import warnings
from pathlib import Path

# Threads that survive a fork by design: jemalloc (pyarrow's allocator, imported with
# `datasets`) stops and restarts its background thread around fork().
FORK_SAFE_THREADS = {"jemalloc_bg_thd"}
# forkserver.main's parameters in CPython 3.10-3.13; 3.14 adds an authentication key
_MAIN_PARAMETERS = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")


def preload_names() -> list[str]:
    """What the server holds for every worker: torch, ddl's trainer, torchvision where
    installed, and the libraries the launcher's pre-flight needed (transformers for xsum)."""
    names = ["torch", "torch.distributed", "ddl.worker.train.trainer"]
    names += [name for name in ("torchvision",) if importlib.util.find_spec(name)]
    names += [name for name in ("transformers", "datasets", "accelerate") if name in sys.modules]
    return names


def start(cpu_only: bool) -> str:
    """Make the fork server for this launcher's workers; say which kind ("forked" or
    "spawned": the latter starts when the agent asks for its first worker)."""
    import multiprocessing

    names = preload_names()
    if cpu_only and _fork_here(names):
        return "forked"
    multiprocessing.set_forkserver_preload(names)
    return "spawned"


def why_not_fork(cpu_only: bool = True) -> str | None:
    """The reason this process may not be forked into a server now, or None."""
    from multiprocessing import forkserver

    if not cpu_only:
        return "a GPU run: the pre-flight may have initialised CUDA"
    params = tuple(inspect.signature(forkserver.main).parameters)
    if params != _MAIN_PARAMETERS or hasattr(forkserver._forkserver, "_forkserver_authkey"):
        return f"Python {sys.version_info[0]}.{sys.version_info[1]}'s forkserver protocol"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised"
    others = [name for name in _thread_names()[1:] if name not in FORK_SAFE_THREADS]
    if others:
        return f"threads are running ({', '.join(others)})"
    if forkserver._forkserver._forkserver_pid is not None:
        return "a fork server is running already"
    return None


def _thread_names() -> list[str]:
    """This process's threads, the main one first (Linux /proc)."""
    tasks = sorted(Path("/proc/self/task").iterdir(), key=lambda t: t.name != str(os.getpid()))
    return [(task / "comm").read_text().strip() for task in tasks]


def _fork_here(names: list[str]) -> bool:
    """Import ``names`` here, then fork this process into the server: the steps of
    ``ForkServer.ensure_running`` with ``os.fork`` in place of a fresh interpreter."""
    from multiprocessing import connection, forkserver, resource_tracker, util

    for name in names:
        try:
            __import__(name)
        except ImportError:
            pass
    if why_not_fork() is not None:
        return False
    server = forkserver._forkserver
    resource_tracker.ensure_running()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        # every client holds the write end of "alive"; EOF on the read end ends the server
        alive_r, alive_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():  # Python 3.12+ warns of any thread; ours are vetted
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the server
            _serve(server, listener.fileno(), alive_r, alive_w)
        os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return True


def _serve(server, listener_fd: int, alive_r: int, alive_w: int) -> None:
    """The forked server's life: multiprocessing's own loop, then an exit that skips the
    interpreter teardown (the launcher's atexit handlers are not the server's)."""
    import threading
    from multiprocessing import forkserver

    code = 0
    try:
        os.close(alive_w)
        server._lock = threading.Lock()  # a copy of a lock is no lock of this process
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)  # as a fresh interpreter's
        forkserver.main(listener_fd, alive_r, [])
    except SystemExit:  # the launcher has gone (EOF on "alive")
        pass
    except BaseException:  # noqa: BLE001 - say why, then go: workers see the socket closed
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def end() -> None:
    """End the fork server and reap it, once the agent has ended every worker. Left alone it
    would exit after this process, as an orphan that no parent accounts for (a test's CPU
    report missed it and its workers), and a spawned one spends ~1 CPU-s tearing down torch
    on the way; it holds nothing worth a clean exit, so SIGKILL, then multiprocessing's own
    ``_stop`` (private, used by CPython's tests) reaps it and forgets it, so that a later
    start makes a new one. Under a Python without it the server is left to exit by itself;
    if reaping fails, multiprocessing is made to forget the server all the same."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or not hasattr(server, "_stop"):
        return
    try:
        os.kill(pid, signal.SIGKILL)
        server._stop()
    except Exception:  # noqa: BLE001 - tidying up must not hide the run's own outcome
        for name in ("_forkserver_pid", "_forkserver_alive_fd", "_forkserver_address",
                     "_forkserver_authkey"):
            if hasattr(server, name):
                setattr(server, name, None)
