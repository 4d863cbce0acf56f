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
    (["--nprocs", "1,2", "--rounds", "0"], "--rounds"),
    (["--nprocs", "1,2", "--rounds", "x"], "--rounds"),
    (["--site", "juwels-booster", "--nodes", "1,2", "--rounds", "2"], "only for local points"),
])
def test_scale_bad_input(args, needle, tmp_path):
    proc = run_ddl("scale", "--plugin", "mnist", *args, "--output", str(tmp_path / "s"))
    assert_one_line_error(proc, needle)
    assert not (tmp_path / "s").exists()


def test_a_thread_count_that_is_no_number_is_refused_before_any_run(tmp_path):
    proc = run_ddl("scale", "--plugin", "mnist", "--nprocs", "1,2", "--output",
                   str(tmp_path / "s"), env={"OMP_NUM_THREADS": "many"})
    assert_one_line_error(proc, "OMP_NUM_THREADS", "'many'")
    assert not (tmp_path / "s").exists()


def test_every_point_gets_the_same_threads_per_rank():
    from ddl.commands.scaling import study_threads
    from ddl.settings import cores

    fixed, record = study_threads([1, 2], env={})
    assert fixed["OMP_NUM_THREADS"] == fixed[cores.GIVEN] == "1"
    assert record["per_rank"] == 1
    # what a worker then decides, whatever its local ranks and cores
    for ranks in (1, 2):
        chosen = cores.decide_threads(launcher="local", local_ranks=ranks, bound=False,
                                      affinity=2, env=fixed)
        assert chosen.per_rank == 1 and "ddl scale" in chosen.source
    fixed, record = study_threads([1, 2], env={"OMP_NUM_THREADS": "2"})
    assert fixed["OMP_NUM_THREADS"] == "2" and cores.SET_BY not in fixed
    assert record["per_rank"] == 2 and "set by the user" in record["source"]


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


def _point(devices, samples_per_s, threads, run_dir="r", batch=32):
    return {"devices": devices, "samples_per_s": samples_per_s, "threads_per_rank": threads,
            "device": "cpu", "run_dir": run_dir, "epoch_time_s": 1000 / samples_per_s,
            "batch_per_replica": batch, "batch_global": batch * devices,
            "flops_per_sample": None, "peak_flops_per_device": None, "mfu": None}


def test_a_speedup_above_ideal_is_no_result_and_says_why():
    from ddl.commands.report import table

    # issue 23's case: a 1-thread baseline against 2 ranks of 2 threads each
    points = table([_point(1, 100.0, 1), _point(2, 520.0, 2)])
    assert points[1]["above_ideal"] and "4 CPU threads in all against 1" in points[1]["warning"]
    assert points[1]["speedup"] is None and points[1]["efficiency"] is None
    assert points[1]["speedup_measured"] == 5.2
    # same threads per rank, still far above ideal: the baseline is suspect
    points = table([_point(1, 100.0, 1), _point(2, 260.0, 1)])
    assert points[1]["speedup"] is None
    assert "baseline was probably slowed" in points[1]["warning"]
    # within 10 % of ideal: a result, no warning
    points = table([_point(1, 100.0, 1), _point(2, 215.0, 1)])
    assert not points[1]["above_ideal"] and points[1]["warning"] is None
    assert points[1]["speedup"] == points[1]["speedup_measured"] == 2.15


def test_rounds_of_a_point_become_its_median_and_spread():
    from ddl.commands.report_rounds import merge

    runs = [_point(1, 100.0, 1, "a"), _point(2, 150.0, 1, "b"), _point(1, 40.0, 1, "c"),
            _point(2, 190.0, 1, "d"), _point(1, 110.0, 1, "e"), _point(2, 180.0, 1, "f"),
            _point(2, 400.0, 1, "g", batch=64)]  # another batch: another point
    one, two, other = merge(runs)
    assert one["rounds"] == 3 and one["run_dirs"] == ["a", "c", "e"]
    assert one["samples_per_s"] == 100.0 and one["run_dir"] == "a"  # the median run
    assert one["epoch_time_s"] == 10.0  # median of 10, 25, 1000/110
    assert (one["samples_per_s_min"], one["samples_per_s_max"]) == (40.0, 110.0)
    assert one["spread"] == 0.7
    assert two["samples_per_s"] == 180.0 and two["run_dir"] == "f"
    assert other["rounds"] == 1 and other["spread"] == 0.0
    # an even count: the median is the mean of the middle two; the slower one is the run
    pair = merge([_point(1, 100.0, 1, "a"), _point(1, 120.0, 1, "b")])[0]
    assert pair["samples_per_s"] == 110.0 and pair["run_dir"] == "a"


def test_the_printed_table_shows_no_number_for_a_speedup_above_ideal():
    from ddl.commands.report import format_table, table
    from ddl.commands.report_rounds import merge

    points = table(merge([_point(1, 100.0, 1, "a"), _point(2, 700.0, 1, "b"),
                          _point(1, 20.0, 1, "c"), _point(2, 690.0, 1, "d")]))
    for p in points:
        p.update(data_wait_fraction=0.01, max_peak_rss_bytes=None, cpu_percent_mean=None,
                 device_util_percent_mean=None)
    text = format_table({"plugin": "mnist", "preset": "tiny", "strategy": "ddp",
                         "scaling": "weak", "points": points})
    lines = text.splitlines()
    assert "median of 2 alternating rounds" in lines[1]
    assert "threads per rank: 1 at every point" in lines[1]
    row = lines[4].split()
    assert row[:5] == ["2", f"{1000 / 695:.2f}", "695.0", "1%", "invalid!"]
    assert "11.58" not in text.replace("measured speedup 11.58", "")  # only in the warning
    warning = "warning: 2 devices: measured speedup 11.58 is 479% above the ideal 2"
    assert lines[5].startswith(warning) and "ranged 20.0-100.0 over 2 rounds" in lines[5]
