"""Rendezvous, site detection and launch-style rules, without a cluster."""

import pytest

from ddl.contract.errors import DdlError, UsageError
from ddl.launch.rendezvous import endpoint_from_env, expand_nodelist, port_for
from ddl.settings.sites import Rendezvous, detect_site, get_site
from ddl.launch.slurm import node_launcher_command, srun_worker_env
from ddl.settings.plan import choose_launcher

pytestmark = pytest.mark.unit

JOB = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
       "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "localhost,node9"}


@pytest.mark.parametrize("nodelist, hosts", [
    ("jwb[0001-0003,0007],login1", ["jwb0001", "jwb0002", "jwb0003", "jwb0007", "login1"]),
    ("nid[005000-005001]", ["nid005000", "nid005001"]),
    ("node1", ["node1"]),
    ("a[9-10]", ["a9", "a10"]),
])
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_ports():
    assert port_for(Rendezvous(port=7010), "999") == 7010
    assert port_for(Rendezvous(port=1, port_from_job_id=True), "8374561") == 14561
    assert port_for(Rendezvous(port=1, port_from_job_id=True), "3") == 10003
    with pytest.raises(DdlError, match="SLURM_JOB_ID"):
        port_for(Rendezvous(port=1, port_from_job_id=True), None)


def test_multi_node_job_never_falls_back_to_localhost():
    rules = Rendezvous()
    with pytest.raises(DdlError, match="every node would train alone"):
        endpoint_from_env(rules, {**JOB, "MASTER_ADDR": "127.0.0.1"})
    # derived from the node list: the first node is 'localhost' -> refused too
    with pytest.raises(DdlError, match="every node would train alone"):
        endpoint_from_env(rules, JOB)
    with pytest.raises(DdlError, match="without MASTER_ADDR or SLURM_JOB_NODELIST"):
        endpoint_from_env(rules, {"SLURM_NNODES": "2"})
    # one node, nothing set: a lone local run is fine
    assert endpoint_from_env(rules, {}) == ("127.0.0.1", 29500)


def test_suffixed_first_node_must_resolve():
    with pytest.raises(DdlError, match="'localhost-nosuch' does not resolve"):
        endpoint_from_env(Rendezvous(host_suffix="-nosuch"), {**JOB})
    host, port = endpoint_from_env(Rendezvous(resolve_ip=True, port=7010),
                                   {"SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost"})
    assert host in ("127.0.0.1", "::1") and port == 7010


def test_detection_by_environment_and_hostname():
    assert detect_site(env={"SYSTEMNAME": "juwelsbooster"}, hostname="jwlogin01")[0] == \
        "juwels-booster"
    assert detect_site(env={"SYSTEMNAME": "jurecadc"}, hostname="x")[0] == "jureca-dc"
    name, why = detect_site(env={}, hostname="uan01")
    assert name == "lumi-g" and "uan01" in why
    assert detect_site(env={}, hostname="my-laptop") == \
        ("local", "no site profile matches this machine")


def test_launcher_choice():
    lumi, jsc = get_site("lumi-g"), get_site("juwels-booster")
    assert choose_launcher("auto", lumi, {}) == "local"  # a login node: nothing started yet
    assert choose_launcher("auto", lumi, JOB) == "srun"
    assert choose_launcher("auto", jsc, JOB) == "torchrun_jsc"
    assert choose_launcher("auto", jsc, {"RANK": "3", "WORLD_SIZE": "8",
                                         "MASTER_ADDR": "x"}) == "worker"
    assert choose_launcher("torchrun", jsc, JOB) == "torchrun"


def test_srun_ranks_come_from_slurm():
    env = {**JOB, "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
           "SLURM_NTASKS_PER_NODE": "4(x2)", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "7010"}
    assert srun_worker_env(get_site("cte-power"), env) == {
        "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "7010"}
    with pytest.raises(UsageError, match="SLURM_LOCALID, SLURM_NTASKS not set"):
        srun_worker_env(get_site("cte-power"), {"SLURM_PROCID": "0"})


@pytest.mark.parametrize("node_id, host_flags", [
    ("0", ["--rdzv_conf=is_host=1", "--local_addr=10.1.0.1"]),
    ("1", ["--rdzv_conf=is_host=0"]),
])
def test_plain_torchrun_gets_is_host_and_local_addr(node_id, host_flags):
    """What torchrun_jsc would do (pytorch#73656), decided per node from SLURM_NODEID."""
    env = {**JOB, "SLURM_NODEID": node_id, "MASTER_ADDR": "10.1.0.1", "MASTER_PORT": "7010"}
    command = node_launcher_command("torchrun", get_site("juwels-booster"), 4, env)
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert "--rdzv_endpoint=10.1.0.1:7010" in command and "--nnodes=2" in command
    assert "--nproc_per_node=4" in command and "--rdzv_id=4242" in command
    assert [c for c in command if c.startswith(("--rdzv_conf", "--local_addr"))] == host_flags
    assert command[-2:] == ["-m", "ddl.worker"]


def test_torchrun_jsc_does_its_own_host_detection():
    env = {**JOB, "SLURM_NODEID": "0", "MASTER_ADDR": "10.1.0.1", "MASTER_PORT": "7010"}
    command = node_launcher_command("torchrun_jsc", get_site("juwels-booster"), 4, env)
    assert command[1:3] == ["-m", "torchrun_jsc"]
    assert not [c for c in command if c.startswith(("--rdzv_conf", "--local_addr"))]


@pytest.mark.parametrize("launcher, conf", [
    ("torchrun", "--rdzv_conf=join_timeout=91,is_host=0"),
    ("torchrun_jsc", "--rdzv_conf=join_timeout=91"),  # torchrun_jsc appends its is_host
])
def test_node_launchers_get_the_rendezvous_timeout(launcher, conf):
    """The launchers meet in torchrun's own rendezvous first: --rendezvous-timeout bounds
    that too (torch's default join_timeout is 600 s)."""
    env = {**JOB, "SLURM_NODEID": "1", "MASTER_ADDR": "10.1.0.1", "MASTER_PORT": "7010"}
    command = node_launcher_command(launcher, get_site("juwels-booster"), 4, env,
                                    rendezvous_timeout=90.5)
    assert [c for c in command if c.startswith("--rdzv_conf")] == [conf]


@pytest.mark.parametrize("device, site_backend, expected", [
    ("cpu", "nccl", "gloo"),   # lumi/juwels with --device cpu
    ("cpu", "gloo", "gloo"),
    ("cuda", "gloo", "nccl"),  # the local profile on a GPU machine
    ("cuda", "nccl", "nccl"),
])
def test_collective_backend_follows_the_device(device, site_backend, expected):
    from ddl.worker.process.distributed import collective_backend

    assert collective_backend(device, site_backend) == expected
