"""The default pipeline cut (issue 51, item 6): stages balanced by size - parameters, or
the costs a workload gives (``Workload.pipeline_costs``: FLOPs) - not by split-point index.
A model of 4 equal blocks and a tiny head at pp=4 was cut [embed, b0] [b1] [b2, b3] [head]
by ``round()``: a head-only last stage. The equivalence of a different cut with one
process is tests/distributed/test_equivalence_matrix.py's (pp cells)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ddl.contract.workload import Workload, balanced_cut, segment_parameters

pytestmark = pytest.mark.unit


class Blocks(Workload):
    """4 blocks of 32 x 32 + a 32 -> 2 head: the shape of the ViT in issue 51."""

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(8, 32), *(nn.Linear(32, 32) for _ in range(4)),
                             nn.Linear(32, 2))

    def pipeline_splits(self, model):  # b1, b2, b3, head (the embedding stays with b0)
        return ["2", "3", "4", "5"]

    def datasets(self, data_dir):
        raise NotImplementedError

    def loss(self, outputs, targets):
        return nn.functional.cross_entropy(outputs, targets)

    def sample_metrics(self, outputs, targets):
        return {}

    def optimizer(self, params, lr):
        return torch.optim.SGD(params, lr)


def _old_rule(splits, n):
    return [splits[round(i * (len(splits) + 1) / n) - 1] for i in range(1, n)]


def _params(stage):
    return sum(p.numel() for p in stage.parameters())


def test_four_blocks_and_a_tiny_head_are_not_cut_head_only():
    work = Blocks.__new__(Blocks)
    model = work.build_model()
    splits = work.pipeline_splits(model)
    assert _old_rule(splits, 4) == ["2", "3", "5"]  # [0,1] [2] [3,4] [5]: the head alone
    stages = work.pipeline_stages(model, 4)
    sizes = [_params(s) for s in stages]
    assert [list(dict(s.named_children())) for s in stages] == \
        [["0", "1"], ["2"], ["3"], ["4", "5"]]
    assert sizes == [288 + 1056, 1056, 1056, 1056 + 66]  # was 1344, 1056, 2112, 66
    assert max(sizes) < 2 * 1056
    # the stages still chain into the whole model
    x = torch.randn(3, 8)
    y = x
    for stage in stages:
        y = stage(y)
    torch.testing.assert_close(y, model(x))


def test_balanced_cut_minimises_the_largest_stage_then_spreads_evenly():
    assert balanced_cut([5, 4, 4, 4, 0.1], 4) == [1, 2, 3]
    assert balanced_cut([1] * 8, 4) == [2, 4, 6]  # equal segments: the even spread
    assert balanced_cut([1, 2, 3, 4, 5, 6], 3) == [3, 5]  # stages 6, 9, 6
    # equal largest stages: the more even one, then the one nearest the even index
    assert balanced_cut([208, 3216, 0, 2570], 2) == [2]  # MNIST tiny: cut at flatten, as before
    assert balanced_cut([3, 3], 1) == []
    with pytest.raises(ValueError):
        balanced_cut([1, 2], 3)


def test_parameters_per_segment_pass_over_a_split_without_parameters():
    model = nn.Sequential()
    model.add_module("a", nn.Linear(2, 2))
    model.add_module("flat", nn.Flatten())
    model.add_module("head", nn.Linear(2, 1))
    assert segment_parameters(model, ["flat", "head"]) == [6, 0, 3]


def test_a_workload_that_knows_its_flops_is_balanced_by_them():
    """cifar's ResNet: the last stage holds most parameters but not most of the work;
    pipeline_costs gives the forward multiply-adds per segment, and the cut follows them."""
    from ddl.contract.plugins import Plugins

    spec = Plugins().workload("cifar")
    work = spec.create(spec.presets["tiny"])
    with torch.device("meta"):
        net = work.build_model()
    costs = work.pipeline_costs(net)
    assert len(costs) == len(work.pipeline_splits(net)) + 1
    assert sum(costs) == pytest.approx(work.flops_per_sample() / 6)
    assert work.pipeline_cut(net, 2) == [work.pipeline_splits(net)[
        balanced_cut(costs, 2)[0] - 1]]
    assert len(work.pipeline_stages(net, 2)) == 2


def test_t5_is_cut_by_its_blocks_work_not_their_count():
    """xsum cuts T5 itself (an encoder-decoder is no chain), with the same balanced cut over
    its blocks' multiply-adds: an encoder block sees 512 source tokens, a decoder block 150
    summary tokens, so t5-3b's 24 + 24 blocks split 18 | 30 at pp=2, not 24 | 24 (by block
    count the encoder's stage did 66 % of the work)."""
    from types import SimpleNamespace

    from ddl.contract.plugins import Plugins

    spec = Plugins().workload("xsum")
    work = spec.create(spec.presets["t5-3b"])
    blocks = SimpleNamespace(encoder=SimpleNamespace(block=[None] * 24),
                             decoder=SimpleNamespace(block=[None] * 24))
    costs = work.pipeline_costs(blocks)
    assert len(costs) == 48 and costs[0] > 1.9 * costs[30]
    assert sum(costs) == pytest.approx(work.flops_per_sample() / 6)
    assert balanced_cut(costs, 2) == [18]
    assert sum(costs[:18]) / sum(costs) == pytest.approx(0.5, abs=0.01)
    assert sum(costs[:24]) / sum(costs) > 0.65  # the old cut by count
