"""ddl's saved-tensor meter (ddl.worker.observe.activation_memory) on small real graphs: it counts
the bytes autograd holds for backward at their peak - tensors freed by a backward stop
counting, a graph dropped without one frees them too, slices of one storage count their
own bytes - and the plan probe's prediction (ddl.planning.plan_probe) of a run with
--sync-bn on a CPU. Whole runs against predictions: test_equivalence_matrix.py."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from ddl.worker.observe.activation_memory import SavedTensorMeter

pytestmark = pytest.mark.unit


def _pass(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.exp(x * w).sum()  # mul saves x (w is a parameter), exp saves its result


def test_counts_the_peak_not_the_sum_of_micro_batches():
    w = nn.Parameter(torch.ones(256))
    x = torch.randn(4, 256)
    one = 2 * x.numel() * 4  # x and exp's output
    meter = SavedTensorMeter()
    with meter.measure():
        _pass(x, w).backward()
    assert meter.peak_bytes == one
    meter = SavedTensorMeter()
    with meter.measure():  # accumulation: each backward frees before the next
        _pass(x.clone(), w).backward()
        _pass(x.clone(), w).backward()
    assert meter.peak_bytes == one
    meter = SavedTensorMeter()
    with meter.measure():  # 1F1B-like, one schedule run: each backward frees its forward's
        first, second = x.clone(), x.clone()  # (both alive: no address is reused)
        _pass(first, w).backward()
        _pass(second, w).backward()
    assert meter.peak_bytes == one
    meter = SavedTensorMeter()
    with meter.measure():  # GPipe-like: both forwards, then both backwards
        losses = [_pass(x.clone(), w), _pass(x.clone(), w)]
        for loss in losses:
            loss.backward()
    assert meter.peak_bytes == 2 * one


def test_slices_of_one_storage_count_their_own_bytes():
    w = nn.Parameter(torch.ones(256))
    batch = torch.randn(8, 256)
    meter = SavedTensorMeter()
    with meter.measure():  # two micro-batches cut from one batch, the first freed first
        _pass(batch[:4], w).backward()
        _pass(batch[4:], w).backward()
    assert meter.peak_bytes == 2 * 4 * 256 * 4
    meter = SavedTensorMeter()
    with meter.measure():  # one tensor saved twice (and as a view of itself): once
        y = batch * w
        (y * w + y.t().t() * w).sum().backward()
    assert meter.peak_bytes == batch.numel() * 4 * 2  # batch and y


def test_a_graph_dropped_without_backward_is_freed():
    """A saved output kept as itself would hold its own grad_fn: a cycle no gc frees when
    the graph is dropped without a backward (torch.distributed.pipelining's shape inference
    on a first stage does that), one micro-batch's activations leaked per run."""
    lin = nn.Linear(16, 16)
    meter = SavedTensorMeter()
    with meter.measure():
        out = torch.relu(lin(torch.randn(4, 16)))  # relu saves its output
        alive = weakref.ref(out)
        del out
    gc.collect()
    assert alive() is None
    assert meter.peak_bytes == 2 * 4 * 16 * 4  # linear's input, relu's output


def test_gradients_are_unchanged_under_the_meter():
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 8), torch.randn(3, 8)
    grads = []
    for metered in (False, True):
        lin.zero_grad()
        meter = SavedTensorMeter()
        with meter.measure() if metered else torch.enable_grad():
            torch.sigmoid(torch.relu(lin(x)).exp()).sum().backward()
        grads.append(lin.weight.grad.clone())
    assert torch.equal(*grads)


def test_probe_with_sync_bn_on_cpu_is_what_the_cpu_kernels_keep(tmp_path):
    """--sync-bn on a CPU converts BatchNorm to ddl.worker.build.sync_bn's float64 layer (1.7x
    the bytes of plain BatchNorm in CIFAR's ResNet): the probe converts as the run does,
    and on the meta device counts what a real CPU forward of the converted model keeps."""
    from ddl.contract.plugins import Plugins
    from ddl.planning import plan_probe
    from ddl.worker.build import sync_bn

    spec = Plugins().workload("cifar")
    workload = spec.create(spec.presets["tiny"])
    inputs, targets = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    model, converted = sync_bn.convert(workload.build_model(), torch.device("cpu"))
    assert converted
    model.train()
    meter = SavedTensorMeter()
    with meter.measure():
        workload.loss(workload.forward(model, inputs), targets)
    meta_in, meta_t = plan_probe.to_meta(inputs), plan_probe.to_meta(targets)

    def probe(sync: bool) -> int:
        return plan_probe.activation_bytes(
            workload, plan_probe.meta_model(workload.build_model), meta_in, meta_t,
            sync_bn=sync, device_type="cpu").per_stage[0]

    assert probe(True) == meter.peak_bytes
    assert meter.peak_bytes > 1.5 * probe(False)
    # torch's SyncBatchNorm (GPUs) keeps what plain BatchNorm keeps: left plain there
    assert plan_probe.activation_bytes(
        workload, plan_probe.meta_model(workload.build_model), meta_in, meta_t,
        sync_bn=True, device_type="cuda").per_stage[0] == probe(False)


class _Unit(nn.Module):
    """A checkpointed unit: under selective checkpointing the matmul's output is kept,
    the exp recomputed."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(64, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x @ self.w)


def test_selective_checkpointing_keeps_count_while_torch_holds_them():
    """The outputs selective checkpointing keeps count from their forward until that call's
    backward (or its graph dropped), as saved tensors do: one schedule run of two micro-
    batches, 1F1B-like, holds one micro-batch's at a time; GPipe-like, both. (They were
    summed over the step, so a pipeline's measured activations counted every micro-batch's
    kept outputs where only the ones in flight are held: CIFAR tiny pp=2 read 1.4x.)"""
    from ddl.worker.build import activation_checkpointing

    unit = _Unit()
    activation_checkpointing.apply([unit], "selective")
    x = torch.randn(8, 64, requires_grad=True)
    kept = 8 * 64 * 4  # the matmul's output, kept by the policy
    saved_outside = 8 * 64 * 4  # the unit's input, saved by checkpoint under our hooks

    def one_pass():
        return unit(x.clone()).sum()

    meter = SavedTensorMeter()
    with meter.measure():
        one_pass().backward()
    single = meter.peak_bytes
    assert kept <= single <= kept + saved_outside + 8 * 64 * 4
    meter = SavedTensorMeter()
    with meter.measure():  # each backward before the next forward
        one_pass().backward()
        one_pass().backward()
    assert meter.peak_bytes == single
    meter = SavedTensorMeter()
    with meter.measure():  # both forwards, then both backwards
        losses = [one_pass(), one_pass()]
        for loss in losses:
            loss.backward()
    assert meter.peak_bytes == 2 * single
    meter = SavedTensorMeter()
    with meter.measure():  # a graph dropped without its backward lets its kept bytes go
        dropped = one_pass()
        del dropped
        gc.collect()
        one_pass().backward()
    assert meter.peak_bytes == single
