"""The trainer owns the optimizer step (ddl.worker.train.step, issue 50): zero_grad -> the
strategy's forward_backward -> clip -> optimizer -> lr schedule. A strategy written for
contract 2.0 that runs the whole step itself (overrides train_step/train_steps) is still
called that way, with one deprecation warning. ddl's own strategies never step the
optimizer."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ddl.contract.deprecation import ContractDeprecationWarning
from ddl.contract.strategy import Strategy, StrategyContext
from ddl.worker.train import step as step_module
from ddl.worker.train.precision import Precision
from ddl.worker.train.step import optimizer_step

pytestmark = pytest.mark.unit

REPO = Path(__file__).parents[2]


class Mse:
    """The workload calls a step makes."""

    def forward(self, model, inputs):
        return model(inputs)

    def loss(self, outputs, targets):
        return ((outputs - targets) ** 2).mean()


class Plain(Strategy):
    name = "plain"

    def wrap(self, model, run):
        return model

    def full_state_dict(self, model, run):
        return model.state_dict()


class WholeStep(Plain):
    """Contract 2.0: runs zero_grad to optimizer.step itself (and counts its calls)."""

    calls = 0

    def train_steps(self, model, batches, run, optimizer, precision):
        type(self).calls += 1
        return super().train_steps(model, batches, run, optimizer, precision)


def make_run(strategy: Strategy, clip: float | None = None):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    context = StrategyContext(world=None, layout=None, workload=Mse(), clip_grad_norm=clip)
    return SimpleNamespace(strategy=strategy, model=model, context=context,
                           optimizer=optimizer, scheduler=scheduler,
                           precision=Precision.create("fp32", torch.device("cpu")))


def batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


def by_hand(steps: list[list[tuple]], clip: float | None = None) -> dict:
    """The same steps written out: SGD on the mean loss of each step's micro-batches, the
    lr halving after every step."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    lr = 0.1
    for micro in steps:
        model.zero_grad()
        loss = torch.stack([((model(x) - y) ** 2).mean() for x, y in micro]).mean()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        lr *= 0.5
    return model.state_dict()


@pytest.mark.parametrize("accumulation, clip", [(1, None), (3, None), (2, 0.05)])
def test_two_steps_equal_sgd_written_out(accumulation, clip):
    run = make_run(Plain(), clip)
    data = batches(2 * accumulation)
    steps = [data[:accumulation], data[accumulation:]]
    for micro in steps:
        loss, outputs, norm = optimizer_step(run, micro)
        assert len(outputs) == accumulation and (norm is not None) == bool(clip)
    want = by_hand(steps, clip)
    for name, value in run.model.state_dict().items():
        torch.testing.assert_close(value, want[name], rtol=1e-6, atol=1e-7)
    assert run.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.25)  # stepped twice


def test_a_strategy_that_runs_the_whole_step_is_still_called_and_warned(monkeypatch):
    monkeypatch.setattr(step_module, "_warned", set())
    run = make_run(WholeStep())
    data = batches(4)
    with pytest.warns(ContractDeprecationWarning, match="override forward_backward"):
        optimizer_step(run, data[:2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per strategy class
        optimizer_step(run, data[2:])
    assert WholeStep.calls == 2
    want = by_hand([data[:2], data[2:]])
    for name, value in run.model.state_dict().items():
        torch.testing.assert_close(value, want[name], rtol=1e-6, atol=1e-7)


def test_ddls_strategies_never_step_the_optimizer():
    """Only the trainer does (ddl.worker.train.step); the pipeline once had its own."""
    sources = (REPO / "packages" / "plugins" / "strategies" / "src" / "ddl_strategies")
    calls = [f"{path.name}:{n}" for path in sources.glob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\b(optimizer|precision)\.step\(|zero_grad\(", line)
             and not line.lstrip().startswith(("#", "`")) and "``" not in line]
    assert not calls, calls
    from ddl.contract.plugins import Plugins

    for name, spec in Plugins().strategies().items():
        assert not step_module.runs_whole_step(spec.create({})), name
