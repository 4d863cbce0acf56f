"""A rendezvous that cannot complete fails within --rendezvous-timeout, in one line.

Real worker processes (`python -m ddl.worker`, configured like a per-node launcher does it,
through DDL_RUN_PLAN and the torch.distributed variables) meet at a real TCP store on
127.0.0.1, with some of the ranks of the world never started. Each must exit non-zero with
exactly one line on stderr naming MASTER_ADDR:MASTER_PORT and how many ranks arrived,
instead of waiting out the default timeout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddl.settings.config import build
from ddl.settings.plan import PLAN_ENV, make_plan

pytestmark = pytest.mark.distributed

TIMEOUT_S = 3
# Far above TIMEOUT_S plus start-up: only there so that a hang fails the test instead of CI.
GIVE_UP_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_rank(rank: int, world_size: int, port: int, run_dir: Path) -> subprocess.Popen:
    flags = {"site": "local", "device": "cpu", "run_dir": run_dir,
             "data_dir": run_dir.parent / "no-data", "rendezvous_timeout": TIMEOUT_S}
    # Nothing from an enclosing launcher or job may leak in (agent store, Slurm ranks).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC_", "SLURM_", "DDL_"))}
    env.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world_size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    plan = make_plan(build(flags), env)  # what `ddl train` under a launcher hands its worker
    env[PLAN_ENV] = plan.model_dump_json()
    return subprocess.Popen([sys.executable, "-m", "ddl.worker"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _one_line_failure(proc: subprocess.Popen) -> str:
    stdout, stderr = proc.communicate(timeout=GIVE_UP_S)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode not in (0, None), (proc.returncode, stdout, stderr)
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr + stdout
    return lines[0]


def test_rank0_alone_names_address_and_arrivals(tmp_path):
    port = _free_port()
    line = _one_line_failure(_start_rank(0, 2, port, tmp_path / "run"))
    assert f"127.0.0.1:{port}" in line, line
    assert "1 of 2 ranks joined" in line, line
    assert "--rendezvous-timeout" in line, line


def test_rank1_with_no_store_listening_gives_up(tmp_path):
    port = _free_port()  # nobody listens here: rank 0 was never started
    line = _one_line_failure(_start_rank(1, 2, port, tmp_path / "run"))
    assert f"127.0.0.1:{port}" in line, line
    assert "0 of 2 ranks joined" in line, line
    assert "nothing listened" in line, line


def test_every_arrived_rank_reports_the_same_count(tmp_path):
    """Rank 2 of 3 never starts: the host (rank 0) and a client (rank 1) both say 2 of 3,
    and the client gets that line rather than a lost connection when the host gives up."""
    port = _free_port()
    procs = [_start_rank(rank, 3, port, tmp_path / "run") for rank in (0, 1)]
    for proc in procs:
        line = _one_line_failure(proc)
        assert f"127.0.0.1:{port}" in line, line
        assert "2 of 3 ranks joined" in line, line
