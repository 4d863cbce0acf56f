"""Fixtures shared by the system tests: a real Apptainer and ONE CPU image per test run.

The Apptainer is Debian sid's 1.4, provided on this Debian 12 machine by
../shared/tools/provide-apptainer (also the Debian 12 Python root used as the
`Bootstrap: localimage` base: registries are unreachable here). Both, and the wheelhouse,
are cached under .cache/ (ignored by git): a second run skips their ~2 minutes; a fresh
clone builds them from nothing. Session scope: every system test file that asks for
`image` shares the same build (it takes minutes on 2 cores).

Which torch: the image is the CPU image, so it gets a CPU build of torch. PyTorch's CPU
index (the definition's default) is unreachable here; the only CPU torch on this machine
is 2.13.0+cpu, and the only torchvision for it 0.28.0 (a CUDA build, whose compiled ops
cannot load beside it: containers/cpu.def handles that, docs/containers.md says how).
PyPI's CUDA build of 2.14.1 would put ~2 GB of CUDA libraries that torch loads at import
into a CPU image (docs/containers.md has the measurement).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_ddl

PROVIDE = Path(os.environ.get("DDL_PROVIDE_APPTAINER",
                              REPO.parent / "shared" / "tools" / "provide-apptainer"))
CACHE = REPO / ".cache"
APPTAINER_DIR = CACHE / "apptainer"
BASE = APPTAINER_DIR / "base"
WHEELHOUSE = CACHE / "wheelhouse"
CPU_TORCH = ("torch==2.13.0+cpu", "torchvision==0.28.0")
# What PyPI's CUDA build of torch brings and a CPU image must not carry.
CUDA_WHEELS = ("torch-", "torchvision-", "nvidia_", "triton-", "cuda_")


@pytest.fixture(scope="session")
def runtime_env() -> dict[str, str]:
    """The environment with a real apptainer first on PATH (provided once, then reused)."""
    if not PROVIDE.is_file():
        pytest.fail(f"{PROVIDE} not found: the system tests need ../shared/tools beside the "
                    "checkout (or DDL_PROVIDE_APPTAINER)")
    proc = subprocess.run([str(PROVIDE), str(APPTAINER_DIR)], capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, f"provide-apptainer failed:\n{proc.stdout}\n{proc.stderr}"
    env = {**os.environ, "PATH": f"{APPTAINER_DIR / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DDL_SITE_PATH", None)  # the image must find its own profiles
    return env


@pytest.fixture(scope="session")
def cpu_wheelhouse(tmp_path_factory) -> Path:
    """scripts/build-wheelhouse.sh's offline wheelhouse with the CPU torch pair in place of
    PyPI's CUDA build: hard links into a directory of this session (several test sessions
    may build at once), the CPU pair copied from pip's local wheel stores."""
    wheels = subprocess.run([str(REPO / "scripts" / "build-wheelhouse.sh"), "--torch",
                             "--offline", str(WHEELHOUSE)], capture_output=True, text=True,
                            timeout=1800)
    assert wheels.returncode == 0, wheels.stderr
    wheelhouse = tmp_path_factory.mktemp("wheelhouse-cpu")
    for path in WHEELHOUSE.iterdir():
        if path.is_file() and not path.name.startswith(CUDA_WHEELS):
            try:
                os.link(path, wheelhouse / path.name)
            except OSError:  # another file system
                shutil.copy2(path, wheelhouse / path.name)
    torch = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--dest", str(wheelhouse), *CPU_TORCH],
                           capture_output=True, text=True, timeout=600)
    assert torch.returncode == 0, torch.stderr
    return wheelhouse


@pytest.fixture(scope="session")
def image(runtime_env, cpu_wheelhouse, tmp_path_factory) -> Path:
    """The CPU image, built through `ddl container build` as docs/containers.md says
    (wheelhouse by scripts/build-wheelhouse.sh --torch --offline: no package index)."""
    sif = tmp_path_factory.mktemp("image") / "ddl-cpu.sif"
    build = run_ddl("container", "build", "--target", "cpu", "--base", str(BASE),
                    "--wheelhouse", str(cpu_wheelhouse), "--offline", "--no-compress",
                    "--build-arg", "TORCH=" + " ".join(CPU_TORCH),
                    "--output", str(sif), cwd=REPO, env=runtime_env, timeout=2400)
    assert build.returncode == 0, build.stderr[-5000:]
    assert f"ddl: built {sif}" in build.stdout
    yield sif
    sif.unlink(missing_ok=True)  # gigabytes


def apptainer(env: dict[str, str], *args: str, cwd: Path | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """The real apptainer (from `runtime_env`), output captured."""
    return subprocess.run(["apptainer", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
