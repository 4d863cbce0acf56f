"""Mixed-precision choice (DataLoader worker counts: test_loader_workers.py)."""

import pytest
import torch

from ddl.contract.errors import UsageError
from ddl.worker.train.precision import Precision, resolve

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")


def test_cpu_precisions():
    assert resolve("auto", CPU) == "fp32"
    assert resolve("bf16", CPU) == "bf16"
    with pytest.raises(UsageError, match="fp16 needs a GPU"):
        resolve("fp16", CPU)


def test_bf16_autocast_runs_the_forward_in_bf16_and_keeps_fp32_weights():
    layer = torch.nn.Linear(4, 4)
    precision = Precision.create("bf16", CPU)
    with precision.autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    with Precision.create("fp32", CPU).autocast():
        assert layer(torch.randn(2, 4)).dtype == torch.float32
