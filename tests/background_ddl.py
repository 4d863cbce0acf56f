"""`ddl train ...` in the background, forked as run_ddl forks it (tests/cli_fork.py).

Tests that signal or kill a run while it trains used to start the console script with
``subprocess.Popen``: a fresh interpreter whose launcher imports torch and whose fork server
imports torchvision again, CPU-s per start that the preloaded server already holds
(test_faults_signals.py: 63 -> 24 CPU-s with its 4 runs and 3 workers forked). Here
run_ddl runs in a thread (it falls back to a fresh interpreter exactly when it would in the
foreground), and the launcher's pid, which a signal needs, is read from the process tree:
a worker's parent is the launcher's fork server, whose parent is the launcher (the tree
test_faults_signals.py checks). The launcher leads a session of its own either way, which
``end`` kills with whatever is left of the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import cli_fork
import rankpool


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


class Run:
    """A `ddl` command running in a thread; its launcher's ``pid`` once its workers live."""

    def __init__(self, args: list[str], *, cwd: Path, run_dir: Path, env: dict | None = None,
                 timeout: float = 300) -> None:
        self.run_dir = run_dir
        self.done = None
        self.error: BaseException | None = None
        self._launcher: int | None = None
        self._thread = threading.Thread(target=self._run, args=(args, cwd, env, timeout),
                                        daemon=True)
        self._thread.start()

    def _run(self, args, cwd, env, timeout) -> None:
        from conftest import run_ddl

        try:
            self.done = run_ddl(*args, cwd=cwd, env=env, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            self.error = exc

    def poll(self) -> int | None:
        """None while the command runs, else its exit code (or its failure, raised)."""
        if self._thread.is_alive():
            return None
        if self.error is not None:
            raise self.error
        return self.done.returncode

    @property
    def pid(self) -> int:
        """The launcher's pid: the grandparent of the run's rank 0 (which must be running)."""
        from conftest import live_workers

        if self._launcher is None:
            self._launcher = _parent(_parent(live_workers(self.run_dir)[0]))
        return self._launcher

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float = 300) -> tuple[str, str]:
        """Wait for the end (bounded: run_ddl's own timeout fails the test first)."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the run did not end within {timeout:g} s"
        if self.error is not None:
            raise self.error
        return self.done.stdout, self.done.stderr

    @property
    def returncode(self) -> int | None:
        return None if self.done is None else self.done.returncode

    def end(self) -> None:
        """After a test: kill the launcher's session if it still runs, then wait."""
        if self._thread.is_alive():
            try:
                cli_fork.kill_session(self.pid)
            except (KeyError, OSError):  # no worker yet: run_ddl's timeout ends it
                pass
        self._thread.join(60)


def _python(argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """The forked child: ``python ARGV`` (``-m MODULE`` or ``-c CODE``, then arguments)."""
    import runpy

    for fd, name in ((1, out), (2, err)):
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    option, what, *args = argv
    if option == "-m":
        sys.argv = [what, *args]
        runpy.run_module(what, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]
        exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102


class Python:
    """``python ARGV`` in ``env``, forked from the fork server that has torch and ddl's
    worker imported (tests/rankpool.py) instead of a fresh interpreter that imports them
    (~4 CPU-s for a worker): stdout and stderr to files, read back by ``communicate``.
    Only for environments that differ from the server's in what is read at run time
    (RANK, MASTER_ADDR, DDL_*), not in what an import reads (PYTHONPATH, HF_*)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self._scratch = tempfile.TemporaryDirectory(prefix="ddl-python-")
        self._out = Path(self._scratch.name, "stdout")
        self._err = Path(self._scratch.name, "stderr")
        self._proc = rankpool.context().Process(
            target=_python, args=(list(argv), dict(env), str(self._out), str(self._err)))
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def kill(self) -> None:
        if self._proc.exitcode is None:
            self._proc.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired("python", timeout)
        out, err = (p.read_text(errors="replace") if p.exists() else ""
                    for p in (self._out, self._err))
        self._scratch.cleanup()
        return out, err
