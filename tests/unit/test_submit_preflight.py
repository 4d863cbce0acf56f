"""`ddl submit` runs the pre-flight of `ddl train` that needs no torch before it writes a
script (issue 42): a job that would fail after the queue wait is refused at once, in one
line, exit 2, and nothing is written. Also the values of issue 43 item 12 (a mesh the job's
world cannot hold, an absurd node count, a stop margin outside the time limit)."""

import pytest

from conftest import assert_one_line_error, run_ddl

pytestmark = pytest.mark.unit

JSC = ["submit", "--site", "juwels-booster", "--account", "proj", "--plugin", "mnist"]


@pytest.mark.parametrize("args, needles", [
    (["--preset", "huge"], ["--preset: mnist has no preset 'huge'; allowed: "]),
    (["--data-dir", "{tmp}/missing"], ["--data-dir: {tmp}/missing does not exist"]),
    (["--strategy-option", "bucket_cap=5"],
     ["--strategy-option: ddp has no option 'bucket_cap'; allowed: bucket_cap_mb"]),
    (["--strategy", "tp", "--strategy-option", "schedule=1f1b"],
     ["--strategy-option: tp has no option 'schedule'; allowed: none"]),
    (["--resume", "{tmp}/runs/old"], ["--resume: {tmp}/runs/old does not exist; allowed: none, "
                                      "auto, or the path"]),
    # issue 43 item 12
    (["--mesh", "tp=3", "--gpus-per-node", "2"], ["--mesh: tp=3 does not divide", " 2 "]),
    (["--strategy", "fsdp+tp", "--mesh", "tp=3", "--gpus-per-node", "2"],
     ["--mesh: tp=3 does not divide the job's 2 processes"]),
    (["--mesh", "dp_shard=3", "--nodes", "2"], ["--mesh: dp_shard=3", "the world has 8"]),
    (["--nodes", "100000000"], ["--nodes: 100000000", "allowed: 1 to 10000"]),
    (["--stop-margin", "-1"], ["--stop-margin: -1; allowed: seconds >= 0 (0 = off)"]),
    (["--stop-margin", "3600", "--time", "01:00:00"],
     ["--stop-margin: 3600 s is not shorter than --time 01:00:00", "allowed: 0 (off) to 3599"]),
    (["--stop-margin", "7200", "--time", "30"], ["--stop-margin: 7200 s", "to 1799"]),
    (["--gpus-per-node", "0"], ["--gpus-per-node: 0 on juwels-booster", "--device cpu"]),
    # values the job or sbatch would refuse later: one line now, no traceback
    (["--container", "{tmp}/" + "c" * 300 + ".sif"],
     ["--container: ", "has a name of 304 bytes; allowed: at most 255 bytes a name"]),
    (["--account", "a" * 100_000], ["--account: aaaa", "is 100000 characters long; allowed: "
                                                      "at most 255"]),
    (["--run-dir", "{tmp}/" + "r" * 256], ["--run-dir: ", "a name of 256 bytes"]),
    (["--run-dir", "{tmp}/" + "/".join(["r" * 200] * 20)], ["--run-dir: ", "allowed: at most 3975"]),
    # issue 41: a layout whose training state alone cannot fit a GPU (t5-3b replicated on
    # 40 GB A100s); the sharded layout that fits is named
    (["--plugin", "xsum", "--preset", "t5-3b", "--strategy", "ddp"],
     ["--strategy ddp: xsum t5-3b (2.85B parameters) needs about 44.5 GiB per GPU",
      "juwels-booster GPU has 40.0 GiB", "--strategy fsdp (12.6 GiB per GPU", "--force"]),
    (["--plugin", "xsum", "--preset", "t5-3b", "--mesh", "dp_replicate=4"],
     ["--strategy mesh: xsum t5-3b", "split 1 ways"]),
    # a symlink loop on the way (issue 43 item 3, for submit too): one line, not pathlib's
    (["--run-dir", "{tmp}/loop/run"], ["--run-dir: cannot resolve", "loop"]),
    (["--data-dir", "{tmp}/loop/data"], ["--data-dir: cannot resolve", "loop"]),
])
def test_a_job_that_would_fail_in_the_queue_is_refused_before_the_script(tmp_path, args,
                                                                         needles):
    given = [a.format(tmp=tmp_path) for a in args]
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # for the symlink-loop rows
    proc = run_ddl(*JSC, *given, "--dry-run", cwd=tmp_path)
    assert_one_line_error(proc, *(n.format(tmp=tmp_path) for n in needles))
    assert proc.stdout == ""


@pytest.mark.parametrize("args", [["--data-dir", "{tmp}/missing"],
                                  ["--stop-margin", "600", "--time", "10"]])
def test_a_real_submit_writes_nothing(tmp_path, args):
    out = tmp_path / "out"
    proc = run_ddl(*JSC, *(a.format(tmp=tmp_path) for a in args), "--output-dir", str(out),
                   cwd=tmp_path)
    assert_one_line_error(proc, args[0])
    assert not out.exists()  # no script, no log folder


@pytest.mark.parametrize("args", [
    ["--data-dir", "/nonexistent-fs/proj/data", "--resume", "/nonexistent-fs/proj/run"],
    ["--gpus-per-node", "0", "--device", "cpu"],
    ["--mesh", "tp=2", "--strategy", "fsdp+tp", "--gpus-per-node", "2"],
    ["--stop-margin", "3599", "--time", "01:00:00"],
    ["--stop-margin", "0", "--time", "1"],
    ["--strategy", "fsdp", "--strategy-option", "reshard_after_forward=false"],
    # sharded over the node's 4 GPUs the same model fits; --force overrides the refusal
    ["--plugin", "xsum", "--preset", "t5-3b", "--strategy", "fsdp"],
    ["--plugin", "xsum", "--preset", "t5-3b", "--strategy", "ddp", "--force"],
])
def test_what_the_job_can_run_still_renders(tmp_path, args):
    """Paths on a file system this machine lacks (a script rendered for another system)
    are left to the job; a margin inside the limit, or none, renders."""
    proc = run_ddl(*JSC, *args, "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash")


def test_existing_paths_render(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "run").mkdir()
    proc = run_ddl(*JSC, "--data-dir", "data", "--resume", str(tmp_path / "run"), "--dry-run",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"--data-dir={tmp_path / 'data'}" in proc.stdout


def test_declared_strategy_options_are_the_strategies_own():
    """The names the registration declares (read by submit, without torch) are the ones
    each strategy class accepts (checked by the job)."""
    from ddl.contract.plugins import Plugins
    from ddl.contract.specs import load_factory

    plugins = Plugins()
    for spec in plugins.strategies().values():
        if spec.options is None or spec.unavailable():
            continue
        assert spec.options == set(load_factory(spec.factory).options_help), spec.name
