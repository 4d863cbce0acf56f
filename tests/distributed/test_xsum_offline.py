"""Compute nodes are offline: a training run must never open a network connection.

Every Python process of the run (the CLI, the launcher, the worker) gets an audit hook
(PEP 578) through a sitecustomize.py on PYTHONPATH. The hook sees each socket.connect,
sendto and getaddrinfo before it happens; one that leaves the machine is written to a log
and refused on the spot, so the probe itself never sends anything. The run happens with
the Hugging Face offline variables *unset*: the workload must keep the libraries local on
its own. A second check proves that the probe records and blocks what it should.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import run_ddl
from ddl_xsum import data, synthetic

pytestmark = pytest.mark.distributed

SITECUSTOMIZE = r'''
import ipaddress, json, os, socket, sys

_LOG = os.environ["XSUM_SOCKET_LOG"]
_LOCAL_NAMES = {"localhost", "ip6-localhost", "ip6-loopback", socket.gethostname()}


def _local(host):
    if host is None or host in ("", b""):
        return True  # getaddrinfo(None, port): the local wildcard
    if isinstance(host, bytes):
        host = host.decode()
    if host in _LOCAL_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False  # any other name is a lookup of a remote host


def _hook(event, args):
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        address = args[1]
        if not isinstance(address, tuple):
            return  # AF_UNIX paths stay on this machine
        host = address[0]
    elif event == "socket.getaddrinfo":
        host = args[0]
    elif event in ("socket.gethostbyname", "socket.gethostbyaddr"):
        host = args[0]
    else:
        return
    if _local(host):
        return
    with open(_LOG, "a") as log:
        log.write(json.dumps({"pid": os.getpid(), "event": event, "host": str(host)}) + "\n")
    raise PermissionError(f"xsum offline probe: blocked {event} to {host!r}")


sys.addaudithook(_hook)
'''


@pytest.fixture
def probe(tmp_path):
    """(environment with the probe installed, path of its log)."""
    site = tmp_path / "probe"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "sockets.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in data.OFFLINE_VARS}
    env.update(PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               XSUM_SOCKET_LOG=str(log))
    return env, log


def _entries(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_probe_records_and_blocks_remote_destinations(probe):
    env, log = probe
    # 192.0.2.1 is TEST-NET-1 (RFC 5737), reserved for documentation; the hook refuses the
    # connect before a packet is sent, as it refuses the name lookup of the Hub.
    script = (
        "import socket\n"
        "def connect(host, port):\n"
        "    with socket.socket() as s:\n"
        "        s.settimeout(1)\n"
        "        s.connect((host, port))\n"
        "for call in (lambda: connect('192.0.2.1', 443),\n"
        "             lambda: socket.getaddrinfo('huggingface.co', 443),\n"
        "             lambda: connect('127.0.0.1', 9)):\n"
        "    try:\n"
        "        call()\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # the two remote ones are refused by the probe; loopback goes through (refused by the OS)
    assert proc.stdout.split() == ["PermissionError", "PermissionError",
                                   "ConnectionRefusedError"]
    assert [(e["event"], e["host"]) for e in _entries(log)] == [
        ("socket.connect", "192.0.2.1"), ("socket.getaddrinfo", "huggingface.co")]


def test_training_opens_no_network_connection(probe, tmp_path):
    env, log = probe
    data_dir = tmp_path / "data"
    synthetic.write_synthetic(data_dir, sizes={"train": 64, "validation": 16, "test": 16})
    proc = subprocess.run(
        [sys.executable, "-c", "import sitecustomize, sys; from ddl.commands.cli import main; "
         "sys.exit(main(sys.argv[1:]))",
         "train", "--plugin", "xsum", "--preset", "tiny", "--nproc", "1", "--epochs", "1",
         "--steps-per-epoch", "2", "--data-dir", str(data_dir), "--run-dir",
         str(tmp_path / "run")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "run" / "results.json").is_file()  # trained, generated, wrote results
    assert _entries(log) == []
