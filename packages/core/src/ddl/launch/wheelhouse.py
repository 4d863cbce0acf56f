"""Which torch/torchvision pair a wheelhouse holds (scripts/build-wheelhouse.sh), so that
`ddl container build` installs what it holds (ddl.launch.container_build)."""

from __future__ import annotations

import re
from pathlib import Path

from ddl.contract.errors import UsageError

# A wheel's file name: NAME-VERSION(-BUILD)?-PYTHON-ABI-PLATFORM.whl (PEP 427); a local
# version such as 2.13.0+cpu stays as it is.
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?"
                    r"-[^-]+-[^-]+-[^-]+\.whl$")
TORCH_PAIR = ("torch", "torchvision")


def wheelhouse_torch(wheelhouse: Path) -> str | None:
    """The torch/torchvision pair the wheelhouse holds, as the definitions' ``TORCH`` build
    argument (``torch==2.13.0+cpu torchvision==0.28.0``), or None when it holds neither.

    cpu.def's default names the lock's pair, which scripts/build-wheelhouse.sh --cpu-torch
    may not have found (a machine whose only CPU torch is 2.13.0+cpu); reading the pair
    from the wheels makes `ddl container build` install what the wheelhouse holds. Half a
    pair, or two versions of one, is refused in one line naming --build-arg TORCH=."""
    found: dict[str, set[str]] = {name: set() for name in TORCH_PAIR}
    for wheel in wheelhouse.glob("*.whl"):
        parts = _WHEEL.match(wheel.name)
        if parts and parts["name"].lower() in found:
            found[parts["name"].lower()].add(parts["version"])
    if not any(found.values()):
        return None
    for name, versions in found.items():
        if len(versions) != 1:
            have = ", ".join(f"{n} {' and '.join(sorted(v)) or 'none'}"
                             for n, v in found.items())
            raise UsageError(f"--wheelhouse: {wheelhouse} holds {have}; expected one "
                             f"torch and one torchvision wheel (scripts/build-wheelhouse.sh "
                             "--cpu-torch), or name the pair: --build-arg "
                             "TORCH='torch==X torchvision==Y'")
    return " ".join(f"{name}=={found[name].pop()}" for name in TORCH_PAIR)
