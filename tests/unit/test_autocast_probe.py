"""ddl.planning.autocast_probe, the 16-bit activation probe's set-up: fake tensors of the run's
device type under torch's autocast, on a machine without a GPU. Whole plans against real
bf16 runs: tests/distributed/test_plan_precision.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ddl.planning import autocast_probe

pytestmark = pytest.mark.unit


def _meta():
    with torch.device("meta"):
        return nn.Linear(16, 8), torch.empty(4, 16)


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_16_bit_forward_on_fake_tensors_and_state_restored(device_type):
    model, x = _meta()
    with autocast_probe.fake_device(model, (x,), "bf16", device_type) as (fx,):
        out = model(fx)
        assert out.dtype == torch.bfloat16 and out.device.type == device_type
        assert type(out).__name__ == "FakeTensor"
    assert not torch.is_autocast_enabled(device_type)
    assert torch.get_autocast_dtype("cuda") == torch.float16  # torch's default, restored
    real = nn.Linear(16, 8)(torch.randn(4, 16))  # nothing fake or autocast left behind
    assert real.dtype == torch.float32 and type(real) is torch.Tensor


def test_fp32_leaves_the_meta_device_alone():
    model, x = _meta()
    with autocast_probe.fake_device(model, (x,), "fp32", "cuda") as (same,):
        assert same is x and next(model.parameters()).is_meta


def test_fake_cuda_tensors_never_create_a_gpu_context(monkeypatch):
    """On a GPU node torch would create a real CUDA context for the first fake CUDA tensor
    (fake_tensor.init_gpu_context): several hundred MiB on GPU 0 in every planning rank.
    Stood in for here (no GPU) by a recorder in its place: the probe must not call it."""
    from torch._subclasses import fake_tensor

    calls = []

    def would_touch_the_gpu(device):
        calls.append(device)

    monkeypatch.setattr(fake_tensor, "init_gpu_context", would_touch_the_gpu)
    model, x = _meta()
    with autocast_probe.fake_device(model, (x,), "bf16", "cuda") as (fx,):
        model(fx)
    assert calls == []
    assert fake_tensor.init_gpu_context is would_touch_the_gpu  # restored afterwards


def test_auto_is_16_bit_on_gpus_only():
    assert autocast_probe.planned_precision("auto", "cuda") == "bf16"
    assert autocast_probe.planned_precision("auto", "rocm") == "bf16"
    assert autocast_probe.planned_precision("auto", "cpu") == "fp32"
    assert autocast_probe.planned_precision("fp16", "cpu") == "fp16"
