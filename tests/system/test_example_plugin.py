"""The example external plugin (docs/examples/ddl-example-plugin) as a third party uses it:
installed from its directory into a fresh venv beside ddl (tests/system/plugin_venv.py),
listed by `ddl plugins`, trained on 2 processes, and passing the conformance kit through its
own test file. The project's own `ddl plugins` must not see it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_bounded

from .plugin_venv import ddl_in, install_in_fresh_venv, listed_in_venv_only

pytestmark = pytest.mark.system

EXAMPLE = REPO / "docs" / "examples" / "ddl-example-plugin"

# The kit's launches forked from one preloaded interpreter: a pytest plugin (-p) for the
# plugin's own test run. Each `ddl train` of the kit is a fresh `python -c ...main()` that
# spends ~6 CPU-s importing torch (and torch._dynamo, which AdamW's first step imports)
# before ~1 CPU-s of work (measured 2026-11-30: chargpt's tiny on 2 processes 7.3 CPU-s
# fresh, 1.5 forked). This plugin replaces ddl.conformance.runs._ddl, the kit's one
# launching function, with a fork of a multiprocessing fork server that imported ddl's CLI,
# torch and the plugin once, in the venv's own interpreter (sys.path and environment of a
# fresh one); the fork then is `ddl ARGS` as tests/cli_fork.py makes it: its own session,
# stdout and stderr captured, ddl.commands.cli.main, atexit handlers, the exit code. The
# launcher, its workers, the rendezvous and the run directories are the real ones. Runs
# whose arguments hold FRESH keep the kit's own launching (a new interpreter), so a fresh
# `ddl train` of the plugin in the venv still runs.
KIT_FORK = '''
import atexit, json, multiprocessing, os, signal, subprocess, sys, tempfile, threading
from multiprocessing import forkserver
from pathlib import Path

from ddl.conformance import runs

PRELOAD = {preload!r}
FRESH = {fresh!r}
_fresh_launch = runs._ddl
_server = []
launches = {{"forked": 0, "fresh": 0}}
_counting = threading.Lock()


def _server_context():
    if not _server:
        path = subprocess.run([sys.executable, "-c", "import sys, json; "
                               "print(json.dumps(sys.path))"], capture_output=True,
                              text=True, check=True, cwd=tempfile.gettempdir()).stdout
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        kept = dict(os.environ)
        os.environ["OMP_NUM_THREADS"] = "1"  # as every launch has it (runs._ddl)
        try:
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(kept)
        atexit.register(forkserver._forkserver._stop)  # reaped: its CPU is accounted
        _server.append((context, json.loads(path)))
    return _server[0]


def _become_ddl(args, cwd, env, path, out, err):
    imported = {{k: v for k, v in os.environ.items() if k not in env}}  # set by imports
    os.setsid()  # its own session: a timeout kills it with its workers
    for fd, name in ((1, out), (2, err)):
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update({{**imported, **env}})
    sys.path[:] = [cwd if entry == "" else entry for entry in path]
    sys.argv = ["-c", *args]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from ddl.commands.cli import main

    try:
        code = main()
    finally:
        atexit._run_exitfuncs()
    sys.exit(code)


def _fresh(args):
    return any(tuple(args[i:i + 2]) == FRESH for i in range(len(args) - 1))


def _launch(command, *args, cwd):
    if tuple(command) != runs.DDL_COMMAND or _fresh(args):
        with _counting:
            launches["fresh"] += 1
        return _fresh_launch(command, *args, cwd=cwd)
    context, path = _server_context()
    env = {{**os.environ, "OMP_NUM_THREADS": "1"}}
    with tempfile.TemporaryDirectory(prefix="kit-launch-") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        proc = context.Process(target=_become_ddl, name="ddl",
                               args=(list(args), str(cwd), env, path, str(out), str(err)))
        proc.start()
        proc.join(runs.LAUNCH_TIMEOUT_S)
        timed_out = proc.exitcode is None
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
            except ProcessLookupError:
                pass
            proc.join()
        stdout = out.read_text(errors="replace") if out.exists() else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
    if timed_out:
        stderr += f"\\ntimed out after {{runs.LAUNCH_TIMEOUT_S}} s"
    with _counting:
        launches["forked"] += 1
    return subprocess.CompletedProcess([*command, *args], proc.exitcode, stdout, stderr)


assert callable(_fresh_launch), "ddl.conformance.runs._ddl is gone: update the test"
runs._ddl = _launch


def pytest_configure(config):
    _server_context()  # now, before the kit's launching threads exist (not in a launch,
    # which imports this module to find _become_ddl)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line("kit launches: " + json.dumps(launches))
'''


def run_kit(venv: Path, basetemp: Path, preload: list[str], fresh: tuple[str, str]
            ) -> subprocess.CompletedProcess:
    """The plugin's own tests/ run as plugin_venv.run_plugin_tests runs them (pytest in the
    venv, the plugin's pyproject.toml), with KIT_FORK loaded (-p, from PYTHONPATH):
    ``preload`` the plugin's modules, ``fresh`` the `ddl train` arguments (a pair such as
    ("--strategy", "ddp")) whose launch stays a new interpreter."""
    plugin = next(p for p in venv.parent.iterdir() if (p / "pyproject.toml").is_file())
    hook = basetemp.parent / "kit-fork"
    hook.mkdir()
    base = ["ddl.commands.cli", "ddl.commands.train", "torch", "torch._dynamo",
            "torch.distributed", "torchvision", "ddl.worker.train.trainer"]
    (hook / "ddl_test_kit_fork.py").write_text(KIT_FORK.format(preload=base + preload,
                                                               fresh=fresh))
    return run_bounded([str(venv / "bin" / "python"), "-m", "pytest", "-q",
                        "-p", "no:cacheprovider", "-p", "ddl_test_kit_fork",
                        "--rootdir", str(plugin), "-c", str(plugin / "pyproject.toml"),
                        "--basetemp", str(basetemp), str(plugin / "tests")],
                       cwd=basetemp.parent, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(hook)})


def kit_launches(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """How many of the kit's launches were forked and how many fresh (KIT_FORK's line)."""
    line = next(l for l in proc.stdout.splitlines() if l.startswith("kit launches: "))
    return json.loads(line.split(": ", 1)[1])


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return install_in_fresh_venv(EXAMPLE, tmp_path_factory.mktemp("third-party"), "ddl_example")


def test_listed_in_the_fresh_venv_only(venv, tmp_path):
    line, listing = listed_in_venv_only(venv, "example", tmp_path)
    assert "example plugin" in line and "ddl-example-plugin 0.1.0" in listing


def test_trains_on_two_processes(venv, tmp_path):
    data = tmp_path / "data"
    proc = ddl_in(venv, "prepare", "--plugin", "example", "--synthetic", "--data-dir", str(data),
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (data / "example" / "train.csv").read_text().startswith("x0,x1,")
    proc = ddl_in(venv, "train", "--plugin", "example", "--preset", "tiny", "--nproc", "2",
                  "--data-dir", str(data), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["plugin"] == "example" and results["world"]["size"] == 2
    assert "ddl-example-plugin" in json.dumps(results["versions"]["plugins"])
    first, last = results["epochs"][0]["val"]["loss"], results["final"]["val"]["loss"]
    assert last < first, (first, last)  # it learns


def test_passes_the_conformance_kit(venv, tmp_path):
    """The example's own test file, run as its author would, in the fresh venv; the kit's
    launches forked from one preloaded interpreter (KIT_FORK: 88 -> 33 CPU-s), all but
    ddp's: one process, its noise reference, clipping's one process, ddp, fsdp,
    accelerate, hsdp (4), accumulation, clipping, resume."""
    proc = run_kit(venv, tmp_path / "kit", ["ddl_example.plugin", "ddl_example.workload"],
                   ("--strategy", "ddp"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    assert kit_launches(proc) == {"forked": 9, "fresh": 1}, proc.stdout[-3000:]
