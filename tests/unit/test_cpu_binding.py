"""A rank started by a hand-written srun (no `--cpu-bind`) binds itself to the CPUs the
site's srun mask list gives its local rank (ddl.worker.process.cpu_binding, issue 42): only under
Slurm, not when srun was told `--cpu-bind=none`, and not when the masks name CPUs the node
lacks (one line, left unbound). The binding itself is a real sched_setaffinity, in a
child process; the CPUs a LUMI node has (64) are not here, so that case is given as a
set of online CPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ddl.settings.sites import CpuBinding, get_site
from ddl.worker.process.cpu_binding import online_cpus, parse_list, ranges, srun_task_cpus

pytestmark = pytest.mark.unit

LUMI = get_site("lumi-g")
JOB = {"SLURM_JOB_ID": "42", "SLURM_LOCALID": "0", "RANK": "3"}
LUMI_NODE = set(range(64))


@pytest.mark.parametrize("local_rank", range(10))
def test_each_local_rank_gets_its_gcds_mask(local_rank):
    """The masks srun would apply, local rank by local rank: the cores nearest each GCD,
    the same as the profile's worker_cores (ranks beyond the list reuse it, as srun)."""
    cpus, note = srun_task_cpus(LUMI, local_rank, JOB, LUMI_NODE)
    assert note is None
    assert sorted(cpus) == LUMI.cpu_binding.worker_cores[local_rank % 8]


def test_gcd_4_is_cores_1_to_7():
    assert ranges(srun_task_cpus(LUMI, 4, JOB, LUMI_NODE)[0]) == "1-7"


def test_a_node_without_those_cpus_is_left_unbound_with_one_line():
    cpus, note = srun_task_cpus(LUMI, 0, JOB, {0, 1})
    assert cpus is None
    assert note == ("ddl: note: rank 3: site lumi-g binds local rank 0 to CPUs 49-55, but "
                    "this node has CPUs 0-1; left unbound")
    # all of the mask's CPUs, not some: CPUs 1-7 on a node with 0-3 is no binding either
    assert srun_task_cpus(LUMI, 4, JOB, set(range(4)))[0] is None


@pytest.mark.parametrize("env", [
    {},  # not in a Slurm job: nothing to imitate
    {**JOB, "SLURM_CPU_BIND_TYPE": "none"},  # srun --cpu-bind=none: the user's choice
])
def test_no_binding_outside_a_job_or_when_srun_was_told_none(env):
    assert srun_task_cpus(LUMI, 0, env, LUMI_NODE) == (None, None)


def test_sites_without_a_cpu_list_bind_nothing():
    jsc = get_site("juwels-booster")  # srun = "none": binding is torchrun_jsc's business
    assert srun_task_cpus(jsc, 0, JOB, LUMI_NODE) == (None, None)
    assert CpuBinding(srun="cores").srun_cpus(0) is None


def test_map_cpu_and_mask_spellings():
    assert CpuBinding(srun="map_cpu:0,8,0x10").srun_cpus(2) == {16}
    assert CpuBinding(srun="mask_cpu:f0,0x3").srun_cpus(0) == {4, 5, 6, 7}
    with pytest.raises(ValueError, match="mask_cpu entry 'zz' is not a CPU mask"):
        CpuBinding(srun="mask_cpu:zz")
    with pytest.raises(ValueError, match="map_cpu entry 'x1' is not a CPU number"):
        CpuBinding(srun="map_cpu:x1")


def test_cpu_lists():
    assert parse_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert ranges({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert online_cpus() >= os.sched_getaffinity(0)


def _bind_in_child(srun: str, env: dict[str, str]) -> dict:
    """bind_srun_task in a fresh process with `srun` as the site's list; its affinity after."""
    code = textwrap.dedent(f"""
        import json, os, sys
        from ddl.settings.sites import CpuBinding, get_site
        from ddl.worker.process.cpu_binding import bind_srun_task
        site = get_site("lumi-g").model_copy(
            update={{"cpu_binding": CpuBinding(srun={srun!r})}})
        bound = bind_srun_task(site, 0, {env!r})
        print(json.dumps({{"bound": bound, "cpus": sorted(os.sched_getaffinity(0))}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return {**json.loads(proc.stdout), "stderr": proc.stderr}


def test_the_rank_really_binds_itself():
    """A mask naming a CPU this process may use: after bind_srun_task the process runs
    there only (the kernel's affinity, read back)."""
    allowed = sorted(os.sched_getaffinity(0))
    target = allowed[-1]
    done = _bind_in_child(f"mask_cpu:{1 << target:x},0x1", JOB)
    assert done == {"bound": True, "cpus": [target], "stderr": ""}
    # srun --cpu-bind=none: left as it was
    left = _bind_in_child(f"mask_cpu:{1 << target:x}", {**JOB, "SLURM_CPU_BIND_TYPE": "none"})
    assert left == {"bound": False, "cpus": allowed, "stderr": ""}
    # a CPU the node does not have: one line, left as it was
    absent = max(online_cpus()) + 1
    missing = _bind_in_child(f"mask_cpu:{1 << absent:x}", JOB)
    assert missing["bound"] is False and missing["cpus"] == allowed
    assert missing["stderr"].count("\n") == 1
    assert f"local rank 0 to CPUs {absent}, but this node has CPUs" in missing["stderr"]
