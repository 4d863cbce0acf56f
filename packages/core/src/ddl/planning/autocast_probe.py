"""``ddl plan``'s activation probe under mixed precision: what a micro-batch keeps for backward
when the run computes in bf16 or fp16 autocast (``--precision``; ``auto`` is 16-bit on GPUs).

Autocast does not act on the meta device the probe normally runs on (no dispatch key for
it), so a 16-bit probe runs on *fake* tensors of the run's device type instead
(``torch._subclasses.fake_tensor.FakeTensorMode``: shapes, dtypes and devices, no memory,
no arithmetic, no device needed; a CUDA build of torch makes fake CUDA tensors without a
GPU). Then torch's own autocast decides, op by op, what is computed - and so saved - in
16 bits: on CUDA its GPU policy (matmuls, convolutions and linear layers in 16 bits, the
reductions, norms and losses of its fp32 list in fp32), on a CPU its CPU policy. bf16
and fp16 keep the same bytes, so the probe uses bf16 for both.

``torch.autocast("cuda")`` switches itself off where no GPU is visible, so on a CPU-only
machine planning for a GPU site the CUDA autocast state is set directly (and restored).
What this reproduces was checked against the saved-tensor meter of real CPU runs under
``--precision bf16`` (tests/distributed/test_plan_precision.py); the CUDA policy runs here only
on fake tensors, never against a GPU run's meter (the GPU kit records that comparison).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

SIXTEEN_BIT = ("bf16", "fp16")


def planned_precision(requested: str, device_kind: str) -> str:
    """The precision a run on ``device_kind`` computes in: ``auto`` is 16-bit autocast on
    GPUs (bf16, or fp16 on GPUs without bf16: the same bytes) and fp32 on a CPU
    (ddl.worker.train.precision.resolve)."""
    if requested != "auto":
        return requested
    return "fp32" if device_kind == "cpu" else "bf16"


@contextmanager
def fake_device(model: nn.Module, batch: tuple[Any, ...], precision: str, device_type: str):
    """Inside: ``model`` (built on the meta device) and ``batch`` (meta tensors) as fake
    tensors on ``device_type`` ("cpu" or "cuda"), and autocast on as the run has it.
    Yields the converted batch; the model is converted in place. fp32: nothing changes
    (the meta device, as before)."""
    if precision not in SIXTEEN_BIT:
        yield batch
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    device = torch.device(device_type)
    with ExitStack() as stack:
        stack.enter_context(_no_gpu_context())
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        model.to_empty(device=device)
        moved = tree_map(lambda t: torch.empty_like(t, device=device)
                         if isinstance(t, torch.Tensor) else t, batch)
        stack.enter_context(_autocast(device_type))
        yield moved


@contextmanager
def _no_gpu_context():
    """Fake CUDA tensors must not touch a real GPU: torch (2.14) creates a CUDA context
    for the first fake CUDA tensor wherever a GPU is visible (``init_gpu_context``, for a
    fake backward; the probe runs none). On a GPU node that would leave a context of
    several hundred MiB on GPU 0 in every rank that plans (``ddl train --mesh auto``) and in
    a ``--verify`` job's planner while its layouts train."""
    from torch._subclasses import fake_tensor

    real = fake_tensor.init_gpu_context
    fake_tensor.init_gpu_context = lambda device: None
    try:
        yield
    finally:
        fake_tensor.init_gpu_context = real


@contextmanager
def _autocast(device_type: str):
    if device_type == "cpu":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
        return
    was = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", was[0])
        torch.set_autocast_dtype("cuda", was[1])
