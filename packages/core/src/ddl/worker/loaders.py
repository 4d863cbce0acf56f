"""Splitting datasets over data-parallel replicas.

Training uses torch's DistributedSampler with ``drop_last`` in both the sampler and the
loader: for a fixed seed and global batch, step k then sees exactly the same samples
whatever the number of replicas, which is what makes runs of different layouts comparable
(and the equivalence tests possible).

Evaluation must count every sample exactly once. DistributedSampler would pad the last
shard with duplicates, biasing the metrics; :class:`EvalShardSampler` pads too (so every
rank runs the same number of forwards, which FSDP and tensor parallel need) but the trainer
knows which positions are padding and gives them zero weight.

Both loaders read through ``ddl.worker.samples``: a sample that fails names its split and
index (a lying ``__len__`` included), a batch that does not collate names its samples.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from torch.utils.data import DataLoader, Sampler
from torch.utils.data.distributed import DistributedSampler

from ddl.worker.samples import UNNAMED, GuardedCollate, GuardedDataset

if TYPE_CHECKING:
    from torch.utils.data import Dataset


class EvalShardSampler(Sampler[int]):
    """Replica r reads samples r, r+R, r+2R, ... then pads with early indices up to the same
    count on every replica, rounded up to whole batches (so every forward has the batch
    shape that training had; pipeline stages and compiled models need that)."""

    def __init__(self, dataset_len: int, replicas: int, rank: int, batch_size: int = 1) -> None:
        self.dataset_len = dataset_len
        self.real = len(range(rank, dataset_len, replicas))  # samples this replica owns
        per_replica = math.ceil(dataset_len / replicas)
        self.total = math.ceil(per_replica / batch_size) * batch_size
        self._indices = list(range(rank, dataset_len, replicas))
        self._indices += [i % dataset_len for i in range(self.total - self.real)]

    def __iter__(self):
        return iter(self._indices)

    def __len__(self) -> int:
        return self.total


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can begin an epoch part-way through, after a resume: the
    order is the epoch's usual one (seed + epoch), the first ``start`` samples of this
    replica's shard are skipped."""

    start = 0

    def __iter__(self):
        return iter(list(super().__iter__())[self.start:])


def train_loader(dataset: Dataset, *, batch_size: int, replicas: int, rank: int, seed: int,
                 workers: int, pin_memory: bool) -> DataLoader:
    sampler = ResumableSampler(dataset, num_replicas=replicas, rank=rank, shuffle=True,
                               seed=seed, drop_last=True)
    return DataLoader(GuardedDataset(dataset, "train"), batch_size=batch_size,
                      sampler=sampler, drop_last=True, num_workers=workers,
                      pin_memory=pin_memory, collate_fn=GuardedCollate("train"))
    # Not persistent_workers: fresh workers each epoch draw their seeds from the main
    # process's RNG, which a checkpoint restores, so a run resumed at an epoch boundary
    # augments exactly as an uninterrupted one (persistent workers would carry their own
    # RNG streams across epochs, which no checkpoint holds).


def eval_loader(dataset: Dataset, *, batch_size: int, replicas: int, rank: int, workers: int,
                pin_memory: bool, split: str = UNNAMED) -> DataLoader:
    sampler = EvalShardSampler(len(dataset), replicas, rank, batch_size)
    return DataLoader(GuardedDataset(dataset, split), batch_size=batch_size, sampler=sampler,
                      shuffle=False, num_workers=workers, pin_memory=pin_memory,
                      collate_fn=GuardedCollate(split))
