"""results.json as ``ddl.worker.observe.results.assemble`` builds it: the summary's first-epoch
rule,
the sources of a few fields, and every field documented in docs/results.md.

The inputs are those a finished 2-rank CPU run would pass (the real mnist plugin, a real
RunConfig); ``assemble`` runs no collective, so no process group is needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import REPO

from ddl.contract.plugins import Plugins
from ddl.contract.world import World
from ddl.settings.config import RunConfig
from ddl.worker.observe import results
from ddl.worker.checkpointing.checkpoint import TrainerState
from ddl.worker.train.setup import TrainingNumbers

pytestmark = pytest.mark.unit


def _epoch(n: int, warmup: bool, time_s: float, samples: int = 1000) -> dict:
    return {"epoch": n, "warmup": warmup, "time_s": time_s, "samples": samples,
            "samples_per_s": samples / time_s, "data_wait_s": 0.1, "data_wait_per_step_s": 0.01,
            "eval_time_s": 0.2, "lr": 0.001, "train": {"loss": 1.0}, "val": {"loss": 0.9}}


def _assemble(tmp_path: Path, epochs: list[dict], **overrides) -> dict:
    plugins = Plugins()
    config = RunConfig(plugin="mnist", strategy="ddp", site="local", keep_checkpoints=3,
                       checkpoint_every=7)
    spec = plugins.workload("mnist")
    world = World(rank=0, local_rank=0, size=2, device=torch.device("cpu"), backend="gloo")
    numbers = TrainingNumbers(preset="tiny", dp_size=2, batch_per_replica=8, global_batch=16,
                    micro_batch=4, accumulation=2, base_lr=0.001, lr=0.002, epochs=len(epochs), steps_per_epoch=10)
    inputs = {
        "config": config, "world": world, "plugins": plugins,
        "workload": spec.create(spec.presets["tiny"]), "numbers": numbers, "data_dir": tmp_path,
        "precision": "fp32", "loader_workers": 0, "parameters": 1234, "epochs": epochs,
        "val": epochs[-1]["val"], "test": {"loss": 0.8}, "started": 1_700_000_000.0,
        "finished": 1_700_000_042.5, "memory": [{"params_bytes": 1}, {"params_bytes": 1}],
        "latest_checkpoint": tmp_path / "checkpoints" / "step-00000020",
        "resumed_from": None, "resumed": None, "strategy_report": {},
        "utilisation": [{}, {}], "profile": None, "peak_flops": None}
    return results.assemble(**{**inputs, **overrides})


def test_the_summary_leaves_out_each_runs_first_epoch(tmp_path):
    # epochs 1-2 from the run that wrote the checkpoint, 3-4 from the resumed run: each
    # run's first epoch carries its one-off costs
    epochs = [_epoch(1, True, 9.0), _epoch(2, False, 2.0), _epoch(3, True, 8.0, 500),
              _epoch(4, False, 3.0, 1500)]
    summary = _assemble(tmp_path, epochs)["summary"]
    assert summary["epochs_measured"] == [2, 4]
    assert summary["epoch_time_s"] == pytest.approx(2.5)
    assert summary["samples_per_s"] == pytest.approx(2500 / 5.0)
    assert summary["first_epoch_excluded"] is True


def test_a_single_epoch_is_measured_itself(tmp_path):
    summary = _assemble(tmp_path, [_epoch(1, True, 4.0)])["summary"]
    assert summary == {"epoch_time_s": 4.0, "samples_per_s": 250.0, "epochs_measured": [1],
                       "first_epoch_excluded": False}


def test_fields_come_from_their_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    saved = TrainerState(step=20, epoch=3, position=0, global_batch=16, world_size=4,
                         scheduler={}, plugin="mnist", preset="tiny", strategy="fsdp")
    doc = _assemble(tmp_path, [_epoch(1, True, 4.0), _epoch(2, False, 2.0)],
                    resumed_from=tmp_path / "old", resumed=saved, peak_flops=1e12,
                    profile=[{"trace": "trace-rank0.json"}, {"trace": "trace-rank1.json"}])
    assert doc["wall_time_s"] == pytest.approx(42.5)
    assert doc["checkpoints"] == {"latest": str(tmp_path / "checkpoints" / "step-00000020"),
                                  "keep": 3, "every_steps": 7, "asynchronous": False,
                                  "stall": {},
                                  "resumed_from": {"checkpoint": str(tmp_path / "old"),
                                                   "step": 20, "saved_by_world_size": 4}}
    assert doc["restarts"] == {"slurm_restart_count": 2, "worker_restarts": 0}
    assert set(doc["versions"]["plugins"]) == {"workload", "strategy"}
    assert len(doc["profile"]) == 2
    flops = doc["mfu"]["flops_per_sample"]
    assert doc["mfu"]["mfu"] == pytest.approx(flops * 500.0 / 2 / 1e12)  # 1000 samples / 2 s
    # the order tools and people see, ending with the optional profile before mfu
    assert list(doc)[-4:] == ["strategy_report", "utilisation", "profile", "mfu"]
    assert "profile" not in _assemble(tmp_path, [_epoch(1, True, 4.0)])


def _undocumented(document: dict, table: str) -> list[str]:
    """Fields (top level, one level down, and per-epoch) with no backticked name in the
    docs table: `top`, `top.sub`, `top[].sub`, `.sub` or `sub`."""
    named = set(re.findall(r"`([\w.\[\]/]+)`", table))

    def known(top: str, sub: str | None = None) -> bool:
        if sub is None:
            return bool({top, f"{top}[]"} & named) or any(n.startswith(f"{top}.") for n in named)
        return bool({f"{top}.{sub}", f"{top}[].{sub}", f".{sub}", sub} & named)

    missing = [top for top in document if not known(top)]
    for top, value in document.items():
        rows = value if top == "epochs" else [value]
        for row in rows:
            # versions: package names; environment: variable names
            if isinstance(row, dict) and top not in ("versions", "environment"):
                missing += [f"{top}.{sub}" for sub in row if not known(top, sub)]
    return sorted(set(missing))


def test_every_field_is_documented(tmp_path):
    epochs = [_epoch(1, True, 4.0), {**_epoch(2, False, 2.0), "resumed_at_step": 3}]
    document = _assemble(tmp_path, epochs, profile=[{}, {}])
    table = (REPO / "docs" / "results.md").read_text()
    assert _undocumented(document, table) == []
    # and the check can fail: a field without a row is named
    assert _undocumented({**document, "surprise": 1}, table) == ["surprise"]
