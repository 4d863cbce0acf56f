"""Model FLOPs utilisation: the share of the devices' peak that the model's own arithmetic
used (PaLM, Chowdhery et al. 2022, app. B).

    MFU = achieved FLOP/s per device / peak FLOP/s per device
    achieved = training FLOPs per sample (forward + backward, ~3 x forward) x samples/s / devices

The FLOPs are the workload's count of the model (``Workload.flops_per_sample``), not what
the hardware executed: recomputation, padding and communication do not raise MFU. Samples/s
is the global throughput, so tensor- and pipeline-parallel layouts (several devices per
sample) divide it by all devices, not by the data-parallel replicas. The peak is the site
profile's ``device_peak_flops`` (dense, the precision the site trains in).

No torch at module level: ``ddl report`` renders MFU without it.
"""

from __future__ import annotations

from typing import Any


def achieved_flops_per_device(flops_per_sample: float, samples_per_s: float,
                              devices: int) -> float:
    if devices < 1:
        raise ValueError(f"devices must be at least 1 (got {devices})")
    return flops_per_sample * samples_per_s / devices


def mfu(flops_per_sample: float | None, samples_per_s: float, devices: int,
        peak_flops_per_device: float | None) -> float | None:
    """The fraction (0..1), or None when the FLOPs or the peak are unknown."""
    if not flops_per_sample or not peak_flops_per_device:
        return None
    return achieved_flops_per_device(flops_per_sample, samples_per_s,
                                     devices) / peak_flops_per_device


def site_peak(peak: float | None, site: str, accelerator: str | None,
              device_type: str) -> tuple[float | None, str]:
    """The peak to divide by and where it came from: the site profile's, unless the run's
    devices are not the site's kind. A ``--device cpu`` run on lumi-g compared against a
    GPU's 191.5 TFLOP/s gave "MFU 0.0 %", a number about nothing; it gets no peak, and
    the source says why (``ddl report --peak-flops measure`` gives a CPU's)."""
    if peak and accelerator and (device_type == "cpu") != (accelerator == "cpu"):
        return None, (f"none: a {device_type} run, and the {peak:.4g} FLOP/s of site profile "
                      f"{site} is the peak of its {accelerator} devices")
    return peak, f"site profile {site}"


def summary(flops_per_sample: float | None, samples_per_s: float, devices: int,
            peak_flops_per_device: float | None, peak_source: str) -> dict[str, Any]:
    """The ``mfu`` block of results.json and of a scaling point."""
    achieved = (achieved_flops_per_device(flops_per_sample, samples_per_s, devices)
                if flops_per_sample else None)
    return {"flops_per_sample": flops_per_sample, "achieved_flops_per_device": achieved,
            "peak_flops_per_device": peak_flops_per_device, "peak_source": peak_source,
            "mfu": mfu(flops_per_sample, samples_per_s, devices, peak_flops_per_device)}


def measure_matmul_peak(size: int = 1024, repeats: int = 5, threads: int = 1) -> float:
    """FLOP/s of a square fp32 matmul on this CPU with ``threads`` threads (best of
    ``repeats``): a measured stand-in for the peak where no datasheet value applies (a
    laptop or CI rank runs one thread; facts/platform.md)."""
    import time

    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b  # first call allocates and picks the kernel
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(previous)
    return 2.0 * size ** 3 / best
