"""Loader workers per rank (decided with the run plan), the epoch hook the training sampler
calls on its dataset, and DeviceBatches on the CPU (its CUDA side-stream path needs a GPU:
not run here)."""

import os

import pytest
import torch
from torch.utils.data import Dataset

from ddl.settings.plan import MAX_LOADER_WORKERS, loader_workers, usable_cores
from ddl.worker.train.loaders import DeviceBatches, train_loader

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("env, launcher, nproc, cores, configured, expected", [
    ({}, "local", 2, 2, 3, 3),                                  # explicit always wins
    ({"SLURM_CPUS_PER_TASK": "12"}, "srun", 4, 64, 0, 0),       # so does an explicit 0
    ({}, "local", 2, 2, None, 0),                               # this 2-core machine
    ({}, "local", 1, 16, None, 8),                              # workstation: capped at 8
    ({}, "local", 4, 16, None, 3),                              # 16 cores / 4 ranks - 1
    ({}, "worker", 8, 32, None, 3),                             # torchrun by hand
    ({"SLURM_CPUS_PER_TASK": "12"}, "srun", 4, 64, None, 8),    # srun: 12 cores for 1 rank
    ({"SLURM_CPUS_PER_TASK": "7"}, "srun", 8, 64, None, 6),     # LUMI: 7 cores per GCD
    ({"SLURM_CPUS_PER_TASK": "48"}, "torchrun_jsc", 4, 48, None, 8),  # JSC: 48/4 - 1 = 11
    ({"SLURM_CPUS_PER_TASK": "8"}, "torchrun", 4, 8, None, 1),
    ({"SLURM_CPUS_PER_TASK": "32"}, "local", 4, 128, None, 7),  # a batch script's task
    ({"SLURM_CPUS_PER_TASK": "1"}, "srun", 1, 128, None, 0),    # one core: the rank's own
])
def test_loader_workers_rule(env, launcher, nproc, cores, configured, expected):
    """Slurm's cpus-per-task when the job has it (not the node's cores: the allocation is
    what the job may use), else the cores this process may run on, shared by the node's
    ranks; one core stays with each rank."""
    assert loader_workers(configured, launcher, nproc, env, cores=cores) == expected


def test_usable_cores_is_this_process_affinity():
    assert usable_cores() == len(os.sched_getaffinity(0)) >= 1
    n = usable_cores()
    assert loader_workers(None, "local", 1, {}) == max(0, min(MAX_LOADER_WORKERS, n - 1))


class Numbers(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[tuple[int, int]] = []

    def begin_epoch(self, epoch: int, seed: int) -> None:
        self.epochs.append((epoch, seed))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i)]), i


def test_the_training_sampler_tells_its_dataset_the_epoch_and_seed():
    data = Numbers(16)
    loader = train_loader(data, batch_size=4, replicas=2, rank=1, seed=11, workers=0,
                          pin_memory=False)
    loader.sampler.set_epoch(0)
    loader.sampler.set_epoch(3)
    assert data.epochs == [(0, 11), (3, 11)]
    # a dataset without the hook is fine
    plain = train_loader(torch.utils.data.TensorDataset(torch.zeros(8, 1), torch.zeros(8)),
                         batch_size=4, replicas=1, rank=0, seed=0, workers=0, pin_memory=False)
    plain.sampler.set_epoch(1)


def test_device_batches_on_cpu_move_each_batch_when_asked():
    moved = []

    def move(batch):
        moved.append(int(batch[1][0]))
        return batch[0] * 2, batch[1]

    loader = torch.utils.data.DataLoader(Numbers(12), batch_size=4)
    batches = DeviceBatches(loader, move, torch.device("cpu"))
    assert moved == []  # nothing to overlap on a CPU: no batch is read ahead
    first = next(batches)
    assert moved == [0] and torch.equal(first[0][:, 0], torch.tensor([0.0, 2, 4, 6]))
    rest = list(batches)
    assert moved == [0, 4, 8] and [int(t[0]) for _, t in rest] == [4, 8]
    with pytest.raises(StopIteration):
        next(batches)
