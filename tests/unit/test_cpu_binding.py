"""Which cores a rank gets is decided once, in the pre-flight (ddl.settings.cores, the run
plan's ``cores``), and the worker only applies it (ddl.worker.process.cpu_binding). A rank
started by a hand-written srun (no `--cpu-bind`) is planned onto the CPUs the site's srun
mask list gives its local rank (issue 42): only under Slurm, not when srun was told
`--cpu-bind=none`, and not when the masks name CPUs the node lacks (one line, left
unbound). The binding itself is a real sched_setaffinity, in a child process; the CPUs a
LUMI node has (64) are not here, so that case is given as a set of online CPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ddl.settings.cores import online_cpus, parse_list, plan_cores, ranges
from ddl.settings.sites import CpuBinding, get_site

pytestmark = pytest.mark.unit

LUMI = get_site("lumi-g")
JOB = {"SLURM_JOB_ID": "42", "SLURM_LOCALID": "0", "RANK": "3"}
LUMI_NODE = set(range(64))


def _srun(site, local_rank, env, online):
    """(the CPUs the plan binds an srun task of ``local_rank`` to, its note)."""
    rank = plan_cores(site, "srun", local_rank + 1, env, online=online, held=online)[-1]
    return (set(rank.cpus) if rank.cpus else None), rank.note


@pytest.mark.parametrize("local_rank", range(10))
def test_each_local_rank_gets_its_gcds_mask(local_rank):
    """The masks srun would apply, local rank by local rank: the cores nearest each GCD,
    the same as the profile's worker_cores (ranks beyond the list reuse it, as srun)."""
    cpus, note = _srun(LUMI, local_rank, JOB, LUMI_NODE)
    assert note is None
    assert sorted(cpus) == LUMI.cpu_binding.worker_cores[local_rank % 8]


def test_gcd_4_is_cores_1_to_7_and_its_seven_threads():
    (rank,) = plan_cores(LUMI, "srun", 1, {**JOB, "SLURM_LOCALID": "4"}, online=LUMI_NODE,
                         held=LUMI_NODE)[4:]
    assert ranges(rank.cpus) == "1-7"
    assert (rank.threads.per_rank, rank.threads.source) == (7, "the 7 cores bound to this rank")
    assert rank.unbound.source == "64 usable cores / 1 local ranks"


def test_a_node_without_those_cpus_is_left_unbound_with_one_line():
    cpus, note = _srun(LUMI, 0, JOB, {0, 1})
    assert cpus is None
    assert note == ("ddl: note: site lumi-g binds local rank 0 to CPUs 49-55, but this node "
                    "has CPUs 0-1; left unbound")
    # all of the mask's CPUs, not some: CPUs 1-7 on a node with 0-3 is no binding either
    assert _srun(LUMI, 4, JOB, set(range(4)))[0] is None


@pytest.mark.parametrize("env", [
    {},  # not in a Slurm job: nothing to imitate
    {**JOB, "SLURM_CPU_BIND_TYPE": "none"},  # srun --cpu-bind=none: the user's choice
])
def test_no_binding_outside_a_job_or_when_srun_was_told_none(env):
    assert _srun(LUMI, 0, env, LUMI_NODE) == (None, None)


def test_sites_without_a_cpu_list_bind_nothing():
    jsc = get_site("juwels-booster")
    assert _srun(jsc, 0, JOB, LUMI_NODE) == (None, None)
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


def test_the_rank_really_binds_itself_and_survives_a_refusal():
    """The worker applies its plan entry: a CPU the node lacks is refused by the system
    (one line, left unbound), a CPU this process may use binds it there only (the
    kernel's affinity, read back). One child process, no torch."""
    allowed = sorted(os.sched_getaffinity(0))
    absent = max(online_cpus()) + 1
    code = textwrap.dedent(f"""
        import json, os
        from ddl.settings.cores import RankCores, Threads
        from ddl.worker.process.cpu_binding import bind
        one = Threads(per_rank=1, source="test")
        seen = []
        for cpus in ([{absent}], [{allowed[-1]}]):
            bound = bind(RankCores(cpus=cpus, threads=one, unbound=one), 0)
            seen.append([bound, sorted(os.sched_getaffinity(0))])
        print(json.dumps(seen))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[False, allowed], [True, [allowed[-1]]]]
    assert proc.stderr.count("\n") == 1
    assert f"local rank 0: cannot bind to CPUs {absent} (" in proc.stderr
    assert "left unbound" in proc.stderr
