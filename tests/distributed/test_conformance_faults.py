"""The kit's layout and feature checks catch a planted fault each, through real `ddl train`
runs: HSDP whose replicas never average (the replicate dimension left out of the FSDP
group), a 3-D mesh whose second pipeline stage tensor parallel forgot to prepare, gradient
accumulation that weights micro-batches unevenly, and a resume that drops the optimizer
state. Each fails naming its check and the tensor furthest from one process.

The faults are a third party's plugin (a dist-info with a `ddl` entry point on PYTHONPATH,
tests/conftest.py install_plugin) built on the GPT example (docs/examples/ddl-gpt-plugin)
and ddl's own strategies. Each test is one kit call selecting one check: one process, then
the check's run(s); the 3-D one starts 8 processes.
"""

from __future__ import annotations

import re

import pytest
from conftest import REPO, install_plugin

pytestmark = pytest.mark.distributed

PLUGIN = """
import sys
from dataclasses import replace

sys.path.insert(0, {src!r})
import torch
from ddl.contract import hookimpl
from ddl.contract.specs import StrategySpec
from ddl.contract.strategy import gradient_sync
from ddl_gpt.plugin import ddl_register_workloads as gpt_specs
from ddl_gpt.workload import GptWorkload
from ddl_strategies import fsdp
from ddl_strategies.shorthands import FSDP


class FirstStageTensorParallel(GptWorkload):
    def prepare_tensor_parallel(self, model, tp_degree):
        if hasattr(model, "pos_emb"):  # the whole model or the first stage: later ones forgotten
            super().prepare_tensor_parallel(model, tp_degree)


class SplitReplicas(FSDP):
    name = "splithsdp"

    def wrap(self, model, run):
        real = fsdp.shard

        def shard(part, units, dp_mesh, **options):  # HSDP's 2-D group cut to its shards
            mesh = dp_mesh["dp_shard"] if dp_mesh.ndim == 2 else dp_mesh
            return real(part, units, mesh, **options)

        fsdp.shard = shard
        try:
            return super().wrap(model, run)
        finally:
            fsdp.shard = real


class RunningMean(FSDP):
    name = "runningmean"

    def train_steps(self, model, batches, run, optimizer, precision):
        optimizer.zero_grad(set_to_none=True)
        losses, outputs = [], []
        for i, (inputs, targets) in enumerate(batches):
            with gradient_sync(model, i == len(batches) - 1):
                out = run.workload.forward(model, inputs)
                loss = run.workload.loss(out, targets)
                precision.backward(loss / (i + 1))  # the count so far, not len(batches)
            losses.append(loss.detach())
            outputs.append(out)
        norm = self.clip_gradients(model, run, optimizer, precision)
        precision.step(optimizer)
        return torch.stack(losses).mean(), outputs, norm


class FreshOptimizer(FSDP):
    name = "freshadam"

    def load_checkpoint_state(self, model, optimizer, state, run):
        super().load_checkpoint_state(model, optimizer, state, run)
        optimizer.state.clear()  # Adam's moments and step count dropped


@hookimpl
def ddl_register_workloads():
    spec = gpt_specs()[0]
    return [spec, replace(spec, name="stagetp", factory=FirstStageTensorParallel)]


@hookimpl
def ddl_register_strategies():
    return [StrategySpec(name=s.name, summary="a planted fault", factory=s)
            for s in (SplitReplicas, RunningMean, FreshOptimizer)]
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    site = tmp_path_factory.mktemp("kit-faults") / "site"
    src = REPO / "docs" / "examples" / "ddl-gpt-plugin" / "src"
    return install_plugin(site, "ddl_kit_faults", PLUGIN.format(src=str(src)))["PYTHONPATH"]


@pytest.fixture(scope="module")
def gpt_data(tmp_path_factory):
    import sys

    sys.path.insert(0, str(REPO / "docs" / "examples" / "ddl-gpt-plugin" / "src"))
    from ddl_gpt import corpus

    root = tmp_path_factory.mktemp("gpt-data")
    corpus.write_synthetic(root)
    return root


@pytest.fixture
def kit(installed, monkeypatch):
    from ddl import conformance

    monkeypatch.syspath_prepend(installed)
    monkeypatch.setenv("PYTHONPATH", installed)
    return conformance


@pytest.mark.parametrize("workload,strategy,check,label,tensor", [
    ("chargpt", "splithsdp", "hsdp", "hsdp dp_replicate=2,dp_shard=2", ""),
    ("stagetp", "mesh", "3d", "3-D pp=2,tp=2,dp_shard=2", "'blocks.1."),
    ("chargpt", "runningmean", "accumulation", "accumulation (runningmean)", ""),
    ("chargpt", "freshadam", "resume", "resume (freshadam)", ""),
], ids=["hsdp-replicate-group", "3d-stage-forgotten-by-tp", "accumulation-running-mean",
        "resume-drops-optimizer-state"])
def test_planted_fault_fails_its_check(kit, gpt_data, tmp_path, workload, strategy, check,
                                       label, tensor):
    with pytest.raises(kit.ContractBroken) as caught:
        kit.check_strategies(workload, gpt_data, tmp_path, [strategy], checks=[check])
    message = str(caught.value)
    assert caught.value.contract == f"strategy:{label}", message
    assert re.search(r"'[\w.]+' differs from one process by", message), message  # a tensor
    assert tensor in message, message  # among the 3 furthest off
    percent = float(message.split("differs from one process by ")[1].split(" %")[0])
    assert percent > 0.01, message  # a different model, not rounding
