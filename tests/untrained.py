"""The untrained model's metrics on a split: what a learning test compares a trained run with.

A run's accuracy or loss alone says little: a threshold set just under what one CPU reached
fails on another CPU whose float rounding, amplified over a few epochs, lands lower (issue 44).
The model ddl builds at the run's seed, before any step, evaluated on the same split with
ddl's own evaluation (ddl.worker.train.evaluation), is the reference that "it learned" is measured
from; docs/testing.md ("How learning thresholds are chosen") says how the margin is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ddl.contract.workload import Workload
from ddl.contract.world import World
from ddl.worker.process.distributed import seed_all
from ddl.worker.train.evaluation import evaluate
from ddl.worker.train.loaders import eval_loader


def learning_seed(default: int = 1) -> int:
    """The seed a learning test trains with: DDL_TEST_SEED for a one-off sweep over seeds
    (docs/testing.md records them), else ``default``, so the permanent test is one run."""
    return int(os.environ.get("DDL_TEST_SEED", default))


def untrained_metrics(workload: Workload, data_dir: Path, split: str, seed: int) -> dict:
    """Metrics of the model ddl builds at ``seed`` (ddl.worker.train.setup seeds, then builds),
    before any step, over ``split`` of the workload's datasets, in one process on the CPU."""
    splits = workload.datasets(data_dir)
    seed_all(seed)
    model = workload.build_model().eval()
    world = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")
    loader = eval_loader(splits[split], batch_size=workload.preset.batch_size, replicas=1,
                         rank=0, workers=0, pin_memory=False, split=split)
    return evaluate(lambda inputs, _targets: workload.forward(model, inputs), loader,
                    workload, world)
