"""`ddl scale` / `ddl report`: bad input is one line, Slurm points render one script each."""

import json

import pytest

from conftest import assert_one_line_error, run_ddl

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("args, needle", [
    (["--nprocs", "1,x"], "--nprocs"),
    (["--nprocs", "0,2"], "--nprocs"),
    (["--nprocs", "2,2"], "--nprocs"),
    ([], "exactly one of"),
    (["--nprocs", "1", "--nodes", "1"], "exactly one of"),
    (["--nprocs", "1,2", "--global-batch-size", "64"], "weak scaling"),
    (["--nprocs", "1,2", "--scaling", "strong", "--batch-size", "8"], "strong scaling"),
    (["--nprocs", "1,2", "--peak-flops", "fast"], "--peak-flops"),
    (["--nprocs", "1,2", "--preset", "huge"], "--preset"),
    (["--nprocs", "1,2", "--account", "proj"], "only for Slurm points"),
    (["--nprocs", "1,2", "--dry-run"], "only for Slurm points"),
])
def test_scale_bad_input(args, needle, tmp_path):
    proc = run_ddl("scale", "--plugin", "mnist", *args, "--output", str(tmp_path / "s"))
    assert_one_line_error(proc, needle)
    assert not (tmp_path / "s").exists()


def test_report_needs_finished_runs(tmp_path):
    assert_one_line_error(run_ddl("report", str(tmp_path)), "finished run")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text("{not json")
    assert_one_line_error(run_ddl("report", str(tmp_path / "r")), "not readable JSON")


def test_slurm_points_render_one_script_per_node_count(tmp_path):
    proc = run_ddl("scale", "--site", "juwels-booster", "--nodes", "1,2", "--plugin", "mnist",
                   "--scaling", "strong", "--global-batch-size", "256", "--account", "proj",
                   "--dry-run", "--output", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    scripts = proc.stdout.split("#!/bin/bash")[1:]
    assert len(scripts) == 2
    for nodes, script in zip((1, 2), scripts):
        assert f"#SBATCH --nodes={nodes}" in script
        assert f"nodes{nodes}" in script  # its own run directory under the study
        assert "--global-batch-size=256" in script


def test_weak_scaling_keeps_the_presets_batch_per_replica(tmp_path):
    proc = run_ddl("scale", "--site", "juwels-booster", "--nodes", "1,2", "--plugin", "mnist",
                   "--preset", "tiny", "--account", "proj", "--dry-run",
                   "--output", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("--batch-size=32") == 2


def test_report_refuses_runs_of_different_workloads(tmp_path):
    for name, plugin in (("a", "mnist"), ("b", "cifar")):
        (tmp_path / name).mkdir()
        results = {"plugin": plugin, "strategy": "ddp", "preset": "tiny", "site": "local",
                   "world": {"size": 1}, "batch": {"per_replica": 8, "global": 8},
                   "summary": {"epoch_time_s": 1.0, "samples_per_s": 8.0,
                               "epochs_measured": [1]},
                   "epochs": [{"epoch": 1, "data_wait_s": 0.1}]}
        (tmp_path / name / "results.json").write_text(json.dumps(results))
    assert_one_line_error(run_ddl("report", str(tmp_path / "a"), str(tmp_path / "b")),
                          "different things")


def _point(devices, samples_per_s, threads):
    return {"devices": devices, "samples_per_s": samples_per_s, "threads_per_rank": threads,
            "device": "cpu"}


def test_a_speedup_above_ideal_is_flagged_with_its_likely_cause():
    from ddl.commands.report import table

    # the case: a 1-thread baseline against 2 ranks of 2 threads each
    points = table([_point(1, 100.0, 1), _point(2, 520.0, 2)])
    assert points[1]["above_ideal"] and "4 CPU threads in all against 1" in points[1]["warning"]
    # same cores in total, still far above ideal: the baseline is suspect
    points = table([_point(1, 100.0, 2), _point(2, 260.0, 1)])
    assert "baseline was probably slowed" in points[1]["warning"]
    # within 10 % of ideal: believed, no warning
    points = table([_point(1, 100.0, 2), _point(2, 215.0, 1)])
    assert not points[1]["above_ideal"] and points[1]["warning"] is None
