"""A plugin still written against the 1.x import paths (ddl.hookspecs, ddl.specs,
ddl.workload, ddl.errors, ddl.datafiles) loads and trains with contract 2.0; `ddl plugins`
names the deprecated imports in one line. The same installed plugin supplies a per-step
learning-rate schedule (Workload.lr_step_factor), which a per-epoch factor could not give:
after 3 steps its rate is a quarter of the base, after 6 a seventh.

The plugin is a real installed distribution (dist-info with a `ddl` entry point on
PYTHONPATH); its data is the example plugin's CSV, read by the example's parser."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO, install_plugin, run_ddl

pytestmark = pytest.mark.unit

SRC = REPO / "docs" / "examples" / "ddl-example-plugin" / "src"

PLUGIN = """
import sys

sys.path.insert(0, {src!r})
from ddl.hookspecs import hookimpl
from ddl.specs import Preset, WorkloadSpec
from ddl_example import data

TINY = Preset("tiny", "linear regression, 64 rows", epochs=2, batch_size=8, lr=0.01)


@hookimpl
def ddl_register_workloads():
    return [WorkloadSpec("oldpaths", "a 1.x-style plugin", "old_paths_plugin:OldPaths",
                         {{"tiny": TINY}}, "tiny")]


def _workload_class():
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from ddl.datafiles import first_line
    from ddl.errors import DataMissing
    from ddl.workload import Workload

    class OldPaths(Workload):
        def check_data(self, data_dir):
            if data.missing_files(data_dir):
                raise DataMissing(first_line(f"no data in {{data_dir}}"))

        def datasets(self, data_dir):
            splits = {{}}
            for split in data.SPLITS:
                xs, ys = data.read(data.dataset_dir(data_dir) / f"{{split}}.csv", 64)
                splits[split] = TensorDataset(torch.tensor(xs), torch.tensor(ys).unsqueeze(1))
            return splits

        def build_model(self):
            return nn.Linear(data.FEATURES, 1)

        def loss(self, outputs, targets):
            return nn.functional.mse_loss(outputs, targets)

        def sample_metrics(self, outputs, targets):
            return {{"loss": (outputs - targets).squeeze(1).square()}}

        def optimizer(self, params, lr):
            return torch.optim.SGD(params, lr=lr)

        def lr_step_factor(self, step):
            return 1.0 / (step + 1)

    return OldPaths


def __getattr__(name):
    if name == "OldPaths":  # the factory: torch only when a run builds the workload
        return _workload_class()
    raise AttributeError(name)
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(the installed plugin's environment, `ddl train`'s result, the run directory)."""
    root = tmp_path_factory.mktemp("old-paths")
    env = install_plugin(root / "site", "old_paths_plugin", PLUGIN.format(src=str(SRC)))
    sys.path.insert(0, str(SRC))  # the data written here: a `ddl prepare` costs seconds
    try:
        from ddl_example import data as example_data
    finally:
        sys.path.remove(str(SRC))
    example_data.generate(root / "data", {"train": 64, "val": 16, "test": 16})
    run_dir = root / "run"
    proc = run_ddl("train", "--plugin", "oldpaths", "--nproc", "1", "--steps-per-epoch", "3",
                   "--data-dir", str(root / "data"), "--run-dir", str(run_dir), env=env,
                   cwd=root)
    return env, proc, run_dir


def test_a_plugin_on_the_old_paths_loads_with_a_warning_and_trains(trained, tmp_path):
    env, proc, run_dir = trained
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert results["epochs"][-1]["val"]["loss"] > 0
    listing = run_ddl("plugins", env=env, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    lines = [line for line in listing.stdout.splitlines() if line.startswith("DEPRECATED ")]
    assert lines == ["DEPRECATED plugin 'old_paths_plugin' (old-paths-plugin 1.0): "
                     "ddl.hookspecs.hookimpl is deprecated and goes in ddl contract 2.1; "
                     "use `from ddl.contract import hookimpl` (and 2 more)"], listing.stdout
    assert any(line.split()[:1] == ["oldpaths"] for line in listing.stdout.splitlines())


def test_a_workload_supplies_a_per_step_learning_rate(trained):
    """lr_step_factor(step) = 1 / (step + 1): the rate after each epoch's 3 steps."""
    _, proc, run_dir = trained
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((run_dir / "results.json").read_text())
    base = results["lr"]["scaled"]
    assert [epoch["lr"] for epoch in results["epochs"]] == pytest.approx([base / 4, base / 7])
