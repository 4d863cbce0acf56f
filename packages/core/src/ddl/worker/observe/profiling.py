"""``--profile N``: torch.profiler over N training steps on every rank.

Each rank writes a Chrome trace ``trace-rank<r>.json`` into the run directory (open it in
chrome://tracing or https://ui.perfetto.dev) and a short summary that goes into
results.json: the ops that took the most time and how much of the profiled op time was
communication (collectives of c10d/gloo/NCCL) rather than compute.

The first step is skipped and the second only warms the profiler up, so the trace shows
steady-state steps (the same reason the first epoch is left out of the timings).
Communication time is the collectives' own time on the host (and on the GPU where there is
one); under DDP much of it overlaps the backward pass, so the split says how much work each
kind took, not how long the step waited. Batch fetching (the DataLoader iterator) is
counted apart from both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SKIP_STEPS, WARMUP_STEPS = 1, 1
TOP_OPS = 8
COMMUNICATION = ("c10d", "gloo", "nccl", "allreduce", "all_reduce", "all_gather",
                 "allgather", "reduce_scatter", "broadcast", "barrier", "all_to_all")


def trace_name(rank: int) -> str:
    return f"trace-rank{rank}.json"


def is_communication(op_name: str) -> bool:
    name = op_name.lower()
    return any(word in name for word in COMMUNICATION)


class StepProfiler:
    """``start()`` before the loop, ``step()`` after every optimizer step, ``finish()`` once
    after training: the rank's summary (or None when profiling is off)."""

    def __init__(self, steps: int, run_dir: Path, rank: int, device_type: str) -> None:
        self.steps, self.rank, self.device_type = steps, rank, device_type
        self.path = Path(run_dir) / trace_name(rank)
        self._profiler = None
        self._summary: dict[str, Any] | None = None

    def start(self) -> None:
        if not self.steps:
            return
        import os

        import torch.profiler as tp

        if self.device_type != "cuda":
            # kineto looks for GPUs anyway and logs "gpuGetDeviceCount failed with code 35"
            # plus trace markers to stderr on CPU-only nodes; it reads this at its first use
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [tp.ProfilerActivity.CPU]
        if self.device_type == "cuda":
            activities.append(tp.ProfilerActivity.CUDA)
        self._profiler = tp.profile(
            activities=activities, on_trace_ready=self._ready,
            schedule=tp.schedule(wait=SKIP_STEPS, warmup=WARMUP_STEPS, active=self.steps,
                                 repeat=1))
        self._profiler.start()

    def step(self) -> None:
        if self._profiler is not None:
            self._profiler.step()

    def finish(self) -> dict[str, Any] | None:
        if self._profiler is not None:
            self._profiler.stop()  # exports if the run ended inside the active steps
            self._profiler = None
        if not self.steps:
            return None
        return self._summary or {"rank": self.rank, "trace": None,
                                 "note": f"the run had fewer than {SKIP_STEPS + WARMUP_STEPS + 1} "
                                         "steps; nothing was profiled"}

    def _ready(self, prof) -> None:
        prof.export_chrome_trace(str(self.path))
        self._summary = summarise(prof.key_averages(), self.rank, self.path,
                                  self.device_type == "cuda")
        if self.device_type == "cuda":
            self._summary["device_idle_share"] = device_idle_share(*_device_activity(prof))


def _device_activity(prof) -> tuple[list[tuple[float, float]], tuple[float, float] | None]:
    """(the device's busy intervals: kernels, copies, sets; the profiled steps' window), in
    the profiler's microseconds. The window runs from the first ``ProfilerStep#`` to the
    end of the last, as the host saw them (kineto puts host and device on one clock)."""
    from torch.autograd import DeviceType

    busy, steps = [], []
    for event in prof.events():
        span = (event.time_range.start, event.time_range.end)
        if event.device_type == DeviceType.CUDA:
            busy.append(span)
        elif event.name.startswith("ProfilerStep#"):
            steps.append(span)
    window = (min(s for s, _ in steps), max(e for _, e in steps)) if steps else None
    return busy, window


def device_idle_share(busy: list[tuple[float, float]], window: tuple[float, float] | None
                      ) -> float | None:
    """The share of ``window`` in which no interval of ``busy`` runs (overlapping kernels
    on several streams count once): how much of the profiled steps the GPU sat idle."""
    if window is None or window[1] <= window[0]:
        return None
    start, end = window
    covered, reach = 0.0, start
    for a, b in sorted(busy):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return 1.0 - covered / (end - start)


def _self_time_us(row, on_device: bool) -> float:
    host = row.self_cpu_time_total
    if not on_device:
        return host
    device = getattr(row, "self_device_time_total", None)
    if device is None:  # older torch
        device = getattr(row, "self_cuda_time_total", 0.0)
    return host + device


def summarise(averages, rank: int, trace: Path, on_device: bool) -> dict[str, Any]:
    rows = [r for r in averages if not r.key.startswith("ProfilerStep")]
    timed = sorted(((r.key, r.count, _self_time_us(r, on_device) / 1e6) for r in rows),
                   key=lambda t: t[2], reverse=True)
    total = sum(t for _, _, t in timed)
    comm = sum(t for name, _, t in timed if is_communication(name))
    data = sum(t for name, _, t in timed if name.startswith("enumerate(DataLoader)"))
    top = [{"op": name, "calls": calls, "self_time_s": t} for name, calls, t in timed[:TOP_OPS]]
    fraction = comm / total if total else 0.0
    text = (f"rank {rank}: {comm * 1e3:.1f} ms of {total * 1e3:.1f} ms profiled op time "
            f"({fraction:.0%}) in communication, {data * 1e3:.1f} ms fetching batches; most "
            "time in " + ", ".join(
                f"{o['op']} ({o['self_time_s'] * 1e3:.1f} ms)" for o in top[:3]))
    return {"rank": rank, "trace": trace.name, "op_time_s": total,
            "communication_time_s": comm, "data_loading_time_s": data,
            "compute_time_s": total - comm - data,
            "communication_fraction": fraction, "top_ops": top, "summary": text}
