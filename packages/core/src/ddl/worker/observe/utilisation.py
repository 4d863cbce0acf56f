"""Device utilisation sampled while a rank trains: a background thread reads, once per
``interval`` seconds, the CPU use of this rank's process (psutil) and, on a GPU, the busy
percentage of the rank's device (NVML on NVIDIA through ``pynvml``; AMD SMI on ROCm through
``amdsmi``). The means and maxima go into results.json (``utilisation[]``, one per rank) and
into ``ddl report``; the newest reading into the live state ``ddl watch`` shows.

The GPU readers are written against the libraries' documented calls but have not run here
(no GPU on the development machine); a reader that fails records why instead of a number.
The window covers the epochs' training and evaluation, from the first step to the last
epoch's end.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


def _cpu_reader() -> tuple[Callable[[], float] | None, str]:
    try:
        import psutil
    except ImportError:
        return None, "psutil is not installed"
    process = psutil.Process()
    process.cpu_percent(None)  # the first call only sets the reference point
    return (lambda: process.cpu_percent(None)), "psutil (this rank's process)"


def _nvml_reader(index: int) -> tuple[Callable[[], float] | None, str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return (lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)), "nvml"
    except Exception as exc:  # missing library or driver: say which
        return None, f"nvml unavailable: {type(exc).__name__}: {exc}"


def _amdsmi_reader(index: int) -> tuple[Callable[[], float] | None, str]:
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        handle = amdsmi.amdsmi_get_processor_handles()[index]
        return (lambda: float(amdsmi.amdsmi_get_gpu_activity(handle)["gfx_activity"])), "amdsmi"
    except Exception as exc:
        return None, f"amdsmi unavailable: {type(exc).__name__}: {exc}"


def device_reader(device_type: str, index: int, rocm: bool):
    if device_type != "cuda":
        return None, "no accelerator"
    return _amdsmi_reader(index) if rocm else _nvml_reader(index)


class Sampler:
    """``start()`` before training, ``stop()`` after: this rank's summary."""

    def __init__(self, rank: int, device_type: str = "cpu", device_index: int = 0,
                 rocm: bool = False, interval: float = 1.0) -> None:
        self.rank, self.interval = rank, interval
        self._cpu, self.cpu_source = _cpu_reader()
        self._device, self.device_source = device_reader(device_type, device_index, rocm)
        self.cpu: list[float] = []
        self.device: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddl-utilisation", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        if self._cpu is not None:
            self.cpu.append(self._cpu())
        if self._device is not None:
            try:
                self.device.append(self._device())
            except Exception as exc:  # a reader that worked once and then failed
                self._device, self.device_source = None, f"failed: {exc}"

    def latest(self) -> dict[str, float | None]:
        """The newest readings (the live state, ``ddl.worker.observe.live``); None before the first."""
        return {"cpu_percent": self.cpu[-1] if self.cpu else None,
                "device_util_percent": self.device[-1] if self.device else None}

    def stop(self) -> dict[str, Any]:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()  # at least one reading, also for runs shorter than the interval
        return {"rank": self.rank, "interval_s": self.interval, "samples": len(self.cpu),
                "cpu_source": self.cpu_source, **_stats("cpu_percent", self.cpu),
                "device_source": self.device_source,
                **_stats("device_util_percent", self.device)}


def _stats(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"{name}_mean": None, f"{name}_max": None}
    return {f"{name}_mean": sum(values) / len(values), f"{name}_max": max(values)}
