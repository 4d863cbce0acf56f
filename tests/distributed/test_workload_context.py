"""Contract v2 through real runs: a workload learns its run (workload.context) and groups
its optimizer's parameters by the names its own model has, whatever the strategy wrapped
around it.

The plugin is installed the way third parties ship one (a dist-info with a `ddl` entry
point on PYTHONPATH): the example workload, recording what it was told to a file per rank.
Each run is ddl's worker training on a rank pool of 2 (tests/rankpool.py, pool_train.py:
the run plan `ddl train` makes, then ddl.worker.train.trainer.train in 2 processes of one
gloo group): the context is made there, not by the launcher, and the pool spares each
strategy a fresh interpreter and a rendezvous (a `ddl train` with the plugin on PYTHONPATH
cannot be forked from the test's fork server: tests/cli_fork.py). The launcher's own
path is tests/distributed/test_run_plan.py and the other CLI tests.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO, install_plugin

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
    """The plugin's site and its synthetic data (what `ddl prepare --synthetic` writes)."""
    from ddl.contract.plugins import Plugins

    root = tmp_path_factory.mktemp("told")
    src = REPO / "docs" / "examples" / "ddl-example-plugin" / "src"
    site = install_plugin(root / "site", "ddl_told", PLUGIN.format(src=str(src)),
                          entry="told")["PYTHONPATH"]
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(site)
        spec = Plugins().workload("told")
        spec.create(spec.presets["tiny"]).prepare(root / "data", synthetic=True)
    return site, root / "data"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_context_and_named_groups_under_wrapping_strategies(tmp_path, installed, strategy,
                                                             rank_pools, monkeypatch):
    from pool_train import prepare, train_cell_with_plugin

    site, data = installed
    seen = tmp_path / "seen"
    seen.mkdir()
    monkeypatch.syspath_prepend(site)  # the run plan finds the plugin, as `ddl train` would
    plan = prepare(["--plugin", "told", "--preset", "tiny", "--strategy", strategy,
                    "--epochs", "2", "--steps-per-epoch", "3", "--data-dir", str(data)],
                   tmp_path / "run", 2)
    rank_pools[2].run(train_cell_with_plugin, plan, site, ("ddl_told", "ddl_example"),
                      {"SEEN_DIR": str(seen)}, timeout_s=300)
    for rank in (0, 1):
        told = json.loads((seen / f"rank{rank}.json").read_text())
        # names as in the model build_model() returned: no DDP "module." prefix
        assert told["names"] == told["own"] and told["names"], told
        assert told["during_datasets"] == [str(data.resolve()), None]  # steps not known yet
        assert (told["epochs"], told["steps_per_epoch"], told["total_steps"]) == (2, 3, 6)
        assert (told["dp"], told["world"]) == (2, 2)
