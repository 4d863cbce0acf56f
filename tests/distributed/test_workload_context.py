"""Contract v2 through real runs: a workload learns its run (workload.context) and groups
its optimizer's parameters by the names its own model has, whatever the strategy wrapped
around it.

The plugin is installed the way third parties ship one (a dist-info with a `ddl` entry
point on PYTHONPATH): the example workload, recording what it was told to a file per rank.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO, install_plugin, run_ddl

pytestmark = pytest.mark.distributed

PLUGIN = """
import json, os, sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, {src!r})
from ddl.contract import hookimpl
from ddl_example.plugin import ddl_register_workloads as example_specs
from ddl_example.workload import RegressionWorkload


class Told(RegressionWorkload):
    def datasets(self, data_dir):
        self.during_datasets = (str(self.context.data_dir), self.context.total_steps)
        return super().datasets(data_dir)

    def param_groups(self, named):
        own = {{name for name, _ in self.build_model().named_parameters()}}
        ctx = self.context
        Path(os.environ["SEEN_DIR"], f"rank{{ctx.world.rank}}.json").write_text(json.dumps({{
            "names": sorted(name for name, _ in named), "own": sorted(own),
            "during_datasets": self.during_datasets, "total_steps": ctx.total_steps,
            "steps_per_epoch": ctx.steps_per_epoch, "epochs": ctx.epochs,
            "dp": ctx.layout.dp, "world": ctx.world.size}}))
        decay = [p for name, p in named if not name.endswith("bias")]
        no_decay = [p for name, p in named if name.endswith("bias")]
        return [{{"params": decay, "weight_decay": 0.1}},
                {{"params": no_decay, "weight_decay": 0.0}}]

    def optimizer(self, params, lr):
        assert [g["weight_decay"] for g in params] == [0.1, 0.0], params
        return torch.optim.AdamW(params, lr=lr)


@hookimpl
def ddl_register_workloads():
    return [replace(spec, name="told", factory=Told) for spec in example_specs()]
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("told")
    src = REPO / "docs" / "examples" / "ddl-example-plugin" / "src"
    env = install_plugin(root / "site", "ddl_told", PLUGIN.format(src=str(src)), entry="told")
    proc = run_ddl("prepare", "--plugin", "told", "--synthetic", "--data-dir",
                   str(root / "data"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return env, root / "data"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_context_and_named_groups_under_wrapping_strategies(tmp_path, installed, strategy):
    env, data = installed
    seen = tmp_path / "seen"
    seen.mkdir()
    proc = run_ddl("train", "--plugin", "told", "--preset", "tiny", "--nproc", "2",
                   "--strategy", strategy, "--epochs", "2", "--steps-per-epoch", "3",
                   "--data-dir", str(data), "--run-dir", str(tmp_path / "run"),
                   env={**env, "SEEN_DIR": str(seen)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        told = json.loads((seen / f"rank{rank}.json").read_text())
        # names as in the model build_model() returned: no DDP "module." prefix
        assert told["names"] == told["own"] and told["names"], told
        assert told["during_datasets"] == [str(data.resolve()), None]  # steps not known yet
        assert (told["epochs"], told["steps_per_epoch"], told["total_steps"]) == (2, 3, 6)
        assert (told["dp"], told["world"]) == (2, 2)
