"""`ddl submit` against a real multi-node Slurm: the local-slurm of ../shared/tools, started
by this module (NETNS=1: each of the 2 nodes is its own network namespace with a hostname
address 10.200.0.i and a separate "InfiniBand" address 10.200.1.i for node<i>i / node<i>-ib0,
as on JSC) and stopped again at the end, whatever the tests did.

Covered:
- a 2-node job through `ddl submit` in every launch style (srun, plain torchrun with ddl's
  is_host/local_addr, torchrun_jsc) trains on 2 x 2 = 4 ranks; with JSC's rendezvous rules
  (test profile sites/local-slurm-jsc.toml) the rendezvous goes through node1i's address;
- JSC's failure (pytorch#73656) reproduced with a hand-written job: plain torchrun with
  --rdzv_endpoint=node1i:PORT fails, the same job with is_host/--local_addr trains;
- a rendezvous host that does not resolve (sites/local-slurm-nosuch.toml) stops the job
  at once with one line, before any worker starts;
- a hand-written `srun ... apptainer run IMAGE train --site lumi` (the CPU image of
  tests/system/conftest.py) gets LUMI's job environment and CPU binding from ddl itself;
- `ddl plan --verify --submit` trains the plan's best layouts in one 2-node job.

Jobs are waited for by polling `scontrol show job` with a deadline; nothing sleeps on timing.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, run_bounded, run_ddl

from .build_cache import apt_turn
from .conftest import APPTAINER_DIR

pytestmark = pytest.mark.system

LOCAL_SLURM = Path(os.environ.get("DDL_LOCAL_SLURM",
                                  REPO.parent / "shared" / "tools" / "local-slurm"))
TEST_SITES = Path(__file__).resolve().with_name("sites")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
JOB_DEADLINE_S = 300  # generous: a tiny 8-rank job takes ~25 s here
SMALL_RUN = ("--plugin", "mnist", "--preset", "tiny", "--epochs", "1", "--steps-per-epoch", "3")
BASH_BOOKKEEPING = {"_", "SHLVL", "PWD", "OLDPWD"}


@dataclass(frozen=True)
class Cluster:
    env: dict[str, str]  # this process's environment + `local-slurm env` + DDL_SITE_PATH
    node1_task: str  # what an srun task on node1 printed (addresses, cluster name)

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return run_bounded(list(cmd), env=self.env, timeout=timeout)

    def address(self, name: str) -> str:
        """`name`'s address as a node of the cluster resolves it (never this machine)."""
        for line in self.node1_task.splitlines():  # getent: ADDRESS NAME [ALIAS...]
            fields = line.split()
            if name in fields[1:]:
                return fields[0]
        raise AssertionError(f"{name} not resolved on node1:\n{self.node1_task}")


def _local_slurm(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return run_bounded([str(LOCAL_SLURM), *args], env={**os.environ, "NETNS": "1"},
                       timeout=timeout)


@pytest.fixture(scope="session")
def slurm():
    """A real 2-node Slurm for this session; `down` runs even when tests or `up` fail."""
    if not LOCAL_SLURM.is_file():
        pytest.fail(f"{LOCAL_SLURM} not found: the system tests need ../shared/tools beside "
                    "the checkout (or DDL_LOCAL_SLURM)")
    try:
        with apt_turn():  # a fresh machine: `up` installs Slurm with apt-get
            up = _local_slurm("up", timeout=600)
        assert up.returncode == 0, f"local-slurm up failed:\n{up.stdout}\n{up.stderr}"
        # eval "$(local-slurm env)", applied to the environment the tests' commands get
        dump = subprocess.run(["bash", "-c", 'eval "$("$0" env)" && env -0', str(LOCAL_SLURM)],
                              capture_output=True, text=True, timeout=60, check=True)
        after = dict(item.split("=", 1) for item in dump.stdout.split("\0") if "=" in item)
        changed = {k: v for k, v in after.items()
                   if os.environ.get(k) != v and k not in BASH_BOOKKEEPING}
        assert "SLURM_CONF" in changed and "PATH" in changed, changed
        env = {**os.environ, **changed, "DDL_SITE_PATH": str(TEST_SITES)}
        env.pop("NETNS", None)
        probe = subprocess.run(
            ["srun", "--nodes=1", "--ntasks=1", "--nodelist=node1", "--time=1", "bash", "-c",
             'echo "SLURM_CLUSTER_NAME=${SLURM_CLUSTER_NAME-<unset>}"; '
             "getent hosts node1 node1i node1-ib0 || true"],
            env=env, capture_output=True, text=True, timeout=120)
        assert probe.returncode == 0, f"srun on node1 failed:\n{probe.stdout}\n{probe.stderr}"
        yield Cluster(env=env, node1_task=probe.stdout)
    finally:
        down = _local_slurm("down", timeout=300)
        print(f"local-slurm down: rc={down.returncode} {down.stdout.strip()} "
              f"{down.stderr.strip()}")


def show_job(cluster: Cluster, job_id: str) -> dict[str, str]:
    proc = cluster.run("scontrol", "show", "job", "-o", job_id)
    assert proc.returncode == 0, f"scontrol show job {job_id}: {proc.stderr}"
    return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))


def wait_for_job(cluster: Cluster, job_id: str, timeout: float = JOB_DEADLINE_S) -> dict:
    """Poll until the job is out of the queue and in a final state; cancel it on the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        queued = cluster.run("squeue", "-h", "-j", job_id).stdout.strip()
        info = show_job(cluster, job_id)
        if not queued and info.get("JobState") in TERMINAL:
            return info
        if time.monotonic() > deadline:
            cluster.run("scancel", job_id)
            pytest.fail(f"job {job_id} not finished after {timeout} s: {info.get('JobState')}")
        time.sleep(0.5)  # poll interval only; the deadline decides


def wait_for_jobs(cluster: Cluster, jobs: dict[str, str], timeout: float) -> dict:
    """wait_for_job for several jobs at once: each one's final record is taken as soon as it
    ends (slurmctld forgets finished jobs after MinJobAge, 300 s)."""
    deadline = time.monotonic() + timeout
    done: dict[str, dict] = {}
    while len(done) < len(jobs):
        for name, job_id in jobs.items():
            if name in done:
                continue
            info = show_job(cluster, job_id)
            queued = cluster.run("squeue", "-h", "-j", job_id).stdout.strip()
            if not queued and info.get("JobState") in TERMINAL:
                done[name] = info
        if time.monotonic() > deadline:
            for job_id in jobs.values():
                cluster.run("scancel", job_id)
            pytest.fail(f"jobs {jobs} not finished after {timeout} s; done: {list(done)}")
        time.sleep(0.5)  # poll interval only; the deadline decides
    return done


def seconds(slurm_time: str) -> int:
    """Slurm's [D-]HH:MM:SS as seconds."""
    days, _, clock = slurm_time.rpartition("-")
    h, m, s = (["0"] * 3 + clock.split(":"))[-3:]
    return int(days or 0) * 86400 + int(h) * 3600 + int(m) * 60 + int(s)


@dataclass
class Submitted:
    job_id: str
    log: Path
    results: Path
    script: Path
    info: dict
    wall_s: float

    @property
    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else "<no log>"


def ddl_submit(cluster: Cluster, out: Path, data: Path, *flags: str) -> Submitted:
    """`ddl submit` a small 2-node run for real and wait for the job to end."""
    start = time.monotonic()
    proc = run_ddl("submit", "--nodes", "2", *SMALL_RUN, "--data-dir", str(data),
                   "--output-dir", str(out), "--time", "00:10:00", *flags,
                   cwd=out.parent, env=cluster.env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = re.search(r"^ddl: submitted job (\d+) ", proc.stdout, re.M).group(1)
    paths = {k: Path(v) for k, v in re.findall(r"^\s+(script|log|results):\s+(\S+)$",
                                               proc.stdout, re.M)}
    info = wait_for_job(cluster, job_id)
    return Submitted(job_id, paths["log"], paths["results"], paths["script"], info,
                     time.monotonic() - start)


def rendezvous_line(log: str) -> tuple[str, int]:
    match = re.search(r"^ddl: job \d+ on 2 node\(s\): \S+; rendezvous (\S+):(\d+)$", log, re.M)
    assert match, log
    return match.group(1), int(match.group(2))


# (site profile, launcher flag or None for the site's default)
STYLES = {
    "srun": ("local-slurm", None),
    "srun-jsc-rules": ("local-slurm-jsc", "srun"),
    "torchrun": ("local-slurm-jsc", "torchrun"),
    "torchrun_jsc": ("local-slurm-jsc", "torchrun_jsc"),
}


# Ranks per node of the launch-style jobs: 2 of the 4 (fake) GPUs. Several per node is what
# a launch style must get right (local ranks, one torchrun per node starting them); each job
# is mostly its ranks importing torch on this machine's 2 cores, so 2 x 2 ranks take about
# half of 2 x 4's time. The site's default of one rank per GPU is in the golden scripts
# (tests/unit/golden), and 2 x 4 ranks over srun run in the `ddl plan --verify` job below.
PER_NODE = 2


@pytest.mark.parametrize("style", list(STYLES))
def test_two_node_job_in_each_launch_style(style, slurm, synthetic_mnist, tmp_path):
    site, launcher = STYLES[style]
    out = tmp_path / "out"
    flags = ["--site", site, "--gpus-per-node", str(PER_NODE)] + (
        ["--launcher", launcher] if launcher else [])
    job = ddl_submit(slurm, out, synthetic_mnist, *flags)
    log = job.log_text
    assert job.info["JobState"] == "COMPLETED", f"job {job.job_id}: {job.info}\n{log}"
    assert job.info["NumNodes"] == "2" and job.info["NodeList"] == "node[1-2]", job.info

    # the script that ran is the one ddl wrote, in the requested launch style
    script = job.script.read_text()
    assert job.info["Command"] == str(job.script)
    expected = launcher or "srun"
    tasks = PER_NODE if expected == "srun" else 1
    assert f"--launcher={expected} --nproc={PER_NODE} " in script, script
    assert f"srun --ntasks-per-node={tasks} " in script, script

    results = json.loads(job.results.read_text())
    assert results["world"]["size"] == 2 * PER_NODE, results["world"]  # 2 nodes
    assert results["site"] == site
    config = json.loads(job.results.with_name("config.json").read_text())
    assert config["launcher"] == expected
    assert re.search(rf"^ddl: mnist \(tiny\) with ddp on {2 * PER_NODE} process\(es\)", log,
                     re.M), log

    host, port = rendezvous_line(log)
    if site == "local-slurm":  # no suffix: the first node's hostname, port 29500
        assert (host, port) == ("node1", 29500), log
    else:  # JSC's rules: node1 + "i", resolved (inside the job) to the IB address, port 7010
        ib_addr, eth_addr = slurm.address("node1i"), slurm.address("node1")
        assert ib_addr != eth_addr  # NETNS=1: the IB name is not the hostname's address
        assert (host, port) == (ib_addr, 7010), log


WORKER = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"worker rank {dist.get_rank()} world {dist.get_world_size()} sum {int(t.item())}",
      flush=True)
dist.destroy_process_group()
"""

# JSC's course set-up by hand: one torchrun per node, rendezvous on the first node's
# InfiniBand name. SLURM_NODEID is expanded in each task (single quotes), never in the
# batch shell. FIX=1 adds what torchrun_jsc (and ddl) pass; FIX=0 is plain torchrun.
RAW_JOB = """\
#!/bin/bash
#SBATCH --job-name=raw-torchrun-{name}
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:05:00
#SBATCH --output={out}/%x-%j.out
set -euo pipefail
first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')"
export RDZV_HOST="${{first_node}}i" RDZV_PORT=$((20000 + SLURM_JOB_ID % 10000))
export FIX={fix} PY={python} WORKER={worker}
echo "raw: endpoint $RDZV_HOST:$RDZV_PORT fix=$FIX"
srun --ntasks-per-node=1 bash -c '
  conf=read_timeout=10; extra=()
  if [ "$FIX" = 1 ]; then
    if [ "$SLURM_NODEID" = 0 ]; then conf=$conf,is_host=1; extra=(--local_addr="$RDZV_HOST")
    else conf=$conf,is_host=0; fi
  fi
  exec "$PY" -m torch.distributed.run --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d \\
    --rdzv_endpoint="$RDZV_HOST:$RDZV_PORT" --rdzv_id="$SLURM_JOB_ID" --rdzv_conf="$conf" \\
    --max_restarts=0 "${{extra[@]}}" "$WORKER"'
"""


@pytest.mark.parametrize("fix", [False, True], ids=["plain-torchrun-fails", "is_host-works"])
def test_jsc_rendezvous_failure_reproduced(fix, slurm, tmp_path):
    """pytorch#73656: with the endpoint node1i, which is not node1's hostname, plain torchrun
    finds no node that hosts the store and every agent times out as a client. The same
    job with is_host/--local_addr (what ddl and torchrun_jsc pass) trains."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    name = "fix" if fix else "plain"
    script = tmp_path / f"{name}.sbatch"
    script.write_text(RAW_JOB.format(name=name, out=tmp_path, fix=int(fix),
                                     python=shlex.quote(sys.executable),
                                     worker=shlex.quote(str(worker))))
    proc = slurm.run("sbatch", "--parsable", str(script))
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    info = wait_for_job(slurm, job_id)
    log = (tmp_path / f"raw-torchrun-{name}-{job_id}.out").read_text()
    assert re.search(r"^raw: endpoint node1i:\d+ ", log, re.M), log
    done = re.findall(r"^worker rank (\d) world 2 sum 2$", log, re.M)
    if fix:
        assert info["JobState"] == "COMPLETED", f"{info}\n{log}"
        assert sorted(done) == ["0", "1"], log
    else:
        assert info["JobState"] == "FAILED", f"{info}\n{log}"
        assert done == [], log
        # both agents are clients of a store nobody hosts
        assert "RendezvousConnectionError" in log, log
        assert re.search(r"failed to connect/validate to host node1i:\d+", log), log


def test_unresolvable_rendezvous_host_fails_fast(slurm, synthetic_mnist, tmp_path):
    out = tmp_path / "out"
    job = ddl_submit(slurm, out, synthetic_mnist, "--site", "local-slurm-nosuch")
    log = job.log_text
    assert job.info["JobState"] == "FAILED", f"{job.info}\n{log}"
    assert job.info["TimeLimit"] == "00:10:00"
    # fast: the job script stops before srun, long before its time limit
    assert seconds(job.info["RunTime"]) < 30, job.info
    assert job.wall_s < 60, job.wall_s
    lines = [line for line in log.splitlines() if line.strip()]
    assert len(lines) == 1, log  # one line, no traceback, no srun
    assert re.fullmatch(r"ddl: rendezvous host node1-nosuch does not resolve on node1; "
                        r"refusing to start .*", lines[0]), lines[0]
    assert not job.results.exists()
    assert not job.results.parent.exists()  # no worker ever started


def test_jobs_see_the_cluster_name(slurm):
    """local-slurm.toml's `detect` relies on SLURM_CLUSTER_NAME inside jobs."""
    assert "SLURM_CLUSTER_NAME=local" in slurm.node1_task, slurm.node1_task


def test_hand_written_srun_of_the_image_gets_the_lumi_environment(slurm, runtime_env, image,
                                                                 synthetic_mnist, tmp_path):
    """Issue 42: `srun ... apptainer run IMAGE train --site lumi`, written by hand (no
    `ddl submit` script exporting anything, no --cpu-bind): the image's ddl sets LUMI's job
    environment itself, as the batch script would have it (results.json's `environment`,
    written inside the image), and binds the rank to its GCD's cores, or, on a node without
    those CPUs (this one), says so in one line and runs unbound. LUMI's GPUs, network and
    Singularity are not here: --device cpu, Apptainer."""
    from ddl.launch import site_env
    from ddl.settings.sites import get_site
    from ddl.settings.cores import online_cpus

    lumi = get_site("lumi")
    env = {**slurm.env, "PATH": f"{APPTAINER_DIR / 'bin'}:{slurm.env['PATH']}",
           "USER": "ana"}  # the name the profile's MIOpen cache path carries
    env.pop("DDL_SITE_PATH")  # the image's own profiles
    assert not set(lumi.env) & set(env), "the test's environment has LUMI's variables"
    run_dir = tmp_path / "run"
    proc = run_bounded(
        ["srun", "--nodes=1", "--ntasks=1", "--time=5", "bash", "-c",
         'echo "job $SLURM_JOB_ID"; exec apptainer run "$0" "$@"', str(image),
         "train", "--site", "lumi", "--plugin", "mnist", "--preset", "tiny", "--device", "cpu",
         "--epochs", "1", "--steps-per-epoch", "2", "--data-dir", str(synthetic_mnist),
         "--run-dir", str(run_dir)], env=env, cwd=tmp_path, timeout=JOB_DEADLINE_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = re.search(r"^job (\d+)$", proc.stdout, re.M).group(1)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["container"]["image"] == str(image), results["container"]  # inside it
    assert results["site"] == "lumi-g" and results["world"]["size"] == 1

    expected = site_env.in_job(lumi, {"USER": "ana", "SLURM_JOB_ID": job})
    assert expected["MIOPEN_USER_DB_PATH"] == f"/tmp/ana-miopen-cache-{job}"
    assert expected["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert set(expected) == set(lumi.env)
    recorded = results["environment"]
    assert {name: recorded.get(name) for name in expected} == expected, recorded

    gcd0 = lumi.cpu_binding.srun_cpus(0)  # 49-55
    if gcd0 <= online_cpus():  # a node as large as LUMI's
        assert results["threads"]["source"] == "the 7 cores bound to this rank", results
    else:
        assert ("ddl: note: site lumi-g binds local rank 0 to CPUs 49-55, but this node has "
                "CPUs") in proc.stderr, proc.stderr
        assert "bound to this rank" not in results["threads"]["source"], results["threads"]


def test_plan_verify_trains_the_best_layout_in_one_job(slurm, synthetic_mnist, tmp_path):
    """`ddl plan --verify 2 --submit` from the "login node": the plan is printed here, the
    job trains its two best layouts for 2 nodes x 4 processes, each an srun step over both
    nodes, and plan.json holds the predictions beside what those runs measured."""
    out = tmp_path / "out"
    proc = run_ddl("plan", "--plugin", "mnist", "--preset", "tiny", "--site", "local-slurm",
                   "--nodes", "2", "--global-batch-size", "64", "--data-dir",
                   str(synthetic_mnist), "--verify", "2", "--submit", "--output-dir", str(out),
                   "--time", "00:10:00", cwd=tmp_path, env=slurm.env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("mnist tiny on local-slurm: 2 node(s) x 4 processes, "
                                  "global batch 64, 2.0 GiB per device"), proc.stdout
    job_id = re.search(r"^ddl: submitted job (\d+) to local-slurm", proc.stdout, re.M)[1]
    paths = dict(re.findall(r"^\s+(script|log|results):\s+(\S+)$", proc.stdout, re.M))
    info = wait_for_job(slurm, job_id)
    log = Path(paths["log"]).read_text() if Path(paths["log"]).exists() else "<no log>"
    assert info["JobState"] == "COMPLETED", f"{info}\n{log}"
    assert info["NumNodes"] == "2", info
    assert "srun --nodes" not in Path(paths["script"]).read_text()  # plan starts the sruns

    report = json.loads(Path(paths["results"]).read_text())
    verified = report["verify"]
    assert verified["slurm_job"] == job_id, verified
    assert len(verified["layouts"]) == 2  # two srun steps, one rendezvous port after another
    # the plan's best row of each of two distinct meshes (issue 51: --verify checks the
    # ranking, not one mesh twice), as they ran
    assert verified["layouts"][0]["plan_rank"] == 1
    assert verified["layouts"][0]["mesh"] != verified["layouts"][1]["mesh"]
    for layout in verified["layouts"]:
        planned = report["fits"][layout["plan_rank"] - 1]
        assert layout["status"] == "measured", layout
        assert layout["mesh"] == planned["mesh"]
        assert layout["measured"]["mesh"] == layout["mesh"]
        assert math.prod(layout["mesh"].values()) == 8
        assert 0.95 <= layout["ratio"]["model_state"] <= 1.05, layout
    assert "predicted / measured" in log, log  # the table, in the job's log
    # the layouts' run dirs and the job's scratch went with the job
    assert sorted(p.name for p in Path(paths["results"]).parent.iterdir()) == ["plan.json"]


def wait_for_restart(cluster: Cluster, job_id: str, timeout: float) -> dict:
    """Poll until Slurm counts a restart of the job (its script requeued it); fail when the
    job ends without one or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        info = show_job(cluster, job_id)
        if int(info.get("Restarts", "0")) >= 1:
            return info
        if (info.get("JobState") in TERMINAL
                and not cluster.run("squeue", "-h", "-j", job_id).stdout.strip()):
            pytest.fail(f"job {job_id} ended without a requeue: {info}")
        if time.monotonic() > deadline:
            cluster.run("scancel", job_id)
            pytest.fail(f"job {job_id} not requeued after {timeout} s: {info.get('JobState')}")
        time.sleep(0.5)  # poll interval only; the deadline decides


# Runs beside the other system tests, first in the Slurm group (tests/system/conftest.py
# FIRST_IN_GROUP): load only makes the training longer, so the signal still lands in it;
# alone after the others it cost CI a 2-minute serial phase (5084f9b).
def test_time_limit_requeues_the_job_which_resumes_to_the_same_weights(slurm, synthetic_mnist,
                                                                       tmp_path):
    """A 2-minute job whose training needs longer: Slurm signals the batch script
    (--signal=B:USR1@105: 15 s after the start, checked by slurmctld about every 30 s, so
    it lands 15-45 s in), the run checkpoints and stops, the script requeues the job. As
    soon as Slurm counts that restart the test raises the job's limit to 15 minutes
    (`scontrol update JobId=.. TimeLimit=..`, as an admin would), so the requeued job
    resumes and finishes in one go: exactly one requeue, instead of one per 2-minute slice
    (five under load). Meanwhile the same run without a time limit goes through on the
    other node. Both end with the same weights. 30 epochs take ~60 s on two idle cores,
    past the latest signal by a third (3 epochs, ~6 s, once finished before the signal
    came); the test takes about the training plus one restart (40 epochs and a signal at
    30-60 s: 81-94 s)."""
    run = ["--plugin", "mnist", "--preset", "tiny", "--global-batch-size", "16", "--epochs",
           "30", "--seed", "7", "--checkpoint-every", "25", "--data-dir", str(synthetic_mnist),
           "--site", "local-slurm", "--nodes", "1", "--gpus-per-node", "2"]
    jobs = {}
    # each job a whole node, as the test means them: ddl now asks for the CPUs of the GPUs
    # it uses (issue 52), so both jobs fit on node1 and, with the profile's fixed port
    # 29500, their rendezvous would collide
    for name, limits in (("limited", ["--time", "2", "--stop-margin", "105",
                                      "--sbatch=--exclusive"]),
                         ("reference", ["--time", "00:15:00", "--stop-margin", "0",
                                        "--sbatch=--exclusive"])):
        proc = run_ddl("submit", *run, *limits, "--output-dir", str(tmp_path / name),
                       "--job-name", name, cwd=tmp_path, env=slurm.env, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        job_id = re.search(r"^ddl: submitted job (\d+) ", proc.stdout, re.M).group(1)
        jobs[name] = (job_id, Path(re.search(r"^\s+results:\s+(\S+)$", proc.stdout,
                                             re.M).group(1)))
    limited_id = jobs["limited"][0]
    requeued = wait_for_restart(slurm, limited_id, timeout=JOB_DEADLINE_S)
    assert requeued["TimeLimit"] == "00:02:00", requeued
    raised = slurm.run("scontrol", "update", f"JobId={limited_id}", "TimeLimit=00:15:00")
    assert raised.returncode == 0, raised.stdout + raised.stderr
    infos = wait_for_jobs(slurm, {name: job_id for name, (job_id, _) in jobs.items()},
                          timeout=2 * JOB_DEADLINE_S)
    logs = {name: next((tmp_path / name).glob("*.out")).read_text() for name in jobs}
    for name in jobs:
        assert infos[name]["JobState"] == "COMPLETED", f"{name}: {infos[name]}\n{logs[name]}"

    limited = logs["limited"]
    assert infos["limited"]["TimeLimit"] == "00:15:00", infos["limited"]
    assert limited.count("checkpointing and stopping") == 1, limited
    assert limited.count("ddl: requeueing job") == 1, limited
    assert len(re.findall(r"^ddl: resumed from \S+step-\d{8} ", limited, re.M)) == 1, limited
    results = json.loads(jobs["limited"][1].read_text())
    assert results["restarts"]["slurm_restart_count"] == 1, results["restarts"]
    assert infos["limited"]["Restarts"] == "1", infos["limited"]
    assert infos["reference"]["Restarts"] == "0", infos["reference"]

    import torch

    weights = {name: torch.load(path.with_name("model.pt"), weights_only=True)
               for name, (_, path) in jobs.items()}
    assert weights["limited"].keys() == weights["reference"].keys()
    for key, expected in weights["reference"].items():
        assert torch.equal(weights["limited"][key], expected), key
