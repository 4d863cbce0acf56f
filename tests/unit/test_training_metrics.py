"""The trainer's training metrics (ddl.worker.train.metrics.TrainingMetrics): small outputs
gathered over steps give the sums that measuring every step gives; anything else is
measured at once, on the objects the step returned."""

import pytest
import torch
import torch.nn.functional as F

from ddl.contract.world import World
from ddl.worker.train.metrics import MetricSums, TrainingMetrics

pytestmark = pytest.mark.unit

ONE = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), backend="gloo")


class Classifier:
    """A workload's metrics as MNIST's: per-sample loss and accuracy; counts its calls."""

    def __init__(self):
        self.calls: list[int] = []

    def sample_metrics(self, outputs, targets):
        self.calls.append(outputs.shape[0])
        return {"loss": F.cross_entropy(outputs, targets, reduction="none"),
                "accuracy": (outputs.argmax(dim=1) == targets).to(torch.float32)}


def _steps(n, batch=32, last=7):
    generator = torch.Generator().manual_seed(0)
    for i in range(n):
        size = last if i == n - 1 else batch
        yield (torch.randn(size, 10, generator=generator, requires_grad=True),
               torch.randint(0, 10, (size,), generator=generator))


def test_gathered_steps_give_the_sums_of_measuring_each_step():
    workload, reference = Classifier(), Classifier()
    gathered = TrainingMetrics(workload, torch.device("cpu"))
    each = MetricSums(torch.device("cpu"))
    for outputs, targets in _steps(40):
        gathered.add(outputs, targets)
        each.add(reference.sample_metrics(outputs.detach(), targets))
    expected, got = each.reduce(ONE), gathered.reduce(ONE)
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=1e-12), name
    # 40 steps in two calls: the first 32 steps, then the last 8 (the 7-sample batch too)
    assert workload.calls == [32 * 32, 7 * 32 + 7]


def test_a_full_gather_is_measured_without_waiting_for_the_end():
    workload = Classifier()
    metrics = TrainingMetrics(workload, torch.device("cpu"))
    for outputs, targets in _steps(TrainingMetrics.GATHER_STEPS, last=32):
        metrics.add(outputs, targets)
    assert workload.calls == [32 * TrainingMetrics.GATHER_STEPS]


def test_outputs_that_are_not_one_tensor_are_measured_at_once_as_given():
    seen = []

    class Structured:
        def sample_metrics(self, outputs, targets):
            seen.append(outputs)
            return {"loss": outputs["logits"].sum(dim=1)}

    metrics = TrainingMetrics(Structured(), torch.device("cpu"))
    outputs = {"logits": torch.ones(4, 3)}
    metrics.add(outputs, torch.zeros(4, dtype=torch.long))
    assert seen and seen[0] is outputs  # the very object, not a copy
    assert metrics.reduce(ONE) == {"loss": 3.0}


def test_large_outputs_are_measured_at_once_on_the_steps_own_tensor():
    seen = []

    class Big(Classifier):
        def sample_metrics(self, outputs, targets):
            seen.append(outputs)
            return super().sample_metrics(outputs, targets)

    metrics = TrainingMetrics(Big(), torch.device("cpu"))
    rows = TrainingMetrics.GATHER_BYTES // (10 * 4) + 1
    outputs = torch.zeros(rows, 10)
    metrics.add(outputs, torch.zeros(rows, dtype=torch.long))
    assert seen and seen[0] is outputs


def test_a_change_of_shape_measures_what_was_gathered_first():
    """Outputs whose width changes between steps cannot be concatenated: the gathered ones
    are measured before the new shape is kept."""

    class RowMean:
        def sample_metrics(self, outputs, targets):
            return {"loss": outputs.mean(dim=1)}

    metrics = TrainingMetrics(RowMean(), torch.device("cpu"))
    metrics.add(torch.full((2, 5), 1.0), torch.zeros(2, dtype=torch.long))
    metrics.add(torch.full((2, 7), 4.0), torch.zeros(2, dtype=torch.long))
    assert metrics.reduce(ONE) == {"loss": 2.5}


def test_per_token_outputs_are_measured_at_once_on_the_steps_own_tensors():
    """Sequence logits [batch, length, vocabulary], however small: a workload may recognise
    the very tensors its loss just saw (ddl_xsum's token losses)."""
    seen = []

    class PerToken:
        def sample_metrics(self, outputs, targets):
            seen.append((outputs, targets))
            return {"loss": outputs.mean(dim=(1, 2))}

    metrics = TrainingMetrics(PerToken(), torch.device("cpu"))
    logits, labels = torch.ones(2, 5, 3), torch.zeros(2, 5, dtype=torch.long)
    metrics.add(logits, labels)
    assert len(seen) == 1 and seen[0][0] is logits and seen[0][1] is labels
