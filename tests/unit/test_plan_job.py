"""`ddl plan --verify K --submit`: the job script it would submit (--dry-run), the srun line
each layout gets inside such a job, and the flags that are refused in one line. The job
itself runs on the real local Slurm: tests/system/test_slurm.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from ddl.commands import plan_verify

pytestmark = pytest.mark.unit

PLAN = ("plan", "--plugin", "mnist", "--preset", "tiny", "--global-batch-size", "64")


def test_dry_run_prints_the_plan_and_a_job_that_verifies_it(synthetic_mnist, tmp_path):
    proc = run_ddl(*PLAN, "--site", "juwels", "--nodes", "2", "--data-dir",
                   str(synthetic_mnist), "--verify", "2", "--submit", "--dry-run",
                   "--account", "training2500", "--output-dir", str(tmp_path / "out"),
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan, _, script = proc.stdout.partition("# --dry-run: the job --submit would hand to "
                                            "sbatch\n")
    assert plan.startswith("mnist tiny on juwels-booster: 2 node(s) x 4 GPUs"), plan
    assert script.startswith("#!/bin/bash\n"), script
    lines = [line.split("  #")[0] for line in script.splitlines()]  # without comments
    for line in ("#SBATCH --nodes=2", "#SBATCH --account=training2500",
                 "#SBATCH --time=00:30:00", 'export TMPDIR="$out"'):
        assert line in lines, line
    assert "--signal" not in script and "--requeue" not in script  # nothing to resume
    # the job's own `ddl plan`: the user's plan with --verify, never --submit again
    [step] = [line for line in script.splitlines() if " plan --plugin " in line]
    words = shlex.split(step)
    assert words[words.index("--verify") + 1] == "2"
    assert words[words.index("--nodes") + 1] == "2"
    assert words[words.index("--data-dir") + 1] == str(synthetic_mnist)
    assert words[words.index("--save") + 1] == "$out/plan.json"
    assert "--submit" not in words and "--dry-run" not in words and "--account" not in words
    # the rendezvous is derived in the job, before the step that needs it
    assert script.index("MASTER_ADDR") < script.index(step)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_in_a_job_each_layout_is_an_srun_step_over_its_nodes(monkeypatch, tmp_path):
    from ddl.contract.plugins import Plugins
    from ddl.settings.sites import get_site

    site = get_site("juwels", Plugins())
    report = {"plugin": "mnist", "preset": "tiny", "site": site.name, "world": 8, "nodes": 2,
              "global_batch": 64}
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    assert plan_verify.in_slurm_job(site, 2)
    row = {"flags": ["--mesh", "dp_shard=8"]}
    command = plan_verify.train_command(row, report, "cuda", tmp_path, tmp_path / "run",
                                        plan_verify.srun_prefix(site, report))
    text = " ".join(command)
    assert command[:3] == ["srun", "--nodes=2", "--ntasks-per-node=4"], command
    assert command[command.index("-m") - 1] == sys.executable
    assert " --launcher srun --nproc 4 " in text and " --mesh dp_shard=8 " in text
    from ddl.settings.cores import srun_cpu_bind

    assert f"--cpu-bind={srun_cpu_bind(site, 4)}" in command  # as `ddl submit`'s srun binds
    # a job of another node count would run other layouts: refused
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    with pytest.raises(Exception, match="this Slurm job has 1 node"):
        plan_verify.in_slurm_job(site, 2)
    # outside Slurm, or on a site that is not Slurm's, the local launcher
    monkeypatch.delenv("SLURM_JOB_ID")
    assert not plan_verify.in_slurm_job(site, 2)
    local = plan_verify.train_command(row, report, "cpu", tmp_path, tmp_path / "run")
    assert local[0] == sys.executable and "--launcher local --nproc 8" in " ".join(local)


@pytest.mark.parametrize("args, needles", [
    (["--site", "juwels", "--submit"], ["--submit: ", "allowed: with --verify [K]"]),
    (["--site", "juwels", "--account", "x"], ["--account: a Slurm job's setting",
                                              "allowed: with --verify K --submit"]),
    (["--site", "local", "--verify", "1", "--submit"],
     ["--submit: site local is not a Slurm site", "or --verify without --submit"]),
    (["--site", "juwels", "--verify", "1", "--submit", "--time", "99:00:00:00"],
     ["--time: "]),
    (["--site", "juwels", "--save", "/nonexistent/dir/plan.json"],
     ["--save: cannot write /nonexistent/dir/plan.json", "allowed: a file in an existing"]),
    (["--site", "juwels", "--save", "/"], ["--save: cannot write /"]),
])
def test_what_cannot_be_submitted_is_one_line(tmp_path, args, needles):
    proc = run_ddl(*PLAN, *args, "--dry-run" if "--submit" in args else "--top=1",
                   cwd=tmp_path)
    assert_one_line_error(proc, *needles)
    assert list(Path(tmp_path).iterdir()) == []


def test_save_writes_the_report_as_json(synthetic_mnist, tmp_path):
    import json

    target = tmp_path / "plan.json"
    proc = run_ddl(*PLAN, "--site", "juwels", "--data-dir", str(synthetic_mnist),
                   "--save", str(target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(target.read_text())
    assert saved["site"] == "juwels-booster" and saved["fits"]
    assert proc.stdout.startswith("mnist tiny on juwels-booster")  # the table still printed
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left


def test_a_cpu_partition_gets_a_task_per_process_and_no_gpus(synthetic_mnist, tmp_path):
    """A CPU cluster's partition has no GPUs: the job asks for the plan's processes as
    tasks (not one task per GPU, which would be one task with all the CPUs) and no GRES."""
    profile = (REPO / "sites" / "local-slurm.toml").read_text()
    (tmp_path / "cpu-only.toml").write_text(
        profile.replace('name = "local-slurm"', 'name = "cpu-only"')
        .replace("gpus_per_node = 4 ", "gpus_per_node = 0 ")
        .replace('"local" }', '"cpu-only" }'))
    proc = run_ddl(*PLAN, "--site", "cpu-only", "--nodes", "2", "--nproc", "4", "--data-dir",
                   str(synthetic_mnist), "--verify", "1", "--submit", "--dry-run",
                   cwd=tmp_path, env={"DDL_SITE_PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    sbatch = [line for line in proc.stdout.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --ntasks-per-node=4" in sbatch and "#SBATCH --cpus-per-task=2" in sbatch
    assert not [line for line in sbatch if "gres" in line or "gpus" in line], sbatch
