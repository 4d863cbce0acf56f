"""When the launcher may fork itself into the workers' fork server (ddl.launch.fork_server).
Whether a real CPU run does is checked in tests/distributed/test_faults_signals.py."""

import ctypes
import threading

import pytest

from ddl.launch import fork_server

pytestmark = pytest.mark.unit


def test_a_gpu_run_spawns_its_fork_server():
    assert "GPU" in fork_server.why_not_fork(cpu_only=False)


def test_a_running_thread_forbids_the_fork_and_is_named():
    named, release = threading.Event(), threading.Event()

    def probe():  # the OS-level name /proc shows (PR_SET_NAME)
        ctypes.CDLL(None).prctl(15, b"ddl-probe", 0, 0, 0)
        named.set()
        release.wait()

    worker = threading.Thread(target=probe)
    worker.start()
    try:
        named.wait()
        reason = fork_server.why_not_fork()
    finally:
        release.set()
        worker.join()
    assert reason is not None and "ddl-probe" in reason, reason


def test_preload_names_hold_torch_and_the_trainer():
    names = fork_server.preload_names()
    assert names[:3] == ["torch", "torch.distributed", "ddl.worker.trainer"]
