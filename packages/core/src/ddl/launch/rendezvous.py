"""Where the ranks of a multi-node job meet, following the site's rules.

The rendezvous host is the first node of the allocation *as the interconnect names it*:
on JSC the InfiniBand name is the hostname plus ``i`` (jwb0001 -> jwb0001i), on CTE-POWER
plus ``-ib0``, on LUMI the plain hostname. Some sites want it resolved to an IP. The port
is fixed (JSC's course uses 7010) or derived from the job id (LUMI: ``1`` + its last four
digits), so concurrent jobs on shared nodes do not collide.

Two implementations of the same rules, on purpose:
- :func:`shell_lines` renders them as bash for the sbatch script, so the address is derived
  inside the job on the first node (never on the login node, whose names differ);
- :func:`endpoint_from_env` does it in Python for a worker started by hand with srun and no
  MASTER_ADDR, without calling ``scontrol`` (which is often missing inside containers).

A multi-node job must never fall back to localhost: each node would then train alone as
its own world. Both paths fail with one clear line instead.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping

from ddl.contract.errors import DdlError
from ddl.settings.sites import Rendezvous


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list: ``jwb[0001-0003,0007],login1`` -> names."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for n in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{n:0{len(low)}d}")
    return hosts


def port_for(rules: Rendezvous, job_id: str | None) -> int:
    if not rules.port_from_job_id:
        return rules.port
    if not job_id or not job_id.isdigit():
        raise DdlError("the site derives the rendezvous port from SLURM_JOB_ID, which is not "
                       "set; run inside a Slurm job or set MASTER_PORT")
    return int(f"{rules.port}{int(job_id) % 10000:04d}")


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve(host: str) -> str:
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        raise DdlError(f"the rendezvous host {host!r} does not resolve on "
                       f"{socket.gethostname()} ({exc.strerror or exc}); check the site's "
                       "host_suffix") from None


def endpoint_from_env(rules: Rendezvous, env: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT) for this job: taken from the environment when the job
    script exported them, else derived from SLURM_JOB_NODELIST by the site's rules."""
    nodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
    host = env.get("MASTER_ADDR", "")
    if not host:
        nodelist = env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", ""))
        if not nodelist:
            if nodes > 1:
                raise DdlError("multi-node job without MASTER_ADDR or SLURM_JOB_NODELIST: "
                               "cannot find the rendezvous host")
            host = "127.0.0.1"
        else:
            host = expand_nodelist(nodelist)[0] + rules.host_suffix
            resolved = resolve(host)
            if rules.resolve_ip:
                host = resolved
    if nodes > 1 and is_loopback(host):
        raise DdlError(f"MASTER_ADDR is {host!r} in a {nodes}-node job: every node would "
                       "train alone; the rendezvous host must be the first node's address")
    port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else port_for(
        rules, env.get("SLURM_JOB_ID"))
    return host, port


def shell_lines(rules: Rendezvous) -> list[str]:
    """Bash that sets and exports MASTER_ADDR and MASTER_PORT inside the job, or stops the
    job with one line on stderr."""
    fail = 'echo "ddl: $*" >&2; exit 1'
    lines = [
        f"ddl_fail() {{ {fail}; }}",
        "# The first node of the allocation hosts the rendezvous; derived here, inside the job.",
        'first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk \'NR == 1\')" '
        '|| ddl_fail "scontrol could not list the nodes of job $SLURM_JOB_ID"',
        '[ -n "$first_node" ] || ddl_fail "no nodes in SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST"',
    ]
    suffix_note = f" plus the interconnect suffix {rules.host_suffix!r}" if rules.host_suffix else ""
    lines.append(f"# Rendezvous host: the first node's name{suffix_note}.")
    lines.append(f'MASTER_ADDR="${{first_node}}{rules.host_suffix}"')
    lines.append('rdzv_ip="$(getent hosts "$MASTER_ADDR" | awk \'NR == 1 {print $1}\')" || true')
    lines.append('[ -n "$rdzv_ip" ] || ddl_fail "rendezvous host $MASTER_ADDR does not resolve '
                 'on $(hostname); refusing to start (nodes would train as separate worlds)"')
    if rules.resolve_ip:
        lines.append('MASTER_ADDR="$rdzv_ip"  # the site wants an IP address')
    if rules.port_from_job_id:
        lines.append(f"# Port: {rules.port} followed by the last four digits of the job id.")
        lines.append(f'MASTER_PORT="{rules.port}$(printf %04d $((SLURM_JOB_ID % 10000)))"')
    else:
        lines.append(f"MASTER_PORT={rules.port}")
    lines.append("export MASTER_ADDR MASTER_PORT")
    return lines
