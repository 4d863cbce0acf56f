"""`ddl train` decides once: the site profile is loaded, the run directory named, the
launcher chosen, and the preset, layout, batch split (by the one global-batch rule), lr,
precision, each rank's cores and threads and the live state's interval worked out in one
process, one time; the workers read the plan instead, and each builds the run's one mesh
once, from the plan's degrees (issue 40, item 1; issue 50, item 4).

The count covers the whole process tree of a real 2-process run: a ``sitecustomize`` module
on PYTHONPATH (imported by every Python process at start-up, the workers the elastic agent
spawns included) wraps the functions that make those decisions and appends one line per
call, with the process id, to a log file. Nothing in ddl knows it is watched.
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
import functools, importlib.abc, importlib.util, json, os, sys

import ddl.contract.layout as layout
import ddl.contract.strategy as strategy
import ddl.settings.batch as batch
import ddl.settings.config as config
import ddl.settings.cores as cores
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


class WatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps a module's function as soon as the module is imported: modules that import
    torch are not imported here, which would cost every process of the test that import."""

    def __init__(self, targets):
        self.targets = targets  # module name -> [(function name, describe)]

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.targets:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            for name, describe in self.targets[fullname]:
                watch(module, name, describe)

        spec.loader.exec_module = exec_module
        return spec


watch(sites, "load_profile", lambda path: str(path))
watch(rundir, "name", lambda plugin, strategy, tag: f"{plugin}-{strategy}")
watch(plan, "choose_launcher", lambda requested, site, env=None: requested)
# what the pre-flight works out and the workers read from the plan (issue 40, item 1)
watch(config, "resolve_preset", lambda config, spec: spec.name)
watch(batch, "resolve_batch", lambda config, batch, dp: f"dp {dp}")
watch(batch, "global_batch", lambda given, per_replica, dp: f"dp {dp}")  # the one rule
watch(config, "scaled_lr", lambda config, lr, glob, batch: f"global {glob}")
watch(strategy.Strategy, "resolve_layout", lambda self, mesh, world: f"world {world}")
# each rank's cores and threads (issue 50, item 4): the pre-flight's, never a worker's
for where in (cores, plan):  # plan.py holds it by name
    watch(where, "plan_cores", lambda site, launcher, nproc, env=None: launcher)
watch(cores, "decide_threads", lambda: "threads")  # keyword arguments only
# how often each rank replaces its live state file (grows with the world)
watch(plan, "live_interval", lambda given, world_size: f"world {world_size}")
# the mesh: built by each worker once, from the plan's degrees, by the one builder
watch(layout.ParallelLayout, "device_mesh", lambda self, kind: self.describe())
# precision: "auto" decided once (ddl.worker.train.precision imports torch)
sys.meta_path.insert(0, WatchOnImport({"ddl.worker.train.precision": [
    ("resolve", lambda requested, device: requested)]}))
'''


# The runs evaluate the first 16 val and test samples only: what is counted is decided
# before training, and a full evaluation of the default (course) preset was a share of
# each run's CPU time.
EVAL = ("--eval-samples", "16")

# decided once per `ddl train` (the pre-flight), read by its workers
RESOLVED = {"resolve_preset": 1, "resolve_batch": 1, "scaled_lr": 1, "resolve_layout": 1,
            "resolve": 1, "plan_cores": 1, "live_interval": 1}
# helpers of those decisions: called by the pre-flight only, however often
PREFLIGHT_ONLY = {"global_batch", "decide_threads"}


def _decisions(log: Path) -> list[tuple[int, str, str]]:
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()]


def test_each_decision_is_made_once_per_train(tmp_path, synthetic_mnist):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(WATCHER)
    log = tmp_path / "decisions.jsonl"
    proc = run_ddl("train", "--site", "local", "--nproc", "2", "--epochs", "1",
                   "--steps-per-epoch", "2", *EVAL, "--data-dir", str(synthetic_mnist),
                   cwd=tmp_path, env={"PYTHONPATH": str(hooks),
                                      "DDL_TEST_DECISION_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "results.json").is_file()
    assert (runs[0] / "plan.json").is_file()  # what the two workers read

    calls = _decisions(log)
    preflight = calls[0][0]  # `ddl train`: it loads the profile first
    assert calls[0][1] == "load_profile" and calls[0][2].endswith("local.toml")
    by_kind = Counter(kind for pid, kind, _ in calls if kind not in PREFLIGHT_ONLY)
    assert by_kind == {"load_profile": 1, "name": 1, "choose_launcher": 1, **RESOLVED,
                       "device_mesh": 2}, calls
    # every decision in `ddl train`, none in a worker
    assert {pid for pid, kind, _ in calls if kind != "device_mesh"} == {preflight}, calls
    # the mesh: once in each worker, from the plan's degrees, never in the pre-flight
    built = Counter(pid for pid, kind, _ in calls if kind == "device_mesh")
    assert len(built) == 2 and set(built.values()) == {1} and preflight not in built, calls
    results = json.loads((runs[0] / "results.json").read_text())
    assert results["world"]["size"] == 2
    # rank 0 computed with the threads the plan gave local rank 0, as it was given them
    planned = json.loads((runs[0] / "plan.json").read_text())["cores"]
    assert len(planned) == 2 and results["threads"] == planned[0]["threads"], planned


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
         "--global-batch-size", "32", "--batch-size", "8", *EVAL, "--data-dir",
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
        assert mine["device_mesh"] == 1, calls  # one mesh, built once
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["batch"] == {"per_replica": 16, "global": 32, "micro": 8,
                                "accumulation_steps": 2}
