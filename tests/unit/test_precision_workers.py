"""Mixed-precision choice and DataLoader worker counts."""

import pytest
import torch

from ddl.settings.config import RunConfig
from ddl.contract.world import World
from ddl.contract.errors import UsageError
from ddl.worker.precision import Precision, resolve
from ddl.worker.trainer import loader_workers

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


@pytest.mark.parametrize("env, configured, expected", [
    ({}, None, 0),                                           # local: no allocation to size from
    ({}, 3, 3),                                              # explicit always wins
    ({"SLURM_CPUS_PER_TASK": "12"}, None, 8),                # srun style: 12 cores for 1 rank, capped
    ({"SLURM_CPUS_PER_TASK": "7"}, None, 6),                 # LUMI: 7 cores per GCD
    ({"SLURM_CPUS_PER_TASK": "48", "DDL_LAUNCHED_PER_NODE": "1",
      "LOCAL_WORLD_SIZE": "4"}, None, 8),                    # JSC torchrun: 48 / 4 ranks - 1
    ({"SLURM_CPUS_PER_TASK": "8", "DDL_LAUNCHED_PER_NODE": "1",
      "LOCAL_WORLD_SIZE": "4"}, None, 1),
])
def test_loader_workers(monkeypatch, env, configured, expected):
    for var in ("SLURM_CPUS_PER_TASK", "DDL_LAUNCHED_PER_NODE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    world = World(rank=0, local_rank=0, size=1, device=CPU, backend="gloo")
    assert loader_workers(RunConfig(workers=configured), world) == expected
