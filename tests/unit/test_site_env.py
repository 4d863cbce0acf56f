"""The site's variables set by `ddl train` inside a job (ddl.launch.site_env.in_job), so a
hand-written srun gets what a `ddl submit` script exports (issue 42)."""

import pytest

from ddl.launch import site_env
from ddl.settings.sites import get_site

pytestmark = pytest.mark.unit


def test_lumi_variables_expand_as_the_batch_shell_would():
    added = site_env.in_job(get_site("lumi-g"), {"USER": "ana", "SLURM_JOB_ID": "42"})
    assert added["MIOPEN_USER_DB_PATH"] == "/tmp/ana-miopen-cache-42"
    assert added["MIOPEN_CUSTOM_CACHE_DIR"] == "/tmp/ana-miopen-cache-42"
    assert added["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert added["CXI_FORK_SAFE"] == "1"


def test_what_is_set_already_wins():
    """The batch script's export, the user's own value and Slurm's device list stay."""
    env = {"USER": "ana", "SLURM_JOB_ID": "42", "NCCL_SOCKET_IFNAME": "hsn0",
           "MIOPEN_USER_DB_PATH": "/flash/miopen"}
    added = site_env.in_job(get_site("lumi-g"), env)
    assert "NCCL_SOCKET_IFNAME" not in added and "MIOPEN_USER_DB_PATH" not in added
    assert added["MIOPEN_CUSTOM_CACHE_DIR"] == "/flash/miopen"
    jsc = site_env.in_job(get_site("juwels-booster"), {"CUDA_VISIBLE_DEVICES": "0"})
    assert "CUDA_VISIBLE_DEVICES" not in jsc and jsc["NCCL_SOCKET_IFNAME"] == "ib0"


@pytest.mark.parametrize("gpus, devices", [(None, "0,1,2,3"), (4, "0,1,2,3"), (2, "0,1"),
                                           (1, "0"), (0, "0,1,2,3")])
def test_device_list_follows_the_gpus(gpus, devices):
    assert site_env.variables(get_site("juwels-booster"), gpus)["CUDA_VISIBLE_DEVICES"] == devices


def test_binding_without_masks_is_kept():
    from ddl.settings.cores import srun_cpu_bind

    assert srun_cpu_bind(get_site("juwels-booster"), 2) == "none"
    assert srun_cpu_bind(get_site("lumi-g"), 1) == "mask_cpu:0x00fe000000000000"
    # the workers bind themselves under torchrun; part of a shared node: Slurm places them
    assert srun_cpu_bind(get_site("lumi-g"), 1, per_node_launcher=True) == "none"
    assert srun_cpu_bind(get_site("lumi-g"), 1, whole_node=False) == "none"
