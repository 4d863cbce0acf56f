"""tests/cli_fork.py: a CLI run forked from the preloaded fork server answers as the console
script in a fresh interpreter does, falls back to one where imports would differ, and a
timeout leaves nothing of the command running."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import cli_fork
import pytest
from conftest import DDL, live_workers, run_ddl

pytestmark = pytest.mark.distributed


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.parametrize("case", ["listing", "refused", "trained"])
def test_a_forked_command_answers_as_the_console_script(tmp_path, synthetic_mnist, case):
    args = {"listing": ["sites"],
            "refused": ["train", "--preset", "tiny", "--strategy", "tp", "--nproc", "2"],
            "trained": ["train", "--preset", "tiny", "--nproc", "2", "--epochs", "1",
                        "--steps-per-epoch", "2", "--seed", "3"]}[case]
    if case != "listing":
        args += ["--data-dir", str(synthetic_mnist)]
    answers = []
    for way in ("fork", "exec"):
        where = tmp_path / way
        where.mkdir()
        run_args = [*args, "--run-dir", str(where / "run")] if case != "listing" else args
        if way == "fork":
            proc = cli_fork.run(DDL, run_args, cwd=where, env=_env(), timeout=300)
            assert proc is not None, "the environment of this test needs no fresh interpreter"
        else:
            proc = run_ddl(*run_args, cwd=where, fresh=True)
        answers.append((proc.returncode, _same_for_both(proc.stdout, where),
                        _same_for_both(proc.stderr, where)))
    assert answers[0] == answers[1]
    assert answers[0][0] == {"listing": 0, "refused": 2, "trained": 0}[case], answers[0]


def _same_for_both(text: str, where: Path) -> list[str]:
    """The printed lines, less what differs between any two runs (folders, speeds)."""
    lines = text.replace(str(where), "WHERE").splitlines()
    return [line.split("|")[0] if "samples/s" in line else line for line in lines]


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "PYTHONPATH", "TORCH_LOGS"])
def test_an_environment_the_imports_did_not_see_runs_in_a_fresh_interpreter(variable,
                                                                           tmp_path):
    value = "1"
    if variable == "PYTHONPATH":  # a torch of its own: a fresh interpreter would import it
        (tmp_path / "torch").mkdir()
        (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('not this one')\n")
        value = str(tmp_path)
    assert cli_fork.run(DDL, ["sites"], cwd=None, env=_env(**{variable: value}),
                        timeout=120) is None
    # what only the run reads: still forked
    assert cli_fork.run(DDL, ["sites"], cwd=None, env=_env(DDL_ANYTHING="1"),
                        timeout=120).returncode == 0


def test_a_plugin_on_pythonpath_is_found_by_a_forked_command(tmp_path):
    """PYTHONPATH folders that only add modules (a third party's plugin package and its
    dist-info) go on the fork's sys.path where a fresh interpreter puts them: the plugin
    is listed by both, the same way."""
    from conftest import install_plugin

    env = _env(**install_plugin(tmp_path / "site", "forkedplugin", PLUGIN))
    forked = cli_fork.run(DDL, ["plugins"], cwd=tmp_path, env=env, timeout=120)
    assert forked is not None, "a plugin's folder needs no fresh interpreter"
    fresh = run_ddl("plugins", cwd=tmp_path, env=env, fresh=True)
    assert forked.returncode == fresh.returncode == 0, forked.stderr + fresh.stderr
    assert "forkedwork" in forked.stdout
    assert _same_for_both(forked.stdout, tmp_path) == _same_for_both(fresh.stdout, tmp_path)
    # without the folder the plugin is not there: the listing above came from it
    assert "forkedwork" not in cli_fork.run(DDL, ["plugins"], cwd=tmp_path, env=_env(),
                                            timeout=120).stdout


PLUGIN = """
from ddl.contract import hookimpl
from ddl_mnist.plugin import ddl_register_workloads as mnist_specs
from dataclasses import replace


@hookimpl
def ddl_register_workloads():
    return [replace(spec, name="forkedwork") for spec in mnist_specs()]
"""


def test_a_timeout_kills_the_command_and_its_workers(tmp_path, synthetic_mnist):
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        cli_fork.run(DDL, ["train", "--preset", "tiny", "--nproc", "2", "--epochs", "1000",
                           "--data-dir", str(synthetic_mnist),
                           "--run-dir", str(tmp_path / "run")],
                     cwd=tmp_path, env=_env(), timeout=8)
    assert "ddl: mnist (tiny) with ddp on 2 process(es)" in timed_out.value.output
    assert not cli_fork.session_members(timed_out.value.pid)
    # the workers hold sessions of their own and die with their parent (PR_SET_PDEATHSIG),
    # a moment after it: they are seen gone, by their own pid files, within 30 s
    deadline = time.monotonic() + 30
    while live_workers(tmp_path / "run") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not live_workers(tmp_path / "run")
