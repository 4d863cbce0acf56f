"""The process group of one run: who am I, which device, which backend.

Workers are started by a launcher (torch's elastic agent, torchrun, torchrun_jsc) that sets
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; a single
process started directly runs as a world of one. The rest of ddl receives a :class:`World`
instead of asking torch.distributed globals, so each piece can say which ranks it uses.

Joining is bounded: a rendezvous that cannot complete (a rank never started, a wrong
``MASTER_ADDR``/``MASTER_PORT``, a firewall) fails after the run's ``rendezvous_timeout``
with one line naming the address and how many ranks arrived, instead of waiting until the
job's wall-clock limit. Collectives keep their own, longer timeout: once everyone is there,
a rank may legitimately wait minutes for another (e.g. one writing a checkpoint).
"""

from __future__ import annotations

import os
import random
import socket
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from ddl.contract.world import World

if TYPE_CHECKING:
    import torch


def pick_device(requested: str, accelerator: str, local_rank: int) -> torch.device:
    """CUDA and ROCm builds of torch both expose GPUs as ``cuda`` devices."""
    import torch

    wants_gpu = requested == "cuda" or (requested == "auto" and accelerator in ("cuda", "rocm"))
    if wants_gpu:
        if not torch.cuda.is_available():
            from ddl.contract.errors import DdlError
            raise DdlError("no GPU visible to torch on this node (torch.cuda.is_available() "
                           "is False); use --device cpu or check the job's GPU request")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def collective_backend(device_type: str, site_backend: str) -> str:
    """The backend follows the device: NCCL/RCCL need GPUs and gloo runs everywhere, so a
    GPU site run with --device cpu uses gloo, and a CPU profile (``local``) run with
    --device cuda uses NCCL (RCCL on ROCm builds) rather than gloo's host copies."""
    if device_type == "cpu":
        return "gloo"
    return "nccl" if site_backend == "gloo" else site_backend


def init_world(requested_device: str, accelerator: str, backend: str,
               rendezvous_timeout_s: float = 300, collective_timeout_s: float = 600) -> World:
    """Join the process group described by the launcher's environment variables."""
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    size = int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(requested_device, accelerator, local_rank)
    backend = collective_backend(device.type, backend)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            store = join_store(rank, size, rendezvous_timeout_s)
            # From here on the store serves the process group, whose waits are collectives'.
            store.set_timeout(timedelta(seconds=collective_timeout_s))
            dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                    timeout=timedelta(seconds=collective_timeout_s),
                                    device_id=device if device.type == "cuda" else None)
        else:  # a lone process: a private in-memory store, no network port
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return World(rank=rank, local_rank=local_rank, size=size, device=device, backend=backend)


def join_store(rank: int, size: int, timeout_s: float):
    """The rendezvous store at MASTER_ADDR:MASTER_PORT once all ``size`` ranks have joined it,
    or a one-line DdlError within about ``timeout_s`` seconds.

    The store is the one torch's ``env://`` rendezvous would build: hosted by rank 0, or by
    the elastic agent when it exports TORCHELASTIC_USE_AGENT_STORE. What ddl adds: a rank
    that connects as a client first waits quietly for something to listen (torch's own
    connect retries log a C++ backtrace on every attempt); every rank then counts itself in,
    so each one can say how many arrived; and a hosting rank 0 that gives up tells the
    others before its store goes away (see :func:`_give_up`).
    """
    from ddl.contract.errors import DdlError

    host, port = os.environ["MASTER_ADDR"], os.environ.get("MASTER_PORT", "")
    where = f"{host}:{port}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DdlError(f"rendezvous: MASTER_PORT={port!r} is not a port number (1-65535)")
    deadline = time.monotonic() + timeout_s
    limit = f"{timeout_s:g} s (--rendezvous-timeout)"
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    if not hosts and not _wait_for_listener(host, int(port), deadline, where):
        raise DdlError(f"rendezvous at {where} failed: nothing listened there within {limit}, "
                       f"0 of {size} ranks joined; is rank 0 (or its node's launcher) running, "
                       f"and do all ranks get the same MASTER_ADDR/MASTER_PORT?")
    try:
        store = _open_store(host, int(port), size, hosts, max(deadline - time.monotonic(), 1))
        store = this_attempts_keys(store)
        arrived, verdict = _count_in(store, size, deadline)
        if arrived < size and hosts:
            _give_up(store, arrived)
    except RuntimeError as exc:  # torch's DistError family: no bind, lost connection
        raise DdlError(f"rendezvous at {where} failed on rank {rank}: "
                       f"{_first_line(exc)}") from None
    if arrived < size:
        joined = verdict if verdict is not None else arrived
        raise DdlError(f"rendezvous at {where} timed out after {limit}: {joined} of {size} "
                       "ranks joined; start the missing ranks or allow more time")
    return store


def this_attempts_keys(store):
    """The store as this elastic attempt's workers share it. The agent's store outlives
    restarted workers: like torch's env:// rendezvous, each attempt gets its own key space,
    or a restarted rank would read the dead workers' addresses (seen: "Gloo connectFullMesh
    failed ... Connection refused")."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return store
    import torch.distributed as dist

    return dist.PrefixStore(f"/worker/attempt_{attempt}", store)


def _open_store(host: str, port: int, size: int, hosts: bool, timeout_s: float):
    """A TCPStore as torch.distributed.rendezvous._create_c10d_store makes it, except that
    the host does not wait for the clients in its constructor: it counts them like every
    other rank, so it can still tell them it gives up."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if hosts:
        return dist.TCPStore(host, port, size, is_master=True, timeout=timeout,
                             wait_for_workers=False, multi_tenant=True,
                             use_libuv=os.environ.get("USE_LIBUV", "1") == "1")
    return dist.TCPStore(host, port, size, is_master=False, timeout=timeout)


def _wait_for_listener(host: str, port: int, deadline: float, where: str) -> bool:
    """Whether something accepts connections at host:port before the deadline. Polled: the
    host rank may simply start later than this one."""
    from ddl.contract.errors import DdlError

    delay = 0.05
    while True:
        try:
            socket.create_connection((host, port),
                                     timeout=max(0.1, deadline - time.monotonic())).close()
            return True
        except socket.gaierror as exc:
            raise DdlError(f"rendezvous at {where}: cannot resolve host {host!r} ({exc}); "
                           "check MASTER_ADDR (or the site's rendezvous rule)") from None
        except OSError:
            if time.monotonic() + delay >= deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, 1.0)


def _keys() -> tuple[str, str, str]:
    """The counting keys. They carry the elastic restart number: a restarted attempt must
    not see the arrivals of the one before in the agent's long-lived store."""
    base = f"ddl/rendezvous/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"{base}/arrived", f"{base}/gave_up", f"{base}/left"


def _count_in(store, size: int, deadline: float) -> tuple[int, int | None]:
    """Add this rank to the arrival count and wait for all ``size`` (or the deadline, or the
    host giving up): the last count seen and, if the host gave up, its count."""
    arrived_key, gave_up_key, left_key = _keys()
    arrived = store.add(arrived_key, 1)
    delay, verdict = 0.01, None
    while arrived < size and time.monotonic() < deadline and verdict is None:
        time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
        delay = min(2 * delay, 0.5)  # cheap for the store even with thousands of ranks
        arrived = store.add(arrived_key, 0)
        if arrived < size and store.check([gave_up_key]):
            verdict = int(store.get(gave_up_key))
    if arrived < size:
        store.add(left_key, 1)  # last: a host that gave up leaves once all joined have left
    return arrived, verdict


def _give_up(store, arrived: int, grace_s: float = 5.0) -> None:
    """The host's store dies with it: announce the count first and give the ranks that
    joined (they poll at least every 0.5 s) a moment to read it, so they fail with the
    same one line instead of a lost connection."""
    _, gave_up_key, left_key = _keys()
    store.set(gave_up_key, str(arrived))
    until = time.monotonic() + grace_s
    while store.add(left_key, 0) < arrived and time.monotonic() < until:
        time.sleep(0.05)


def _first_line(exc: BaseException) -> str:
    """torch's messages can carry a C++ backtrace after the first line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def close_world() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def seed_all(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) alike."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
