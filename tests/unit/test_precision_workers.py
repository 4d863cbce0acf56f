"""Mixed-precision choice and DataLoader worker counts."""

import pytest
import torch

from ddl.contract.errors import UsageError
from ddl.settings.plan import loader_workers
from ddl.worker.precision import Precision, resolve

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


@pytest.mark.parametrize("env, launcher, nproc, configured, expected", [
    ({}, "local", 2, None, 0),                              # local: no allocation to size from
    ({}, "local", 2, 3, 3),                                 # explicit always wins
    ({"SLURM_CPUS_PER_TASK": "12"}, "srun", 4, None, 8),    # srun: 12 cores for 1 rank, capped
    ({"SLURM_CPUS_PER_TASK": "7"}, "srun", 8, None, 6),     # LUMI: 7 cores per GCD
    ({"SLURM_CPUS_PER_TASK": "48"}, "torchrun_jsc", 4, None, 8),  # JSC: 48 / 4 ranks - 1
    ({"SLURM_CPUS_PER_TASK": "8"}, "torchrun", 4, None, 1),
])
def test_loader_workers(env, launcher, nproc, configured, expected):
    """Sized where the plan is made (the launch side), from the allocation the task got."""
    assert loader_workers(configured, launcher, nproc, env) == expected
