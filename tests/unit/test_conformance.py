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
    """A strategy run that fails through the real CLI: the workload is not installed in
    this environment, so `ddl train --plugin example` exits 2, and the kit says which
    strategy contract broke and quotes ddl's one-line error."""
    with pytest.raises(conformance.ContractBroken) as caught:
        conformance.check_strategies("example", data_dir, tmp_path, ["fsdp"])
    assert caught.value.contract == "strategy:fsdp"
    assert "exited 2" in str(caught.value) and "unknown plugin 'example'" in str(caught.value)
