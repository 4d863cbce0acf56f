"""Run ``ddl ARGS`` as a fork of a process that has imported ddl and torch already.

Most CLI tests start ``ddl train`` (or another command that imports torch): a fresh
interpreter importing torch, torchvision and transformers costs 2.5-5 CPU-s per command,
more than most of these runs train. The rank pools' fork server (tests/rankpool.py) holds
those imports; a CLI run is a process forked from it that becomes the command as its console
script would: ``sys.argv``, ``sys.path`` and the environment of a real ``ddl`` process (the
path read once from one), its own session (a timeout kills the launcher and its workers
together), stdout and stderr to files, then ``ddl.commands.cli.main`` and the exit code it
returns, atexit handlers included. A launcher forked this way starts its workers as it
always does: the launch, rendezvous, run directory and exit codes are the real ones.

What a fork cannot give is an import made under another environment: libraries read
some variables when imported (HF_*, TORCH_*, ...). So the fork compares the environment
asked for with the one the server started with; if anything but OMP_NUM_THREADS (read by
each run's thread rule, not at import), a DDL_* setting (read at run time), pytest's
PYTEST_* or a shell's PWD, OLDPWD, SHLVL and _ differs, it exits with NEEDS_EXEC and the
command runs in a fresh interpreter instead. PYTHONPATH is the exception when its folders
only add modules (a third party's plugin and its dist-info): the fork puts them on its
sys.path where a fresh interpreter would, and the plugin's entry point is found as it
would be there (importlib.metadata reads sys.path when asked); a folder that holds a
module the server has imported (a torch of its own) still needs a fresh interpreter. Commands whose point
is a fresh interpreter (``ddl --help`` imports no torch) pass ``fresh=True``;
DDL_TEST_CLI=exec runs every command that way.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import rankpool

NEEDS_EXEC = 121  # the fork's answer: this environment needs a fresh interpreter
_FORKABLE_PREFIXES = ("DDL_", "PYTEST_")
# OMP_NUM_THREADS is read by each run's thread rule; the rest is a shell's bookkeeping,
# which no import reads (a `./ddl` relayed from a bash script: tests/cli_relay.py).
_FORKABLE_NAMES = {"OMP_NUM_THREADS", "PWD", "OLDPWD", "SHLVL", "_"}
_console_path: list[list[str]] = []
fallbacks: list[str] = []  # the variables that sent each command to a fresh interpreter


def enabled() -> bool:
    return os.environ.get("DDL_TEST_CLI", "fork") != "exec"


def run(ddl: str, args: list[str], *, cwd: Path | None, env: dict[str, str],
        timeout: float) -> subprocess.CompletedProcess | None:
    """The finished command, or None when it must run in a fresh interpreter. Raises
    subprocess.TimeoutExpired (output attached) after killing its session."""
    context, server_env = rankpool.context(), rankpool.fork_server_env()
    with tempfile.TemporaryDirectory(prefix="ddl-cli-") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        proc = context.Process(
            target=_become_ddl, name="ddl",
            args=(ddl, list(args), str(cwd or os.getcwd()), env, server_env, _sys_path(ddl),
                  str(out), str(err)))
        proc.start()
        timed_out = False
        try:
            proc.join(timeout)
            timed_out = proc.exitcode is None
        finally:
            if proc.exitcode is None:  # timed out, or the test was ended around us
                kill_session(proc.pid)
                proc.join(30)
        stdout = out.read_text(errors="replace") if out.exists() else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
        if timed_out:
            expired = subprocess.TimeoutExpired([ddl, *args], timeout, stdout, stderr)
            expired.pid = proc.pid  # its session's id
            raise expired
    if proc.exitcode == NEEDS_EXEC and not stdout and stderr.startswith("cli_fork: "):
        fallbacks.append(stderr[len("cli_fork: "):].strip())  # why (DDL_TEST_CLI_LOG)
        return None
    return subprocess.CompletedProcess([ddl, *args], proc.exitcode, stdout, stderr)


def forkable(key: str) -> bool:
    """May this variable differ from the server's environment (read only at run time)?"""
    return key in _FORKABLE_NAMES or key.startswith(_FORKABLE_PREFIXES)


def kill_session(pid: int, wait_s: float = 30.0) -> None:
    """SIGKILL the command's session (launcher, fork server, workers) and wait, up to
    ``wait_s``, until none of it is left (SIGKILL takes effect asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = session_members(pid)
        for member in left:
            try:
                os.kill(member, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def session_of(pid: int) -> int | None:
    """The session id of a live (not zombie) process, None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, _, _, sid = stat.rsplit(")", 1)[1].split()[:4]  # state ppid pgrp session
    return None if state == "Z" else int(sid)


def session_members(session: int) -> list[int]:
    """The live (not zombie) processes of a session, from /proc."""
    return [int(name) for name in os.listdir("/proc")
            if name.isdigit() and session_of(int(name)) == session]


def _sys_path(ddl: str) -> list[str]:
    """sys.path of the console script (its own folder first, no test folders)."""
    if not _console_path:
        python = Path(ddl).with_name("python")
        found = subprocess.run([str(python), "-I", "-c", "import sys, json; "
                                "print(json.dumps(sys.path[1:]))"],
                               capture_output=True, text=True, check=True)
        _console_path.append([str(Path(ddl).parent), *json.loads(found.stdout)])
    return _console_path[0]


def _added_folders(pythonpath: str) -> list[str] | None:
    """PYTHONPATH's folders, if a fork may put them on its sys.path: they only add modules
    (a plugin's package and its dist-info, tests/conftest.py install_plugin). None when one
    holds a module the server has imported already (a fresh interpreter would import that
    one instead: the fork cannot) or a sitecustomize (run at a fresh interpreter's start)."""
    folders = [os.path.abspath(entry) for entry in pythonpath.split(os.pathsep) if entry]
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue  # a fresh interpreter skips it too
        for name in names:
            module = name.split(".", 1)[0]
            if name.endswith((".dist-info", ".egg-info")):
                continue
            if module in sys.modules or module in ("sitecustomize", "usercustomize"):
                return None
    return folders


def _become_ddl(ddl: str, args: list[str], cwd: str, env: dict[str, str],
                server_env: dict[str, str], path: list[str], out: str, err: str) -> None:
    """The forked child: check the environment, then be ``ddl ARGS``."""
    # variables the server's imports set (TORCHINDUCTOR_CACHE_DIR): a fresh `ddl` sets them
    # too, when it imports the same; every other difference is one the imports did not see
    imported = {key: os.environ[key] for key in set(os.environ) - set(server_env)}
    changed = {key for key in set(env) | set(os.environ)
               if env.get(key, imported.get(key)) != os.environ.get(key)}
    added = _added_folders(env.get("PYTHONPATH", "")) if "PYTHONPATH" in changed else []
    refused = sorted(k for k in changed if not forkable(k)
                     and not (k == "PYTHONPATH" and added is not None))
    if refused:
        with open(err, "w") as why:
            why.write(f"cli_fork: {', '.join(refused)}")
        os._exit(NEEDS_EXEC)
    path = [path[0], *(added or []), *path[1:]]  # where a fresh interpreter puts PYTHONPATH
    env = {**imported, **env}
    os.setsid()  # its own session: a timeout kills it with its workers
    for fd, name in ((1, out), (2, err)):
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = path
    sys.argv = [ddl, *args]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from ddl.commands.cli import main

    try:
        code = main()
    finally:
        atexit._run_exitfuncs()  # as the interpreter would at exit
    sys.exit(code)
