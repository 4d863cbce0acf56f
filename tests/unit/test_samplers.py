"""Data sharding: identical global batches for any replica count; exact evaluation."""

import pytest
import torch
from torch.utils.data import TensorDataset

from ddl.worker.train.loaders import EvalShardSampler, train_loader
from ddl.worker.train.metrics import MetricSums

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n, global_batch, replicas", [(103, 8, 2), (100, 12, 4), (50, 6, 3)])
def test_global_batches_do_not_depend_on_replica_count(n, global_batch, replicas):
    dataset = TensorDataset(torch.arange(n))

    def steps(world):
        loaders = [train_loader(dataset, batch_size=global_batch // world, replicas=world,
                                rank=r, seed=5, workers=0, pin_memory=False)
                   for r in range(world)]
        for loader in loaders:
            loader.sampler.set_epoch(3)
        per_rank = [[b[0].tolist() for b in loader] for loader in loaders]
        return [sorted(sum((rank[i] for rank in per_rank), [])) for i in range(len(per_rank[0]))]

    single, sharded = steps(1), steps(replicas)
    assert single == sharded
    assert len(single) == n // global_batch


@pytest.mark.parametrize("n, replicas, batch", [(7, 2, 1), (10, 3, 2), (3, 4, 1), (12, 4, 5)])
def test_eval_shards_cover_each_sample_once(n, replicas, batch):
    samplers = [EvalShardSampler(n, replicas, r, batch) for r in range(replicas)]
    assert len({len(s) for s in samplers}) == 1  # same number of forwards on every rank
    assert len(samplers[0]) % batch == 0  # whole batches only
    real = sorted(i for s in samplers for i in list(s)[: s.real])
    assert real == list(range(n))


def test_metric_sums_weight_out_padding():
    sums = MetricSums(torch.device("cpu"))
    sums.add({"acc": torch.tensor([1.0, 0.0, 1.0])}, weight=torch.tensor([1.0, 1.0, 0.0],
                                                                          dtype=torch.float64))
    sums.add({"acc": torch.tensor([1.0])})

    class OneRank:
        size = 1

    assert sums.reduce(OneRank()) == {"acc": pytest.approx(2 / 3)}
