"""The CPU sync counter (ddl.worker.observe.step_breakdown) finds a read of a tensor's value made
outside torch, names its line, ignores reads inside torch and while the loader runs, and
leaves torch.Tensor as it was. What a training step reads is checked in
tests/distributed/test_step_syncs.py."""

import inspect

import pytest
import torch

from ddl.worker.observe.step_breakdown import READERS, StepBreakdown, SyncCounter

pytestmark = pytest.mark.unit


def _line_of(marker: str) -> int:
    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text and "_line_of" not in text)


def test_a_planted_item_is_counted_with_its_line():
    counter = SyncCounter(torch.device("cpu"))
    loss = torch.tensor(1.5)
    with counter.counting() as found:
        loss.item()  # planted-read
        float(loss * 2)  # planted-float
        torch.stack([loss, loss]).sum()  # no read: stays a tensor
    here = f"test_sync_counter.py:{_line_of('# planted-read')}"
    assert found == {here: 1, f"test_sync_counter.py:{_line_of('# planted-float')}": 1}
    assert counter.where == found


def test_reads_inside_torch_and_while_loading_are_not_counted():
    counter = SyncCounter(torch.device("cpu"))
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    optimizer = torch.optim.Adam([param], lr=0.1)  # reads its host-side step count itself
    with counter.counting() as found:
        optimizer.step()
        counter.loading(True)
        int(torch.tensor(3))  # a data set reading its own host tensor
        counter.loading(False)
    assert not found


def test_torch_tensor_is_restored_after_counting():
    before = {name: getattr(torch.Tensor, name) for name in READERS}
    counter = SyncCounter(torch.device("cpu"))
    with pytest.raises(RuntimeError):
        with counter.counting():
            raise RuntimeError("a failing step")
    assert {name: getattr(torch.Tensor, name) for name in READERS} == before


def test_breakdown_attributes_syncs_to_the_flag_that_asked():
    breakdown = StepBreakdown(torch.device("cpu"), count_syncs=True)
    loss = torch.tensor(2.0)
    # (the flag that asked for a read, whether the step reads): the first step, one-off
    # costs, is left out even though it reads
    steps = [(None, True), (None, True), ("--log-every", True), (None, False)]
    for asked, reads in steps:
        with breakdown.step() as syncs:
            breakdown.started()
            breakdown.fetched()
            breakdown.stepped()
            if reads:
                loss.item()  # step-read
        breakdown.ended(asked, syncs)
    record = breakdown.record()
    line = f"test_sync_counter.py:{_line_of('# step-read')}"
    assert record["steps"] == 3
    assert record["syncs"]["requested"] == {"--log-every": 1}
    assert record["syncs"]["unrequested"] == 1
    assert record["syncs"]["unrequested_where"] == {line: 1}
    per_step = record["per_step"]
    assert per_step["step_s"] == pytest.approx(
        per_step["data_wait_s"] + per_step["strategy_s"] + per_step["ddl_s"])


def test_device_idle_share_counts_overlapping_kernels_once():
    from ddl.worker.observe.profiling import device_idle_share

    # a 100 us window: kernels busy 10-30 and 20-40 (overlapping: 30 us), 90-120 (10 inside)
    assert device_idle_share([(20, 40), (10, 30), (90, 120)], (0, 100)) == pytest.approx(0.6)
    assert device_idle_share([], (0, 100)) == 1.0
    assert device_idle_share([(0, 5)], None) is None
