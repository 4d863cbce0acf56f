"""Every test is bounded: pytest-timeout with this project's configuration ends a hanging
test, prints what every thread was doing and still tears the session's fixtures down; a
command started through tests/conftest.py::run_bounded (run_ddl) is killed with its whole
process group and named with the tail of its output. Unit tests (seconds, no torch), kept
beside the system tests whose limits they guard."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_bounded

pytestmark = pytest.mark.unit

PLANTED = """\
import threading
import time
import pytest

@pytest.fixture(scope="session")
def resource():
    yield
    print("SESSION-TEARDOWN-RAN")

def test_sleeps_past_the_limit(resource):
    stuck = threading.Event()
    threading.Thread(target=stuck.wait, name="planted-helper", daemon=True).start()
    time.sleep(600)  # PLANTED-HANG
"""


def test_project_limit_is_active(pytestconfig):
    # getini raises ValueError for an option no plugin registered: pytest-timeout is loaded
    assert 60 <= float(pytestconfig.getini("timeout")) <= 3600
    assert pytestconfig.getini("timeout_method") == "signal"


def test_hanging_test_is_ended_with_its_stack_and_teardown_runs(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(PLANTED)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"),
                           "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-s",
                           "-o", "timeout=3", str(planted)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert time.monotonic() - start < 60, out
    assert "Failed: Timeout (>3.0s) from pytest-timeout" in out, out
    # every thread's stack: the other thread's wait, and the test's own traceback
    assert "Stack of planted-helper" in out and "signaled = self._cond.wait" in out, out
    assert "time.sleep(600)  # PLANTED-HANG" in out, out
    assert "SESSION-TEARDOWN-RAN" in out, out


def test_command_past_its_timeout_is_killed_with_its_children_and_named(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = f"echo started; sleep 300 & echo $! > {pid_file}; echo to-stderr >&2; wait"
    with pytest.raises(pytest.fail.Exception) as failed:
        run_bounded(["bash", "-c", script], timeout=2, cwd=tmp_path)
    message = str(failed.value)
    assert message.startswith("timed out after 2 s, killed: bash -c "), message
    assert "echo started" in message and f"(cwd {tmp_path})" in message
    assert "--- last stdout:\nstarted" in message and "--- last stderr:\nto-stderr" in message
    child = int(pid_file.read_text())
    # the background sleep went with its launcher: SIGKILL to the group is delivered
    # asynchronously, so poll (with a deadline) until the kernel has ended it
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_command_within_its_timeout_returns_like_subprocess_run(tmp_path):
    proc = run_bounded(["bash", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")
