"""Opt-in: CPU seconds per test, to find where the suite's time goes (docs/testing.md).

`DDL_TEST_CPU_REPORT=FILE ./run-tests` appends one JSON line per test phase to FILE: wall
seconds, and CPU seconds (user + system) of the pytest process, of the subprocesses it
reaped during the phase (a `ddl train` and its workers), and of this worker's rank pools.
On 2 cores the wall times of a parallel run mostly measure the neighbours; CPU does not.
Commands forked from the fork server (tests/cli_fork.py) are the server's children, not
this process's: neither count sees them. `cpu_machine` does (every core's busy time, from
/proc/stat) but counts the neighbours too: exact only in a run of one worker on an
otherwise idle machine (`DDL_TEST_CPU_REPORT=FILE ./run-tests -p no:xdist ...`).
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _pool_cpu() -> float:
    try:
        from rankpool import pools
    except ImportError:
        return 0.0
    total = 0.0
    for pool in pools().values():
        for pid in pool.pids():
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / _TICK
            except (OSError, IndexError, ValueError):
                pass
    return total


def _machine_busy() -> float:
    """CPU seconds every core has spent busy since boot (not idle, not waiting on I/O)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / _TICK


def _sample() -> tuple[float, float, float, float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (time.monotonic(), own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime,
            _pool_cpu(), _machine_busy())


class CpuReport:
    def __init__(self, path: str) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._measure(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._measure(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._measure(item, "teardown")

    def _measure(self, item, phase):
        before = _sample()
        yield
        after = _sample()
        wall, own, kids, pool, machine = (b - a for a, b in zip(before, after))
        line = {"test": item.nodeid, "phase": phase, "wall": round(wall, 2),
                "cpu_self": round(own, 2), "cpu_children": round(kids, 2),
                "cpu_pool": round(pool, 2), "cpu_machine": round(machine, 2),
                "pid": os.getpid()}
        with open(self.path, "a") as out:
            out.write(json.dumps(line) + "\n")


def pytest_configure(config):
    path = os.environ.get("DDL_TEST_CPU_REPORT")
    if path:
        config.pluginmanager.register(CpuReport(path), "ddl-cpu-report")
