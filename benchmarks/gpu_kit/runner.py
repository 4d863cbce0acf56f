"""Running one check's command: a time limit, the whole process group stopped on expiry,
output to a log file (a pipe could fill and stall a chatty run), the tail kept for the JSON;
and, on a GPU, the device's memory in use sampled through NVML while it runs."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

TAIL_CHARS = 3000


@dataclass
class Outcome:
    returncode: int | None  # None: stopped at the time limit
    seconds: float
    tail: str
    timed_out: bool


def run(command: list[str], log: Path, timeout: float, env: dict | None = None,
        cwd: Path | None = None) -> Outcome:
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        # its own session: on expiry the run and its loader workers stop together
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=cwd, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code, timed_out = None, True
    text = log.read_text(encoding="utf-8", errors="replace")
    return Outcome(code, time.perf_counter() - t0, text[-TAIL_CHARS:], timed_out)


class GpuMemory:
    """Peak bytes in use on GPU 0 while a ``with`` block runs, sampled every 50 ms through
    NVML (the driver's count: the CUDA context and torch's cached blocks included, so it
    should be at least torch's own peak allocation). ``peak`` stays None without NVML."""

    def __init__(self, enabled: bool) -> None:
        self.peak: int | None = None
        self.baseline: int | None = None  # in use before the run started
        self.source = "not sampled (no GPU)"
        self._handle = None
        self._stop = threading.Event()
        if not enabled:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._read = lambda: int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
            self.source = "nvml"
        except Exception as exc:  # noqa: BLE001 - the kit reports why, and goes on
            self.source = f"nvml unavailable: {type(exc).__name__}: {exc}"

    def __enter__(self) -> GpuMemory:
        if self._handle is not None:
            self.peak = self.baseline = self._read()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._read())

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._stop.set()
            self._thread.join()
