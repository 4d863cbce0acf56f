"""`ddl submit` scripts for the four systems, checked against shared/facts/sites.md.

Each site's script is compared with a reviewed golden file (tests/unit/golden), and the
lines that matter are asserted one by one with the fact they come from, so a golden file
cannot silently drift into something wrong. The rendezvous block is then executed by bash
with stand-ins for scontrol/getent/srun (no real cluster here) to check what a job does.
"""

import os
from pathlib import Path

import pytest

from sbatch_harness import render, run_script

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).with_name("golden")
SITES = ["juwels-booster", "jureca-dc", "cte-power", "lumi-g"]
RUN = ["--plugin", "mnist", "--data-dir", "/scratch/proj/data"]


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("site", SITES)
def test_matches_reviewed_golden_file(capsys, site, nodes):
    script = render(capsys, "--site", site, "--nodes", str(nodes), *RUN)
    golden = GOLDEN / f"{site}-{nodes}n.sbatch"
    if os.environ.get("DDL_UPDATE_GOLDEN") == "1":
        golden.write_text(script)
    assert script == golden.read_text()


def _lines(script):
    return script.splitlines()


def _common(script, nodes):
    lines = _lines(script)
    assert lines[0] == "#!/bin/bash"
    assert f"#SBATCH --nodes={nodes}" in lines
    assert "#SBATCH --account=proj" in lines
    assert "#SBATCH --output=/scratch/proj/runs/%x-%j.out" in lines
    # srun no longer inherits --cpus-per-task since Slurm 22.05 [facts: JSC course]
    assert any(line.startswith('export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"')
               for line in lines)
    assert "export MASTER_ADDR MASTER_PORT" in lines
    return lines


@pytest.mark.parametrize("site, partition, cpus", [("juwels-booster", "booster", 48),
                                                    ("jureca-dc", "dc-gpu", 128)])
@pytest.mark.parametrize("nodes", [1, 2])
def test_jsc(capsys, site, partition, cpus, nodes):
    lines = _common(render(capsys, "--site", site, "--nodes", str(nodes), *RUN), nodes)
    assert f"#SBATCH --partition={partition}" in lines
    assert "#SBATCH --gres=gpu:4" in lines            # GPU request: --gres=gpu:4
    assert "#SBATCH --ntasks-per-node=1" in lines     # one torchrun_jsc per node
    assert f"#SBATCH --cpus-per-task={cpus}" in lines  # the whole node for the launcher
    assert 'MASTER_ADDR="${first_node}i"' in lines    # IB host suffix `i`
    assert 'MASTER_ADDR="$rdzv_ip"  # the site wants an IP address' in lines  # nslookup
    assert "MASTER_PORT=7010" in lines                # course's fixed port
    for env in ('NCCL_SOCKET_IFNAME="ib0"', 'GLOO_SOCKET_IFNAME="ib0"', 'NCCL_IB_TIMEOUT="50"',
                'UCX_RC_TIMEOUT="4s"', 'NCCL_IB_RETRY_CNT="10"',
                'TORCH_NCCL_ASYNC_ERROR_HANDLING="1"', 'CUDA_VISIBLE_DEVICES="0,1,2,3"'):
        assert f"export {env}" in lines
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
                "HF_EVALUATE_OFFLINE"):                # offline compute nodes
        assert f"export {var}=1" in lines
    launch = [line for line in lines if line.startswith("srun ")]
    assert launch == ["srun --ntasks-per-node=1 --cpu-bind=none --kill-on-bad-exit=1 ddl \\"]  # --cpu_bind=none
    assert "--launcher=torchrun_jsc --nproc=4" in lines[lines.index(launch[0]) + 1]


@pytest.mark.parametrize("nodes", [1, 2])
def test_cte_power(capsys, nodes):
    lines = _common(render(capsys, "--site", "cte-power", "--nodes", str(nodes), *RUN), nodes)
    assert "#SBATCH --gres=gpu:4" in lines
    assert "#SBATCH --ntasks-per-node=4" in lines     # one process per V100
    assert "#SBATCH --cpus-per-task=40" in lines      # 160 threads / 4 GPUs
    assert 'MASTER_ADDR="${first_node}-ib0"' in lines  # BSC's suffix is -ib0, not i
    # no hands-on module line: its python/3.7.4_ML is below what ddl needs (the user's
    # environment comes from --setup)
    assert not any("python/3.7" in line for line in lines)
    assert "srun --ntasks-per-node=4 --cpu-bind=none --kill-on-bad-exit=1 ddl \\" in lines
    assert any("--launcher=srun --nproc=4" in line for line in lines)


@pytest.mark.parametrize("nodes", [1, 2])
def test_lumi(capsys, nodes):
    lines = _common(render(capsys, "--site", "lumi-g", "--nodes", str(nodes), *RUN), nodes)
    assert "#SBATCH --partition=standard-g" in lines
    assert "#SBATCH --gpus-per-node=8" in lines       # not --gres on LUMI
    assert "#SBATCH --ntasks-per-node=8" in lines     # srun style: one task per GCD
    assert "#SBATCH --cpus-per-task=7" in lines
    assert "#SBATCH --mem-per-gpu=60G" in lines
    assert 'MASTER_ADDR="${first_node}"' in lines     # no suffix on LUMI
    assert not any(line.startswith('MASTER_ADDR="$rdzv_ip"') for line in lines)
    assert 'MASTER_PORT="1$(printf %04d $((SLURM_JOB_ID % 10000)))"' in lines
    masks = ("0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,"
             "0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000")
    assert f"srun --ntasks-per-node=8 --cpu-bind=mask_cpu:{masks} --kill-on-bad-exit=1 ddl \\" in lines
    for env in ('NCCL_SOCKET_IFNAME="hsn0,hsn1,hsn2,hsn3"', 'NCCL_NET_GDR_LEVEL="PHB"',
                'MIOPEN_USER_DB_PATH="/tmp/${USER}-miopen-cache-${SLURM_JOB_ID}"',
                'MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"', 'CXI_FORK_SAFE="1"',
                'CXI_FORK_SAFE_HP="1"', 'FI_CXI_DISABLE_CQ_HUGETLB="1"'):
        assert f"export {env}" in lines


@pytest.mark.parametrize("site", ["juwels-booster", "jureca-dc"])
def test_jsc_with_fewer_gpus_exports_only_those(capsys, site):
    """The profile's CUDA_VISIBLE_DEVICES lists the node's four GPUs; a two-GPU job gets
    two (issue 42)."""
    lines = _lines(render(capsys, "--site", site, "--gpus-per-node", "2", *RUN))
    assert "#SBATCH --gres=gpu:2" in lines
    assert 'export CUDA_VISIBLE_DEVICES="0,1"' in lines


def test_lumi_small_g_with_two_gcds_binds_no_whole_node_masks(capsys):
    """A partial small-g node: Slurm hands out any two GCDs and 14 of the node's cores, so
    the masks of GCDs 0 and 1 would bind to cores the job may not have; LUMI documents mask
    binding for full-node allocations only (issue 52; test_submit_sized.py)."""
    lines = _lines(render(capsys, "--site", "lumi-g", "--partition", "small-g",
                          "--gpus-per-node", "2", *RUN))
    assert "#SBATCH --ntasks-per-node=2" in lines
    assert "#SBATCH --cpus-per-task=7" in lines
    assert "srun --ntasks-per-node=2 --cpu-bind=none --kill-on-bad-exit=1 ddl \\" in lines


# --- what the rendered rendezvous block does, run by bash ---------------------------------

def test_jsc_job_resolves_the_ib_name_of_the_first_node(capsys, tmp_path):
    script = render(capsys, "--site", "juwels-booster", "--nodes", "2", *RUN)
    proc, args = run_script(script, tmp_path, nodes=["jwb0001", "jwb0002"],
                            hosts={"jwb0001": "10.0.0.1", "jwb0001i": "10.1.0.1"})
    assert proc.returncode == 0, proc.stderr
    assert "rendezvous 10.1.0.1:7010" in proc.stdout  # the IB address, not the hostname's
    assert "--run-dir=/scratch/proj/runs/mnist-ddp-1234567" in args
    assert "--data-dir=/scratch/proj/data" in args


def test_lumi_job_port_comes_from_the_job_id(capsys, tmp_path):
    script = render(capsys, "--site", "lumi-g", "--nodes", "2", *RUN)
    proc, _ = run_script(script, tmp_path, nodes=["nid005000", "nid005001"],
                         hosts={"nid005000": "10.2.0.1"}, job_id="8374561")
    assert proc.returncode == 0, proc.stderr
    assert "rendezvous nid005000:14561" in proc.stdout
    proc, _ = run_script(script, tmp_path, nodes=["nid005000"], hosts={"nid005000": "1.2.3.4"},
                         job_id="17")
    assert "rendezvous nid005000:10017" in proc.stdout  # short ids are zero-padded


def test_unresolvable_rendezvous_host_stops_the_job(capsys, tmp_path):
    script = render(capsys, "--site", "cte-power", "--nodes", "2", *RUN)
    proc, args = run_script(script, tmp_path, nodes=["p9r1n01", "p9r1n02"],
                            hosts={"p9r1n01": "10.0.0.1"})  # no p9r1n01-ib0
    assert proc.returncode == 1 and args == []  # srun never ran
    assert "ddl: rendezvous host p9r1n01-ib0 does not resolve" in proc.stderr
