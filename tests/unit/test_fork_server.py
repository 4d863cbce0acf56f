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
    assert names[:3] == ["torch", "torch.distributed", "ddl.worker.train.trainer"]


def test_the_launcher_asks_torch_for_accelerators_only_after_forking_its_server(
        monkeypatch, tmp_path):
    """torch's LaunchConfig asks torch.accelerator.is_available(); on a machine with a GPU
    driver that starts a CUDA driver thread (seen on an H100 machine with `--device cpu`),
    and a launcher with a thread is not forked. No driver here, so the test records the
    order of the two instead: the fork server first."""
    import os

    import torch
    import torch.distributed.launcher.api as launcher_api

    from ddl.launch import local

    order: list[str] = []

    class Launched(Exception):
        pass

    def elastic_launch(config, entry):
        order.append("agent")
        raise Launched

    monkeypatch.setattr(torch.accelerator, "is_available",
                        lambda: order.append("accelerator") or False)
    monkeypatch.setattr(fork_server, "start", lambda cpu_only: order.append("fork server"))
    monkeypatch.setattr(launcher_api, "elastic_launch", elastic_launch)
    saved = dict(os.environ)
    try:
        with pytest.raises(Launched):
            local.launch_local(tmp_path, nproc=2, cpu_only=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert order[0] == "fork server" and order[-1] == "agent", order
