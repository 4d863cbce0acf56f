"""What this node runs: Python, torch (version and build), CPU architecture.

torch is deliberately not a dependency of the ``ddl`` distribution (GPU images take torch
from their base image, and pip must not replace it), so pip cannot enforce ddl's torch
floor: ``ddl train`` and ``ddl doctor`` check it here, in one line, before workers start.

Nothing here imports torch: the installed torch is read from its generated
``torch/version.py`` (version, CUDA or HIP build), so the check costs milliseconds and
works even where importing torch would fail.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ddl.contract.errors import UsageError

#: The oldest Python ddl runs on (also `requires-python` in packages/core/pyproject.toml).
PYTHON_FLOOR = (3, 10)

#: The oldest torch ddl runs on, found by running ddl on older ones (PyPI wheels, CPU, gloo,
#: 2026-11): on torch 2.6.0 ddp trains but pp fails (the pipeline schedules take no
#: `scale_grads` before 2.7; ddl passes it) and fsdp fails on CPU (2.6's CPU Stream has no
#: `record_event`, which FSDP2 calls); torch 2.5 has no public
#: `torch.distributed.fsdp.fully_shard` at all. On 2.7.1 ddp and fsdp train; every name ddl
#: imports from torch is there (tensor parallel, DCP: present, not run on 2.7).
TORCH_FLOOR = (2, 7)

#: Strategies that need more than the floor, found the same way. pp: on 2.7.1 it fails at
#: the first evaluation (the schedules have `eval()` from 2.9), on 2.9.1 at the first step
#: (gloo: "Received data size doesn't match expected size"); 2.10.0 trains. LUMI's
#: PyTorch image is 2.7.1.
STRATEGY_TORCH_FLOORS = {"pp": ((2, 10), "torch.distributed.pipelining as ddl drives it")}

#: CPU architecture of sites whose nodes are not x86_64. The site profile schema has no
#: field for it yet; until it has, the fact lives here.
#: CTE-POWER: 2x POWER9 per node, ppc64le (the BSC hands-on,
#: jorditorresBCN/Fundamentals-DL-CTE-POWER).
GPU_LABEL = {"cuda": "CUDA", "rocm": "ROCm"}


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version: '2.6.0a0+ecf3bae' -> (2, 6, 0), '3.10' -> (3, 10).

    NVIDIA's containers ship pre-release builds ('2.6.0a0+...') of the release they name;
    they count as that release, so pre-release and local parts are ignored.
    """
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    if not match:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def _dotted(numbers: tuple[int, ...]) -> str:
    return ".".join(str(n) for n in numbers)


def check_python(found: tuple[int, ...] = tuple(sys.version_info[:3])) -> None:
    if tuple(found[:2]) < PYTHON_FLOOR:
        raise UsageError(f"Python {_dotted(found)} is too old for ddl; it needs Python >= "
                         f"{_dotted(PYTHON_FLOOR)} (load a newer Python module or use ddl's "
                         "container image)")


def check_torch(found: str | None) -> None:
    """`found` is the installed torch's version string, None if torch is not installed."""
    needed = f"torch >= {_dotted(TORCH_FLOOR)}"
    if found is None:
        raise UsageError(f"torch is not installed; ddl needs {needed} (install it, or run "
                         "ddl's container image, which has it)")
    if version_tuple(found)[:2] < TORCH_FLOOR:
        raise UsageError(f"torch {found} is too old for ddl; it needs {needed} (its FSDP2 "
                         "and pipeline schedules; install a newer torch or use ddl's "
                         "container image)")


def check_strategy_torch(strategy: str, found: str | None) -> None:
    """A strategy that needs a newer torch than ddl's floor: one line before training."""
    if strategy not in STRATEGY_TORCH_FLOORS or found is None:
        return
    floor, why = STRATEGY_TORCH_FLOORS[strategy]
    if version_tuple(found)[:2] < floor:
        raise UsageError(f"--strategy {strategy}: needs torch >= {_dotted(floor)} ({why}), "
                         f"found torch {found}; the other strategies run on torch >= "
                         f"{_dotted(TORCH_FLOOR)}")


@dataclass(frozen=True)
class TorchBuild:
    version: str
    kind: str  # "cuda", "rocm" or "cpu": what the torch binary was built for
    toolkit: str | None  # the CUDA or HIP version it was built with

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"torch {self.version} (CPU-only build)"
        label = "CUDA" if self.kind == "cuda" else "ROCm (HIP)"
        return f"torch {self.version} ({label} {self.toolkit} build)"


def installed_torch() -> TorchBuild | None:
    """The torch that `import torch` would load, read from its torch/version.py."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    version_file = Path(spec.origin).with_name("version.py")
    try:
        text = version_file.read_text()
    except OSError:
        return None
    values = dict(re.findall(r"^(__version__|cuda|hip)\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]",
                             text, re.M))
    if "__version__" not in values:
        return None
    if values.get("hip"):
        return TorchBuild(values["__version__"], "rocm", values["hip"])
    if values.get("cuda"):
        return TorchBuild(values["__version__"], "cuda", values["cuda"])
    return TorchBuild(values["__version__"], "cpu", None)


def check_runtime() -> None:
    """Python and torch floors; the first thing `ddl train` does (before any import that an
    old Python or torch would break with a traceback)."""
    check_python()
    build = installed_torch()
    check_torch(build.version if build else None)


def build_mismatch(build: TorchBuild, site_name: str, accelerator: str) -> str | None:
    """Why this torch build cannot drive the site's GPUs (None: it can)."""
    if accelerator == "cpu" or build.kind == accelerator:
        return None
    label = GPU_LABEL[accelerator]
    return (f"{build.describe()} cannot use {site_name}'s {label} GPUs; the site needs a "
            f"{label} build of torch >= {_dotted(TORCH_FLOOR)}")


def machine() -> str:
    return platform.machine()


def arch_mismatch(site, found: str) -> str | None:
    """Why this node cannot be one of the site's (None: it can, or the profile names no
    ``arch``)."""
    needed = site.arch
    if needed is None or found == needed:
        return None
    gpu = f" + {GPU_LABEL[site.accelerator]}" if site.accelerator in GPU_LABEL else ""
    return (f"this machine is {found}; {site.name} nodes are {needed}, where ddl needs "
            f"Python >= {_dotted(PYTHON_FLOOR)} and torch >= {_dotted(TORCH_FLOOR)} built for "
            f"{needed}{gpu}" + (f": {site.torch_source}" if site.torch_source else ""))