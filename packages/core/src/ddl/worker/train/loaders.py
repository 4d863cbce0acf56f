"""Splitting datasets over data-parallel replicas.

Training uses torch's DistributedSampler with ``drop_last`` in both the sampler and the
loader: for a fixed seed and global batch, step k then sees exactly the same samples
whatever the number of replicas, which is what makes runs of different layouts comparable
(and the equivalence tests possible).

Evaluation must count every sample exactly once. DistributedSampler would pad the last
shard with duplicates, biasing the metrics; :class:`EvalShardSampler` pads too (so every
rank runs the same number of forwards, which FSDP and tensor parallel need) but the trainer
knows which positions are padding and gives them zero weight.

Both loaders read through ``ddl.worker.train.samples``: a sample that fails names its split and
index (a lying ``__len__`` included), a batch that does not collate names its samples.

A training dataset with a ``begin_epoch(epoch, seed)`` method is told the epoch and the
run's seed before each epoch's loader starts (the sampler's ``set_epoch``), so it can draw
per-sample randomness from (seed, epoch, index): augmentation that is the same on any
rank and any number of loader processes (Imagewoof's device-side crops).

:class:`DeviceBatches` moves batches to the device one ahead of the training step: on CUDA
on a side stream, so the host-to-device copy (and whatever a workload's ``to_device`` does
there) overlaps the previous step's compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data.distributed import DistributedSampler

from ddl.worker.train.samples import UNNAMED, GuardedCollate, GuardedDataset

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

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        begin = getattr(self.dataset, "begin_epoch", None)
        if callable(begin):  # before iter(loader): fresh loader processes copy the dataset
            begin(epoch, self.seed)

    def __iter__(self):
        return iter(list(super().__iter__())[self.start:])


class DeviceBatches:
    """``batches`` passed through ``move`` (typically ``workload.to_device``), one ahead.

    On CUDA, ``move`` runs for batch k+1 on a side stream as soon as batch k is handed out,
    so its non-blocking copies (from the loader's pinned memory) and any device-side
    augmentation overlap step k's compute; the main stream waits on the side stream's work
    before it uses a batch, and every tensor of it is marked as used by the main stream so
    the caching allocator does not hand its memory out early. Elsewhere (CPU) it moves each
    batch when asked: there is nothing to overlap.
    """

    def __init__(self, batches: Iterable, move: Callable[[Any], Any],
                 device: torch.device) -> None:
        self._batches = iter(batches)
        self._move = move
        self._device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._ahead: Any = None
        self._exhausted = False
        if self._stream is not None:
            self._load_ahead()

    def _load_ahead(self) -> None:
        try:
            batch = next(self._batches)
        except StopIteration:
            self._exhausted = True
            return
        with torch.cuda.stream(self._stream):
            self._ahead = self._move(batch)

    def __iter__(self) -> DeviceBatches:
        return self

    def __next__(self) -> Any:
        if self._stream is None:
            return self._move(next(self._batches))
        if self._exhausted:
            raise StopIteration
        main = torch.cuda.current_stream(self._device)
        main.wait_stream(self._stream)
        batch, self._ahead = self._ahead, None
        _used_on(batch, main)
        self._load_ahead()
        return batch


def _used_on(batch: Any, stream: torch.cuda.Stream) -> None:
    """``record_stream`` on every tensor in a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            _used_on(item, stream)
    elif isinstance(batch, dict):
        for item in batch.values():
            _used_on(item, stream)


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
