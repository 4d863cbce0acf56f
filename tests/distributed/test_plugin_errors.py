"""An exception in a plugin's code or data ends a 2-process run with ONE line on the
terminal, printed by the local launcher after every worker ended: the plugin, the hook and
phase (or the split and sample), the ranks that failed, the exception's last line and where
the per-rank tracebacks are (RUN_DIR/logs/rank<N>-traceback.txt); exit 1.

The plugins are real installed distributions as importlib.metadata sees them (dist-info with
a `ddl` entry point on PYTHONPATH), built on the example workload: one whose forward fails
the way a wrong reshape does, one whose validation set's __len__ claims 4 samples too many
(it passes check_data and fails only after a whole epoch of training), one whose rank 1 is
killed without a word (SIGKILL, as by the out-of-memory killer).

The runs are forked from the fork server as any test's `ddl` is (tests/cli_fork.py), with the
plugins' folder on sys.path where PYTHONPATH would put it: the folder holds only the plugins'
module and dist-info, which shadow nothing the server imported, so the fork finds the same
modules and entry points a fresh `PYTHONPATH=SITE ddl` would, without its 2.5-5 CPU-s of
imports per run (plugin_path below).
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager

import pytest

import cli_fork
from conftest import DDL, REPO, install_plugin, run_ddl

pytestmark = pytest.mark.distributed

PLUGINS = """
import os
import signal
import sys
from dataclasses import replace

sys.path.insert(0, {src!r})
from ddl.contract import hookimpl
from ddl_example.plugin import ddl_register_workloads as example_specs
from ddl_example.workload import RegressionWorkload


class BadReshape(RegressionWorkload):
    def forward(self, model, inputs):
        return model(inputs).view(16, 32, 3, 21)  # the wrong shape, as in a GPT attention


class Liar:
    '''A dataset whose __len__ claims 4 samples it does not have.'''

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset) + 4

    def __getitem__(self, index):
        return self.dataset[index]


class LyingVal(RegressionWorkload):
    def datasets(self, data_dir):
        splits = super().datasets(data_dir)
        return {{**splits, "val": Liar(splits["val"])}}


class KilledRank1(RegressionWorkload):
    def forward(self, model, inputs):
        if self.context.world.rank == 1:  # as the kernel's out-of-memory killer would
            os.kill(os.getpid(), signal.SIGKILL)
        return model(inputs)


@hookimpl
def ddl_register_workloads():
    return [replace(spec, name=name, factory=factory) for spec in example_specs()
            for name, factory in (("badreshape", BadReshape), ("lyingval", LyingVal),
                                  ("killed", KilledRank1))]
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(environment with both plugins installed, their prepared data directory)."""
    root = tmp_path_factory.mktemp("plugin-errors")
    src = REPO / "docs" / "examples" / "ddl-example-plugin" / "src"
    env = install_plugin(root / "site", "ddl_broken", PLUGINS.format(src=str(src)))
    sys.path.insert(0, str(src))  # generated here: a `ddl prepare` would cost seconds
    try:
        from ddl_example import data as example_data
    finally:
        sys.path.remove(str(src))
    data = root / "data"
    example_data.generate(data, {"train": 512, "val": 128, "test": 128})  # the tiny preset
    return env, data


@contextmanager
def plugin_path(env: dict[str, str]):
    """The environment for run_ddl that finds the plugins of ``env`` (install_plugin's
    PYTHONPATH): with forked commands, none, and the folder put on the forked command's
    sys.path right after the console script's own, where a fresh interpreter puts
    PYTHONPATH (a PYTHONPATH in the environment would send the command to a fresh
    interpreter: tests/cli_fork.py). The launcher's workers are forked from it and inherit
    that path. Under DDL_TEST_CLI=exec, ``env`` itself."""
    if not cli_fork.enabled():
        yield env
        return
    console = cli_fork._sys_path(DDL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli_fork, "_console_path", [[console[0], env["PYTHONPATH"], *console[1:]]])
        yield {}


def _train(plugin: str, installed, tmp_path, *extra: str):
    """Train with 2 processes; (the one line on stderr, the run dir, the crash records)."""
    env, data = installed
    run_dir = tmp_path / "run"
    fallbacks = len(cli_fork.fallbacks)
    with plugin_path(env) as run_env:
        proc = run_ddl("train", "--plugin", plugin, "--preset", "tiny", "--nproc", "2",
                       "--data-dir", str(data), "--run-dir", str(run_dir), *extra,
                       env=run_env, cwd=tmp_path)
    assert cli_fork.fallbacks[fallbacks:] == [], cli_fork.fallbacks  # forked, as planned
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1, proc.stderr
    records = {int(p.name[4:-11]): json.loads(p.read_text())
               for p in (run_dir / "logs").glob("rank*-error.json")}
    print(lines[0])
    return lines[0], run_dir, records


def test_failing_forward_is_one_line_naming_hook_phase_and_ranks(installed, tmp_path):
    line, run_dir, records = _train("badreshape", installed, tmp_path, "--epochs", "1")
    assert line.startswith("ddl: error: plugin 'badreshape': forward() in a training step "
                           "failed on rank"), line
    assert "RuntimeError: shape '[16, 32, 3, 21]' is invalid" in line
    assert "(at ddl_broken.py:" in line and "in forward)" in line
    # the line names exactly the ranks that recorded a failure (both, unless the agent
    # stopped the slower one before it got that far)
    named = re.search(r"failed on ranks? ([\d, ]+):", line).group(1)
    assert sorted(int(r) for r in named.split(", ")) == sorted(records) != []
    assert line.endswith(f"tracebacks: {run_dir / 'logs'}/rank<N>-traceback.txt") \
        if len(records) > 1 else line.endswith(f"traceback: {run_dir / 'logs'}/"
                                               f"rank{min(records)}-traceback.txt")
    text = (run_dir / "logs" / f"rank{min(records)}-traceback.txt").read_text()
    assert "Traceback" in text and "view(16, 32, 3, 21)" in text


def test_lying_len_names_plugin_split_and_sample(installed, tmp_path):
    """The tiny preset's val split has 128 rows and claims 132: evaluation shards indices
    r, r+2, ... so rank 0 fails at sample 128, rank 1 at sample 129."""
    line, run_dir, records = _train("lyingval", installed, tmp_path, "--epochs", "1",
                                    "--steps-per-epoch", "2")
    assert re.fullmatch(
        r"ddl: error: plugin 'lyingval': the val split's sample 12[89] failed on rank [01]: "
        r"IndexError: .*\(datasets\(\); its __len__ says 132\)(; also rank [01]: the val "
        r"split's sample 12[89])?; tracebacks?: .*", line), line
    assert "ddl_broken.py" in (run_dir / "logs" / f"rank{min(records)}-traceback.txt").read_text()


def test_a_rank_killed_without_a_word_is_named_not_rank_0(installed, tmp_path):
    """Rank 0 only loses contact (or is stopped by the agent); the line names rank 1."""
    line, _, records = _train("killed", installed, tmp_path, "--epochs", "1")
    assert line.startswith("ddl: error: worker rank 1 was killed by SIGKILL without an "
                           "error message"), line
    assert records == {}
