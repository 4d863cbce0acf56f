"""`ddl submit` sizes jobs as the sites bill them, and refuses or notes what a user would
otherwise find only after the queue (issue 52, items 1-6 and 20's submit part).

All in-process `--dry-run`s (no torch, no Slurm): each a few milliseconds.

1. CPUs follow the GPUs asked for: the node's CPUs per GPU (LUMI 7 per GCD as its AI guide
   gives, CTE-POWER 40 per V100 as the hands-on's `--cpus-per-task=160 --gres=gpu:4`), not
   the node's CPUs divided over the GPUs requested.
2. LUMI: GCD masks only where the job has the whole node (standard-g); a partial node on a
   shared partition is not bound to them (LUMI documents the masks for full-node
   allocations); standard-g bills whole nodes, which a partial request is told.
3. tp against the model's heads, before the queue; a note when tp groups span nodes.
4. No --partition line for a profile's stand-in partition name (CTE-POWER, MN5).
5. A bad value is quoted cut to ~40 characters; --ddl-command/--run-dir refuse a newline.
6. A note for a JSC submit without --account, and for CTE-POWER from an x86_64 install.
20. Empty --account/--job-name/--partition/--time/--output-dir and out-of-range clock
    fields in --time are refused in one line, exit 2.
"""

from __future__ import annotations

import pytest

from ddl.commands.cli import main

pytestmark = pytest.mark.unit

RUN = ["--plugin", "mnist", "--data-dir", "/scratch/proj/data", "--output-dir",
       "/scratch/proj/runs", "--dry-run"]
FIXED = [*RUN, "--account", "proj", "--ddl-command", "ddl"]


def submit(capsys, *args: str, fixed=FIXED) -> tuple[int, list[str], list[str]]:
    """(exit code, script lines, stderr lines) of `ddl submit ARGS`."""
    capsys.readouterr()
    code = main(["submit", *fixed, *args])
    out = capsys.readouterr()
    return code, out.out.splitlines(), [line for line in out.err.splitlines() if line]


def script(capsys, *args: str, fixed=FIXED) -> list[str]:
    code, lines, err = submit(capsys, *args, fixed=fixed)
    assert code == 0, err
    return lines


def refused(capsys, *args: str, fixed=FIXED) -> str:
    code, _, err = submit(capsys, *args, fixed=fixed)
    assert code == 2, err
    assert len(err) == 1, err
    return err[0]


def srun_line(lines: list[str]) -> str:
    return next(line for line in lines if line.startswith("srun "))


# --- 1. CPUs per task follow the GPUs requested -------------------------------------------

@pytest.mark.parametrize("site, partition, gpus, tasks, cpus", [
    # srun style: one task per GPU, the node's CPUs per GPU each
    ("lumi-g", "small-g", 2, 2, 7),        # 56 usable cores / 8 GCDs [S]; was 28
    ("lumi-g", "small-g", 1, 1, 7),        # was 56: the whole node for one GCD
    ("cte-power", None, 2, 2, 40),         # 160 threads / 4 V100 [S]; was 80
    ("cte-power", None, 1, 1, 40),         # was 160
    # per-node launcher: one task with the CPUs of its node's GPUs
    ("juwels-booster", None, 2, 1, 24),    # 48 cores / 4 A100, 2 of them; was 48
    ("jureca-dc", None, 1, 1, 32),         # 128 / 4; was 128
])
def test_cpus_per_task_follow_the_gpus_asked_for(capsys, site, partition, gpus, tasks, cpus):
    part = ["--partition", partition] if partition else []
    lines = script(capsys, "--site", site, *part, "--gpus-per-node", str(gpus))
    assert f"#SBATCH --ntasks-per-node={tasks}" in lines
    assert f"#SBATCH --cpus-per-task={cpus}" in lines


@pytest.mark.parametrize("site, cpus", [("lumi-g", 7), ("cte-power", 40),
                                        ("juwels-booster", 48), ("jureca-dc", 128)])
def test_a_whole_node_keeps_the_whole_nodes_cpus(capsys, site, cpus):
    assert f"#SBATCH --cpus-per-task={cpus}" in script(capsys, "--site", site)


def test_a_per_node_launcher_on_part_of_a_lumi_node_asks_memory_per_gcd(capsys):
    """torchrun style asks the whole node's --mem=480G; for 2 GCDs, 60G each instead."""
    lines = script(capsys, "--site", "lumi-g", "--partition", "small-g", "--gpus-per-node",
                   "2", "--launcher", "torchrun")
    assert "#SBATCH --cpus-per-task=14" in lines
    assert "#SBATCH --mem-per-gpu=60G" in lines
    assert not any(line.startswith("#SBATCH --mem=") for line in lines)


# --- 2. LUMI partial nodes ---------------------------------------------------------------

@pytest.mark.parametrize("partition", ["small-g", "dev-g"])
def test_part_of_a_shared_lumi_node_is_not_bound_to_whole_node_masks(capsys, partition):
    lines = script(capsys, "--site", "lumi-g", "--partition", partition,
                   "--gpus-per-node", "2")
    assert "mask_cpu" not in srun_line(lines)
    assert srun_line(lines).startswith("srun --ntasks-per-node=2 --cpu-bind=none ")
    assert "#SBATCH --exclusive" not in lines  # that would bill the whole node
    assert any("masks are for whole nodes" in line for line in lines if line.startswith("#"))


def test_a_whole_lumi_node_keeps_the_gcd_masks(capsys):
    lines = script(capsys, "--site", "lumi-g", "--partition", "small-g")
    assert "--cpu-bind=mask_cpu:0x00fe000000000000," in srun_line(lines)


def test_part_of_a_standard_g_node_is_bound_and_told_it_pays_for_the_node(capsys):
    code, lines, err = submit(capsys, "--site", "lumi-g", "--gpus-per-node", "4")
    assert code == 0, err
    assert ("--cpu-bind=mask_cpu:0x00fe000000000000,0xfe00000000000000,"
            "0x0000000000fe0000,0x00000000fe000000 ") in srun_line(lines)
    assert err == ["ddl: note: --gpus-per-node 4: partition standard-g of lumi-g allocates "
                   "and bills whole nodes, so the job pays for all 8 GPUs of each node; use "
                   "all 8, or a partition that shares nodes (small-g)"]


def test_workers_under_torchrun_on_part_of_a_node_stay_unbound():
    """Under a per-node launcher the workers bind themselves to the site's per-GCD cores
    (worker_cores, planned by ddl.settings.cores); a job holding other cores (small-g)
    leaves them unbound, one note (rank 0's)."""
    from ddl.contract.errors import UsageError
    from ddl.settings.cores import plan_cores
    from ddl.settings.sites import get_site

    site, node = get_site("lumi-g"), set(range(64))
    part = plan_cores(site, "torchrun", 8, {}, online=node, held=set(range(8, 22)))
    assert [rank.cpus for rank in part] == [None] * 8
    assert [rank.note for rank in part] == [
        "ddl: note: site lumi-g's per-GPU cores are for a whole node; this job holds CPUs "
        "8-21: workers left unbound"] + [None] * 7
    whole = plan_cores(site, "torchrun", 8, {}, online=node, held=node)
    assert whole[4].cpus == [1, 2, 3, 4, 5, 6, 7] and whole[4].threads.per_rank == 7
    with pytest.raises(UsageError, match="lists CPU cores .* for 8 devices, but this node "
                                         "runs 9 ranks"):
        plan_cores(site, "torchrun", 9, {}, online=node, held=node)


# --- 3. tp against the model's heads -----------------------------------------------------

XSUM_TINY = ["--plugin", "xsum", "--preset", "tiny"]  # 4 heads


@pytest.mark.parametrize("site", ["juwels-booster", "jureca-dc", "cte-power", "lumi-g"])
def test_tp_that_does_not_divide_the_heads_is_refused_before_the_queue(capsys, site):
    line = refused(capsys, "--site", site, "--nodes", "2", *XSUM_TINY, "--mesh", "tp=8")
    assert line == ("ddl: error: --mesh: tp=8, but 4 attention heads do not split over 8 "
                    "ranks; allowed: tp dividing 4 (1, 2, 4)")


def test_strategy_tp_over_the_whole_world_is_checked_too(capsys):
    line = refused(capsys, "--site", "juwels-booster", "--nodes", "2", *XSUM_TINY,
                   "--strategy", "tp")
    assert "tp=8, but 4 attention heads" in line


def test_tp_within_a_node_gives_no_note(capsys):
    code, _, err = submit(capsys, "--site", "juwels-booster", "--nodes", "2", *XSUM_TINY,
                          "--mesh", "tp=4")
    assert (code, err) == (0, [])


def test_tp_spanning_nodes_is_allowed_with_a_note(capsys):
    """t5-base's 12 heads split over 6, but 6 ranks do not fit a 4-GPU node."""
    code, _, err = submit(capsys, "--site", "juwels-booster", "--nodes", "3", "--plugin",
                          "xsum", "--mesh", "tp=6")
    assert code == 0, err
    assert len(err) == 1 and err[0].startswith(
        "ddl: note: tp=6: tensor-parallel groups span nodes (4 GPUs per node)"), err


def test_the_workload_applies_the_same_rule_in_the_job():
    """One rule (ddl.contract.layout.check_heads), two callers: the preset's declared
    count at submit, the model's own in xsum's prepare_tensor_parallel."""
    from importlib.util import find_spec
    from pathlib import Path

    from ddl_xsum.data import T5_SHAPES
    from ddl_xsum.plugin import PRESETS

    source = Path(find_spec("ddl_xsum.workload").origin).read_text()  # not imported: torch
    assert "check_heads(module.n_heads, tp_degree)" in source
    for preset in PRESETS.values():
        assert preset.attention_heads == T5_SHAPES[
            preset.options["model"]]["num_heads"], preset.name


# --- 4. no partition line for a stand-in name --------------------------------------------

@pytest.mark.parametrize("site", ["cte-power", "mn5-acc"])
def test_a_placeholder_partition_writes_no_partition_line(capsys, site):
    lines = script(capsys, "--site", site)
    assert not any(line.startswith("#SBATCH --partition") for line in lines)
    assert any(line.startswith("# No --partition:") for line in lines)


def test_the_real_partition_can_still_be_given(capsys):
    lines = script(capsys, "--site", "cte-power", "--sbatch=--partition=gpu")
    assert "#SBATCH --partition=gpu" in lines


@pytest.mark.parametrize("site, partition", [("juwels-booster", "booster"),
                                             ("jureca-dc", "dc-gpu"),
                                             ("lumi-g", "standard-g")])
def test_known_partitions_are_still_written(capsys, site, partition):
    assert f"#SBATCH --partition={partition}" in script(capsys, "--site", site)


# --- 5. long values cut, newlines refused ------------------------------------------------

LONG = "x" * 100_000


def _options() -> list[str]:
    from ddl.commands.parser import make_parser

    sub = make_parser()._subparsers._group_actions[0].choices["submit"]  # noqa: SLF001
    return sorted(a.option_strings[-1] for a in sub._actions  # noqa: SLF001
                  if a.option_strings and a.nargs != 0 and a.dest != "help")


@pytest.mark.parametrize("flag", [f for f in _options() if f not in ("--ddl-command",
                                                                      "--setup")])
def test_a_100k_character_value_is_quoted_cut(capsys, flag):
    """Every option that refuses a value quotes it in well under 400 characters."""
    line = refused(capsys, "--site", "juwels-booster", f"{flag}={LONG}")
    assert len(line) < 400, (flag, len(line))
    assert "xxxxxxxxxx" in line or flag in line


@pytest.mark.parametrize("flag", ["--ddl-command", "--run-dir"])
def test_a_newline_in_the_jobs_command_line_is_refused(capsys, flag):
    line = refused(capsys, "--site", "lumi-g", f"{flag}=/p/x\nrm -rf ~")
    assert line == (f"ddl: error: {flag}: '/p/x\\nrm -rf ~' holds a newline or control "
                    "character; allowed: printable characters only")


# --- 6. notes: JSC account, CTE-POWER architecture ---------------------------------------

@pytest.mark.parametrize("site", ["juwels-booster", "jureca-dc"])
def test_a_jsc_submit_without_account_gets_a_note(capsys, monkeypatch, site):
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    code, lines, err = submit(capsys, "--site", site, fixed=[*RUN, "--ddl-command", "ddl"])
    assert code == 0 and lines[0] == "#!/bin/bash"
    assert err == [f"ddl: note: no --account: {site}'s sbatch refuses a job without a "
                   "compute project; add --account PROJECT (or set SBATCH_ACCOUNT, as "
                   "`jutil env activate -p PROJECT` does on JSC systems)"]


def test_no_account_note_with_sbatch_account_or_on_lumi(capsys, monkeypatch):
    monkeypatch.setenv("SBATCH_ACCOUNT", "proj")
    assert submit(capsys, "--site", "jureca-dc", fixed=[*RUN, "--ddl-command", "ddl"])[2] == []
    monkeypatch.delenv("SBATCH_ACCOUNT")
    assert submit(capsys, "--site", "lumi-g", fixed=[*RUN, "--ddl-command", "ddl"])[2] == []


def test_cte_power_from_an_x86_64_install_gets_a_note(capsys, monkeypatch):
    """ddl doctor's platform check (environment.arch_mismatch), said at submit: without a
    container or setup the job runs this x86_64 installation on ppc64le nodes."""
    from ddl.launch import environment

    monkeypatch.setattr(environment, "machine", lambda: "x86_64")
    code, _, err = submit(capsys, "--site", "cte-power", "--device", "cpu",
                          fixed=[*RUN, "--account", "proj"])
    assert code == 0, err
    assert len(err) == 1 and err[0].startswith(
        "ddl: note: no --container: the job runs "), err
    assert "this machine is x86_64; cte-power nodes are ppc64le" in err[0]
    # with --setup the job's own environment decides: no note
    assert submit(capsys, "--site", "cte-power", "--device", "cpu", "--setup",
                  "conda activate ddl", fixed=[*RUN, "--account", "proj"])[2] == []


# --- 20. empty values and clock fields ---------------------------------------------------

@pytest.mark.parametrize("flag", ["--account", "--job-name", "--partition", "--time"])
def test_an_empty_value_is_refused(capsys, flag):
    line = refused(capsys, "--site", "lumi-g", f"{flag}=")
    assert line == (f"ddl: error: {flag}: '' is empty; allowed: a value, or leave the flag "
                    "out for the default")


def test_an_empty_account_does_not_drop_one_given_earlier(capsys):
    assert "--account: '' is empty" in refused(capsys, "--site", "jureca-dc", "--account=")


def test_an_empty_output_dir_is_refused(capsys):
    line = refused(capsys, "--site", "lumi-g", "--output-dir=")
    assert line.startswith("ddl: error: argument --output-dir: an empty path would mean the "
                           "current directory")


@pytest.mark.parametrize("value, field", [("99:99:99", "99 minutes"), ("10:60", "60 seconds"),
                                          ("1-24", "24 hours"), ("2-00:60", "60 minutes"),
                                          ("1:00:60", "60 seconds")])
def test_a_clock_field_out_of_range_is_refused(capsys, value, field):
    line = refused(capsys, "--site", "lumi-g", "--time", value)
    assert line.startswith(f"ddl: error: --time: '{value}' has {field}; allowed: MM, MM:SS, "
                           "HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"), line


@pytest.mark.parametrize("value", ["90:00", "36:00:00", "1-23:59:59", "600"])
def test_the_first_field_is_open_as_slurm_reads_it(capsys, value):
    assert f"#SBATCH --time={value}" in script(capsys, "--site", "lumi-g", "--time", value)
