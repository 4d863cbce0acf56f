"""Before a build pulls its base from a registry: is the registry reachable at all?

Without network the runtime fails late and deep ("conveyor failed to get ... no such host"),
and nothing says that an offline build exists. One TCP connection to the registry (a
fraction of a second when DNS or the route is missing) decides; when it fails, the one-line
error gives the offline route instead: a base on this machine (``--base DIR_OR_SIF``) and
a wheelhouse with every dependency (``scripts/build-wheelhouse.sh --offline``; for the
CPU image with a CPU torch, ``--cpu-torch``). Behind a proxy (``HTTPS_PROXY``) the runtime
goes through it, so no direct probe is made.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from ddl.contract.errors import DdlError, UsageError
from ddl.launch.container_def import TEMPLATE, parse

# Where each registry agent pulls from when the reference names no host (Apptainer's
# defaults: Docker Hub's registry, the Sylabs library, Singularity Hub).
DEFAULT_REGISTRY = {"docker": "registry-1.docker.io", "library": "library.sylabs.io",
                    "shub": "singularity-hub.org", "oras": None}
PROBE_TIMEOUT_S = 5.0


def registry_of(agent: str, ref: str) -> tuple[str, int] | None:
    """(host, port) a ``Bootstrap: agent`` / ``From: ref`` pulls from; None for a local base.
    As Docker reads a reference: the first path part is a registry when it has a dot or a
    port or is ``localhost`` (``nvcr.io/nvidia/pytorch:25.09-py3``), else Docker Hub."""
    agent = agent.lower()
    if agent not in DEFAULT_REGISTRY:
        return None
    first, slash, _ = ref.removeprefix("//").partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, _, port = first.partition(":")
        return host, int(port) if port.isdigit() else 443
    default = DEFAULT_REGISTRY[agent]
    return (default, 443) if default else None


def registries(definition: Path, values: dict[str, str]) -> list[tuple[str, str, int]]:
    """(base, host, port) of every stage that pulls from a registry, with build arguments
    (the definition's %arguments defaults, then ``values``) filled in."""
    try:
        stages = parse(definition)
    except UsageError:
        return []  # unreadable: the runtime's own parser says why (--no-check)
    filled = {k: v for d in stages for k, v in d.arguments.items()} | values
    out = []
    for d in stages:
        agent = TEMPLATE.sub(lambda m: filled.get(m.group(1), ""), d.bootstrap or "")
        ref = TEMPLATE.sub(lambda m: filled.get(m.group(1), ""),
                           d.header.get("from", (0, ""))[1])
        found = registry_of(agent, ref)
        if found:
            out.append((f"{agent.lower()}://{ref}", *found))
    return out


def offline_route(definition: Path) -> str:
    torch = " --cpu-torch" if definition.name == "cpu.def" else ""
    return (f"without network, build offline: `scripts/build-wheelhouse.sh{torch} --offline "
            "wheelhouse` where an index is reachable, then `ddl container build --offline "
            "--wheelhouse wheelhouse --base BASE` with BASE a local image or root directory "
            "with Python 3 (docs/containers.md, CPU image)")


def require_registries(definition: Path, values: dict[str, str]) -> None:
    """Raise DdlError, naming the offline route, when a registry base is unreachable."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                        "all_proxy")):
        return
    for base, host, port in registries(definition, values):
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            why = exc.strerror or str(exc) or type(exc).__name__
            raise DdlError(f"the base {base} needs {host}:{port}, which cannot be reached "
                           f"({why}); {offline_route(definition)}") from None
