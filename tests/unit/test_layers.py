"""The core's layers hold: commands > launch > worker > settings > contract, each importing
only those below it; ddl's own plugins import only the contract, as a third party's do.
Checked with the real import-linter against pyproject.toml's contracts, and shown able to
fail: a copy of the core with one planted upward import, or of a plugin with a planted
import of the worker, is refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

CORE = REPO / "packages" / "core" / "src" / "ddl"
LINT = str(Path(sys.executable).with_name("lint-imports"))


def _lint(cwd: Path, source_root: Path) -> subprocess.CompletedProcess:
    # lint-imports reads the contract from ./pyproject.toml and finds `ddl` on sys.path.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(source_root)}
    return subprocess.run([LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_layer_contract_is_kept():
    proc = _lint(REPO, CORE.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize("module, upward", [
    ("contract/errors.py", "from ddl.settings import sites"),
    ("settings/config.py", "from ddl.worker import trainer"),
    ("worker/train/trainer.py", "from ddl.launch import slurm"),
    ("launch/submit.py", "from ddl.commands import cli"),
])
def test_a_planted_upward_import_breaks_the_contract(tmp_path, module, upward):
    copy = tmp_path / "src" / "ddl"
    shutil.copytree(CORE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    # At the end, inside a function: import-linter sees every import, not just top-level ones.
    target.write_text(target.read_text() + f"\n\ndef _planted():\n    {upward}\n")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    proc = _lint(tmp_path, tmp_path / "src")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # the layers contract breaks (and, below the worker, the plugins' one with it: a plugin
    # importing the contract would reach the worker through it)
    assert "contract BROKEN" in proc.stdout, proc.stdout
    planted = "ddl." + module.removesuffix(".py").replace("/", ".")
    assert planted in proc.stdout, proc.stdout


def test_a_plugin_importing_the_worker_breaks_the_contract(tmp_path):
    """ddl_strategies' pipeline once imported ddl.worker.train.precision (issue 50)."""
    strategies = REPO / "packages" / "plugins" / "strategies" / "src" / "ddl_strategies"
    copy = tmp_path / "src" / "ddl_strategies"
    shutil.copytree(strategies, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "pipeline.py"
    target.write_text(target.read_text() + "\n\ndef _planted():\n"
                      "    from ddl.worker.train.precision import resolve\n")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    proc = _lint(tmp_path, f"{tmp_path / 'src'}:{CORE.parent}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 kept, 1 broken" in proc.stdout, proc.stdout
    assert "ddl_strategies.pipeline -> ddl.worker.train.precision" in proc.stdout, proc.stdout
