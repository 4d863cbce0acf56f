"""Collectives a step pays for beside the gradients', read from the workload's own model
so that a plugin declares nothing: weights several pipeline ranks hold (the example GPT's
``Stage`` keeps its tied ``tok_emb`` on both end stages; ``Planner.shared_weights``) are
all-reduced after each schedule run, and DDP broadcasts rank 0's buffers (BatchNorm's
statistics; ``Planner.buffer_groups``) before every forward, one call per dtype."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import gpt_example_workload
from ddl.contract.layout import ParallelLayout
from ddl.planning import step_time_model as stm
from ddl.planning.planner import Device, Planner

pytestmark = pytest.mark.unit

CPU = Device("cpu", 1, 1 << 34, None, None, None)


def test_the_example_gpts_tied_embedding_is_shared_by_its_end_stages(tmp_path):
    workload = gpt_example_workload()
    planner = Planner(workload, Path(tmp_path), CPU)
    emb = planner.model.tok_emb.weight
    assert planner.shared_weights(ParallelLayout(pp=2)) == (1, emb.numel() * 4)
    # replicas of the pipeline: each holds its pair of copies
    assert planner.shared_weights(ParallelLayout(pp=2, dp_shard=2)) == (1, emb.numel() * 4)
    assert planner.shared_weights(ParallelLayout(dp_shard=2)) == (0, 0)  # no pipeline


def test_stages_that_share_nothing_have_no_shared_weights(tmp_path):
    from ddl_mnist.plugin import PRESETS
    from ddl_mnist.workload import MnistWorkload

    planner = Planner(MnistWorkload(PRESETS["tiny"]), Path(tmp_path), CPU)
    assert planner.shared_weights(ParallelLayout(pp=2)) == (0, 0)


def test_ddp_broadcasts_the_buffers_of_a_batchnorm_model_once_per_forward(tmp_path):
    """CIFAR tiny's ResNet: 13 BatchNorm layers, fp32 statistics and int64 counters, two
    broadcast calls per forward, each on the p2p fit; MNIST's CNN has no buffers."""
    import torch

    from ddl_cifar.plugin import PRESETS
    from ddl_cifar.workload import CifarWorkload

    workload = CifarWorkload(PRESETS["tiny"])
    planner = Planner(workload, Path(tmp_path), CPU)
    real = workload.build_model()
    batchnorms = [m for m in real.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert batchnorms
    nbytes = sum(b.numel() * b.element_size() for b in real.buffers())
    assert planner.buffer_groups() == (2, nbytes)

    network = stm.Network(stm.Link(1.0, 1e9, {"p2p": (1e-3, 1e6)}))
    compute = stm.Compute(1e12, cpu=True, cores=2)
    sizes = stm.Sizes(4e4, buffers=(2, 5e3))
    for accumulation in (1, 3):  # every micro-step's forward broadcasts
        layout = stm.StepLayout(ParallelLayout(dp_replicate=2), micro_batch=8,
                                accumulation=accumulation)
        with_buffers, without = (stm.step_time(layout, 1e6, compute, s, network,
                                               local_ranks=2).exposed_s["dp_replicate"]
                                 for s in (sizes, stm.Sizes(4e4)))
        assert with_buffers - without == pytest.approx(accumulation * (2 * 1e-3 + 5e3 / 1e6))
    fsdp = stm.StepLayout(ParallelLayout(dp_replicate=2, dp_shard=1, tp=2), micro_batch=8)
    assert stm.comm_seconds(fsdp, sizes, network)["dp_replicate"] == \
        stm.comm_seconds(fsdp, stm.Sizes(4e4), network)["dp_replicate"]  # FSDP2: none
