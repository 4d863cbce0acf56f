"""ddl.worker.build.build_memory: the peak of a block, exactly (the kernel's high-water mark, not
samples), above what the process held before it; the process's own peak survives the
reset. Linux CPUs (this machine); the GPU path reads torch's allocator and has not run
here."""

import pytest
import torch

from ddl.worker.build import build_memory

pytestmark = pytest.mark.unit

MB = 2**20


def _touch(n_bytes: int) -> torch.Tensor:
    t = torch.empty(n_bytes // 4, dtype=torch.float32)
    t.fill_(1.0)  # resident, not just reserved
    return t


def test_a_freed_allocation_still_counts_and_earlier_memory_does_not():
    held_before = _touch(64 * MB)  # resident before the block: not the block's cost
    with build_memory.measure(torch.device("cpu")) as peak:
        spike = _touch(48 * MB)
        del spike  # gone before the block ends: a sampler could miss it, the mark does not
    assert peak.bytes is not None
    assert 44 * MB <= peak.bytes < 60 * MB, peak.bytes
    del held_before


def test_the_process_peak_keeps_what_came_before_the_reset():
    big = _touch(96 * MB)
    del big
    before = build_memory.process_peak()
    with build_memory.measure(torch.device("cpu")):
        pass
    assert build_memory.process_peak() >= before
