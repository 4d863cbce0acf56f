"""The conformance kit (ddl.conformance) fails, naming the broken contract, on deliberately
broken variants of the example plugin's workload, and passes the intact one.

The variants are registered in-process through ddl's plugin manager (no installation): the
in-process checks are the ones that catch these faults. The checks that go through
`ddl train` run on the installed example in tests/system/test_example_plugin.py.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

sys.path.insert(0, str(REPO / "docs" / "examples" / "ddl-example-plugin" / "src"))

from ddl import conformance  # noqa: E402
from ddl.contract.hookspecs import hookimpl  # noqa: E402
from ddl.contract.plugins import Plugins  # noqa: E402
from ddl_example import data  # noqa: E402
from ddl_example.plugin import PRESETS  # noqa: E402
from ddl_example.plugin import ddl_register_workloads as example_specs  # noqa: E402
from ddl_example.workload import RegressionWorkload  # noqa: E402


class MissingValSplit(RegressionWorkload):
    def datasets(self, data_dir):
        splits = super().datasets(data_dir)
        del splits["val"]
        return splits


class NonFiniteLoss(RegressionWorkload):
    def loss(self, outputs, targets):
        return super().loss(outputs, targets) / 0.0


class MetricsDisagreeWithLoss(RegressionWorkload):
    def sample_metrics(self, outputs, targets):  # per-sample loss that is not the mean's
        error = (outputs - targets).squeeze(1)
        return {"loss": error.abs()}


class WrongOutputShape(RegressionWorkload):
    def build_model(self):
        from torch import nn

        model = super().build_model()
        model.head = nn.Linear(model.head.in_features, 3)  # targets are (batch, 1)
        return model


class ForeignFsdpUnits(RegressionWorkload):
    def fsdp_units(self, model):
        from torch import nn

        return [nn.Linear(2, 2)]  # a module that is not part of the model


class LyingLength(RegressionWorkload):
    """A validation split whose len() counts 4 samples that do not exist (the last rows of
    the file are read short), which a check of sample 0 alone misses."""

    def datasets(self, data_dir):
        splits = super().datasets(data_dir)
        splits["val"] = _Overcounted(splits["val"], extra=4)
        return splits


class _Overcounted:
    def __init__(self, real, extra):
        self.real, self.extra = real, extra

    def __len__(self):
        return len(self.real) + self.extra

    def __getitem__(self, index):
        if index < len(self.real):
            return self.real[index]
        inputs, targets = self.real[index - len(self.real)]
        return inputs[:-1], targets  # a short row past the real end


class PatternTpPlan(RegressionWorkload):
    """A plan in torch's pattern form (`*` = one level of the module path), as xsum writes."""

    def tp_plan(self, model):
        return {"block*.0": "colwise", "head": "rowwise"}


class UnknownTpPath(RegressionWorkload):
    def tp_plan(self, model):
        return {"blocks.*.0": "colwise"}  # no module "blocks"


def _spec(factory, **changes):
    return replace(example_specs()[0], factory=factory, **changes)


class _TestPlugin:
    """A plugin registered the way a notebook or test would, without an entry point."""

    def __init__(self, specs):
        self.specs = specs

    @hookimpl
    def ddl_register_workloads(self):
        return self.specs


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("example-data")
    data.generate(root, rows={"train": 200, "val": 50, "test": 50})
    return root


BROKEN = [
    (_spec(MissingValSplit), "datasets", "val"),
    (_spec(NonFiniteLoss), "forward-backward", "loss is"),
    (_spec(WrongOutputShape), "metrics", "shape (4, 3)"),
    (_spec(MetricsDisagreeWithLoss), "metrics", "mean per-sample loss"),
    (_spec(ForeignFsdpUnits), "fsdp_units", "not sub-modules"),
    (_spec(RegressionWorkload, default_preset="course"), "presets", "'course'"),
    (_spec(RegressionWorkload, presets={"standard": PRESETS["standard"]}), "presets", "tiny"),
    (_spec(RegressionWorkload, capabilities=frozenset({"fsdp_unit"})), "capabilities",
     "fsdp_unit"),
    (_spec(UnknownTpPath, capabilities=frozenset({"tp_plan"})), "tp_plan", "blocks.*.0"),
    (_spec(LyingLength), "datasets", "split 'val' sample 50 does not batch with sample 0"),
]


@pytest.mark.filterwarnings("ignore:Using a target size")  # WrongOutputShape broadcasts
@pytest.mark.parametrize("spec,contract,detail", BROKEN,
                         ids=[f"{c}-{s.factory.__name__}" for s, c, _ in BROKEN])
def test_broken_workload_fails_naming_the_contract(spec, contract, detail, data_dir):
    plugins = Plugins(load_entry_points=False)
    plugins.register(_TestPlugin([spec]), name="broken")
    with pytest.raises(conformance.ContractBroken) as caught:
        conformance.check_in_process(plugins.workload("example"), data_dir)
    message = str(caught.value)
    assert caught.value.contract == contract, message
    assert f"workload 'example' breaks contract '{contract}'" in message
    assert detail in message


def test_intact_example_passes(data_dir):
    conformance.check_in_process(_spec(RegressionWorkload), data_dir)


class _AsDicts:
    def __init__(self, real):
        self.real = real

    def __len__(self):
        return len(self.real)

    def __getitem__(self, index):
        inputs, targets = self.real[index]
        return {"x": inputs, "y": targets}


class DictSamples(RegressionWorkload):
    """Samples as dicts (as xsum's are), made into (inputs, targets) by to_device()."""

    def datasets(self, data_dir):
        return {split: _AsDicts(d) for split, d in super().datasets(data_dir).items()}

    def to_device(self, batch, device):
        return batch["x"].to(device), batch["y"].to(device)


class DictSamplesNoPairs(DictSamples):
    to_device = RegressionWorkload.to_device  # the default unpacks a pair: dicts break it


def test_samples_need_to_be_pairs_only_for_the_default_to_device(data_dir):
    conformance.check_in_process(_spec(DictSamples), data_dir)
    with pytest.raises(conformance.ContractBroken, match="sample 0 is dict, not an"):
        conformance.check_in_process(_spec(DictSamplesNoPairs), data_dir)


def test_tp_plan_patterns_are_read_as_torch_reads_them(data_dir):
    spec = _spec(PatternTpPlan, capabilities=frozenset({"tp_plan"}))
    conformance.check_hints(spec, PatternTpPlan(PRESETS["tiny"]))


def test_missing_data_is_generated_and_checked(tmp_path):
    class NoPrepare(RegressionWorkload):
        def prepare(self, data_dir, *, synthetic):
            return data_dir  # writes nothing: check_data must still fail

    with pytest.raises(conformance.ContractBroken, match="contract 'data'"):
        conformance.check_data(_spec(NoPrepare), tmp_path)


def test_strategy_failure_names_the_strategy(data_dir, tmp_path):
    """A run that fails through the real CLI: the workload is not installed in this
    environment, so `ddl train --plugin example` exits 2, and the kit says which run
    broke (the one-process reference comes first) and quotes ddl's one-line error."""
    with pytest.raises(conformance.ContractBroken) as caught:
        conformance.check_strategies("example", data_dir, tmp_path, ["fsdp"], parallel=1)
    assert caught.value.contract == "strategy:one process"
    assert "exited 2" in str(caught.value) and "unknown plugin 'example'" in str(caught.value)


# --- pipeline stages keep the model's names ---------------------------------------------

class RenamingStages(RegressionWorkload):
    """Stages as a fresh nn.Sequential numbers them: '0.0.weight', not 'block1.0.weight'."""

    def pipeline_splits(self, model):
        return ["block2", "head"]

    def pipeline_stages(self, model, n_stages):
        from torch import nn

        return [nn.Sequential(model.block1), nn.Sequential(model.block2, model.head)]


class TiedHeadDefaultCut(RegressionWorkload):
    """An output layer tied to the input layer, cut by the default pipeline_stages: the
    first stage holds the weight as 'embed.weight', the last as 'head.weight'."""

    def build_model(self):
        from torch import nn

        model = nn.Sequential()
        model.add_module("embed", nn.Linear(8, 8, bias=False))
        model.add_module("mid", nn.Linear(8, 8))
        model.add_module("head", nn.Linear(8, 8, bias=False))
        model.head.weight = model.embed.weight
        return model

    def pipeline_splits(self, model):
        return ["mid", "head"]


@pytest.mark.parametrize("workload,detail", [
    (RenamingStages, "stage 0 holds '0.0.weight', which is not the model's parameter"),
    (TiedHeadDefaultCut,
     "'embed.weight' (tied: embed.weight, head.weight) is held by stages [0, 1] under"),
])
def test_pipeline_stages_must_keep_the_models_names(workload, detail):
    spec = _spec(workload, capabilities=frozenset({"pipeline_splits"}))
    with pytest.raises(conformance.ContractBroken) as caught:
        conformance.check_hints(spec, workload(PRESETS["tiny"]))
    assert caught.value.contract == "pipeline_splits"
    assert detail in str(caught.value)


# --- tolerance rules and the runs a workload gets ----------------------------------------

def _weights(scale=0.0, element=0.0):
    import torch

    want = {"w": torch.linspace(-1, 1, 10_000), "steps": torch.tensor(3)}
    got = {"w": want["w"] * (1 + scale), "steps": torch.tensor(3)}
    got["w"][17] += element
    return got, want


@pytest.mark.parametrize("scale,element,adam,passes", [
    (0.0, 3e-5, True, True),      # one Adam-amplified element: the tensor still agrees
    (0.0, 3e-5, False, False),    # ... but not element by element (SGD's rule)
    (2e-6, 0.0, False, True),     # rounding-sized everywhere: both rules accept
    (1e-4, 0.0, True, False),     # 1e-4 relative on the whole tensor: a different model
    (0.0, 2e-4, True, False),     # one element off by 2e-4: over the per-tensor element cap
])
def test_tolerance_rules(scale, element, adam, passes):
    got, want = _weights(scale, element)
    if passes:
        conformance.assert_same_weights(got, want, adam=adam)
    else:
        with pytest.raises(AssertionError, match="^w: "):
            conformance.assert_same_weights(got, want, adam=adam)


def test_auto_tolerance_follows_the_optimizer():
    import torch

    params = [torch.nn.Parameter(torch.zeros(2))]
    assert conformance.tolerance_for("auto", torch.optim.SGD(params, lr=0.1)).name == \
        "elementwise"
    assert conformance.tolerance_for("auto", torch.optim.AdamW(params)).name == "per-tensor"
    from ddl.contract.errors import UsageError
    with pytest.raises(UsageError, match="unknown rule 'loose'; allowed: auto, elementwise"):
        conformance.tolerance_for("loose")


@pytest.mark.parametrize("capabilities,supported,expected", [
    ({"fsdp_units"}, ["mesh", "ddp", "fsdp"], ["ddp@2", "fsdp@2"]),
    ({"tp_plan"}, ["mesh", "tp", "fsdp+tp"], ["mesh dp_replicate=2,tp=2@4", "tp@2", "fsdp+tp@4"]),
    ({"pipeline_splits"}, ["mesh", "pp"], ["mesh pp=2,dp_shard=2@4", "pp@2"]),
    ({"tp_plan", "pipeline_splits"}, ["mesh", "tp", "pp"], ["mesh pp=2,tp=2@4", "tp@2", "pp@2"]),
])
def test_each_supported_strategy_gets_its_smallest_run(capabilities, supported, expected):
    runs = conformance.plan_runs(supported, frozenset(capabilities), checks=["strategies"])
    assert [f"{r.label}@{r.nproc}" for r in runs] == expected
    assert all("prepare_tensor_parallel / tp_plan" in r.suspects for r in runs if "tp" in r.label)
    assert all("pipeline_stages" in r.suspects for r in runs if "pp" in r.label)


def test_the_kit_runs_every_layout_and_feature_ddl_runs():
    """By default: HSDP, the 3-D mesh, the degrees the model allows, accumulation,
    clipping and resume, each its own run; resume continues fsdp's own run."""
    plan = conformance.plan_checks(["mesh", "ddp", "fsdp"], frozenset({"tp_plan",
                                   "pipeline_splits"}), degrees={"tp=4": None, "pp=4": "no"})
    runs = {r.label: r for r in plan.runs}
    assert list(runs)[3:] == ["hsdp dp_replicate=2,dp_shard=2", "3-D pp=2,tp=2,dp_shard=2",
                              "tp=4", "accumulation (fsdp)", "clipping (fsdp)", "resume (fsdp)"]
    assert runs["3-D pp=2,tp=2,dp_shard=2"].nproc == 8
    assert runs["hsdp dp_replicate=2,dp_shard=2"].args[-2:] == ("--mesh",
                                                                "dp_replicate=2,dp_shard=2")
    assert runs["accumulation (fsdp)"].args[-2:] == ("--batch-size", "4")  # 16 = 2 x 2 x 4
    assert runs["clipping (fsdp)"].reference == runs["clipping (fsdp)"].args[-2:]
    assert runs["resume (fsdp)"].resumes == "fsdp"
    assert runs["fsdp"].args[-2:] == ("--checkpoint-every", "2")
    assert plan.skipped == [conformance.Skipped("pp=4", "no")]


@pytest.mark.parametrize("strategies,capabilities,label,reason", [
    (["mesh", "ddp"], set(), "mesh", "without tp_plan or pipeline_splits"),
    (["mesh"], {"tp_plan"}, "3-D pp=2,tp=2,dp_shard=2", "declares no pipeline_splits"),
    (["ddp"], set(), "hsdp dp_replicate=2,dp_shard=2", "no selected strategy takes --mesh"),
    (["mesh"], {"tp_plan"}, "tp=4", "the workload was not asked"),
    ([], set(), "resume", "no strategy selected"),
])
def test_no_layout_is_left_out_silently(strategies, capabilities, label, reason):
    skipped = conformance.plan_checks(strategies, frozenset(capabilities)).skipped
    assert any(s.label == label and reason in s.reason for s in skipped), skipped


def test_degrees_are_asked_of_the_workload_on_the_meta_device():
    class TwoHeads(RegressionWorkload):
        def tp_plan(self, model):
            return {"block1.0": "colwise"}

        def prepare_tensor_parallel(self, model, tp_degree):
            from ddl.contract.errors import UsageError

            assert next(model.parameters()).is_meta  # shapes only, no memory
            if 2 % tp_degree:
                raise UsageError(f"tp={tp_degree} does not divide 2 heads")

    problems = conformance.degree_problems(TwoHeads(PRESETS["tiny"]), {"tp_plan"})
    assert problems == {"tp=4": "tp=4 does not divide 2 heads",
                        "pp=4": "the workload declares no pipeline_splits"}


def test_unknown_check_is_one_clear_error():
    from ddl.contract.errors import UsageError

    with pytest.raises(UsageError, match="checks: unknown hdsp; allowed: strategies, hsdp"):
        conformance.plan_checks(["fsdp"], frozenset(), checks=["hdsp"])


def test_a_strategy_mismatch_names_the_run_the_tensors_and_the_hooks():
    import torch

    from ddl.conformance.runs import compare

    pp, tp = conformance.plan_runs(["pp", "tp"], frozenset({"pipeline_splits", "tp_plan"}),
                                   checks=["strategies"])
    want = {"a.weight": torch.ones(4), "b.weight": torch.ones(4)}
    with pytest.raises(conformance.ContractBroken) as caught:  # a stage renamed its tensors
        compare(pp, "gpt", {"a.weight": torch.ones(4), "0.weight": torch.ones(4)}, want,
                conformance.TOLERANCES["per-tensor"])
    assert caught.value.contract == "strategy:pp"
    assert "missing ['b.weight'], extra ['0.weight']" in str(caught.value)
    assert "check pipeline_stages / pipeline_splits" in str(caught.value)
    got = {"a.weight": torch.full((4,), 1.01), "b.weight": torch.full((4,), 1.5)}
    with pytest.raises(conformance.ContractBroken) as caught:
        compare(tp, "gpt", got, want, conformance.TOLERANCES["per-tensor"])
    message = str(caught.value)
    assert "'b.weight' differs from one process by 50 %" in message  # furthest off first
    assert "'a.weight' by 1 %: check prepare_tensor_parallel / tp_plan" in message
