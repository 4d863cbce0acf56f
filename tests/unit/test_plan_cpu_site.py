"""`ddl plan` on a CPU site: `--site local` plans this machine's processes (`--nproc`, else
the site's 2), each with its share of the memory the machine has available (MemAvailable /
processes, as `ddl train --mesh auto` counts it); what cannot be planned is one line and
exit 2 (several nodes of one machine, a CPU cluster that gives no memory per process,
more processes than a GPU node has GPUs)."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, assert_one_line_error, run_ddl
from ddl.contract.host_memory import available_bytes as available_memory

pytestmark = pytest.mark.unit


def test_local_plans_this_machines_processes(synthetic_mnist, tmp_path):
    before = available_memory()
    proc = run_ddl("plan", "--plugin", "mnist", "--preset", "tiny", "--site", "local",
                   "--nproc", "4", "--data-dir", str(synthetic_mnist), "--format", "json",
                   cwd=tmp_path)
    after = available_memory()
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["world"] == report["gpus_per_node"] == 4 and report["nodes"] == 1
    assert report["devices"] == "processes" and "MemAvailable" in report["memory_source"]
    # a quarter of what the machine had available while it planned (other work moves it)
    share = report["device_memory_bytes"]
    assert min(before, after) // 4 * 0.8 < share < max(before, after) // 4 * 1.2
    # timed from this machine's links (planted by conftest) and the workload timed here
    assert report["fits"] and report["ranked_by"] == "predicted step time"
    assert all(row["step_s"] > 0 for row in report["fits"])
    best = report["fits"][0]["mesh"]  # the tiny CNN: a pipeline's per-pass cost x 4 loses
    assert best["pp"] == 1 and best["dp_replicate"] * best["dp_shard"] == 4, best
    for row in report["fits"]:
        mesh = row["mesh"]
        assert mesh["pp"] * mesh["dp_replicate"] * mesh["dp_shard"] * mesh["tp"] == 4
        assert 0 < row["model_state_bytes"] <= row["memory_per_rank_bytes"] <= share


def test_local_table_names_processes_and_defaults_to_two(synthetic_mnist, tmp_path):
    proc = run_ddl("plan", "--plugin", "mnist", "--preset", "tiny", "--site", "local",
                   "--data-dir", str(synthetic_mnist), "--top", "2", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    head = proc.stdout.splitlines()[0]
    assert head.startswith("mnist tiny on local: 1 node(s) x 2 processes, global batch 64, ")
    assert "MemAvailable) / 2 processes" in head
    assert "KiB" in proc.stdout or "MiB" in proc.stdout  # a tiny model is not "0.0 GiB"


@pytest.mark.parametrize("args, needles", [
    (["--site", "local", "--nodes", "2"], ["--nodes: 2; site local is this machine",
                                           "allowed: 1 (more processes: --nproc N)"]),
    (["--site", "local", "--nproc", "0"], ["--nproc: 0; allowed: a whole number >= 1"]),
    (["--site", "cpu-cluster"], ["--site: cpu-cluster is a CPU site of other machines",
                                 "device_memory_bytes"]),
    (["--site", "juwels", "--nproc", "8"], ["--nproc: 8; a juwels-booster node has 4 GPUs",
                                            "allowed: 1 to 4"]),
])
def test_what_cannot_be_planned_is_one_line(tmp_path, args, needles):
    # cpu-cluster: local-slurm's profile without the memory per process it gives the plan
    profile = (REPO / "sites" / "local-slurm.toml").read_text()
    assert "\ndevice_memory_bytes = " in profile
    (tmp_path / "cpu-cluster.toml").write_text(
        profile.replace('name = "local-slurm"', 'name = "cpu-cluster"').replace(
            "\ndevice_memory_bytes = ", "\n# device_memory_bytes = ").replace(
            '"local" }', '"cpu-cluster" }'))
    proc = run_ddl("plan", "--plugin", "mnist", *args, cwd=tmp_path,
                   env={"DDL_SITE_PATH": str(tmp_path)})
    assert_one_line_error(proc, *needles)


def test_sync_bn_is_planned_as_the_runs_will_use_it(synthetic_cifar, tmp_path):
    """`--sync-bn` on a CPU swaps BatchNorm for ddl's float64 layer, which keeps more for
    backward (ddl.planning.plan_probe): the plan must count that when the runs use it, and
    --verify's runs must then train with it."""
    def plan(*extra: str) -> dict:
        proc = run_ddl("plan", "--plugin", "cifar", "--preset", "tiny", "--site", "local",
                       "--nproc", "2", "--data-dir", str(synthetic_cifar), "--format", "json",
                       *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    plain, synced = plan(), plan("--sync-bn")
    assert (plain["sync_bn"], synced["sync_bn"]) == (False, True)
    # BatchNorm cannot train one sample per forward pass: such layouts are dropped, saying
    # why (the probe once stopped the whole plan with torch's traceback)
    single = [r for r in plain["dropped"] + plain["fits"]
              if r["micro_batch"] // (r["pipeline_microbatches"] or 1) == 1]
    assert single and all(r["dropped"].startswith("one sample per forward pass cannot "
                                                  "train: Expected more than 1 value")
                          for r in single), single
    by_flags = {tuple(r["flags"]): r["activation_bytes"] for r in plain["fits"]}
    more = [r["activation_bytes"] > by_flags[tuple(r["flags"])] for r in synced["fits"]
            if tuple(r["flags"]) in by_flags and r["mesh"]["pp"] == 1]  # data-parallel ones
    assert more and all(more), (by_flags, synced["fits"])

    from ddl.commands.plan_verify import train_command

    command = train_command(synced["fits"][0], synced, "cpu", tmp_path, tmp_path / "run")
    assert "--sync-bn" in command and "--sync-bn" not in train_command(
        plain["fits"][0], plain, "cpu", tmp_path, tmp_path / "run")
