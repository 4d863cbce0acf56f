"""Per-rank memory of what training keeps: parameters, gradients, optimizer state.

Counted from the tensors this rank actually holds (for sharded DTensors, the local shard),
so DDP shows the full model on every rank and FSDP about 1/N of it. The process's peak
resident memory (and, on GPUs, torch's peak allocation) are reported next to it.
"""

from __future__ import annotations

import resource
from typing import Any

import torch
import torch.distributed as dist

from ddl.worker.build import build_memory


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def rank_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                device: torch.device) -> dict[str, int]:
    params = sum(_local_bytes(p) for p in model.parameters())
    grads = sum(_local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    state = sum(_local_bytes(v) for s in optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    report = {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": state,
              "model_state_bytes": params + grads + state,
              "peak_rss_bytes": build_memory.process_peak()}
    baseline = build_memory.baseline_rss()
    if baseline is not None:
        report["baseline_rss_bytes"] = baseline
    if device.type == "cuda":
        report["device_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        report["device_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return report


def current(device: torch.device) -> dict[str, int]:
    """This process's memory now, cheap enough for the live state (``ddl.worker.observe.live``): the
    resident set (Linux /proc; else the peak), its peak, and on a GPU torch's allocation
    counters (host-side numbers: no device synchronisation)."""
    peak = now = build_memory.process_peak()
    try:
        with open("/proc/self/statm") as f:
            now = int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        pass
    report = {"rss_bytes": now, "peak_rss_bytes": max(peak, now)}  # the peak lags a little
    if device.type == "cuda":
        report["device_allocated_bytes"] = torch.cuda.memory_allocated(device)
        report["device_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return report


def gather(report: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    """Every rank's report, in rank order (a collective)."""
    if world_size == 1:
        return [report]
    reports: list[Any] = [None] * world_size
    dist.all_gather_object(reports, report)
    return reports
