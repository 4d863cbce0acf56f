"""Metric averaging and uneven evaluation shards over a real gloo process group."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset

pytestmark = pytest.mark.distributed


def _worker(rank, world_size, init_file, n, queue):
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    from ddl.worker.train.loaders import eval_loader
    from ddl.contract.world import World
    from ddl.worker.train.trainer import evaluate

    class Echo:
        """A workload whose 'model' returns its input: metrics are the sample values."""

        def to_device(self, batch, device):
            return batch[0], batch[0]

        def sample_metrics(self, outputs, targets):
            return {"value": outputs.float(), "square": outputs.float() ** 2}

    world = World(rank=rank, local_rank=rank, size=world_size, device=torch.device("cpu"),
                  backend="gloo")
    loader = eval_loader(TensorDataset(torch.arange(n)), batch_size=2, replicas=world_size,
                         rank=rank, workers=0, pin_memory=False)
    queue.put((rank, evaluate(lambda inputs, targets: inputs, loader, Echo(), world)))
    dist.destroy_process_group()


@pytest.mark.parametrize("n, world_size", [(7, 2), (10, 3)])
def test_evaluation_is_exact_with_uneven_shards(tmp_path, n, world_size):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(_worker, args=(world_size, str(tmp_path / "init"), n, queue), nprocs=world_size)
    results = dict(queue.get() for _ in range(world_size))
    expected = {"value": sum(range(n)) / n, "square": sum(i * i for i in range(n)) / n}
    for rank in range(world_size):  # every rank gets the same global means
        assert results[rank] == pytest.approx(expected)
