"""The data pipeline alone, for benchmarks: how many training images per second the
DataLoader delivers (JPEG decode + RandomResizedCrop + flip + normalise, or the decode
cache's copies and the crops ``to_device`` makes of them), with no model.

On GPUs this workload is often input-bound (the talk's 4-GPU epoch of ~8 s is ~1100
images/s), so knowing the loader's ceiling for a given number of workers tells whether
adding GPUs can help at all.
"""

from __future__ import annotations

import time
from pathlib import Path


def loader_throughput(data_dir: Path | str, workers: int, n_batches: int, *,
                      batch_size: int = 64, image_size: int = 160, warmup_batches: int = 2,
                      seed: int = 0, decode_cache: bool = True) -> float:
    """Images per second from the training DataLoader over ``n_batches`` batches, after
    ``warmup_batches`` (worker start-up, first file opens) that are not timed; batches go
    through the workload's ``to_device`` on the CPU."""
    import torch

    from ddl.contract.specs import Preset
    from ddl_imagewoof.workload import ImagewoofWorkload

    preset = Preset(name="bench", summary="loader benchmark", epochs=1, batch_size=batch_size,
                    lr=1e-3, options={"image_size": image_size, "decode_cache": decode_cache})
    workload = ImagewoofWorkload(preset)
    train = workload.datasets(Path(data_dir))["train"]
    cpu = torch.device("cpu")
    return dataset_throughput(train, workers, n_batches, batch_size=batch_size,
                              warmup_batches=warmup_batches, seed=seed,
                              move=lambda batch: workload.to_device(batch, cpu))


def dataset_throughput(dataset, workers: int, n_batches: int, *, batch_size: int,
                       warmup_batches: int = 2, seed: int = 0, move=None) -> float:
    """Samples per second a DataLoader over ``dataset`` delivers, each batch passed through
    ``move`` if given (a workload's ``to_device``); samples are drawn with replacement, so
    any dataset size serves any number of batches."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    if n_batches < 1 or workers < 0 or batch_size < 1 or warmup_batches < 0:
        raise ValueError("need n_batches >= 1, workers >= 0, batch_size >= 1, "
                         "warmup_batches >= 0")
    generator = torch.Generator().manual_seed(seed)
    total = (n_batches + warmup_batches) * batch_size
    sampler = RandomSampler(dataset, replacement=True, num_samples=total, generator=generator)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                        drop_last=True)
    batches = (move(batch) if move else batch for batch in loader)
    for _ in range(warmup_batches):
        next(batches)
    start = time.perf_counter()
    samples = 0
    for _, targets in batches:
        samples += len(targets)
    return samples / (time.perf_counter() - start)
