"""The kit's layout and feature checks catch a planted fault each, through real `ddl train`
runs: HSDP whose replicas never average (the replicate dimension left out of the FSDP
group), a 3-D mesh whose second pipeline stage tensor parallel forgot to prepare, gradient
accumulation that weights micro-batches unevenly, and a resume that drops the optimizer
state. Each fails naming its check and the tensor furthest from one process, and the runs
beside it that carry no fault pass: tp on 2 (the GPT's own preparation: the whole model
is the first stage) and the feature checks' base runs under the faulty strategies.

The faults are a third party's plugin (a dist-info with a `ddl` entry point on PYTHONPATH,
tests/conftest.py install_plugin) built on the GPT example (docs/examples/ddl-gpt-plugin)
and ddl's own strategies. Each check's runs are the kit's own plan for it
(conformance.plan_for, one faulty strategy and one check each, as check_strategies makes
it); all of them go through one equivalence_results call on the workload ``stagetp``, so
the one-process reference and the noise reference are trained once, not once per check
(their cost was half of this module's; the strategy faults do not touch tensor parallel,
the only hook ``stagetp`` changes). 2 one-process launches, then hsdp (4), 3-D (8), tp,
and the accumulation and resume checks with their base runs (2 each).

The kit runs its `ddl train` commands through ``command``; here that is the `./ddl` relay of
the docs' blocks (tests/cli_relay.py), so each launch is forked from the fork server as any
test's `ddl` is (tests/cli_fork.py) instead of a fresh interpreter importing torch (9
launches, 2.5-6 CPU-s each). The plugin's folder is put on the forked commands' sys.path
where PYTHONPATH would put it (it holds only the plugin's module and dist-info: nothing the
server imported is shadowed), and their workers, forked from the launcher, inherit it.
"""

from __future__ import annotations

import re

import pytest
from conftest import DDL, REPO, install_plugin

import cli_fork
import cli_relay

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


CHECKS = {  # the planted fault's check: (faulty strategy, label, a tensor it names)
    "hsdp": ("splithsdp", "hsdp dp_replicate=2,dp_shard=2", ""),
    "3d": ("mesh", "3-D pp=2,tp=2,dp_shard=2", "'blocks.1."),
    "accumulation": ("runningmean", "accumulation (runningmean)", ""),
    "resume": ("freshadam", "resume (freshadam)", ""),
}


@pytest.fixture(scope="module")
def outcomes(installed, gpt_data, tmp_path_factory):
    """{run label: its ContractBroken or None} for every run of the planted checks' plans
    and a tp run, from one kit call (module docstring)."""
    from ddl import conformance
    from ddl.contract.plugins import Plugins

    work = tmp_path_factory.mktemp("kit-runs")
    fallbacks = len(cli_fork.fallbacks)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(installed)
        if cli_fork.enabled():  # forked launches (module docstring)
            console = cli_fork._sys_path(DDL)
            mp.setattr(cli_fork, "_console_path", [[console[0], installed, *console[1:]]])
            command = (str(cli_relay.write_ddl(work)),)
        else:  # DDL_TEST_CLI=exec: the kit's own fresh interpreters
            mp.setenv("PYTHONPATH", installed)
            command = conformance.DDL_COMMAND
        plugins = Plugins()
        spec = plugins.workload("stagetp")
        workload = spec.create(spec.presets["tiny"])
        runs = []
        for check, (strategy, _, _) in CHECKS.items():
            plan = conformance.plan_for(spec.capabilities, workload, [strategy], [check],
                                        plugins)
            assert plan.skipped == [], plan.skipped
            runs += [r for r in plan.runs if r not in runs]
        runs += conformance.plan_for(spec.capabilities, workload, ["tp"], ["strategies"],
                                     plugins).runs
        labels = [r.label for r in runs]
        assert len(set(labels)) == len(labels), labels
        results = conformance.equivalence_results(
            "stagetp", gpt_data, work, runs, conformance.tolerance_for("per-tensor"),
            noise=True, command=command)
        found = {(run.label if run else "one process"): failure for run, failure in results}
    assert cli_fork.fallbacks[fallbacks:] == [], cli_fork.fallbacks  # all forked
    assert found.pop("one process") is None  # the reference trained
    return found


@pytest.mark.parametrize("check", CHECKS, ids=["hsdp-replicate-group", "3d-stage-forgotten-by-tp",
                                               "accumulation-running-mean",
                                               "resume-drops-optimizer-state"])
def test_planted_fault_fails_its_check(outcomes, check):
    _, label, tensor = CHECKS[check]
    failure = outcomes[label]
    assert failure is not None, f"strategy:{label} passed: {sorted(outcomes)}"
    message = str(failure)
    assert "\n" not in message, message  # one line
    assert failure.contract == f"strategy:{label}", message
    assert re.search(r"'[\w.]+' differs from one process by", message), message  # a tensor
    assert tensor in message, message  # among the 3 furthest off
    percent = float(message.split("differs from one process by ")[1].split(" %")[0])
    assert percent > 0.01, message  # a different model, not rounding


def test_runs_without_a_fault_pass_beside_them(outcomes):
    """The runs in the same call that carry no fault: tp on 2 and the base runs of the
    feature checks (the faulty strategies train correctly until they accumulate or
    resume), so each failure above is its check's, not the workload's or the reference's.
    (The intact GPT's tensor parallel was test_conformance_tp.py's
    test_intact_gpt_passes_tensor_parallel; the whole kit passing on it is
    tests/system/test_gpt_example_plugin.py.)"""
    faults = {label for _, label, _ in CHECKS.values()}
    passed = {label for label, failure in outcomes.items() if failure is None}
    assert passed == set(outcomes) - faults, {l: str(f) for l, f in outcomes.items()}
    assert {"tp", "runningmean", "freshadam"} <= passed, sorted(outcomes)
