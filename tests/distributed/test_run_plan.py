"""`ddl train` decides once: the site profile is loaded, the run directory named and the
launcher chosen in one process, one time, and the workers read the plan instead.

The count covers the whole process tree of a real 2-process run: a ``sitecustomize`` module
on PYTHONPATH (imported by every Python process at start-up, the workers the elastic agent
spawns included) wraps the three functions that make those decisions and appends one line
per call, with the process id, to a log file. Nothing in ddl knows it is watched.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import run_ddl

pytestmark = pytest.mark.distributed

WATCHER = '''
import functools, json, os

import ddl.contract.strategy as strategy
import ddl.settings.batch as batch
import ddl.settings.config as config
import ddl.settings.plan as plan
import ddl.settings.rundir as rundir
import ddl.settings.sites as sites

LOG = os.environ["DDL_TEST_DECISION_LOG"]


def watch(module, name, describe):
    original = getattr(module, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        with open(LOG, "a") as log:
            log.write(json.dumps([os.getpid(), name, describe(*args)]) + "\\n")
        return original(*args, **kwargs)

    setattr(module, name, wrapper)


watch(sites, "load_profile", lambda path: str(path))
watch(rundir, "name", lambda plugin, strategy, tag: f"{plugin}-{strategy}")
watch(plan, "choose_launcher", lambda requested, site, env=None: requested)
# what the pre-flight works out and the workers read from the plan (issue 40, item 1)
watch(config, "resolve_preset", lambda config, spec: spec.name)
watch(batch, "resolve_batch", lambda config, batch, dp: f"dp {dp}")
watch(config, "scaled_lr", lambda config, lr, glob, batch: f"global {glob}")
watch(strategy.Strategy, "resolve_layout", lambda self, mesh, world: f"world {world}")
'''


RESOLVED = {"resolve_preset": 1, "resolve_batch": 1, "scaled_lr": 1, "resolve_layout": 1}


def _decisions(log: Path) -> list[tuple[int, str, str]]:
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()]


def test_each_decision_is_made_once_per_train(tmp_path, synthetic_mnist):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(WATCHER)
    log = tmp_path / "decisions.jsonl"
    proc = run_ddl("train", "--site", "local", "--nproc", "2", "--epochs", "1",
                   "--steps-per-epoch", "2", "--data-dir", str(synthetic_mnist),
                   cwd=tmp_path, env={"PYTHONPATH": str(hooks),
                                      "DDL_TEST_DECISION_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "results.json").is_file()
    assert (runs[0] / "plan.json").is_file()  # what the two workers read

    calls = _decisions(log)
    by_kind = Counter(kind for _, kind, _ in calls)
    assert by_kind == {"load_profile": 1, "name": 1, "choose_launcher": 1, **RESOLVED}, calls
    assert calls[0][2].endswith("local.toml")
    assert len({pid for pid, _, _ in calls}) == 1  # all in `ddl train`, none in a worker
    assert json.loads((runs[0] / "results.json").read_text())["world"]["size"] == 2


def test_auto_detection_reads_each_profile_once(monkeypatch):
    """Site auto: every profile is read once to match the machine; the chosen one is not
    read again."""
    from ddl.settings import config, sites

    seen: list[str] = []
    original = sites.load_profile

    def counting(path):
        seen.append(Path(path).name)
        return original(path)

    monkeypatch.setattr(sites, "load_profile", counting)
    built = config.build({"site": "auto"})
    assert seen and len(seen) == len(set(seen)), seen
    assert f"{built.site.name}.toml" in seen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_rank_started_by_a_launcher_decides_once(tmp_path, synthetic_mnist):
    """Two ranks started as torchrun or srun start them (each a `ddl train` of its own,
    RANK/WORLD_SIZE/MASTER_ADDR set): each runs the pre-flight and its worker in one
    process, and each of those decides once; the worker reads the pre-flight's results."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(WATCHER)
    log = tmp_path / "decisions.jsonl"
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC_", "SLURM_", "DDL_"))}
    env.update(PYTHONPATH=str(hooks), DDL_TEST_DECISION_LOG=str(log), WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1")
    ddl = Path(sys.executable).with_name("ddl")
    procs = [subprocess.Popen(
        [str(ddl), "train", "--site", "local", "--epochs", "1", "--steps-per-epoch", "2",
         "--global-batch-size", "32", "--batch-size", "8", "--data-dir",
         str(synthetic_mnist), "--run-dir", str(tmp_path / "run")],
        env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in (0, 1)]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    calls = _decisions(log)
    pids = {pid for pid, _, _ in calls}
    assert len(pids) == 2, calls
    for pid in pids:  # no decision made twice in one process: the worker read the plan
        mine = Counter(kind for p, kind, _ in calls if p == pid)
        assert {k: mine[k] for k in RESOLVED} == RESOLVED, calls
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["batch"] == {"per_replica": 16, "global": 32, "micro": 8,
                                "accumulation_steps": 2}
