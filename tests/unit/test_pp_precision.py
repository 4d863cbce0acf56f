"""pp refuses fp16 instead of training without loss scaling.

fp16 exists only on GPUs, which this machine lacks: the World below names a CUDA device
that is never touched (the check only asks which precision the run would use), so this is
the one place the device is a stand-in. bf16 and fp32 pass the same check.
"""


import pytest
import torch

from ddl.contract.world import World
from ddl.contract.errors import UsageError
from ddl.contract.strategy import StrategyContext
from ddl_strategies.shorthands import Pipeline

pytestmark = pytest.mark.unit

GPU_WORLD = World(rank=0, local_rank=0, size=2, device=torch.device("cuda", 0), backend="nccl")


def _check(precision: str) -> None:
    strategy = Pipeline()
    strategy.check(StrategyContext(world=GPU_WORLD, layout=strategy.resolve_layout({}, 2),
                                   workload=_Splittable(), precision=precision))


class _Splittable:
    """Only what the check reads: a workload that declares pipeline split points."""

    def pipeline_splits(self, model):
        return ["second"]


def test_fp16_is_refused_with_what_is_allowed():
    with pytest.raises(UsageError, match=r"pp does not scale fp16.*allowed with pp: fp32, bf16"):
        _check("fp16")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fp32_and_bf16_pass(precision):
    _check(precision)
